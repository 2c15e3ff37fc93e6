package aggregator

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/ipc"
)

// Taking a device model's BAR-remap mappings away, and handing it the
// slice of the slot its vGPU has now (docs/protocol.md §6.7; docs/design.md,
// "BAR remap after a move"). A move, and an eviction, change the VRAM slice
// behind a vGPU. Clearing the remap table is not enough before the old
// slice is copied: an access the device model began under an entry just
// cleared still stores into the old page. So revokeRemap clears every
// entry, asks the device model to unmap, and returns once it acknowledged
// that no access of it can reach the old slice any more; rebindRemap sends
// it the current slot's slice and the table, and passes pages through
// again once it acknowledged the new mapping. Until then, and for good if
// the device model does not answer in time, every aperture access traps:
// slower, never a wrong page.

// remapLink is the device model's end of the remap updates
// (*ipc.ServerConn).
type remapLink interface {
	RemapOffered() bool
	UpdateRemap(ctx context.Context, files []*os.File) (uint32, error)
}

// remapAckTimeout bounds each wait for the device model's acknowledgement.
// Answering takes it an unmap and a map (microseconds) once its socket
// reader runs; a second is far beyond that on a loaded host, and short
// enough for a move's caller (8 s through the control API).
const remapAckTimeout = time.Second

// remapLegacyDrain is how long a revoke lets a remapped access already
// under way land when the device model cannot be asked (it does not
// handle remap updates: the socket transport, an older device model):
// orders of magnitude above one store, and a guess, which is why the
// acknowledged update exists.
const remapLegacyDrain = 2 * time.Millisecond

// errRemapOff reports that remap is off for good for a vGPU: its device
// model cannot be asked, did not answer, or could not map.
var errRemapOff = errors.New("BAR remap off: every aperture access traps")

// linkRemap records the connection that can update v's device model's
// remap mappings; the Welcome has just handed it the table and its slice.
func (v *VGPU) linkRemap(l remapLink) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if r := v.remap; r != nil {
		r.link, r.mapped = l, true
	}
}

// revokeRemap stops v's device model reaching its VRAM slice: every remap
// entry is set to trap, and the device model is asked to unmap its table
// and slice (docs/protocol.md §6.7). It returns nil once it acknowledged —
// from then on no access of it can reach the slice, so the slice can be
// copied or taken away — or at once if it holds no mapping (no remap, or
// already revoked). It returns an error wrapping errRemapOff if the device
// model could not be asked or did not answer within remapAckTimeout (or
// ctx): remap is then off for the rest of the connection, and the device
// model may still hold its old mapping, so the caller must not hand the
// old slice's memory to anyone before the slot is renewed
// (SegmentRenewer), which orphans that mapping; a store of the device
// model there may be lost to its own VM, never seen by another.
//
// Every call must be matched by one rebindRemap, also when it fails:
// revokes nest, and pages are passed through again only when the last is
// matched. Call it without v.mu: the wait lets the VM's trapped accesses
// run (the acknowledgement may arrive behind them).
func (v *VGPU) revokeRemap(ctx context.Context) error {
	v.mu.Lock()
	r := v.remap
	if r == nil {
		v.mu.Unlock()
		return nil
	}
	v.mu.Unlock()
	r.op.Lock()
	defer r.op.Unlock()
	v.mu.Lock()
	if v.remap != r { // torn down meanwhile: the table is unmapped
		v.mu.Unlock()
		return nil
	}
	r.held++
	v.remapOff = true
	v.trapAllRemapped(r)
	mapped, link, broken := r.mapped, r.link, r.broken
	v.mu.Unlock()
	if !mapped {
		return nil
	}
	if broken != "" {
		return fmt.Errorf("vGPU %d: revoke remap: %w (%s)", v.ID, errRemapOff, broken)
	}
	if link == nil || !link.RemapOffered() {
		// The device model cannot be asked: let an access under way
		// land, and trap from now on.
		time.Sleep(remapLegacyDrain)
		return v.remapGiveUp(r, "its device model does not handle remap updates", nil)
	}
	wctx, cancel := context.WithTimeout(ctx, remapAckTimeout)
	defer cancel()
	if _, err := link.UpdateRemap(wctx, nil); err != nil {
		return v.remapGiveUp(r, "its device model did not acknowledge the revoke", err)
	}
	// Acknowledged (either status: the old mappings are gone).
	v.mu.Lock()
	r.mapped = false
	v.revokeAllAcked(r)
	v.mu.Unlock()
	return nil
}

