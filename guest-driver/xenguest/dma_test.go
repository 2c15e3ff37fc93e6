package xenguest_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuvm/gpuvm/gpu/hostmem"
	"github.com/gpuvm/gpuvm/guest-driver/xenguest"
	"github.com/gpuvm/gpuvm/internal/rangealloc"
)

// iomemReserved is /proc/iomem of a guest with 64 MiB of RAM booted with
// memmap=16M$0x1000000: the range is a Reserved entry between System RAM.
const iomemReserved = `00000000-00000fff : Reserved
00001000-0009fbff : System RAM
000a0000-000bffff : PCI Bus 0000:00
000f0000-000fffff : System ROM
00100000-00ffffff : System RAM
  00200000-00bfffff : Kernel code
01000000-01ffffff : Reserved
02000000-03ffffff : System RAM
e0000000-efffffff : PCI Bus 0000:00
  e0000000-e7ffffff : 0000:00:05.0
f0000000-f1ffffff : 0000:00:05.0
`

func writeFile(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// The DMA range over a /dev/mem stand-in: buffers' bus addresses are their
// guest-physical addresses, what the CPU writes through Bytes is at that
// address of "physical memory", buffers come zeroed, and the range runs out.
func TestDMA(t *testing.T) {
	dir := t.TempDir()
	mem := sparseFile(t, filepath.Join(dir, "mem"), 64<<20)
	iomem := writeFile(t, dir, "iomem", iomemReserved)
	const base, size = 16 << 20, 16 << 20
	d, err := xenguest.OpenDMA(xenguest.DMAConfig{Base: base, Size: size, DevMem: mem, IOMem: iomem})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if !d.Checked || d.Base() != base || d.Size() != size || d.FreeBytes() != size {
		t.Errorf("DMA %+v: base %#x size %#x free %#x", d, d.Base(), d.Size(), d.FreeBytes())
	}
	a, err := d.Alloc(100)
	if err != nil {
		t.Fatal(err)
	}
	if a.Bus != base || len(a.Bytes) != 4096 {
		t.Errorf("first buffer at %#x, %d bytes; want %#x, one page", a.Bus, len(a.Bytes), base)
	}
	b, err := d.Alloc(3 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if b.Bus%4096 != 0 || b.Bus < base+4096 || b.Bus+uint64(len(b.Bytes)) > base+size {
		t.Errorf("second buffer at %#x+%#x", b.Bus, len(b.Bytes))
	}
	copy(b.Bytes[0x1234:], "guest-physical")
	if got := string(readAt(t, mem, int64(b.Bus)+0x1234, 14)); got != "guest-physical" {
		t.Errorf("physical memory at bus %#x+0x1234 holds %q", b.Bus, got)
	}
	// Freed and allocated again, the memory comes back zeroed.
	if err := d.Free(b); err != nil {
		t.Fatal(err)
	}
	c, err := d.Alloc(3 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if c.Bus != b.Bus {
		t.Errorf("reallocation at %#x, want the freed %#x", c.Bus, b.Bus)
	}
	for i, v := range c.Bytes {
		if v != 0 {
			t.Fatalf("reused buffer byte %#x = %#x, want zeroed", i, v)
		}
	}
	// Exhaustion, and recovery.
	var bufs []hostmem.Buffer
	for {
		buf, err := d.Alloc(1 << 20)
		if err != nil {
			if !errors.Is(err, rangealloc.ErrNoSpace) || !strings.Contains(err.Error(), "memmap=16M$0x1000000") {
				t.Errorf("exhausted: %v", err)
			}
			break
		}
		bufs = append(bufs, buf)
		if len(bufs) > 16 {
			t.Fatal("more than the range allocated")
		}
	}
	if len(bufs) != 12 {
		t.Errorf("%d 1 MiB buffers after 4 KiB + 3 MiB, want 12", len(bufs))
	}
	if _, err := d.Alloc(size + 1); err == nil {
		t.Error("buffer larger than the range")
	}
	if err := d.Free(bufs[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Alloc(1 << 20); err != nil {
		t.Errorf("after a free: %v", err)
	}
	if err := d.Free(hostmem.Buffer{Bus: base - 4096}); err == nil {
		t.Error("freed a buffer below the range")
	}
	if err := d.Free(hostmem.Buffer{Bus: base + size}); err == nil {
		t.Error("freed a buffer past the range")
	}
	if err := d.Free(hostmem.Buffer{Bus: base + 8192}); err == nil {
		t.Error("freed a buffer that was never allocated")
	}
}

func readAt(t *testing.T, path string, off int64, n int) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDMARangeChecks(t *testing.T) {
	dir := t.TempDir()
	mem := sparseFile(t, filepath.Join(dir, "mem"), 64<<20)
	for _, c := range []struct {
		base, size uint64
		want       string
	}{
		{16 << 20, 0, "zero size"},
		{16<<20 + 512, 1 << 20, "multiples of 4 KiB"},
		{16 << 20, 1<<20 + 512, "multiples of 4 KiB"},
		{^uint64(0) &^ 0xfff, 1 << 20, "overflows"},
	} {
		_, err := xenguest.OpenDMA(xenguest.DMAConfig{Base: c.base, Size: c.size, DevMem: mem, IOMem: filepath.Join(dir, "none")})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%#x+%#x: %v, want %q", c.base, c.size, err, c.want)
		}
	}
	// No resource map to check against: opened, marked unchecked.
	d, err := xenguest.OpenDMA(xenguest.DMAConfig{Base: 1 << 20, Size: 1 << 20, DevMem: mem, IOMem: filepath.Join(dir, "none")})
	if err != nil {
		t.Fatal(err)
	}
	if d.Checked {
		t.Error("checked against a missing resource map")
	}
	d.Close()
	// Beyond the end of "physical memory".
	if _, err := xenguest.OpenDMA(xenguest.DMAConfig{Base: 63 << 20, Size: 2 << 20, DevMem: mem, IOMem: filepath.Join(dir, "none")}); err == nil {
		t.Error("mapped past the end of the /dev/mem stand-in")
	}
}

// The resource map decides: the range must be reserved (or, as memmap=
// leaves it, a gap), all of it, and nobody's; System RAM is refused with
// the memmap= parameter to boot with.
func TestCheckIOMem(t *testing.T) {
	for _, c := range []struct {
		name       string
		iomem      string
		base, size uint64
		want       string // "" = accepted
	}{
		{"reserved", iomemReserved, 16 << 20, 16 << 20, ""},
		{"inside reserved", iomemReserved, 20 << 20, 4 << 20, ""},
		{"system RAM", iomemReserved, 32 << 20, 16 << 20, "overlaps System RAM 0x2000000-0x3ffffff: the guest kernel uses it; boot the guest with memmap=16M$0x2000000"},
		{"straddles", iomemReserved, 24 << 20, 16 << 20, "overlaps System RAM"},
		{"kernel", iomemReserved, 2 << 20, 1 << 20, "overlaps System RAM"},
		// memmap= leaves a gap in the map (it is built from the firmware's
		// e820): a range nothing claims is accepted.
		{"a gap", iomemReserved, 0x100000000, 1 << 20, ""},
		{"a device's", iomemReserved, 0xe0000000, 1 << 20, "not a reserved range"},
		{"lower-case reserved", strings.ReplaceAll(iomemReserved, "Reserved", "reserved"), 16 << 20, 16 << 20, ""},
		{"claimed", strings.Replace(iomemReserved, "01000000-01ffffff : Reserved\n", "01000000-01ffffff : Reserved\n  01800000-018fffff : ramoops\n", 1), 16 << 20, 16 << 20, `0x1800000-0x18fffff of it is claimed by "ramoops"`},
		{"claimed elsewhere", strings.Replace(iomemReserved, "01000000-01ffffff : Reserved\n", "01000000-01ffffff : Reserved\n  01800000-018fffff : ramoops\n", 1), 16 << 20, 8 << 20, ""},
		{"malformed", "garbage\n", 16 << 20, 16 << 20, "want start-end : name"},
	} {
		err := xenguest.CheckIOMem(strings.NewReader(c.iomem), c.base, c.size)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
	// Read without privilege, every address is 0: not checkable.
	hidden := "00000000-00000000 : Reserved\n00000000-00000000 : System RAM\n"
	if err := xenguest.CheckIOMem(strings.NewReader(hidden), 16<<20, 16<<20); !errors.Is(err, xenguest.ErrIOMemHidden) {
		t.Errorf("hidden map: %v", err)
	}
	dir := t.TempDir()
	mem := sparseFile(t, filepath.Join(dir, "mem"), 64<<20)
	d, err := xenguest.OpenDMA(xenguest.DMAConfig{Base: 32 << 20, Size: 1 << 20, DevMem: mem, IOMem: writeFile(t, dir, "hidden", hidden)})
	if err != nil {
		t.Fatalf("hidden map: %v", err)
	}
	if d.Checked {
		t.Error("hidden map: marked checked")
	}
	d.Close()
	if _, err := xenguest.OpenDMA(xenguest.DMAConfig{Base: 32 << 20, Size: 1 << 20, DevMem: mem, IOMem: writeFile(t, dir, "iomem", iomemReserved)}); err == nil ||
		!strings.Contains(err.Error(), "memmap=1M$0x2000000") {
		t.Errorf("System RAM opened: %v", err)
	}
}

func TestMemmapParam(t *testing.T) {
	for _, c := range []struct {
		base, size uint64
		want       string
	}{
		{0x10000000, 32 << 20, "memmap=32M$0x10000000"},
		{1 << 30, 2 << 30, "memmap=2G$0x40000000"},
		{0x100000, 1<<20 + 4096, "memmap=1028K$0x100000"},
	} {
		if got := xenguest.MemmapParam(c.base, c.size); got != c.want {
			t.Errorf("MemmapParam(%#x, %#x) = %s, want %s", c.base, c.size, got, c.want)
		}
	}
}
