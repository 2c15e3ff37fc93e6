package aggregator

import (
	"errors"
	"fmt"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/hypercall"
	"github.com/gpuvm/gpuvm/internal/probe"
)

// ErrDetached is returned for accesses to a vGPU that was torn down.
var ErrDetached = errors.New("vGPU detached")

// checkAccess rejects what no device model may send: an unknown BAR, an
// offset outside it, an unaligned offset. The transport validates too; this
// is the aggregator's own line.
func checkAccess(bar int, off uint64) error {
	size := nvc0.BARSize(bar)
	if size == 0 || off >= size || off%4 != 0 {
		return fmt.Errorf("access to BAR%d offset %#x: outside the device", bar, off)
	}
	return nil
}

// Read32 handles a trapped guest read forwarded by the VM's device model. An
// error means the device model misbehaved or the vGPU is gone: the caller
// drops the connection.
func (v *VGPU) Read32(bar int, off uint64) (uint32, error) {
	probe.TrapBegin(v.ID, bar, false) // gpuvm trace: a trapped access's latency
	defer probe.TrapEnd(v.ID)
	if err := checkAccess(bar, off); err != nil {
		return 0, err
	}
	if err := v.lockResident(); err != nil {
		if errors.Is(err, ErrDeviceLost) {
			return 0xFFFFFFFF, nil // an absent device's read (lost.go)
		}
		return 0, err
	}
	defer v.mu.Unlock()
	if v.dead {
		return 0, ErrDetached
	}
	v.ctr.reads[bar].Add(1)
	switch bar {
	case nvc0.BAR0:
		return v.bar0Read(uint32(off)), nil
	case nvc0.BAR1, nvc0.BAR3:
		return v.apertureRead(bar, off), nil
	}
	return v.hypercallRead(off), nil // BAR5: the hypercall window (PV) or the I/O stub
}

// Write32 handles a trapped guest write.
func (v *VGPU) Write32(bar int, off uint64, val uint32) error {
	probe.TrapBegin(v.ID, bar, true)
	defer probe.TrapEnd(v.ID)
	if err := checkAccess(bar, off); err != nil {
		return err
	}
	if err := v.lockResident(); err != nil {
		if errors.Is(err, ErrDeviceLost) {
			return nil // dropped, as by an absent device (lost.go)
		}
		return err
	}
	if v.dead {
		v.mu.Unlock()
		return ErrDetached
	}
	v.ctr.writes[bar].Add(1)
	denied := v.ctr.denied.Load()
	switch bar {
	case nvc0.BAR0:
		v.bar0Write(uint32(off), val)
	case nvc0.BAR1, nvc0.BAR3:
		v.apertureWrite(bar, off, val)
	case hypercall.BAR:
		v.hypercallWrite(off, val)
	}
	// What the write made the shadows retire (a closed channel, a space
	// whose last channel left, tables a scan unlinked) is freed now, after
	// the TLB flushes that make that safe.
	v.reclaim()
	refused := v.ctr.denied.Load() != denied
	a := v.agg
	v.mu.Unlock()
	if refused {
		// A write refused because the board failed under it (it fell off
		// the bus since the last health check) must leave the vGPU lost
		// before the guest's next access, which then reads all ones as an
		// absent device's does — not a refusal its driver takes for its
		// quota. One identity read, on refused writes only.
		a.confirmBoard()
	}
	return nil
}

// detached reports whether the vGPU was torn down.
func (v *VGPU) detached() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.dead
}
