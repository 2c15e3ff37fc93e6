package nouveau

import (
	"errors"
	"fmt"

	"github.com/gpuvm/gpuvm/gpu/hwseq"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/internal/rangealloc"
)

// Resetting the GPU under the driver (docs/design.md, "Resetting a vGPU").
//
// A reset — a function-level reset the driver started (FunctionReset), or
// one the host made (the operator's `gpuvm vgpu reset`) — stops every
// channel, clears VRAM and returns the registers to their power-on
// values. The driver notices a reset it did not start when PMC_ENABLE,
// which it set to PMCEnableAll at Open, reads its power-on value 0: a
// channel's fault check (every fence wait that does not pass at once
// looks, and the host raises the interrupt at the reset, so sleeping
// waits wake to look) then fails with ErrDeviceReset. The caller then calls
// Reset, which brings the GPU up again as Open did, and carries on with
// new VMs and channels: the objects from before the reset are orphaned —
// their calls fail with ErrDeviceReset and their Close frees only their
// host memory. Close the old objects (gdev contexts included) before
// Reset: VRAM addresses from before it mean nothing in the fresh VRAM
// allocator Reset starts, so free none of them afterwards.

// ErrDeviceReset is returned by operations on a GPU that was reset since
// the objects they use were made (see Reset).
var ErrDeviceReset = errors.New("GPU was reset")

// PCIConfig is the PCI configuration space of the function behind the
// driver's MMIO, if the driver can reach it (a device model's Device).
type PCIConfig interface {
	ConfigRead(off, size int) (uint32, error)
	ConfigWrite(off, size int, val uint32) error
}

// current reports whether objects of generation gen are still the
// device's.
func (d *Device) current(gen uint64) bool { return d.gen.Load() == gen }

// orphaned reports whether objects of generation gen lost what they had
// on the GPU: a reset happened since they were made, whether or not the
// driver re-initialised yet.
func (d *Device) orphaned(gen uint64) bool { return !d.current(gen) || d.resetDetected() }

// ResetDetected reports whether the GPU reads as reset since the driver
// last brought it up (Open or Reset). A caller whose results did not
// verify asks it: data read back through BAR1 after a reset it had not
// yet noticed is the fresh GPU's, not its own, and the work is to be made
// again after Reset rather than reported as wrong.
func (d *Device) ResetDetected() bool { return d.resetDetected() }

// resetDetected reports whether the GPU reads as reset: PMC_ENABLE at its
// power-on value although Open enabled the engines (all-ones: the device
// is gone, which is not a reset).
func (d *Device) resetDetected() bool {
	return d.rd(nvc0.RegPMCEnable) == 0
}

// Reset re-initialises the driver on a GPU that was reset (ErrDeviceReset),
// as Open brought it up: engines enabled, the hypercall slot registered
// again in the PV modes, BAR1, BAR3 and the poll area rebuilt in a fresh
// VRAM allocator. Channels and VMs from before are orphaned (see above).
// Reset must not run concurrently with other uses of the device.
func (d *Device) Reset() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return fmt.Errorf("reset: %w", ErrClosed)
	}
	d.gen.Add(1)
	old := d.chans
	d.chans = [nvc0.MaxChannels]*Channel{}
	d.bar1, d.bar3, d.userArea, d.playlist, d.plCur, d.pollBase = nil, nil, nil, [2]*kobj{}, 0, 0
	d.mu.Unlock()
	d.errMu.Lock()
	d.errs = [nvc0.MaxChannels]*FaultError{}
	d.errMu.Unlock()
	d.prMu.Lock()
	d.window, d.windowSet = 0, false // the window register is at its power-on value
	d.prMu.Unlock()
	d.vram = rangealloc.New(vramReserved, d.vramSize-vramReserved)
	d.wr(nvc0.RegPMCEnable, nvc0.PMCEnableAll)
	// A channel the driver set up after the reset and before it noticed
	// (a context opened between the two) is enabled on the fresh GPU,
	// though orphaned here: stop it and give its id back, or the id would
	// be refused to the next channel.
	var errs []error
	for id, ch := range old {
		if ch == nil {
			continue
		}
		errs = append(errs, hwseq.StopChannel(d.mmio, id, d.opts.Timeout))
		d.wr(nvc0.ChanCtl(id), 0)
		d.wr(nvc0.ChanInst(id), 0)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("reset: stop channels from before it: %w", err)
	}
	if old := d.pv; old != nil {
		// The host forgot the slot registration with everything else;
		// the old slot page is the driver's own RAM.
		old.mu.Lock()
		old.closed = true
		slot := old.slot
		old.mu.Unlock()
		var err error
		d.pv, err = d.openPV(old.multi)
		if err = errors.Join(err, d.host.Free(slot)); err != nil {
			return fmt.Errorf("reset: %w", err)
		}
	}
	if err := d.initBARs(); err != nil {
		return fmt.Errorf("reset: %w", err)
	}
	d.log.Info("GPU re-initialised after a reset")
	return nil
}

