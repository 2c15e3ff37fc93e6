package aggregator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"
)

// VRAM overcommit by eviction, Becchi's swapping per whole VM
// (docs/design.md, "Overcommit and eviction"). A board may admit vGPUs
// whose VRAM sums past the VRAM of its slots, up to Options.Overcommit
// times it. When a vGPU needs a slot and none is free, a resident vGPU is
// evicted: its work in flight ends (a submission boundary, as for a move),
// its channels stop through the one stop path and their state is saved,
// the shadows, BAR slices, poll pages, error routes and remap entries go
// as at a move, the pages of its slot in use are copied into an image in
// the daemon's memory at the bus DMA rate (at most the vGPU's own VRAM: the
// image is bounded by the slot), its RAM is unregistered from the board,
// and the slot is renewed (scrubbed, outside mappings orphaned) and freed
// like any teardown. The vGPU stays attached — its id, connection,
// guest-visible registers and channels — but parked: on the guest's next
// trapped access it is restored into a free slot, possibly another one,
// or on another board (a move of a parked vGPU, or a lost board's parked
// vGPUs handed over): the image is copied in, the shadows are rebuilt
// from the guest's own structures, the channels start with their saved
// state and the submissions it had queued are queued again. The guest only
// waits. The image is zeroed when it is used or the vGPU goes.
//
// The victim is chosen by the named policy "lru": the resident vGPU with
// no work queued or in flight whose last activity (trapped access,
// doorbell, completed submission) is oldest, if it has been idle for
// Options.EvictIdle. A vGPU that waited EvictIdle without finding one
// takes the slot of the vGPU resident the longest, once that one has held
// it for Options.MinResidency — the turns of an overcommitted board. Only vGPUs
// that can move (the full-virtualization modes) are evicted.

// ErrNoRoom is returned when no slot could be freed for a vGPU within
// Options.RestoreWait.
var ErrNoRoom = errors.New("no slot could be freed for the vGPU")

// EvictPolicy is the name of the victim choice.
const EvictPolicy = "lru"

// Defaults of the eviction options.
const (
	DefaultEvictIdle   = 200 * time.Millisecond
	DefaultRestoreWait = 30 * time.Second
)

// roomNap is how often a vGPU waiting for a slot looks again.
const roomNap = time.Millisecond

// evictImage is a parked vGPU's physical state in the daemon's memory:
// the saved state of each channel that ran (nil: it did not) and the pages
// of its slot in use, at offsets from the slot's base.
type evictImage struct {
	chans [][]uint32
	pv    *pvImage // a PV vGPU's tables and apertures (pvmove.go)
	pages []imagePage
	bytes uint64
	// kept: its VRAM was not copied out — it is in the slot it left
	// (homeSlot), kept for it (keep.go), and only that slot can restore it.
	kept bool
}

// imagePage is one resident range of an evicted slot.
type imagePage struct {
	off  uint64
	data []byte
}

// scrub zeroes the image: nothing of the VM stays in the daemon's memory
// for a later allocation to see.
func (m *evictImage) scrub() {
	for _, p := range m.pages {
		clear(p.data)
	}
	for _, c := range m.chans {
		clear(c)
	}
	m.pv.scrub()
	m.pages, m.chans, m.pv, m.bytes, m.kept = nil, nil, nil, 0, false
}

// EvictStats describes one eviction or restore.
type EvictStats struct {
	Board string
	Slot  int
	// Bytes is the VRAM copied out (eviction) or in (restore).
	Bytes uint64
	// Took is how long the vGPU was paused for the copy and the teardown
	// or rebuild.
	Took time.Duration
}

// Evicted reports whether v is parked: evicted, with no slot.
func (v *VGPU) Evicted() bool { return v.evicted.Load() }

// touch records guest activity for the eviction policy.
func (v *VGPU) touch() { v.active.Store(time.Now().UnixNano()) }

