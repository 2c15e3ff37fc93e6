package xenguest_test

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/guest-driver/xenguest"
)

// sparseFile creates a file of size bytes (holes: costs nothing).
func sparseFile(t *testing.T, path string, size int64) string {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return path
}

func wordAt(t *testing.T, path string, off int64) uint32 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b [4]byte
	if _, err := f.ReadAt(b[:], off); err != nil {
		t.Fatal(err)
	}
	return binary.LittleEndian.Uint32(b[:])
}

func putWord(t *testing.T, path string, off int64, v uint32) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], v)
	if _, err := f.WriteAt(b[:], off); err != nil {
		t.Fatal(err)
	}
}

// The memory BARs mapped from a /dev/mem stand-in at their physical
// addresses: each access lands at base + offset of the "physical" file,
// and what the "device" writes there is what a read returns.
func TestBARsOverDevMem(t *testing.T) {
	mem := sparseFile(t, filepath.Join(t.TempDir(), "mem"), 16<<20)
	bars := []xenguest.BAR{
		{Index: nvc0.BAR0, Base: 0x100000, Size: 0x10000},
		{Index: nvc0.BAR1, Base: 0x400000, Size: 0x20000},
		{Index: nvc0.BAR3, Base: 0x800000, Size: 0x8000},
	}
	b, err := xenguest.OpenBARs(bars, xenguest.MapOptions{DevMem: mem})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	b.Write32(nvc0.BAR0, 0x88, 0xdeadbeef)
	b.Write32(nvc0.BAR1, 0x1fffc, 0x01020304) // the last word of BAR1
	b.Write32(nvc0.BAR3, 0, 0xcafef00d)
	for _, c := range []struct {
		off  int64
		want uint32
	}{{0x100088, 0xdeadbeef}, {0x400000 + 0x1fffc, 0x01020304}, {0x800000, 0xcafef00d}} {
		if got := wordAt(t, mem, c.off); got != c.want {
			t.Errorf("physical %#x = %#x, want %#x", c.off, got, c.want)
		}
	}
	putWord(t, mem, 0x100000+0x200, 0x12345678)
	if got := b.Read32(nvc0.BAR0, 0x200); got != 0x12345678 {
		t.Errorf("BAR0 0x200 = %#x, want what the device holds, 0x12345678", got)
	}
	if got := b.Read32(nvc0.BAR0, 0x88); got != 0xdeadbeef {
		t.Errorf("BAR0 0x88 reads back %#x", got)
	}
	if err := b.Err(); err != nil {
		t.Errorf("Err after good accesses: %v", err)
	}
	s := b.Stats()
	if s.Reads[nvc0.BAR0] != 2 || s.Writes[nvc0.BAR0] != 1 || s.Writes[nvc0.BAR1] != 1 || s.Writes[nvc0.BAR3] != 1 ||
		s.Accesses() != 5 || s.BadAccesses != 0 {
		t.Errorf("stats %+v, want 2 reads and 3 writes", s)
	}
	if s.Mean() <= 0 || s.Time() <= 0 {
		t.Errorf("no time counted: mean %v, total %v", s.Mean(), s.Time())
	}
	if o := xenguest.ClockOverhead(100); o < 0 || o > time.Millisecond {
		t.Errorf("clock overhead %v", o)
	}
	if sz := b.Size(nvc0.BAR1); sz != 0x20000 {
		t.Errorf("Size(BAR1) = %#x", sz)
	}
}

