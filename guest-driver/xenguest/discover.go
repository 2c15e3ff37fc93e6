package xenguest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// DefaultSysfsRoot is where Linux lists PCI functions, one directory (a
// symbolic link) per SBDF.
const DefaultSysfsRoot = "/sys/bus/pci/devices"

// Resource flags of the sysfs resource file (Linux include/linux/ioport.h).
const (
	ResourceIO       = 0x00000100 // IORESOURCE_IO: an I/O-port BAR
	ResourceMem      = 0x00000200 // IORESOURCE_MEM
	ResourcePrefetch = 0x00002000 // IORESOURCE_PREFETCH
	ResourceMem64    = 0x00100000 // IORESOURCE_MEM_64
	ResourceDisabled = 0x10000000 // IORESOURCE_DISABLED
	ResourceUnset    = 0x20000000 // IORESOURCE_UNSET: no address assigned
)

// Device is a PCI function found in sysfs.
type Device struct {
	SBDF     string // domain:bus:device.function, e.g. 0000:00:05.0
	Dir      string // its sysfs directory
	Vendor   uint16
	DeviceID uint16
	// Driver is the kernel driver bound to it ("" if none). The guest
	// driver must be the only driver of the vGPU.
	Driver string
	// BARs are the standard BARs (indices 0-5) the resource file lists
	// with a size, in index order.
	BARs []BAR
}

// BAR returns BAR i of the device, if it has one.
func (d *Device) BAR(i int) (BAR, bool) {
	for _, b := range d.BARs {
		if b.Index == i {
			return b, true
		}
	}
	return BAR{}, false
}

// Enable writes 1 to the function's sysfs enable file, which makes Linux
// enable it (turn on memory and I/O decoding). The guest's firmware or
// kernel normally has; a device without the file is left alone.
func (d *Device) Enable() error {
	err := os.WriteFile(filepath.Join(d.Dir, "enable"), []byte("1"), 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("enable %s: %w", d.SBDF, err)
	}
	return nil
}

func (d *Device) String() string {
	return fmt.Sprintf("%s [%04x:%04x]", d.SBDF, d.Vendor, d.DeviceID)
}

func resourcePath(dir string, bar int) string {
	return filepath.Join(dir, "resource"+strconv.Itoa(bar))
}

var sbdfRE = regexp.MustCompile(`^(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-1][0-9a-fA-F])\.([0-7])$`)

// ParseSBDF checks a PCI address, domain:bus:device.function or
// bus:device.function (domain 0), and returns it as sysfs names it
// (lower case, four-digit domain).
func ParseSBDF(s string) (string, error) {
	m := sbdfRE.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return "", fmt.Errorf("PCI address %q: want domain:bus:device.function, e.g. 0000:00:05.0", s)
	}
	dom := m[1]
	if dom == "" {
		dom = "0000"
	}
	return strings.ToLower(fmt.Sprintf("%04s:%s:%s.%s", dom, m[2], m[3], m[4])), nil
}

// ParseResource reads a sysfs resource file: one line per resource,
// "start end flags" in hex, the first six lines the standard BARs (later
// lines are the expansion ROM and, for bridges, windows). It returns the
// BARs with a size (an unused BAR reads 0 0 0; the upper half of a 64-bit
// BAR too).
func ParseResource(r io.Reader) ([]BAR, error) {
	var bars []BAR
	sc := bufio.NewScanner(r)
	for line := 0; sc.Scan(); line++ {
		f := strings.Fields(sc.Text())
		if len(f) == 0 && line >= NumBARs {
			continue
		}
		if len(f) != 3 {
			return nil, fmt.Errorf("resource line %d %q: want start end flags", line+1, sc.Text())
		}
		var v [3]uint64
		for i, s := range f {
			n, err := strconv.ParseUint(strings.TrimPrefix(strings.TrimPrefix(s, "0x"), "0X"), 16, 64)
			if err != nil {
				return nil, fmt.Errorf("resource line %d: %q is not a hex number", line+1, s)
			}
			v[i] = n
		}
		if line >= NumBARs {
			continue // ROM, bridge windows: not BARs
		}
		start, end, flags := v[0], v[1], v[2]
		if flags == 0 || start == 0 && end == 0 {
			continue
		}
		if end < start || end-start == ^uint64(0) {
			return nil, fmt.Errorf("resource line %d: end %#x before start %#x", line+1, end, start)
		}
		bars = append(bars, BAR{Index: line, Base: start, Size: end - start + 1, IO: flags&ResourceIO != 0, Flags: flags})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("resource file: %w", err)
	}
	return bars, nil
}

