package devmodel

import (
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// PCI configuration-space offsets and bits of a type 0 header (PCI Local Bus
// Specification 3.0, §6.1-6.2). They are the PCI standard's, not the GPU's;
// the GPU's identity and BARs are in gpu/nvc0.
const (
	pciVendorID     = 0x00
	pciDeviceID     = 0x02
	pciCommand      = 0x04
	pciStatus       = 0x06
	pciRevision     = 0x08
	pciClassCode    = 0x09 // 3 bytes: prog-if, subclass, class
	pciHeaderType   = 0x0E
	pciBAR0         = 0x10
	pciSubVendorID  = 0x2C
	pciSubsystemID  = 0x2E
	pciInterruptPin = 0x3D
	pciConfigSize   = 256

	pciCommandIO     = 0x1
	pciCommandMemory = 0x2
	pciCommandMaster = 0x4

	barMem64        = 0x4 // memory BAR, 64-bit
	barPrefetchable = 0x8
	barIO           = 0x1
)

// barDef is one BAR of the virtual device as its config space presents it.
type barDef struct {
	index int
	size  uint64
	flags uint32 // low bits of the BAR register
}

// bars returns the device's BARs: BAR0 registers, BAR1 and BAR3 as 64-bit
// prefetchable VRAM apertures, BAR5 the small I/O BAR.
func bars() []barDef {
	return []barDef{
		{nvc0.BAR0, nvc0.BAR0Size, 0},
		{nvc0.BAR1, nvc0.BAR1Size, barMem64 | barPrefetchable},
		{nvc0.BAR3, nvc0.BAR3Size, barMem64 | barPrefetchable},
		{nvc0.BAR5, nvc0.BAR5Size, barIO},
	}
}

// ConfigSpace is the virtual GPU's PCI configuration space: identity, class,
// command register, and BARs with the standard sizing protocol (write all
// ones, read back the size mask). The guest's firmware places the BARs; the
// device model routes accesses by BAR index, so placement is informational.
// Safe for concurrent use.
type ConfigSpace struct {
	mu   sync.Mutex
	regs [pciConfigSize]byte
	bars []barDef
	// flr runs a function-level reset of the device behind the config
	// space (SetFLR); nil: the write of Initiate FLR resets only the
	// config space's own state.
	flr func() error
}

// SetFLR sets what a guest's function-level reset does to the device: f
// runs when the guest sets Initiate Function Level Reset in Device
// Control, and the config write completes when f returned (a device
// model's f resets the vGPU through the aggregator, ipc.OpReset). Its
// error is the write's.
func (c *ConfigSpace) SetFLR(f func() error) {
	c.mu.Lock()
	c.flr = f
	c.mu.Unlock()
}

// NewConfigSpace returns the config space of a Quadro 6000.
func NewConfigSpace() *ConfigSpace { return newConfigSpace(bars()) }

// NewConfigSpaceApertures returns the config space of a Quadro 6000 whose
// BAR1 and BAR3 apertures are bar1 and bar3 bytes: a vGPU's slices, so that
// a guest sizing its BARs learns what it may use. Each must be a power of
// two from 4 KiB up to the board's BAR.
func NewConfigSpaceApertures(bar1, bar3 uint64) (*ConfigSpace, error) {
	defs := bars()
	for i, d := range defs {
		want := map[int]uint64{nvc0.BAR1: bar1, nvc0.BAR3: bar3}[d.index]
		if want == 0 {
			continue
		}
		if want < nvc0.PageSize || want > d.size || want&(want-1) != 0 {
			return nil, fmt.Errorf("BAR%d aperture of %d bytes: want a power of two in %d..%d", d.index, want, nvc0.PageSize, d.size)
		}
		defs[i].size = want
	}
	return newConfigSpace(defs), nil
}

func newConfigSpace(defs []barDef) *ConfigSpace {
	c := &ConfigSpace{bars: defs}
	le := binary.LittleEndian
	le.PutUint16(c.regs[pciVendorID:], nvc0.PCIVendorNVIDIA)
	le.PutUint16(c.regs[pciDeviceID:], nvc0.PCIDeviceQuadro6000)
	c.regs[pciRevision] = nvc0.PCIRevision
	class := uint32(nvc0.PCIClassDisplayVGA)
	c.regs[pciClassCode], c.regs[pciClassCode+1], c.regs[pciClassCode+2] = byte(class), byte(class>>8), byte(class>>16)
	le.PutUint16(c.regs[pciSubVendorID:], nvc0.PCIVendorNVIDIA)
	le.PutUint16(c.regs[pciSubsystemID:], nvc0.PCIDeviceQuadro6000)
	c.regs[pciInterruptPin] = 1
	for _, b := range c.bars {
		le.PutUint32(c.regs[pciBAR0+4*b.index:], b.flags)
	}
	// The PCI Express capability, the only one in the list: an endpoint
	// that can be reset alone (function-level reset).
	le.PutUint16(c.regs[pciStatus:], nvc0.PCIStatusCapList)
	c.regs[nvc0.PCICapPtr] = nvc0.PCIExpCapOffset
	x := nvc0.PCIExpCapOffset
	c.regs[x], c.regs[x+1] = nvc0.PCICapIDExp, 0 // the last capability
	le.PutUint16(c.regs[x+nvc0.PCIExpFlags:], nvc0.PCIExpFlagsVersion2|nvc0.PCIExpFlagsTypeEndpoint)
	le.PutUint32(c.regs[x+nvc0.PCIExpDevCap:], nvc0.PCIExpDevCapFLR)
	le.PutUint16(c.regs[x+nvc0.PCIExpDevCtl:], nvc0.PCIExpDevCtlDefault)
	le.PutUint32(c.regs[x+nvc0.PCIExpLnkCap:], nvc0.PCIExpLinkGen1x16)
	le.PutUint16(c.regs[x+nvc0.PCIExpLnkSta:], nvc0.PCIExpLinkGen1x16)
	return c
}

// devCtl is the offset of Device Control in the config space.
const devCtl = nvc0.PCIExpCapOffset + nvc0.PCIExpDevCtl

// Read returns size (1, 2 or 4) bytes at off.
func (c *ConfigSpace) Read(off, size int) (uint32, error) {
	if err := checkConfig(off, size); err != nil {
		return 0, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var v uint32
	for i := size - 1; i >= 0; i-- {
		v = v<<8 | uint32(c.regs[off+i])
	}
	return v, nil
}

// Write stores size bytes at off where the register is writable: the command
// register's enable bits, the BAR address bits and Device Control.
// Everything else is read-only. Setting Initiate Function Level Reset in
// Device Control resets the function: the device (SetFLR) and the config
// space's own resettable state — Command and Device Control return to
// their power-on values (a driver restores what it saved, as Linux's
// pci_restore_state does); the BAR placement stays. The write completes
// once the reset has, and returns its error.
func (c *ConfigSpace) Write(off, size int, val uint32) error {
	if err := checkConfig(off, size); err != nil {
		return err
	}
	c.mu.Lock()
	flr := false
	for i := 0; i < size; i++ {
		flr = c.writeByte(off+i, byte(val>>(8*i))) || flr
	}
	f := c.flr
	c.mu.Unlock()
	if !flr {
		return nil
	}
	// Outside the lock: the reset takes as long as stopping the vGPU's
	// channels and scrubbing its VRAM, and config reads meanwhile are
	// harmless.
	var err error
	if f != nil {
		err = f()
	}
	c.mu.Lock()
	le := binary.LittleEndian
	le.PutUint16(c.regs[pciCommand:], 0)
	le.PutUint16(c.regs[devCtl:], nvc0.PCIExpDevCtlDefault)
	c.mu.Unlock()
	if err != nil {
		return fmt.Errorf("function-level reset: %w", err)
	}
	return nil
}

// writeByte stores one byte; it reports whether the byte started a
// function-level reset.
func (c *ConfigSpace) writeByte(off int, b byte) (flr bool) {
	switch {
	case off == pciCommand:
		c.regs[off] = b & (pciCommandIO | pciCommandMemory | pciCommandMaster)
	case off >= pciBAR0 && off < pciBAR0+6*4:
		c.writeBARByte(off, b)
	case off == devCtl:
		c.regs[off] = b
	case off == devCtl+1:
		// Bit 15 (Initiate FLR) always reads 0.
		c.regs[off] = b &^ byte(nvc0.PCIExpDevCtlFLR>>8)
		return b&byte(nvc0.PCIExpDevCtlFLR>>8) != 0
	}
	return false
}

// writeBARByte keeps the BAR's type bits and clears the address bits below
// its size, so that writing all ones reads back the size mask.
func (c *ConfigSpace) writeBARByte(off int, b byte) {
	idx, byteInBAR := (off-pciBAR0)/4, (off-pciBAR0)%4
	for _, d := range c.bars {
		var mask uint64
		switch {
		case d.index == idx:
			low := uint32(0xF)
			if d.flags&barIO != 0 {
				low = 0x3
			}
			mask = ^(d.size - 1) &^ uint64(low)
			if d.flags&barMem64 == 0 {
				mask &= 0xFFFFFFFF
			}
		case d.flags&barMem64 != 0 && d.index+1 == idx:
			mask = ^(d.size - 1) >> 32 // upper half of a 64-bit BAR
		default:
			continue
		}
		m := byte(mask >> (8 * byteInBAR))
		c.regs[off] = c.regs[off]&^m | b&m
		return
	}
}

func checkConfig(off, size int) error {
	if (size != 1 && size != 2 && size != 4) || off < 0 || off+size > pciConfigSize || off%size != 0 {
		return fmt.Errorf("PCI config access of %d bytes at %#x: invalid", size, off)
	}
	return nil
}

// BARPlacement is where the guest's firmware placed one of the device's
// BARs, and whether the command register lets the device decode it.
type BARPlacement struct {
	Index   int    // nvc0.BAR0, BAR1, BAR3 or BAR5
	Base    uint64 // guest-physical address (memory) or I/O port
	Size    uint64
	IO      bool // an I/O BAR (ports), else memory
	Enabled bool // placed (non-zero) and decoded (command register)
}

// Placements returns every BAR's placement as the config space holds it
// now: what a device model must claim from the hypervisor.
func (c *ConfigSpace) Placements() []BARPlacement {
	c.mu.Lock()
	defer c.mu.Unlock()
	le := binary.LittleEndian
	cmd := c.regs[pciCommand]
	var out []BARPlacement
	for _, d := range c.bars {
		p := BARPlacement{Index: d.index, Size: d.size, IO: d.flags&barIO != 0}
		lo := uint64(le.Uint32(c.regs[pciBAR0+4*d.index:]))
		if p.IO {
			p.Base = lo &^ 0x3
			p.Enabled = cmd&pciCommandIO != 0
		} else {
			p.Base = lo &^ 0xF
			if d.flags&barMem64 != 0 {
				p.Base |= uint64(le.Uint32(c.regs[pciBAR0+4*(d.index+1):])) << 32
			}
			p.Enabled = cmd&pciCommandMemory != 0
		}
		// A BAR still at 0, or mid-sizing (all address bits set), is not placed.
		p.Enabled = p.Enabled && p.Base != 0 && p.Base != ^(d.size-1)&^uint64(0xF) && p.Base+p.Size > p.Base
		out = append(out, p)
	}
	return out
}
