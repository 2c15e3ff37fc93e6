package devmodel

import (
	"testing"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

func TestConfigSpaceIdentity(t *testing.T) {
	c := NewConfigSpace()
	for _, tc := range []struct {
		off, size int
		want      uint32
	}{
		{0x00, 2, nvc0.PCIVendorNVIDIA},
		{0x02, 2, nvc0.PCIDeviceQuadro6000},
		{0x00, 4, nvc0.PCIDeviceQuadro6000<<16 | nvc0.PCIVendorNVIDIA},
		{0x08, 4, nvc0.PCIClassDisplayVGA<<8 | 0xA3},
		{0x0E, 1, 0},
		{0x14, 4, barMem64 | barPrefetchable},
		{0x24, 4, barIO},
	} {
		if got, err := c.Read(tc.off, tc.size); err != nil || got != tc.want {
			t.Errorf("Read(%#x, %d) = %#x, %v; want %#x", tc.off, tc.size, got, err, tc.want)
		}
	}
}

// BAR sizing: writing all ones reads back the size mask with the type bits.
func TestConfigSpaceBARSizing(t *testing.T) {
	c := NewConfigSpace()
	sizeOf := func(lo, hi int) uint64 {
		_ = c.Write(lo, 4, 0xFFFFFFFF)
		l, _ := c.Read(lo, 4)
		v := uint64(l &^ 0xF)
		if hi >= 0 {
			_ = c.Write(hi, 4, 0xFFFFFFFF)
			h, _ := c.Read(hi, 4)
			v |= uint64(h) << 32
		} else {
			v |= 0xFFFFFFFF << 32
		}
		return ^v + 1
	}
	if got := sizeOf(0x10, -1); got != nvc0.BAR0Size {
		t.Errorf("BAR0 size %#x", got)
	}
	if got := sizeOf(0x14, 0x18); got != nvc0.BAR1Size {
		t.Errorf("BAR1 size %#x", got)
	}
	if got := sizeOf(0x1C, 0x20); got != nvc0.BAR3Size {
		t.Errorf("BAR3 size %#x", got)
	}
	_ = c.Write(0x10, 4, 0xF2000000)
	if got, _ := c.Read(0x10, 4); got != 0xF2000000 {
		t.Errorf("BAR0 placed at %#x", got)
	}
	_ = c.Write(0x00, 4, 0x12345678)
	if got, _ := c.Read(0x00, 4); got != nvc0.PCIDeviceQuadro6000<<16|nvc0.PCIVendorNVIDIA {
		t.Errorf("identity writable: %#x", got)
	}
	_ = c.Write(0x04, 2, 0xFFFF)
	if got, _ := c.Read(0x04, 2); got != pciCommandIO|pciCommandMemory|pciCommandMaster {
		t.Errorf("command = %#x", got)
	}
	for _, bad := range [][2]int{{0x01, 4}, {0xFE, 4}, {0x100, 1}, {-4, 4}, {0, 3}} {
		if _, err := c.Read(bad[0], bad[1]); err == nil {
			t.Errorf("Read(%#x, %d) accepted", bad[0], bad[1])
		}
	}
}