// Evict parks v (on a): it gives its slot back and keeps its state in the
// daemon's memory until its guest's next access brings it back. ctx bounds
// the wait for its work in flight; an eviction that times out there changes
// nothing. Evicting a parked vGPU does nothing.
func (a *Aggregator) Evict(ctx context.Context, v *VGPU, reason string) (EvictStats, error) {
	return a.evictVGPU(ctx, v, reason, false)
}

// evictVGPU is Evict; with keep, the vGPU's VRAM stays in its slot, which
// is kept for it instead of renewed and freed (keep.go).
func (a *Aggregator) evictVGPU(ctx context.Context, v *VGPU, reason string, keep bool) (EvictStats, error) {
	st := EvictStats{Board: a.opts.BoardName, Slot: -1}
	if err := canMove(a, a); err != nil {
		return st, fmt.Errorf("evict vGPU %d: %w", v.ID, err)
	}
	if lost, why := a.Lost(); lost && !v.Evicted() {
		return st, fmt.Errorf("evict vGPU %d: %w: %s", v.ID, ErrBoardLost, why)
	}
	// Its device model lets go of the slice before it is copied out; the
	// restore hands it the new one (remap_rebind.go). An eviction that
	// does not happen gives it back.
	if err := v.revokeRemap(ctx); err != nil {
		v.logger().Warn("evict: remap revoke", "err", err)
	}
	parked := false
	defer func() {
		if !parked {
			if err := v.rebindRemap(); err != nil {
				v.logger().Warn("evict: remap rebind", "err", err)
			}
		}
	}()
	a.disp.hold(v)
	defer a.disp.unhold(v)
	if err := a.disp.drain(ctx, v); err != nil {
		return st, fmt.Errorf("evict vGPU %d: waiting for its work in flight: %w", v.ID, err)
	}
	v.mu.Lock()
	start := time.Now()
	if v.dead || v.agg != a {
		v.mu.Unlock()
		return st, fmt.Errorf("evict vGPU %d: %w", v.ID, ErrDetached)
	}
	if v.image != nil {
		v.mu.Unlock()
		return st, nil
	}
	if v.wedged > 0 {
		v.mu.Unlock()
		return st, fmt.Errorf("evict vGPU %d: it has a channel out of service: %w", v.ID, ErrMoveUnsupported)
	}
	if lost, why := a.Lost(); lost {
		// Its state cannot be saved from the dead board: it becomes a
		// lost device (lost.go), not a failed eviction that destroys it.
		v.mu.Unlock()
		return st, fmt.Errorf("evict vGPU %d: %w: %s", v.ID, ErrBoardLost, why)
	}
	if err := a.disp.quiesce(ctx, v); err != nil {
		v.mu.Unlock()
		return st, fmt.Errorf("evict vGPU %d: waiting for its work in flight: %w", v.ID, err)
	}
	st.Slot = v.Slot.Index
	pending, failed, err := v.evict(a, &st, keep)
	if failed == "" {
		v.ctr.evictions.Add(1)
		v.ctr.evictedBytes.Add(st.Bytes)
		st.Took = time.Since(start)
		a.mu.Lock()
		a.parked[v.ID] = v
		a.mu.Unlock()
		if keep {
			// Under v.mu: no teardown comes between (its dropImage
			// then releases the slot kept here).
			a.keepSlot(v, st.Slot)
		}
		v.evicted.Store(true)
		parked = true
		log := v.log // a restore may set it once mu is let go
		v.mu.Unlock()
		if !keep {
			a.releaseMoved(v, st.Slot, a)
		}
		if pending {
			// Its guest waits for work the eviction held back: wake its
			// fence sleeps — a pvdrm back end's CPU_PREP waiters too —
			// so that their look at the registers brings it back (it
			// queues for a slot). Left asleep, a pvdrm waiter found the
			// vGPU parked only at its next fault poll.
			v.raiseIRQ()
			if v.pvdrmWake != nil { // set once at attach
				v.pvdrmWake()
			}
		}
		log.Info("vGPU evicted", "reason", reason, "policy", EvictPolicy, "from_slot", st.Slot, "bytes", st.Bytes, "took", st.Took)
		a.paused(Pause{Kind: PauseEvict, VGPU: v.ID, FromBoard: st.Board, ToBoard: st.Board,
			FromSlot: st.Slot, ToSlot: -1, Bytes: st.Bytes, Took: st.Took})
		return st, nil
	}
	v.dead = true
	v.mu.Unlock()
	why := fmt.Sprintf("eviction of vGPU %d failed: %s", v.ID, failed)
	v.logger().Error("vGPU eviction failed: destroying it", "failed", failed, "err", err)
	return st, errors.Join(fmt.Errorf("evict vGPU %d: %w: %s: %w", v.ID, ErrMoveDestroyed, failed, err), a.Destroy(v, why))
}

