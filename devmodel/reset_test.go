package devmodel

import (
	"errors"
	"testing"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// TestConfigSpaceFLR: the capability list leads to a PCI Express
// capability that offers function-level reset; setting Initiate FLR runs
// the device's reset once, reads back 0, returns Command and Device
// Control to their power-on values and keeps the BARs; the reset's error
// is the write's.
func TestConfigSpaceFLR(t *testing.T) {
	c := NewConfigSpace()
	rd := func(off, size int) uint32 {
		t.Helper()
		v, err := c.Read(off, size)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if rd(pciStatus, 2)&nvc0.PCIStatusCapList == 0 {
		t.Fatalf("Status %#x has no capability list", rd(pciStatus, 2))
	}
	x := int(rd(nvc0.PCICapPtr, 1))
	if x != nvc0.PCIExpCapOffset || rd(x, 1) != nvc0.PCICapIDExp || rd(x+1, 1) != 0 {
		t.Fatalf("capability list: pointer %#x, ID %#x, next %#x", x, rd(x, 1), rd(x+1, 1))
	}
	if rd(x+nvc0.PCIExpDevCap, 4)&nvc0.PCIExpDevCapFLR == 0 {
		t.Errorf("Device Capabilities %#x without FLR", rd(x+nvc0.PCIExpDevCap, 4))
	}
	ctl := x + nvc0.PCIExpDevCtl
	if got := rd(ctl, 2); got != nvc0.PCIExpDevCtlDefault {
		t.Errorf("Device Control %#x at power-on, want %#x", got, nvc0.PCIExpDevCtlDefault)
	}
	resets := 0
	c.SetFLR(func() error { resets++; return nil })
	if err := c.Write(ctl, 2, 0x0010); err != nil || resets != 0 || rd(ctl, 2) != 0x0010 {
		t.Errorf("plain Device Control write: err %v, resets %d, reads %#x", err, resets, rd(ctl, 2))
	}
	_ = c.Write(pciCommand, 2, pciCommandMemory|pciCommandMaster)
	_ = c.Write(pciBAR0, 4, 0xF2000000)
	if err := c.Write(ctl, 2, 0x0010|nvc0.PCIExpDevCtlFLR); err != nil {
		t.Fatalf("FLR: %v", err)
	}
	if resets != 1 {
		t.Errorf("FLR ran the device's reset %d times, want 1", resets)
	}
	if got := rd(ctl, 2); got&nvc0.PCIExpDevCtlFLR != 0 || got != nvc0.PCIExpDevCtlDefault {
		t.Errorf("Device Control after FLR %#x, want %#x", got, nvc0.PCIExpDevCtlDefault)
	}
	if got := rd(pciCommand, 2); got != 0 {
		t.Errorf("Command after FLR %#x, want 0", got)
	}
	if got := rd(pciBAR0, 4); got != 0xF2000000 {
		t.Errorf("BAR0 after FLR %#x: the placement must stay", got)
	}
	// A byte write of the upper half starts one too.
	boom := errors.New("no")
	c.SetFLR(func() error { resets++; return boom })
	if err := c.Write(ctl+1, 1, nvc0.PCIExpDevCtlFLR>>8); !errors.Is(err, boom) || resets != 2 {
		t.Errorf("failing FLR: err %v, resets %d", err, resets)
	}
}
