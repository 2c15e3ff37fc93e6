package aggregator

import (
	"time"
)

// Per-page revocation for a device model that maps remapped pages into its
// guest (docs/protocol.md §6.8; docs/design.md, "BAR remap"). Such a
// device model reads an entry once, when it maps the page; a store of 0
// into the table does not take the guest's mapping away. So when
// updateRemap takes entries back (their pages became page tables, page
// directories or RAMINs, or the BAR maps other pages there) it names them
// in RemapRevoke messages, keeps them 0 until the device model
// acknowledged, and until then tells the page tracker that the pages may
// have been written (Unseen) before every use of the structures in them
// (settleRevokes): a write through the stale mapping before a use is seen
// by that use's scan, as a trapped one would be. It does not block for the
// acknowledgement: the revocation is made inside the trapped access the
// device model is waiting on (QEMU holds the lock its unmap needs).

// revokeLink is what per-page revocation needs of the device model's
// connection (*ipc.ServerConn).
type revokeLink interface {
	RemapMapped() bool
	RevokeRemap(idx []uint32) (uint32, error)
	RemapAcked() uint32
}

// revokeBatch is one updateRemap's revocation awaiting acknowledgement.
type revokeBatch struct {
	epoch uint32    // the last RemapRevoke of the batch
	sent  time.Time // when
	idx   []int     // table entries, kept 0 until acknowledged
	pages []uint64  // guest page numbers behind them
}

// revokeState is a remapTable's per-page revocation state, under the
// vGPU's mu.
type revokeState struct {
	pending []revokeBatch
	hold    map[int]bool // entries of pending batches: kept 0
	// lost are pages revoked from a device model that did not
	// acknowledge: it may map them into its guest for the rest of the
	// connection, so they are Unseen before every use.
	lost map[uint64]bool
	// cleared are the pages trapAllRemapped took back from a device
	// model that maps pages into its guest, until its acknowledgement of
	// the RemapUpdate (revokeRemap) — lost if it does not come.
	cleared map[uint64]bool
}

// remapMappedLink reports whether r's device model maps remapped pages
// into its guest (§6.8).
func remapMappedLink(r *remapTable) bool {
	l, ok := r.link.(revokeLink)
	return ok && l.RemapMapped()
}

// revokeMapped is called by updateRemap, with v.mu held, when it took the
// entries idx (guest pages pages) back from a device model that maps
// remapped pages into its guest (remapMappedLink): it names them; the
// entries stay 0 until acknowledged.
func (v *VGPU) revokeMapped(r *remapTable, idx []int, pages []uint64) {
	l := r.link.(revokeLink)
	wire := make([]uint32, len(idx))
	for i, x := range idx {
		wire[i] = uint32(x)
	}
	epoch, err := l.RevokeRemap(wire)
	rv := &r.rv
	if err != nil {
		v.revokeLost(r, pages, "its device model could not be sent a revocation", err)
		return
	}
	n := (len(idx) + maxRevokeBatch - 1) / maxRevokeBatch
	v.ctr.remapRevokes.Add(uint64(n))
	v.ctr.remapRevoked.Add(uint64(len(idx)))
	if rv.hold == nil {
		rv.hold = make(map[int]bool)
	}
	for _, x := range idx {
		rv.hold[x] = true
	}
	rv.pending = append(rv.pending, revokeBatch{epoch: epoch, sent: time.Now(), idx: idx, pages: pages})
}

// maxRevokeBatch is ipc.MaxRevokeEntries (a RemapRevoke's entries), for
// the round-trip counter.
const maxRevokeBatch = 256

// settleRevokes runs before every use of the structures in guest VRAM
// (channel activation and enable, TLB flushes) and at every table update,
// with v.mu held: every page whose revocation is not acknowledged yet, and
// every lost one, may have been written through the guest's stale mapping,
// and the tracker is told so; a batch acknowledged now is told once more
// and dropped (its entries may be passed through again); one past
// remapAckTimeout turns remap off for the connection.
func (v *VGPU) settleRevokes() {
	r := v.remap
	if r == nil || (len(r.rv.pending) == 0 && len(r.rv.lost) == 0 && len(r.rv.cleared) == 0) || v.shadows == nil {
		return
	}
	tr := v.shadows.Tracker()
	for p := range r.rv.lost {
		tr.Unseen(p)
	}
	for p := range r.rv.cleared {
		tr.Unseen(p)
	}
	if len(r.rv.pending) == 0 {
		return
	}
	l, _ := r.link.(revokeLink)
	var acked uint32
	if l != nil {
		acked = l.RemapAcked()
	}
	now := time.Now()
	keep := r.rv.pending[:0]
	var late []uint64
	for _, b := range r.rv.pending {
		for _, p := range b.pages {
			tr.Unseen(p)
		}
		switch {
		case l != nil && acked >= b.epoch: // epochs do not wrap in 2³² revocations
			for _, x := range b.idx {
				delete(r.rv.hold, x)
			}
			v.remapStale = true
		case now.Sub(b.sent) > remapAckTimeout:
			late = append(late, b.pages...)
		default:
			keep = append(keep, b)
		}
	}
	r.rv.pending = keep
	if late != nil {
		v.revokeLost(r, late, "its device model did not acknowledge a revocation", nil)
	}
}

// revokeLost gives up on per-page revocation (and remap) for the rest of
// the connection: every entry stays 0, and the pages of every revocation
// not acknowledged are Unseen before every use from now on. Called with
// v.mu held.
func (v *VGPU) revokeLost(r *remapTable, pages []uint64, why string, cause error) {
	if r.rv.lost == nil {
		r.rv.lost = make(map[uint64]bool)
	}
	for _, p := range pages {
		r.rv.lost[p] = true
	}
	for _, b := range r.rv.pending {
		for _, p := range b.pages {
			r.rv.lost[p] = true
		}
	}
	for p := range r.rv.cleared {
		r.rv.lost[p] = true
	}
	r.rv.pending, r.rv.hold, r.rv.cleared = nil, nil, nil
	if r.broken == "" {
		r.broken = why
		v.log.Warn("BAR remap off: every aperture access traps", "why", why, "err", cause)
	}
	v.remapOff = true
	v.trapAllRemapped(r)
}

// revokeAllAcked is called by revokeRemap, with v.mu held, once the
// device model acknowledged a RemapUpdate: the pages trapAllRemapped took
// back are unmapped from its guest; they are Unseen once more.
func (v *VGPU) revokeAllAcked(r *remapTable) {
	if v.shadows != nil {
		for p := range r.rv.cleared {
			v.shadows.Tracker().Unseen(p)
		}
	}
	r.rv.cleared = nil
}