// evict does the work of Evict with v.mu held and v off a's dispatcher. It
// returns "" on success, else what failed (v must then be destroyed), and
// whether the guest had work queued that the eviction held back.
func (v *VGPU) evict(a *Aggregator, st *EvictStats, keep bool) (pending bool, failed string, err error) {
	from := a.layout.Slots[v.Slot.Index]
	imgs, chans, failed, err := v.stopSaving(a)
	if failed != "" {
		return false, failed, err
	}
	for i, img := range imgs {
		pending = pending || (img != nil && v.chans[i].put != img[chanImageGPGet])
	}
	pv, err := v.exportPV()
	if err != nil {
		return pending, "describing its PV page tables", err
	}
	if failed, err := v.leaveBoard(a, chans); failed != "" {
		pv.scrub()
		return pending, failed, err
	}
	img := &evictImage{chans: imgs, pv: pv, kept: keep}
	// Its own VRAM only: a quota narrows the slot's (the guest sees
	// [0, v.Slot.VRAM.Size)), and nothing of it lies past that.
	if keep {
		// Left where it is, in the slot kept for it.
	} else if err := exportSlot(a, Region{Base: from.VRAM.Base, Size: v.Slot.VRAM.Size}, img); err != nil {
		img.scrub()
		return pending, "copying its VRAM out", err
	}
	st.Bytes = img.bytes
	if err := a.gpu.UnregisterSystemMemory(v.ramBase); err != nil {
		img.scrub()
		return pending, "unregistering its RAM from the board", err
	}
	v.ramBase = 0
	v.image = img
	v.homeSlot = v.Slot.Index
	parked := v.Slot
	parked.Index, parked.VRAM.Base, parked.ChanBase = -1, 0, 0
	v.setPlace(a, parked)
	return pending, "", nil
}

// exportSlot copies the pages of r in use on a into img.
func exportSlot(a *Aggregator, r Region, img *evictImage) error {
	out := a.gpu.(VRAMMover)
	ranges, err := out.VRAMResidentRanges(r.Base, r.Size)
	if err != nil {
		return err
	}
	for _, rg := range ranges {
		for off := rg.Base; off < rg.End(); {
			n := min(uint64(moveChunk), rg.End()-off)
			p := imagePage{off: off - r.Base, data: make([]byte, n)}
			if err := out.ExportVRAM(p.data, off); err != nil {
				return err
			}
			img.pages = append(img.pages, p)
			img.bytes += n
			off += n
		}
	}
	return nil
}

