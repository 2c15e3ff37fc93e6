package aggregator

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Lost devices and their way back (docs/design.md, "Losing a board").
//
// A vGPU resident on a board that falls off the bus loses everything the
// board held of it: its VRAM, its channels, its shadows. It becomes a lost
// device — not destroyed: its id, its device model's connection, its guest
// RAM and its remap table stay, and it is parked on its board with an
// empty image and the reason. What its guest sees is the documented error
// state of an absent PCI device: every read of its BARs returns all ones
// and every write is dropped (nouveau tests PMC_BOOT_0 for exactly that);
// its fence sleeps are woken so the guest driver looks and finds out. It
// holds nothing of any board, so it costs no slot: the lost board's slots
// are out of service anyway.
//
// A reset brings it back (the guest's function-level reset, `gpuvm vgpu
// reset ID`): on its own board once that is back on the bus and
// reinitialised (Aggregator.Reinit), or, while it is still lost, on the
// board the host's placement chooses (SetRehome). The vGPU is restored into
// a slot with its power-on state and the reset completes as any reset does,
// so the guest driver re-initialises and carries on. A reset with no board
// to go to fails and leaves the vGPU lost. A pvdrm vGPU cannot be reset in
// place (its state is the back end's driver): it is destroyed with its
// board as before.

// ErrDeviceLost is returned for a guest access to a lost device, which its
// device model answers as an absent device does (reads all ones, writes
// dropped); the vGPU comes back only through a reset.
var ErrDeviceLost = errors.New("the vGPU is a lost device (its board fell off the bus): reset it")

// Lost reports whether v is a lost device, and why.
func (v *VGPU) Lost() (bool, string) {
	if why := v.lostWhy.Load(); why != nil {
		return true, *why
	}
	return false, ""
}

// loseVGPU makes v, resident on the lost board a, a lost device. It
// reports false if v cannot be one (a pvdrm vGPU, or one no longer
// resident on a), which its caller then destroys (or leaves, if it is
// gone).
func (a *Aggregator) loseVGPU(v *VGPU, why string) bool {
	if v.feat.PVDRM {
		return false
	}
	// Its device model lets go of the dead board's slice: every aperture
	// access traps (and reads all ones) until a reset maps a new one.
	ctx, cancel := context.WithTimeout(context.Background(), a.opts.Timeout)
	if err := v.revokeRemap(ctx); err != nil {
		v.logger().Warn("lost device: remap revoke", "err", err)
	}
	cancel()
	v.mu.Lock()
	if v.dead || v.agg != a || v.image != nil {
		v.mu.Unlock()
		return false
	}
	slot := v.Slot.Index
	full := a.layout.Slots[slot]
	chans := make([]int, full.Chans)
	for i := range chans {
		chans[i] = full.ChanBase + i
	}
	// Nothing on the dead board can be stopped or trusted: its channels
	// count as never stopped (the slot stays out of service until the
	// board is reinitialised), its work in flight will not complete (the
	// waiters for it are woken), what it reported goes with its routes.
	for i := range v.chans {
		v.chans[i].running, v.chans[i].inList = false, false
	}
	a.disp.abandon(v)
	// Writes to the dead board go nowhere; what matters here is the host
	// side: poll pages and BAR slices unmapped, remap entries set to trap.
	if err := errors.Join(v.dropPhysicalState(a, chans)...); err != nil {
		v.log.Debug("lost device: dropping its state on the dead board", "err", err)
	}
	if v.remap != nil {
		v.remapOff = true // the revoke above is matched by the reset's restore
	}
	// Its shadows lived in the dead board's reserve, which Reinit starts
	// afresh: they are dropped, not freed through the board.
	v.ctr.carried.add(v.shadows.Counters())
	a.mu.Lock() // VGPUs reads v.shadows under it
	v.shadows, v.bars = nil, [2]*barShadow{}
	a.mu.Unlock()
	if err := a.gpu.UnregisterSystemMemory(v.ramBase); err != nil {
		// The host's side of the IOMMU: it waits out DMA in flight. If it
		// fails the vGPU cannot be trusted with its RAM again.
		v.dead = true
		v.mu.Unlock()
		v.logger().Error("lost device: unregistering its RAM from the dead board", "err", err)
		return false
	}
	v.ramBase = 0
	v.clearGuestState()
	v.image = &evictImage{}
	v.homeSlot = -1
	parked := v.Slot
	parked.Index, parked.VRAM.Base, parked.ChanBase = -1, 0, 0
	v.setPlace(a, parked)
	v.lostWhy.Store(&why)
	v.evicted.Store(true)
	a.mu.Lock()
	if a.vgpus[slot] == v {
		a.vgpus[slot] = nil
	}
	a.broken[slot] = "the board fell off the bus: " + why
	a.parked[v.ID] = v
	a.mu.Unlock()
	log := v.log
	v.mu.Unlock()
	v.raiseIRQ() // its fence sleeps look, and find the device gone
	log.Error("vGPU lost: its board stopped answering; it comes back with a reset", "reason", why, "slot", slot)
	return true
}

// abandon takes v off the dispatcher of a lost board: its queued
// submissions dropped, those in flight forgotten (their waiters woken),
// its totals kept for the board it comes back on.
func (d *dispatcher) abandon(v *VGPU) {
	d.mu.Lock()
	v.leftAccount = d.accounts[v.ID]
	d.mu.Unlock()
	d.dropVM(v)
	d.removeVM(v)
}

// rehomeEvery is how often a vGPU of a lost board may ask placement for
// another board (recoverLost).
const rehomeEvery = time.Second

// recoverLost readies lost v for its reset — or a parked v whose board was
// lost since it was evicted: if its board is still lost, v is handed to
// the board the host's placement chooses; then it stops being lost, and
// the reset's access restores it (from its empty image, for a lost
// device). It fails, leaving v as it was, when there is no board to go to.
func (v *VGPU) recoverLost() error {
	if v.lostWhy.Load() == nil && !v.Evicted() {
		return nil
	}
	v.restoreMu.Lock() // not while a restore of it is under way
	defer v.restoreMu.Unlock()
	cur, _ := v.where()
	if lost, why := cur.Lost(); lost {
		// Asking placement costs a decision record and a log line: a
		// guest that resets in a loop gets one look per rehomeEvery.
		now := time.Now().UnixNano()
		if last := v.rehomeAt.Load(); last != 0 && now-last < int64(rehomeEvery) {
			return fmt.Errorf("its board %s is still lost (%s); no other board had room %v ago: %w", cur.opts.BoardName, why,
				time.Duration(now-last).Round(time.Millisecond), ErrNoRoom)
		}
		v.rehomeAt.Store(now)
		cur.mu.Lock()
		rehome := cur.rehome
		cur.mu.Unlock()
		var dst *Aggregator
		if rehome != nil {
			dst = rehome(v)
		}
		if dst == nil || dst == cur {
			return fmt.Errorf("its board %s is still lost (%s) and no other board can take it: %w", cur.opts.BoardName, why, ErrNoRoom)
		}
		if err := cur.handOver(v, dst); err != nil {
			return err
		}
		cur.log.Info("vGPU of a lost board handed to another board for its reset", "vgpu", v.ID, "name", v.Guest.Name, "to_board", dst.opts.BoardName)
	}
	v.lostWhy.Store(nil)
	return nil
}