// A fill stores the value into exactly the words asked for (one string
// store on amd64, counted as a fill; word by word elsewhere); a run beyond
// the BAR or unaligned stores nothing.
func TestBARsFill(t *testing.T) {
	mem := sparseFile(t, filepath.Join(t.TempDir(), "mem"), 1<<20)
	b, err := xenguest.OpenBARs([]xenguest.BAR{{Index: nvc0.BAR3, Base: 0x20000, Size: 0x10000}}, xenguest.MapOptions{DevMem: mem})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	putWord(t, mem, 0x20000+0x100-4, 0x11111111)
	putWord(t, mem, 0x20000+0x100+4*1000, 0x22222222)
	b.Fill32(nvc0.BAR3, 0x100, 0xabcdef01, 1000)
	for i := int64(0); i < 1000; i++ {
		if got := wordAt(t, mem, 0x20100+4*i); got != 0xabcdef01 {
			t.Fatalf("word %d = %#x", i, got)
		}
	}
	if wordAt(t, mem, 0x20100-4) != 0x11111111 || wordAt(t, mem, 0x20100+4000) != 0x22222222 {
		t.Error("the fill spilled over its neighbours")
	}
	b.Fill32(nvc0.BAR3, 0xfffc, 7, 1) // the last word
	if got := wordAt(t, mem, 0x2fffc); got != 7 {
		t.Errorf("last word %#x", got)
	}
	b.Fill32(nvc0.BAR3, 0, 9, 0) // nothing
	if err := b.Err(); err != nil {
		t.Fatal(err)
	}
	s := b.Stats()
	if runtime.GOARCH == "amd64" {
		if s.Fills[nvc0.BAR3] != 2 || s.FillWords[nvc0.BAR3] != 1001 || s.Writes[nvc0.BAR3] != 0 || s.FillTime() <= 0 {
			t.Errorf("stats %+v: want 2 fills of 1001 words", s)
		}
	} else if s.Writes[nvc0.BAR3] != 1001 || s.Fills[nvc0.BAR3] != 0 {
		t.Errorf("stats %+v: want 1001 single writes", s)
	}
	if c := s.Counters(); c["guest_bar3_fills"] != s.Fills[nvc0.BAR3] || c["guest_fill_words"] != s.FillWords[nvc0.BAR3] {
		t.Errorf("counters %v", c)
	}

	b.Fill32(nvc0.BAR3, 0xfff0, 0x33333333, 5) // one word too many
	if err := b.Err(); err == nil || !strings.Contains(err.Error(), "beyond the BAR") {
		t.Errorf("fill beyond the BAR: %v", err)
	}
	if got := wordAt(t, mem, 0x2fff0); got == 0x33333333 {
		t.Error("the refused fill stored")
	}
	b.Fill32(nvc0.BAR3, 2, 0x44444444, 2)
	if got := wordAt(t, mem, 0x20000); got == 0x44444444 {
		t.Error("the unaligned fill stored")
	}
	if after := b.Stats(); after.Fills != s.Fills || after.Writes != s.Writes || after.BadAccesses != 2 {
		t.Errorf("refused fills counted: %+v", after)
	}
}