// ensureResident brings a parked v back into a slot of the board it is
// parked on before a guest access goes on. Called without v.mu; it returns
// with v resident (or not parked: torn down, which the caller finds).
func (v *VGPU) ensureResident() error {
	if !v.evicted.Load() {
		return nil
	}
	v.restoreMu.Lock() // one restore per vGPU; its other accesses wait for it
	defer v.restoreMu.Unlock()
	if !v.evicted.Load() {
		return nil
	}
	v.mu.Lock()
	dead := v.dead
	v.mu.Unlock()
	if dead {
		// Torn down while parked (saved, destroyed): nothing to make
		// room for; the caller finds it dead.
		return nil
	}
	a, _ := v.where()
	if ok, _ := v.Lost(); ok {
		return fmt.Errorf("restore vGPU %d: %w", v.ID, ErrDeviceLost)
	}
	if lost, why := a.Lost(); lost {
		// Parked on a board that fell off the bus since, and no other
		// board took it then (health.go): it reads as absent until a
		// reset finds it one, or the board is reinitialised.
		return fmt.Errorf("restore vGPU %d: board %s lost (%s): %w", v.ID, a.opts.BoardName, why, ErrDeviceLost)
	}
	t0 := time.Now()
	to, kept, err := a.slotForRestore(v, func() (Slot, error) { return a.roomFor(context.Background(), v, v.homeSlot) })
	v.ctr.restoreWaitNs.Add(uint64(time.Since(t0)))
	if err != nil {
		return fmt.Errorf("restore vGPU %d: %w", v.ID, err)
	}
	v.mu.Lock()
	if v.dead || v.image == nil || v.agg != a {
		v.mu.Unlock()
		a.freeClaimed(to.Index, kept)
		return nil
	}
	st, err := v.restoreOn(a, to)
	log := v.log
	v.mu.Unlock()
	if err != nil {
		return err
	}
	v.rebindParked()
	log.Info("vGPU restored", "to_slot", st.Slot, "bytes", st.Bytes, "took", st.Took, "waited", time.Since(t0)-st.Took)
	a.paused(Pause{Kind: PauseRestore, VGPU: v.ID, FromBoard: a.opts.BoardName, ToBoard: st.Board,
		FromSlot: -1, ToSlot: st.Slot, Bytes: st.Bytes, Took: st.Took})
	return nil
}

// restoreOn restores parked v into slot to of dst (held for it), which may
// be another board than the one it was evicted from. Called with v.mu held;
// on failure v is destroyed.
func (v *VGPU) restoreOn(dst *Aggregator, to Slot) (EvictStats, error) {
	st := EvictStats{Board: dst.opts.BoardName, Slot: to.Index}
	src := v.agg
	start := time.Now()
	failed, err := v.restore(src, dst, to, &st)
	if failed == "" {
		st.Took = time.Since(start)
		v.ctr.restores.Add(1)
		v.ctr.restoredBytes.Add(st.Bytes)
		v.evicted.Store(false)
		v.residentSince.Store(time.Now().UnixNano())
		dst.mu.Lock()
		dst.vgpus[to.Index] = v
		dst.mu.Unlock()
		src.mu.Lock()
		delete(src.parked, v.ID)
		src.mu.Unlock()
		v.touch()
		v.raiseIRQ() // a fence wait that slept through the restore looks again
		return st, nil
	}
	// The teardown finishes it wherever it got to.
	v.dead = true
	cur, _ := v.where()
	if cur == dst && v.image == nil {
		dst.mu.Lock()
		dst.vgpus[to.Index] = v
		dst.mu.Unlock()
		src.mu.Lock()
		delete(src.parked, v.ID)
		src.mu.Unlock()
		v.evicted.Store(false)
	} else if v.image != nil && v.image.kept && dst == src && to.Index == v.homeSlot {
		dst.unclaimKept(v, to.Index) // its teardown renews it
	} else {
		dst.freeHeld(to.Index)
	}
	why := fmt.Sprintf("restore of vGPU %d failed: %s", v.ID, failed)
	v.logger().Error("vGPU restore failed: destroying it", "failed", failed, "err", err)
	go func() { _ = cur.Destroy(v, why) }() // it takes v.mu, which the caller holds
	return st, fmt.Errorf("restore vGPU %d: %w: %s: %w", v.ID, ErrMoveDestroyed, failed, err)
}