// IsVGPU reports whether a PCI vendor and device id are the vGPU's (the
// board gpu/nvc0 models, which the device model's config space presents).
func IsVGPU(vendor, device uint16) bool {
	return vendor == nvc0.PCIVendorNVIDIA && device == nvc0.PCIDeviceQuadro6000
}

// Discover finds the vGPU among the PCI functions under root (a sysfs
// tree, DefaultSysfsRoot) by its vendor and device id. Exactly one must be
// there; functions whose ids cannot be read are skipped.
func Discover(root string) (*Device, error) {
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("find the vGPU: %w", err)
	}
	var found []string
	for _, e := range ents {
		dir := filepath.Join(root, e.Name())
		v, d, err := readIDs(dir)
		if err != nil || !IsVGPU(v, d) {
			continue
		}
		found = append(found, e.Name())
	}
	sort.Strings(found)
	switch len(found) {
	case 0:
		return nil, fmt.Errorf("find the vGPU: no PCI function %04x:%04x under %s (is the vGPU attached to this guest? A PVH guest has no PCI enumeration: give the BAR addresses instead)",
			nvc0.PCIVendorNVIDIA, nvc0.PCIDeviceQuadro6000, root)
	case 1:
		return Lookup(root, found[0])
	}
	return nil, fmt.Errorf("find the vGPU: %d functions %04x:%04x under %s (%s): name one",
		len(found), nvc0.PCIVendorNVIDIA, nvc0.PCIDeviceQuadro6000, root, strings.Join(found, ", "))
}

// Lookup reads the PCI function sbdf under root, which must be the vGPU.
func Lookup(root, sbdf string) (*Device, error) {
	name, err := ParseSBDF(sbdf)
	if err != nil {
		return nil, err
	}
	d := &Device{SBDF: name, Dir: filepath.Join(root, name)}
	if d.Vendor, d.DeviceID, err = readIDs(d.Dir); err != nil {
		return nil, fmt.Errorf("PCI function %s: %w", name, err)
	}
	if !IsVGPU(d.Vendor, d.DeviceID) {
		return nil, fmt.Errorf("PCI function %s is %04x:%04x, not the vGPU (%04x:%04x)", name, d.Vendor, d.DeviceID,
			nvc0.PCIVendorNVIDIA, nvc0.PCIDeviceQuadro6000)
	}
	f, err := os.Open(filepath.Join(d.Dir, "resource"))
	if err != nil {
		return nil, fmt.Errorf("PCI function %s: %w", name, err)
	}
	defer f.Close()
	if d.BARs, err = ParseResource(f); err != nil {
		return nil, fmt.Errorf("PCI function %s: %w", name, err)
	}
	if link, err := os.Readlink(filepath.Join(d.Dir, "driver")); err == nil {
		d.Driver = filepath.Base(link)
	}
	return d, nil
}

// readIDs reads a function's vendor and device files ("0x10de").
func readIDs(dir string) (vendor, device uint16, err error) {
	read := func(name string) (uint16, error) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return 0, err
		}
		s := strings.TrimSpace(string(b))
		n, err := strconv.ParseUint(strings.TrimPrefix(s, "0x"), 16, 16)
		if err != nil {
			return 0, fmt.Errorf("%s %q: not a 16-bit hex id", name, s)
		}
		return uint16(n), nil
	}
	if vendor, err = read("vendor"); err != nil {
		return 0, 0, err
	}
	if device, err = read("device"); err != nil {
		return 0, 0, err
	}
	return vendor, device, nil
}
