package xenguest_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/guest-driver/xenguest"
)

// vgpuResource is the resource file of the vGPU as an HVM guest's kernel
// shows it: BAR0 32 MiB, BAR1 128 MiB and BAR3 64 MiB (64-bit prefetchable,
// so lines 2 and 4 are their upper halves, empty), BAR5 128 I/O ports, no
// ROM, and the bridge-window lines a function's file ends with.
const vgpuResource = `0x00000000f0000000 0x00000000f1ffffff 0x0000000000040200
0x00000000e0000000 0x00000000e7ffffff 0x000000000014220c
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x00000000e8000000 0x00000000ebffffff 0x000000000014220c
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x000000000000c000 0x000000000000c07f 0x0000000000040101
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x0000000000000000 0x0000000000000000 0x0000000000000000
`

// fakeFunction writes a PCI function's sysfs directory under root.
func fakeFunction(t *testing.T, root, sbdf string, vendor, device uint16, resource string) string {
	t.Helper()
	dir := filepath.Join(root, sbdf)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{
		"vendor":   fmt.Sprintf("0x%04x\n", vendor),
		"device":   fmt.Sprintf("0x%04x\n", device),
		"resource": resource,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// fakeVGPU writes the vGPU's function with resource0/1/3 files of its BAR
// sizes (sparse), as sysfs offers them for mmap.
func fakeVGPU(t *testing.T, root, sbdf string) string {
	dir := fakeFunction(t, root, sbdf, nvc0.PCIVendorNVIDIA, nvc0.PCIDeviceQuadro6000, vgpuResource)
	for _, bar := range []int{nvc0.BAR0, nvc0.BAR1, nvc0.BAR3} {
		sparseFile(t, filepath.Join(dir, fmt.Sprintf("resource%d", bar)), int64(nvc0.BARSize(bar)))
	}
	return dir
}

func TestParseResource(t *testing.T) {
	bars, err := xenguest.ParseResource(strings.NewReader(vgpuResource))
	if err != nil {
		t.Fatal(err)
	}
	want := []xenguest.BAR{
		{Index: 0, Base: 0xf0000000, Size: 32 << 20, Flags: 0x40200},
		{Index: 1, Base: 0xe0000000, Size: 128 << 20, Flags: 0x14220c},
		{Index: 3, Base: 0xe8000000, Size: 64 << 20, Flags: 0x14220c},
		{Index: 5, Base: 0xc000, Size: 128, IO: true, Flags: 0x40101},
	}
	if fmt.Sprint(bars) != fmt.Sprint(want) {
		t.Errorf("bars:\n%v\nwant\n%v", bars, want)
	}
	for i, b := range bars {
		if b.Size != nvc0.BARSize(b.Index) {
			t.Errorf("bar %d: size %#x, the vGPU's is %#x", i, b.Size, nvc0.BARSize(b.Index))
		}
	}
	for _, bad := range []string{
		"0x0 0x0\n",
		"0xf0000000 0xf1ffffff zz\n",
		"0xf1000000 0xf0ffffff 0x200\n",
	} {
		if _, err := xenguest.ParseResource(strings.NewReader(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestParseSBDF(t *testing.T) {
	for in, want := range map[string]string{
		"0000:00:05.0":  "0000:00:05.0",
		"00:05.0":       "0000:00:05.0",
		"0000:0A:1f.7":  "0000:0a:1f.7",
		"1:00:05.0":     "",
		"0000:00:05":    "",
		"0000:00:20.0":  "",
		"0000:00:05.8":  "",
		"10000:00:05.0": "10000:00:05.0",
	} {
		got, err := xenguest.ParseSBDF(in)
		if want == "" {
			if err == nil {
				t.Errorf("%q: accepted as %q", in, got)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("%q: %q, %v; want %q", in, got, err, want)
		}
	}
}

// Discovery finds the vGPU by its ids among other functions, and maps its
// memory BARs from the resourceN files.
func TestDiscover(t *testing.T) {
	root := t.TempDir()
	fakeFunction(t, root, "0000:00:00.0", 0x8086, 0x1237, "0x0 0x0 0x0\n")            // host bridge
	fakeFunction(t, root, "0000:00:02.0", 0x1234, 0x1111, vgpuResource)               // emulated VGA, same layout
	fakeFunction(t, root, "0000:00:03.0", nvc0.PCIVendorNVIDIA, 0x1c82, vgpuResource) // another NVIDIA board
	if err := os.MkdirAll(filepath.Join(root, "0000:00:04.0"), 0o755); err != nil {   // unreadable ids: skipped
		t.Fatal(err)
	}
	if _, err := xenguest.Discover(root); err == nil || !strings.Contains(err.Error(), "no PCI function 10de:06d8") {
		t.Errorf("without a vGPU: %v", err)
	}
	dir := fakeVGPU(t, root, "0000:00:05.0")
	d, err := xenguest.Discover(root)
	if err != nil {
		t.Fatal(err)
	}
	if d.SBDF != "0000:00:05.0" || d.Dir != dir || d.Vendor != nvc0.PCIVendorNVIDIA || d.DeviceID != nvc0.PCIDeviceQuadro6000 || d.Driver != "" {
		t.Errorf("found %+v", d)
	}
	if b, ok := d.BAR(nvc0.BAR5); !ok || !b.IO || b.Base != 0xc000 || b.Size != 128 {
		t.Errorf("BAR5 %+v %v", b, ok)
	}
	if _, ok := d.BAR(2); ok {
		t.Error("BAR2 (BAR1's upper half) listed")
	}

	bars, err := xenguest.OpenDevice(d, false)
	if err != nil {
		t.Fatal(err)
	}
	defer bars.Close()
	bars.Write32(nvc0.BAR1, 0x7fffffc, 0xa5a5a5a5)
	if got := wordAt(t, filepath.Join(dir, "resource1"), 0x7fffffc); got != 0xa5a5a5a5 {
		t.Errorf("resource1 at the end of BAR1: %#x", got)
	}
	putWord(t, filepath.Join(dir, "resource0"), nvc0.RegBoot0, nvc0.Boot0Value)
	if got := bars.Read32(nvc0.BAR0, nvc0.RegBoot0); got != nvc0.Boot0Value {
		t.Errorf("PMC_BOOT_0 through resource0: %#x", got)
	}
	if bars.Size(nvc0.BAR3) != nvc0.BAR3Size || bars.Size(nvc0.BAR5) != 0 {
		t.Errorf("sizes: BAR3 %#x, BAR5 %#x (not asked for)", bars.Size(nvc0.BAR3), bars.Size(nvc0.BAR5))
	}
	if bars.Read32(nvc0.BAR5, 0) != nvc0.ReadAllOnes || bars.Err() == nil {
		t.Error("BAR5 read without ports: want all-ones and an error")
	}

	// Two vGPUs: discovery will not choose.
	fakeVGPU(t, root, "0000:00:06.0")
	if _, err := xenguest.Discover(root); err == nil || !strings.Contains(err.Error(), "0000:00:05.0, 0000:00:06.0") {
		t.Errorf("two vGPUs: %v", err)
	}
	if d, err := xenguest.Lookup(root, "00:06.0"); err != nil || d.SBDF != "0000:00:06.0" {
		t.Errorf("explicit SBDF: %+v, %v", d, err)
	}
}

func TestLookupRefuses(t *testing.T) {
	root := t.TempDir()
	fakeFunction(t, root, "0000:00:02.0", 0x1234, 0x1111, vgpuResource)
	if _, err := xenguest.Lookup(root, "0000:00:02.0"); err == nil || !strings.Contains(err.Error(), "1234:1111, not the vGPU") {
		t.Errorf("wrong ids: %v", err)
	}
	if _, err := xenguest.Lookup(root, "0000:00:09.0"); err == nil {
		t.Error("missing function found")
	}
	if _, err := xenguest.Lookup(root, "garbage"); err == nil {
		t.Error("bad SBDF accepted")
	}
	fakeFunction(t, root, "0000:00:07.0", nvc0.PCIVendorNVIDIA, nvc0.PCIDeviceQuadro6000, "0x1 0x2\n")
	if _, err := xenguest.Lookup(root, "0000:00:07.0"); err == nil {
		t.Error("malformed resource file accepted")
	}

	// A kernel driver bound to the vGPU: discovery says so, mapping refuses.
	dir := fakeVGPU(t, root, "0000:00:05.0")
	drv := filepath.Join(root, "drivers", "nouveau")
	if err := os.MkdirAll(drv, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(drv, filepath.Join(dir, "driver")); err != nil {
		t.Fatal(err)
	}
	d, err := xenguest.Lookup(root, "0000:00:05.0")
	if err != nil {
		t.Fatal(err)
	}
	if d.Driver != "nouveau" {
		t.Errorf("driver %q", d.Driver)
	}
	if _, err := xenguest.OpenDevice(d, false); err == nil || !strings.Contains(err.Error(), "bound to the kernel driver nouveau") {
		t.Errorf("bound device: %v", err)
	}

	// A device without BAR3 cannot be the vGPU's driver's.
	d.Driver = ""
	d.BARs = d.BARs[:2]
	if _, err := xenguest.OpenDevice(d, false); err == nil || !strings.Contains(err.Error(), "no BAR3") {
		t.Errorf("device without BAR3: %v", err)
	}
}

// Enable writes 1 to the function's enable file when there is one.
func TestEnable(t *testing.T) {
	root := t.TempDir()
	dir := fakeVGPU(t, root, "0000:00:05.0")
	d, err := xenguest.Lookup(root, "0000:00:05.0")
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Enable(); err != nil {
		t.Errorf("without an enable file: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "enable"), []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := d.Enable(); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "enable")); string(b) != "1" {
		t.Errorf("enable holds %q", b)
	}
}