// restore does the work of restoreOn: RAM registered with dst, the image
// copied into the slot, the vGPU rebuilt and back on dst's dispatcher.
func (v *VGPU) restore(src, dst *Aggregator, to Slot, st *EvictStats) (failed string, err error) {
	img := v.image
	if img.kept && (dst != src || to.Index != v.homeSlot) {
		return "restoring it", fmt.Errorf("its VRAM is kept in slot %d of board %s, not slot %d of board %s", v.homeSlot, src.opts.BoardName, to.Index, dst.opts.BoardName)
	}
	if v.ramBase, err = dst.gpu.RegisterSystemMemory(v.ram); err != nil {
		v.ramBase = 0
		return "registering its RAM with the board", err
	}
	in := dst.gpu.(VRAMMover)
	for _, p := range img.pages {
		if err := in.ImportVRAM(p.data, to.VRAM.Base+p.off); err != nil {
			return "copying its VRAM in", err
		}
		st.Bytes += uint64(len(p.data))
	}
	chans := img.chans
	v.image = nil
	v.setPlace(dst, to)
	gets, err := v.rebuild(dst, chans, img.pv)
	img.scrub()
	if err != nil {
		return "rebuilding it on the slot", err
	}
	if err := dst.disp.addVM(v, dst.weightFor(v.Guest)); err != nil {
		return "joining the board's scheduler", err
	}
	v.rewireEnded(dst)
	v.requeue(gets)
	if src != dst {
		src.handDomain(v, dst)
	}
	return "", nil
}

// handDomain moves the domain's registered settings from a to dst.
func (a *Aggregator) handDomain(v *VGPU, dst *Aggregator) {
	a.mu.Lock()
	s, ok := a.domains[v.Guest.DomID]
	delete(a.domains, v.Guest.DomID)
	a.mu.Unlock()
	if ok {
		dst.mu.Lock()
		dst.domains[v.Guest.DomID] = s
		dst.mu.Unlock()
	}
}

// rebindParked matches the remap revoke of the eviction a restore undid:
// the device model maps the new slot's slice and pages pass through again.
// Called without v.mu.
func (v *VGPU) rebindParked() {
	if err := v.rebindRemap(); err != nil {
		v.logger().Warn("restore: remap rebind", "err", err)
	}
}

// dropImage zeroes and forgets a parked vGPU's image (its teardown).
// Called with v.mu held.
func (v *VGPU) dropImage() {
	if v.image != nil {
		if v.image.kept {
			// Its VRAM goes with it: the slot kept for it is renewed.
			v.agg.releaseKept(v.homeSlot, v.Guest.DomID)
		}
		v.image.scrub()
		v.image = nil
	}
}

