package aggregator

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/shadow"
)

// Resetting one vGPU without restarting its guest (docs/design.md,
// "Resetting a vGPU"). A reset is a teardown that keeps the slot, the
// device model's connection, the guest RAM mapping and the remap table:
// every physical channel of the slot is stopped by the one stop path
// (whatever the aggregator believes about it), its queued and in-flight
// submissions voided and its scheduling points dropped, its error-report
// routes removed after a last collection, its poll pages and BAR slices
// unmapped, every remap entry set back to trap, its shadows (channel and
// PV page tables included) freed after the TLB flushes that make that
// safe, and the whole slot's VRAM scrubbed in place — then the guest-visible
// state starts again at its power-on values. Everything runs under v.mu,
// which every guest access, doorbell, poll and watchdog stop of the vGPU
// takes: a trapped access racing the reset runs wholly before or wholly
// after it. A remapped (passed-through) access does not trap; one already
// under way may land after the scrub, in the VM's own slice, as a write
// the guest made during the reset — nothing of the old state.
//
// If a channel would not stop, the vGPU is handled as a failed teardown:
// destroyed, its slot out of service. It is never left half-reset.

// ErrResetUnsupported is returned for a vGPU that cannot be reset in
// place: a pvdrm vGPU, whose guest-side state is the back end's driver
// running in the aggregator.
var ErrResetUnsupported = errors.New("reset not supported for this vGPU")

// ErrResetDestroyed is returned when a reset could not stop a channel (or
// could not restore the slot) and destroyed the vGPU instead.
var ErrResetDestroyed = errors.New("vGPU destroyed: its reset could not complete")

// Reset resets v as a PCIe function-level reset would: its channels stop,
// its slot's VRAM is scrubbed, its registers return to their power-on
// values; its slot, id and connection stay, so its guest driver
// re-initialises and carries on. reason is logged. Reset of a vGPU that is
// being or was torn down returns ErrDetached; a concurrent Reset waits for
// this one and then resets again.
func (a *Aggregator) Reset(v *VGPU, reason string) error {
	if v.feat.PVDRM {
		return fmt.Errorf("reset vGPU %d: mode %s: %w", v.ID, v.Guest.Mode, ErrResetUnsupported)
	}
	if err := v.recoverLost(); err != nil { // a lost device comes back (lost.go)
		return fmt.Errorf("reset vGPU %d: %w", v.ID, err)
	}
	if err := v.lockResident(); err != nil { // a parked vGPU is reset in a slot
		return fmt.Errorf("reset vGPU %d: %w", v.ID, err)
	}
	if v.dead {
		v.mu.Unlock()
		return fmt.Errorf("reset vGPU %d: %w", v.ID, ErrDetached)
	}
	failed, err := v.reset()
	if failed == "" {
		v.ctr.resets.Add(1)
		v.mu.Unlock()
		// Wake the guest's fence sleeps: what they waited for will not
		// complete, and a look at the registers shows the reset.
		v.raiseIRQ()
		v.log.Info("vGPU reset", "reason", reason)
		return nil
	}
	// Nothing more reaches the vGPU; the teardown finishes it.
	v.dead = true
	v.mu.Unlock()
	why := fmt.Sprintf("reset of vGPU %d (%s) failed: %s", v.ID, reason, failed)
	v.log.Error("vGPU reset failed: destroying it", "reason", reason, "failed", failed, "err", err)
	return errors.Join(fmt.Errorf("reset vGPU %d: %w: %s: %w", v.ID, ErrResetDestroyed, failed, err), a.Destroy(v, why))
}