// FunctionReset resets the GPU by a PCIe function-level reset and
// re-initialises the driver (Reset). It needs the function's config space
// (PCIConfig) and the FLR capability in its PCI Express capability, as
// Linux's pcie_flr does; the Command register is saved and restored
// around the reset, as pci_reset_function does.
func (d *Device) FunctionReset() error {
	cfg, ok := d.mmio.(PCIConfig)
	if !ok {
		return fmt.Errorf("function-level reset: no PCI config space: %w", ErrNotSupported)
	}
	x, err := findPCIExp(cfg)
	if err != nil {
		return fmt.Errorf("function-level reset: %w", err)
	}
	devcap, err := cfg.ConfigRead(x+nvc0.PCIExpDevCap, 4)
	if err != nil {
		return fmt.Errorf("function-level reset: %w", err)
	}
	if devcap&nvc0.PCIExpDevCapFLR == 0 {
		return fmt.Errorf("function-level reset: Device Capabilities %#x: %w", devcap, ErrNotSupported)
	}
	cmd, err := cfg.ConfigRead(0x04, 2)
	if err != nil {
		return fmt.Errorf("function-level reset: %w", err)
	}
	ctl, err := cfg.ConfigRead(x+nvc0.PCIExpDevCtl, 2)
	if err != nil {
		return fmt.Errorf("function-level reset: %w", err)
	}
	if err := cfg.ConfigWrite(x+nvc0.PCIExpDevCtl, 2, ctl|nvc0.PCIExpDevCtlFLR); err != nil {
		return fmt.Errorf("function-level reset: %w", err)
	}
	if err := errors.Join(cfg.ConfigWrite(0x04, 2, cmd), cfg.ConfigWrite(x+nvc0.PCIExpDevCtl, 2, ctl&^nvc0.PCIExpDevCtlFLR)); err != nil {
		return fmt.Errorf("function-level reset: restore config: %w", err)
	}
	if boot0 := d.rd(nvc0.RegBoot0); boot0 == nvc0.ReadAllOnes {
		return fmt.Errorf("function-level reset: %w", ErrDeviceGone)
	}
	return d.Reset()
}

// findPCIExp walks the capability list for the PCI Express capability.
func findPCIExp(cfg PCIConfig) (int, error) {
	st, err := cfg.ConfigRead(0x06, 2)
	if err != nil {
		return 0, err
	}
	if st&nvc0.PCIStatusCapList == 0 {
		return 0, fmt.Errorf("no capability list: %w", ErrNotSupported)
	}
	p, err := cfg.ConfigRead(nvc0.PCICapPtr, 1)
	for n := 0; err == nil && p >= 0x40 && n < 48; n++ { // 48: the most that fit
		p &^= 3
		var id uint32
		if id, err = cfg.ConfigRead(int(p), 1); err != nil {
			break
		}
		if id == nvc0.PCICapIDExp {
			return int(p), nil
		}
		p, err = cfg.ConfigRead(int(p)+1, 1)
	}
	if err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no PCI Express capability: %w", ErrNotSupported)
}

// releaseOrphan frees what a channel from before a reset holds in host
// memory (its ring and fence pages); its VRAM, page-table entries and
// state on the GPU went with the reset. Its id is free again unless the
// driver re-initialised already (Reset freed every id).
func (c *Channel) releaseOrphan() error {
	d := c.d
	var errs []error
	if d.current(c.gen) {
		// The driver has not re-initialised yet, so the id is still this
		// channel's: the reset stopped the channel, unless the driver set
		// it up after the reset and before it noticed — then it is
		// enabled on the fresh GPU, and must be stopped before its id is
		// handed out again.
		d.mu.Lock()
		errs = append(errs, hwseq.StopChannel(d.mmio, c.id, d.opts.Timeout))
		d.wr(nvc0.ChanCtl(c.id), 0)
		d.wr(nvc0.ChanInst(c.id), 0)
		if d.chans[c.id] == c {
			d.chans[c.id] = nil
		}
		d.mu.Unlock()
		d.forgetError(c.id)
	}
	if c.fence.Bytes != nil {
		errs = append(errs, c.d.host.Free(c.fence))
	}
	if c.ring.Bytes != nil {
		errs = append(errs, c.d.host.Free(c.ring))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close channel %d from before a reset: %w", c.id, err)
	}
	return nil
}