// roomFor holds a free slot of a for v (which is not resident on a) —
// slot prefer if it is free (the one it was evicted from: its neighbours
// stay where they are), else the first —, evicting a victim when none is
// free, and waiting up to
// Options.RestoreWait for one. Called without v.mu.
func (a *Aggregator) roomFor(ctx context.Context, v *VGPU, prefer int) (Slot, error) {
	start := time.Now()
	wait := a.opts.RestoreWait
	if wait <= 0 {
		wait = DefaultRestoreWait
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	refused := map[*VGPU]bool{} // victims that cannot be evicted: not asked again
	for {
		if lost, why := a.Lost(); lost {
			return Slot{}, fmt.Errorf("board %s: %w: %s", a.opts.BoardName, ErrBoardLost, why)
		}
		if v.detached() { // its VM went while it waited: evict no one for it
			return Slot{}, ErrDetached
		}
		if a.renewing(v, prefer) {
			// The slot it left is being scrubbed for it (Evict's last
			// step): wait for that rather than take a neighbour's place.
			select {
			case <-ctx.Done():
				return Slot{}, fmt.Errorf("board %s, after %v, its slot still being renewed: %w", a.opts.BoardName, time.Since(start).Round(time.Millisecond), ErrNoRoom)
			case <-time.After(roomNap):
			}
			continue
		}
		to, err := a.holdSlotPrefer(v, prefer)
		if err == nil {
			return to, nil
		}
		if !errors.Is(err, ErrNoSlot) {
			return Slot{}, err
		}
		waited := time.Since(start)
		if u := a.victim(v, waited >= a.evictIdle(), refused); u != nil {
			ectx, cancel := context.WithTimeout(ctx, a.opts.Timeout)
			_, err := a.Evict(ectx, u, fmt.Sprintf("its slot is wanted by vGPU %d (%s)", v.ID, v.Guest.Name))
			cancel()
			if err != nil {
				// Work in flight that outlasted the bound is waited for
				// again on the next look: it ends (the watchdog bounds it).
				// A victim that cannot be evicted at all is not asked again.
				if !errors.Is(err, context.DeadlineExceeded) {
					refused[u] = true
				}
				a.log.Warn("eviction to make room failed", "vgpu", u.ID, "for", v.ID, "err", err)
				if ctx.Err() != nil {
					return Slot{}, fmt.Errorf("board %s, after %v: %w", a.opts.BoardName, time.Since(start).Round(time.Millisecond), ErrNoRoom)
				}
			}
			continue
		}
		select {
		case <-ctx.Done():
			return Slot{}, fmt.Errorf("board %s, after %v: %w", a.opts.BoardName, time.Since(start).Round(time.Millisecond), ErrNoRoom)
		case <-time.After(roomNap):
		}
	}
}

// renewing reports whether slot still carries parked v: its eviction is
// scrubbing the slot and has not freed it yet.
func (a *Aggregator) renewing(v *VGPU, slot int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slot >= 0 && slot < len(a.vgpus) && a.vgpus[slot] == v
}

// evictIdle is Options.EvictIdle with its default.
func (a *Aggregator) evictIdle() time.Duration {
	if a.opts.EvictIdle > 0 {
		return a.opts.EvictIdle
	}
	return DefaultEvictIdle
}

// DefaultMinResidency is how long a vGPU keeps a slot before a waiting one
// may take it although it is busy (Options.MinResidency): long enough that
// an overcommitted board runs work, not copies (a restore of a few MiB
// takes milliseconds).
const DefaultMinResidency = 500 * time.Millisecond

// minResidency is Options.MinResidency with its default.
func (a *Aggregator) minResidency() time.Duration {
	if a.opts.MinResidency > 0 {
		return a.opts.MinResidency
	}
	return DefaultMinResidency
}

// victim chooses the vGPU to evict for except (lru): the resident,
// evictable vGPU idle for EvictIdle whose last activity is oldest; failing
// that, with preempt, the one resident longest if it held its slot for
// MinResidency; never one in refused. nil: none now.
func (a *Aggregator) victim(except *VGPU, preempt bool, refused map[*VGPU]bool) *VGPU {
	now := time.Now().UnixNano()
	idle := int64(a.evictIdle())
	a.mu.Lock()
	var cands []*VGPU
	for _, u := range a.vgpus {
		if u != nil && u != except && u.agg != nil && !u.evicted.Load() && !refused[u] {
			cands = append(cands, u)
		}
	}
	a.mu.Unlock()
	var lru, longest *VGPU
	for _, u := range cands {
		if at := u.active.Load(); now-at >= idle && a.disp.idle(u) && (lru == nil || at < lru.active.Load()) {
			lru = u
		}
		if since := u.residentSince.Load(); now-since >= int64(a.minResidency()) && (longest == nil || since < longest.residentSince.Load()) {
			longest = u
		}
	}
	if lru != nil || !preempt {
		return lru
	}
	return longest
}

// idle reports whether none of v's work is queued or in flight.
func (d *dispatcher) idle(v *VGPU) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.queues[v.ID]) > 0 {
		return false
	}
	for _, s := range d.inflight {
		if s.v == v {
			return false
		}
	}
	return true
}