// rebindRemap matches a revokeRemap. When it matches the last one it
// hands v's device model the remap table and the VRAM slice of the slot v
// has now, and once the device model acknowledged that it maps them,
// passes the pages the page tracker allows through again. It returns nil
// when pages are passed through again, or nothing was to be done (another
// revoke is outstanding, v has no remap, is gone or holds no slot); an
// error wrapping errRemapOff when the device model could not be asked,
// did not answer within remapAckTimeout or could not map — v then traps
// every aperture access for the rest of the connection; or another error
// (the slice file), in which case v traps every aperture access until the
// next revoke and rebind. Call it without v.mu.
func (v *VGPU) rebindRemap() error {
	v.mu.Lock()
	r := v.remap
	v.mu.Unlock()
	if r == nil {
		return nil
	}
	r.op.Lock()
	defer r.op.Unlock()
	v.mu.Lock()
	if r.held > 0 {
		r.held--
	}
	if r.held > 0 || v.dead || v.remap != r || v.shadows == nil {
		v.mu.Unlock()
		return nil
	}
	if r.broken != "" {
		why := r.broken
		v.mu.Unlock()
		return fmt.Errorf("vGPU %d: rebind remap: %w (%s)", v.ID, errRemapOff, why)
	}
	a, slot, link := v.agg, v.Slot.Index, r.link
	// A descriptor of our own: teardown closes r.file (after taking
	// v.remap away under v.mu), and a number closed and reused meanwhile
	// would send the device model some other file.
	table, err := dupFile(r.file)
	v.mu.Unlock()
	if err != nil {
		return fmt.Errorf("vGPU %d: rebind remap: %w", v.ID, err)
	}
	defer table.Close()
	if link == nil || !link.RemapOffered() {
		return v.remapGiveUp(r, "its device model does not handle remap updates", nil)
	}
	slice, err := a.sliceFile(a.layout.Slots[slot])
	if err != nil {
		return fmt.Errorf("vGPU %d: rebind remap: slice of slot %d: %w", v.ID, slot, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), remapAckTimeout)
	defer cancel()
	st, err := link.UpdateRemap(ctx, []*os.File{table, slice})
	slice.Close()
	if err != nil {
		// It may or may not have mapped them: keep treating it as
		// holding a mapping.
		v.mu.Lock()
		r.mapped = true
		v.mu.Unlock()
		return v.remapGiveUp(r, "its device model did not acknowledge the new slice", err)
	}
	if st != ipc.RemapDone {
		return v.remapGiveUp(r, "its device model could not map the new slice", nil)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	r.mapped = true
	if v.dead || v.remap != r || v.agg != a || v.Slot.Index != slot || v.shadows == nil {
		// It changed place meanwhile without a revoke (it cannot: a
		// revoke waits for op): keep trapping.
		return nil
	}
	v.remapOff = false
	v.remapStale = true
	v.updateRemap()
	return nil
}

// remapGiveUp turns remap off for the rest of v's connection (why, and
// the error that made it, are logged) and returns an error wrapping
// errRemapOff. Every entry is 0 already (revokeRemap), and stays so.
func (v *VGPU) remapGiveUp(r *remapTable, why string, cause error) error {
	v.mu.Lock()
	if r.broken == "" {
		r.broken = why
	}
	if v.remap == r {
		v.remapOff = true
		v.trapAllRemapped(r)
		if len(r.rv.pending) > 0 || len(r.rv.cleared) > 0 {
			v.revokeLost(r, nil, why, cause)
		}
	}
	v.mu.Unlock()
	v.log.Warn("BAR remap off: every aperture access traps", "why", why, "err", cause)
	if cause != nil {
		return fmt.Errorf("vGPU %d: %w: %s: %w", v.ID, errRemapOff, why, cause)
	}
	return fmt.Errorf("vGPU %d: %w: %s", v.ID, errRemapOff, why)
}

// dupFile duplicates f's descriptor (close-on-exec).
func dupFile(f *os.File) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dup %s: %w", f.Name(), err)
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// trapAllRemapped sets every entry of r (v.remap) to trap; a page that was
// passed through may have been written without a trap, which the page
// tracker is told (as updateRemap does). Called with v.mu held.
func (v *VGPU) trapAllRemapped(r *remapTable) {
	mapped := remapMappedLink(r)
	for i := range r.entries {
		if old := r.get(i); old != 0 {
			r.set(i, 0)
			if v.shadows != nil {
				v.shadows.Tracker().Unseen(old >> nvc0.PageShift)
			}
			if mapped {
				if r.rv.cleared == nil {
					r.rv.cleared = make(map[uint64]bool)
				}
				r.rv.cleared[old>>nvc0.PageShift] = true
			}
		}
	}
}