// reset does the work of Reset with v.mu held. It returns "" on success,
// else what failed (the vGPU must then be destroyed) and the error.
func (v *VGPU) reset() (failed string, err error) {
	a := v.agg
	full := a.layout.Slots[v.Slot.Index] // all of the slot, whatever the quota
	chans := make([]int, full.Chans)
	for i := range chans {
		chans[i] = full.ChanBase + i
	}
	wedged, serr := a.phys.stop(chans...)
	for i := range v.chans {
		v.chans[i].running, v.chans[i].inList = false, false
		a.disp.channelStopped(v, i) // queued and in-flight submissions end; points dropped
	}
	if len(wedged) > 0 {
		return fmt.Sprintf("%d channel(s) did not stop", len(wedged)), serr
	}
	var errs []error
	if serr != nil {
		errs = append(errs, fmt.Errorf("stop channels: %w", serr))
	}
	// Deliver what the stopped channels reported, then drop their routes:
	// nothing of the old state reaches the guest after the reset. The
	// shadows go (channel spaces, PV tables and handles, BAR spaces),
	// freed after the TLB flushes that make that safe (reclaim). The
	// manager stays (VGPUs and the counters read it); it starts afresh.
	errs = append(errs, v.dropPhysicalState(a, chans)...)
	errs = append(errs, v.shadows.Reset())
	v.reclaim()
	if err := errors.Join(errs...); err != nil {
		return "stopping the vGPU's use of the board", err
	}
	if err := a.gpu.ScrubVRAM(full.VRAM.Base, full.VRAM.Size); err != nil {
		return "scrubbing the slot's VRAM", err
	}
	v.powerOn()
	return "", nil
}

// powerOn gives v the state of a freshly attached vGPU: new BAR spaces in
// the emptied shadow manager, the PV hypercall registers unregistered,
// every emulated register and guest channel at its power-on value, no
// error report. Called with v.mu held, after the shadows were reset.
func (v *VGPU) powerOn() {
	a := v.agg
	// As attach builds them (vgpu.go).
	v.bars[0] = newBARShadow(v, nvc0.BAR1, &a.phys.bar1, v.Slot.BAR1)
	v.bars[1] = newBARShadow(v, nvc0.BAR3, &a.phys.bar3, v.Slot.BAR3)
	v.clearGuestState()
	if v.feat.PV {
		v.enablePV()
	}
}

// clearGuestState gives v the guest-visible state of a vGPU just
// attached — every emulated register and guest channel at its power-on
// value, no error report, the hypercall registers unregistered — and
// forgets what its shadows had synced: a reset's powerOn, and a lost
// device, whose restore then builds only that (lost.go). Called with v.mu
// held.
func (v *VGPU) clearGuestState() {
	v.hc, v.hcOps = nil, nil
	v.synced = map[*shadow.Space]bool{}
	v.stale = map[*shadow.Space]bool{}
	v.remapAt, v.remapStale = 0, true
	v.emu = map[uint32]uint32{}
	v.window, v.windowOK = 0, true
	v.pollBase, v.pollOn = 0, false
	v.chans = make([]vchan, len(v.chans))
	v.verr.Clear()
}

// add accumulates a dropped BAR space's counters.
func (c *shadowCarry) add(s shadow.Counters) {
	c.FullScans += s.FullScans
	c.IncrementalScans += s.IncrementalScans
	c.PTEsScanned += s.PTEsScanned
	c.ShadowTime += s.ShadowTime
}

// shadowCarry is what the BAR spaces resets dropped had counted, so the
// vGPU's counters stay monotonic across resets (the shadow manager keeps
// its own).
type shadowCarry shadow.Counters

// Resets returns how many times v was reset.
func (v *VGPU) Resets() uint64 { return v.ctr.resets.Load() }

// serveReset answers POST /v1/vgpus/{id}/reset: 200 with the vGPU's id
// once it is reset, 404 for no such vGPU, 501 for one that cannot be reset
// in place, 500 when the reset failed (and destroyed the vGPU).
func (a *Aggregator) serveReset(w http.ResponseWriter, id string) {
	v := a.lookup(id)
	if v == nil {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such vGPU"})
		return
	}
	err := a.Reset(v, fmt.Sprintf("vGPU %d reset through the control API", v.ID))
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, map[string]string{"reset": strconv.Itoa(v.ID)})
	case errors.Is(err, ErrResetUnsupported):
		writeJSON(w, http.StatusNotImplemented, map[string]string{"error": err.Error()})
	case errors.Is(err, ErrDetached):
		writeJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
	default:
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
	}
}