// overcommitFits reports whether a may take one more vGPU of vram bytes:
// the VRAM of the vGPUs it holds, resident and parked, and vram within
// Options.Overcommit times its slots' VRAM. Called with a.mu held.
func (a *Aggregator) overcommitFits(vram uint64) bool {
	budget, held := a.overcommitBudget()
	return float64(held+vram) <= budget
}

// overcommitBudget is the VRAM a may commit (Overcommit times its slots'
// in service) and the VRAM its vGPUs hold, resident and parked. Called
// with a.mu held.
func (a *Aggregator) overcommitBudget() (budget float64, held uint64) {
	var total uint64
	for i, s := range a.layout.Slots {
		if _, broken := a.broken[i]; !broken {
			total += s.VRAM.Size
		}
		if u := a.vgpus[i]; u != nil {
			held += u.Slot.VRAM.Size
		}
	}
	for _, u := range a.parked {
		held += u.Slot.VRAM.Size
	}
	for _, k := range a.kept {
		if a.parked[k.owner] == nil { // a parked owner counted above
			held += k.vram // its vGPU comes back into it
		}
	}
	return max(a.opts.Overcommit, 1) * float64(total), held
}

// stopSaving stops every physical channel of v's slot on a through the one
// stop path and saves the state of each channel that ran (nil for the
// others). Called with v.mu held; "" or what failed.
func (v *VGPU) stopSaving(a *Aggregator) (imgs [][]uint32, chans []int, failed string, err error) {
	from := a.layout.Slots[v.Slot.Index]
	chans = make([]int, from.Chans)
	for i := range chans {
		chans[i] = from.ChanBase + i
	}
	wedged, serr := a.phys.stop(chans...)
	if len(wedged) > 0 {
		for i := range v.chans {
			v.chans[i].running, v.chans[i].inList = false, false
		}
		v.wedged += len(wedged)
		return nil, chans, fmt.Sprintf("%d channel(s) did not stop", len(wedged)), serr
	}
	saver := a.gpu.(ChannelStateMover)
	imgs = make([][]uint32, len(v.chans))
	for i := range v.chans {
		if v.chans[i].running {
			if imgs[i], err = saver.SaveChannelState(v.phys(i)); err != nil {
				return nil, chans, fmt.Sprintf("saving channel %d's state", i), err
			}
		}
	}
	return imgs, chans, "", nil
}

// lockResident records guest activity and returns with v.mu held and v
// resident (restored first if it was parked), or dead; or with an error
// and v.mu not held when no slot could be had for it.
func (v *VGPU) lockResident() error {
	v.touch()
	for {
		if err := v.ensureResident(); err != nil {
			return err
		}
		v.mu.Lock()
		if v.image == nil || v.dead {
			return nil
		}
		v.mu.Unlock() // evicted again between the restore and the lock
	}
}

// Room is how many more vGPUs of a whole slot's size the board can take
// now: its free slots, or on an overcommitted board what the overcommit
// leaves of its VRAM, in slots (parked vGPUs count).
func (a *Aggregator) Room() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	free := 0
	for i, u := range a.vgpus {
		if u == nil && a.slotFree(i) {
			free++
		}
	}
	if a.opts.Overcommit <= 1 || len(a.layout.Slots) == 0 {
		return free
	}
	budget, held := a.overcommitBudget()
	n := int((budget - float64(held)) / float64(a.layout.Slots[0].VRAM.Size))
	return max(n, free)
}

// Parked is how many vGPUs are parked on the board (evicted, no slot).
func (a *Aggregator) Parked() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.parked)
}