// Accesses the BARs cannot make read all-ones, write nothing and leave the
// first of them as a sticky error.
func TestBARsBadAccesses(t *testing.T) {
	mem := sparseFile(t, filepath.Join(t.TempDir(), "mem"), 1<<20)
	b, err := xenguest.OpenBARs([]xenguest.BAR{{Index: nvc0.BAR0, Base: 0x10000, Size: 0x1000}}, xenguest.MapOptions{DevMem: mem})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, c := range []struct {
		bar  int
		off  uint64
		want string
	}{
		{nvc0.BAR0, 0x1000, "outside the BAR"},
		{nvc0.BAR0, 0x2, "not 4-byte aligned"},
		{nvc0.BAR5, 0, "BAR5 is not mapped"},
		{2, 0, "BAR2 is not mapped"},
		{-1, 0, "not mapped"},
		{99, 0, "not mapped"},
	} {
		if got := b.Read32(c.bar, c.off); got != nvc0.ReadAllOnes {
			t.Errorf("read BAR%d %#x = %#x, want all-ones", c.bar, c.off, got)
		}
		b.Write32(c.bar, c.off, 0x55555555)
		if err := b.Err(); err == nil || (c.bar == nvc0.BAR0 && c.off == 0x1000 && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("after BAR%d %#x: Err = %v, want the first error (%q)", c.bar, c.off, err, c.want)
		}
	}
	// The first error stays; the count of the others is added.
	if err := b.Err(); !strings.Contains(err.Error(), "read of BAR0 offset 0x1000: outside the BAR") || !strings.Contains(err.Error(), "11 more") {
		t.Errorf("sticky error %v", err)
	}
	if got := wordAt(t, mem, 0x11000); got != 0 {
		t.Errorf("a write outside BAR0 reached memory past it: %#x", got)
	}
	if got := wordAt(t, mem, 0x10000); got != 0 {
		t.Errorf("the unaligned write landed: %#x", got)
	}
	if s := b.Stats(); s.Accesses() != 0 || s.BadAccesses != 12 {
		t.Errorf("stats %+v: want no accesses and 12 refused", s)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if got := b.Read32(nvc0.BAR0, 0); got != nvc0.ReadAllOnes {
		t.Errorf("read after Close = %#x", got)
	}
}

// Each mistake in a BAR list is refused at open.
func TestOpenBARsRefuses(t *testing.T) {
	mem := sparseFile(t, filepath.Join(t.TempDir(), "mem"), 1<<20)
	for _, c := range []struct {
		bars []xenguest.BAR
		want string
	}{
		{[]xenguest.BAR{{Index: 2, Base: 0, Size: 0x1000}}, "no such BAR"},
		{[]xenguest.BAR{{Index: nvc0.BAR5, Base: 0, Size: 0x1000}}, "is an I/O BAR on the vGPU, given as a memory BAR"},
		{[]xenguest.BAR{{Index: nvc0.BAR1, Base: 0xc000, Size: 0x80, IO: true}}, "is a memory BAR on the vGPU, given as an I/O BAR"},
		{[]xenguest.BAR{{Index: nvc0.BAR0, Base: 0x800, Size: 0x1000}}, "not page aligned"},
		{[]xenguest.BAR{{Index: nvc0.BAR0, Base: 0, Size: 0}}, "not a positive multiple of 4"},
		{[]xenguest.BAR{{Index: nvc0.BAR0, Base: 0, Size: 0x1000}, {Index: nvc0.BAR0, Base: 0x1000, Size: 0x1000}}, "given twice"},
		{[]xenguest.BAR{{Index: nvc0.BAR0, Base: 0xff000, Size: 0x2000}}, "beyond the file"},
		{[]xenguest.BAR{{Index: nvc0.BAR0, Base: 0, Size: 0x1000, Flags: xenguest.ResourceMem | xenguest.ResourceUnset}}, "not placed"},
		{[]xenguest.BAR{{Index: nvc0.BAR0, Base: ^uint64(0) &^ 0xfff, Size: 0x2000}}, "overflows"},
	} {
		b, err := xenguest.OpenBARs(c.bars, xenguest.MapOptions{DevMem: mem})
		if err == nil {
			b.Close()
			t.Errorf("%+v: opened", c.bars)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.bars, err, c.want)
		}
	}
	if _, err := xenguest.OpenBARs([]xenguest.BAR{{Index: nvc0.BAR0, Size: 0x1000}}, xenguest.MapOptions{DevMem: filepath.Join(t.TempDir(), "none")}); err == nil {
		t.Error("opened BARs of a missing /dev/mem")
	}
}

// The I/O BAR needs ioperm: without the right (an unprivileged process, a
// container, another architecture) opening it fails at once, saying why.
// The test never makes a port access.
func TestIOBARNeedsPermission(t *testing.T) {
	b, err := xenguest.OpenBARs([]xenguest.BAR{{Index: nvc0.BAR5, Base: 0xc000, Size: nvc0.BAR5Size, IO: true}}, xenguest.MapOptions{})
	if err == nil {
		// Granted (a privileged process on linux/amd64): only the
		// permission was taken, no port touched.
		defer b.Close()
		if bar, ok := b.BAR(nvc0.BAR5); !ok || !bar.IO || bar.Size != nvc0.BAR5Size {
			t.Errorf("BAR5 = %+v, %v", bar, ok)
		}
		t.Skip("this process may use ioperm, so the refusal cannot be shown (tests make no port access)")
	}
	if !strings.Contains(err.Error(), "ioperm") && !strings.Contains(err.Error(), "linux/amd64 only") {
		t.Errorf("open of the I/O BAR: %v, want an ioperm (or architecture) error", err)
	}
	t.Logf("refused as expected: %v", err)
}