// serveEvict answers POST /v1/vgpus/{id}/evict: 200 with the bytes copied
// out and the pause once the vGPU is parked, 404 for no such vGPU, 501 for
// one that cannot be evicted, 500 when the eviction failed (and destroyed
// the vGPU), 409 when its work in flight did not end in time.
func (a *Aggregator) serveEvict(w http.ResponseWriter, r *http.Request) {
	v := a.lookup(r.PathValue("id"))
	if v == nil {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such vGPU"})
		return
	}
	cur, _ := v.where()
	ctx, cancel := context.WithTimeout(r.Context(), cur.opts.Timeout)
	defer cancel()
	st, err := cur.Evict(ctx, v, "evicted through the control API")
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, map[string]any{"evicted": v.ID, "board": st.Board, "from_slot": st.Slot,
			"bytes": st.Bytes, "pause_ns": st.Took.Nanoseconds()})
	default:
		writeParkError(w, err)
	}
}

// writeParkError answers a failed eviction or save: 501 for a vGPU that
// cannot be parked (or saved), 404 for one torn down, 409 when its work in
// flight did not end in time, 500 otherwise (it failed and was destroyed).
func writeParkError(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, ErrSaveUnsupported), errors.Is(err, ErrMoveUnsupported):
		code = http.StatusNotImplemented
	case errors.Is(err, ErrDetached):
		code = http.StatusNotFound
	case errors.Is(err, context.DeadlineExceeded):
		code = http.StatusConflict
	}
	writeJSON(w, code, map[string]string{"error": err.Error()})
}

// SetRehome sets how a parked vGPU of this board finds another board when
// this one is lost (package host's placement): its image is in the
// daemon's memory, not on the lost board, so it is handed to the board
// rehome returns and restored there on its guest's next access, where the
// vGPUs resident on the lost board are lost devices. nil: none.
func (a *Aggregator) SetRehome(rehome func(*VGPU) *Aggregator) {
	a.mu.Lock()
	a.rehome = rehome
	a.mu.Unlock()
}

// restartElsewhere hands a parked v of the lost board a to the board its
// rehome chooses, and reports whether it did.
func (a *Aggregator) restartElsewhere(v *VGPU) bool {
	a.mu.Lock()
	rehome := a.rehome
	a.mu.Unlock()
	if rehome == nil || !v.Evicted() {
		return false
	}
	dst := rehome(v)
	if dst == nil || dst == a {
		return false
	}
	// a.log, not v.log: a restore on dst may set that once handed over.
	if err := a.handOver(v, dst); err != nil {
		a.log.Warn("parked vGPU of a lost board not restarted elsewhere", "vgpu", v.ID, "name", v.Guest.Name, "to_board", dst.opts.BoardName, "err", err)
		return false
	}
	a.log.Info("parked vGPU of a lost board restarted from its image on another board", "vgpu", v.ID, "name", v.Guest.Name, "to_board", dst.opts.BoardName)
	return true
}

// handOver moves parked v from a's parked list to dst's, with its domain
// settings: its next access restores it on dst.
func (a *Aggregator) handOver(v *VGPU, dst *Aggregator) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.dead || v.image == nil || v.agg != a {
		return fmt.Errorf("vGPU %d is no longer parked on board %s: %w", v.ID, a.opts.BoardName, ErrDetached)
	}
	if v.image.kept {
		return fmt.Errorf("vGPU %d: its VRAM is kept in slot %d of board %s: %w", v.ID, v.homeSlot, a.opts.BoardName, ErrMoveUnsupported)
	}
	a.mu.Lock()
	delete(a.parked, v.ID)
	a.mu.Unlock()
	dst.mu.Lock()
	dst.parked[v.ID] = v
	dst.mu.Unlock()
	v.homeSlot = -1
	v.setPlace(dst, v.Slot) // Index -1: no slot
	a.handDomain(v, dst)
	return nil
}

// logger is v.log for callers that may not hold v.mu: a move or restore
// sets it under placeMu.
func (v *VGPU) logger() *slog.Logger {
	v.placeMu.RLock()
	defer v.placeMu.RUnlock()
	return v.log
}
