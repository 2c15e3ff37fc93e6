package aggregator

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/gpuvm/gpuvm/gpu"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/sched"
	"github.com/gpuvm/gpuvm/shadow"
)

// Moving a running vGPU to another slot, of another board or of its own
// (docs/design.md, "Moving a vGPU"). Under the vGPU's lock — every trapped
// access, doorbell and poll of the VM waits: the guest's pause — the
// dispatcher stops releasing its work and the move waits for what is in
// flight to end (a submission boundary; a submission the watchdog gives up
// on is stopped as the watchdog would); then every physical channel of the
// slot stops by the one stop path and each running channel's state (the
// board's RAMFC and engine method state) is saved; the shadows, BAR slices,
// poll pages and error routes on the old board go as at a reset; the VRAM
// pages in use are copied to the new slot at the bus DMA rate; the guest RAM
// is registered with the new board; new shadows are built from the guest's
// own structures, now in the new slice; its channels start on the new board
// with their saved state, and the submissions the guest had queued are
// queued again. The guest-visible state (registers, channels, error
// reports, the id) is kept. The old slot is renewed (scrubbed, every outside
// mapping orphaned) and freed like any teardown.

// ErrMoveUnsupported is returned for a vGPU that cannot be moved: one with
// a channel out of service, or on a host GPU that cannot save a channel's
// state or copy VRAM.
var ErrMoveUnsupported = errors.New("move not supported for this vGPU")

// ErrMoveDestroyed is returned when a move could not stop the vGPU's
// channels or could not rebuild it, and destroyed it instead.
var ErrMoveDestroyed = errors.New("vGPU destroyed: its move could not complete")

// ChannelStateMover is implemented by host GPUs that can save an idle
// channel's state (what a GF100 keeps in RAMFC and the engine context
// images) and load it into a channel just enabled (the simulated board).
type ChannelStateMover interface {
	SaveChannelState(ch int) ([]uint32, error)
	RestoreChannelState(ch int, img []uint32) error
}

// VRAMMover is implemented by host GPUs whose VRAM in use can be listed
// and copied through the copy engine at the bus rate (the simulated
// board). A move needs it on both boards.
type VRAMMover interface {
	VRAMResidentRanges(base, size uint64) ([]gpu.Range, error)
	ExportVRAM(p []byte, off uint64) error
	ImportVRAM(p []byte, off uint64) error
}

// MoveStats describes a completed move.
type MoveStats struct {
	FromBoard, ToBoard string
	FromSlot, ToSlot   int
	// Bytes is the VRAM copied: the pages of the old slot in use.
	Bytes uint64
	// Downtime is how long the guest was paused (its accesses waited);
	// Copy is the part of it spent copying VRAM.
	Downtime, Copy time.Duration
}

// moveQuiesceNap is how often the move looks whether the VM's in-flight
// work ended (as often as the dispatcher reaps).
const moveQuiesceNap = 20 * time.Microsecond

// moveChunk is the copy buffer: the bounce buffer a real move would DMA
// through.
const moveChunk = 1 << 20

// Move moves v to a free slot of dst (which may be v's own board: another
// slot). It returns once the guest runs on the new slot, or with an error
// and v where it was — unless the error is ErrMoveDestroyed. ctx bounds the
// wait for v's in-flight work (the pause); a move that times out there
// changes nothing.
func Move(ctx context.Context, v *VGPU, dst *Aggregator) (MoveStats, error) {
	src, _ := v.where()
	st := MoveStats{FromBoard: src.opts.BoardName, ToBoard: dst.opts.BoardName}
	if err := canMove(src, dst); err != nil {
		return st, fmt.Errorf("move vGPU %d: %w", v.ID, err)
	}
	if lost, why := dst.Lost(); lost {
		return st, fmt.Errorf("move vGPU %d to board %s: %w: %s", v.ID, dst.opts.BoardName, ErrBoardLost, why)
	}
	if lost, _ := v.Lost(); lost {
		return st, fmt.Errorf("move vGPU %d: %w", v.ID, ErrDeviceLost)
	}
	if lost, why := src.Lost(); lost && !v.Evicted() {
		return st, fmt.Errorf("move vGPU %d off board %s: %w: %s", v.ID, src.opts.BoardName, ErrBoardLost, why)
	}
	to, err := dst.holdSlot(v)
	if err != nil {
		return st, fmt.Errorf("move vGPU %d to board %s: %w", v.ID, dst.opts.BoardName, err)
	}
	// Its device model lets go of the old slice before anything of it is
	// copied, and maps the new one once the vGPU runs there — or the old
	// one again if the move changes nothing (remap_rebind.go). If it does
	// not answer, every aperture access traps from now on.
	if err := v.revokeRemap(ctx); err != nil {
		v.log.Warn("move: remap revoke", "err", err)
	}
	defer func() {
		if err := v.rebindRemap(); err != nil {
			v.log.Warn("move: remap rebind", "err", err)
		}
	}()
	// Stop releasing the VM's work and let what is in flight end while the
	// guest still runs (its CPU side: doorbells queue), then pause it.
	src.disp.hold(v)
	defer src.disp.unhold(v)
	if err := src.disp.drain(ctx, v); err != nil {
		dst.freeHeld(to.Index)
		return st, fmt.Errorf("move vGPU %d: waiting for its work in flight: %w", v.ID, err)
	}
	v.mu.Lock()
	start := time.Now()
	if v.dead || v.agg != src {
		v.mu.Unlock()
		dst.freeHeld(to.Index)
		return st, fmt.Errorf("move vGPU %d: %w", v.ID, ErrDetached)
	}
	if v.image != nil && v.image.kept {
		v.mu.Unlock()
		dst.freeHeld(to.Index)
		return st, fmt.Errorf("move vGPU %d: its VRAM is kept in slot %d of board %s: %w", v.ID, v.homeSlot, src.opts.BoardName, ErrMoveUnsupported)
	}
	if v.image != nil {
		// Parked (evict.go): it is restored on dst from its image.
		rst, err := v.restoreOn(dst, to)
		v.mu.Unlock()
		st.FromSlot, st.ToSlot, st.Bytes, st.Downtime, st.Copy = -1, to.Index, rst.Bytes, rst.Took, rst.Took
		if err != nil {
			return st, fmt.Errorf("move vGPU %d: %w", v.ID, err)
		}
		v.ctr.moves.Add(1)
		v.rebindParked() // the eviction's revoke; the deferred one is this move's
		src.paused(Pause{Kind: PauseMove, VGPU: v.ID, FromBoard: st.FromBoard, ToBoard: st.ToBoard,
			FromSlot: -1, ToSlot: st.ToSlot, Bytes: st.Bytes, Took: st.Downtime, Copy: st.Copy})
		return st, nil
	}
	if v.wedged > 0 {
		v.mu.Unlock()
		dst.freeHeld(to.Index)
		return st, fmt.Errorf("move vGPU %d: it has a channel out of service: %w", v.ID, ErrMoveUnsupported)
	}
	if lost, why := src.Lost(); lost {
		// Nothing of it can be saved from the dead board: it becomes a
		// lost device (lost.go), not a failed move that destroys it.
		v.mu.Unlock()
		dst.freeHeld(to.Index)
		return st, fmt.Errorf("move vGPU %d off board %s: %w: %s", v.ID, src.opts.BoardName, ErrBoardLost, why)
	}
	st.FromSlot, st.ToSlot = v.Slot.Index, to.Index
	if err := src.disp.quiesce(ctx, v); err != nil {
		v.mu.Unlock()
		dst.freeHeld(to.Index)
		return st, fmt.Errorf("move vGPU %d: waiting for its work in flight: %w", v.ID, err)
	}
	// From here on the vGPU is off the old board's dispatcher: it either
	// runs on the new slot or is destroyed.
	failed, err := v.move(src, dst, to, &st)
	if failed == "" {
		v.ctr.moves.Add(1)
		st.Downtime = time.Since(start)
		v.mu.Unlock()
		dst.install(v, to.Index)
		src.releaseMoved(v, st.FromSlot, dst)
		v.raiseIRQ() // a fence wait that slept through the pause looks again
		v.log.Info("vGPU moved", "from_board", st.FromBoard, "from_slot", st.FromSlot, "bytes", st.Bytes,
			"downtime", st.Downtime, "copy", st.Copy)
		src.paused(Pause{Kind: PauseMove, VGPU: v.ID, FromBoard: st.FromBoard, ToBoard: st.ToBoard,
			FromSlot: st.FromSlot, ToSlot: st.ToSlot, Bytes: st.Bytes, Took: st.Downtime, Copy: st.Copy})
		return st, nil
	}
	v.dead = true
	cur, _ := v.where()
	v.mu.Unlock()
	if cur == dst {
		// It left the old slot: that is renewed and freed; the teardown
		// finishes it on the new one.
		dst.install(v, to.Index)
		src.releaseMoved(v, st.FromSlot, dst)
	} else {
		dst.freeHeld(to.Index)
	}
	why := fmt.Sprintf("move of vGPU %d to board %s failed: %s", v.ID, dst.opts.BoardName, failed)
	v.log.Error("vGPU move failed: destroying it", "failed", failed, "err", err)
	return st, errors.Join(fmt.Errorf("move vGPU %d: %w: %s: %w", v.ID, ErrMoveDestroyed, failed, err), cur.Destroy(v, why))
}

// canMove checks that both boards can do what a move needs.
func canMove(src, dst *Aggregator) error {
	for _, a := range []*Aggregator{src, dst} {
		if _, ok := a.gpu.(ChannelStateMover); !ok {
			return fmt.Errorf("board %s cannot save channel state: %w", a.opts.BoardName, ErrMoveUnsupported)
		}
		if _, ok := a.gpu.(VRAMMover); !ok {
			return fmt.Errorf("board %s cannot copy VRAM: %w", a.opts.BoardName, ErrMoveUnsupported)
		}
	}
	return nil
}

// holdSlot takes a free slot of a for v (held, as attach holds it while
// building) and returns it narrowed to v's sizes, which the guest was told.
func (a *Aggregator) holdSlot(v *VGPU) (Slot, error) { return a.holdSlotPrefer(v, -1) }

// holdSlotPrefer is holdSlot that takes slot prefer if it is free.
func (a *Aggregator) holdSlotPrefer(v *VGPU, prefer int) (Slot, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	order := make([]int, 0, len(a.vgpus)+1)
	if prefer >= 0 && prefer < len(a.vgpus) {
		order = append(order, prefer)
	}
	for i := range a.vgpus {
		order = append(order, i)
	}
	for _, i := range order {
		u := a.vgpus[i]
		if u != nil || !a.slotFree(i) {
			continue
		}
		s := a.layout.Slots[i]
		if v.Slot.VRAM.Size > s.VRAM.Size || v.Slot.Chans > s.Chans || v.Slot.BAR1.Size > s.BAR1.Size || v.Slot.BAR3.Size > s.BAR3.Size {
			return Slot{}, fmt.Errorf("its slot is larger than board %s's: %w", a.opts.BoardName, ErrNoSlot)
		}
		s.VRAM.Size, s.Chans, s.BAR1.Size, s.BAR3.Size = v.Slot.VRAM.Size, v.Slot.Chans, v.Slot.BAR1.Size, v.Slot.BAR3.Size
		a.vgpus[i] = &VGPU{ID: v.ID, Slot: s, Guest: v.Guest}
		return s, nil
	}
	return Slot{}, ErrNoSlot
}

// freeHeld gives back a slot holdSlot took.
func (a *Aggregator) freeHeld(slot int) {
	a.mu.Lock()
	if u := a.vgpus[slot]; u != nil && u.agg == nil {
		a.vgpus[slot] = nil
	}
	a.mu.Unlock()
}

// install puts v in slot, which holdSlot held for it.
func (a *Aggregator) install(v *VGPU, slot int) {
	a.mu.Lock()
	a.vgpus[slot] = v
	a.mu.Unlock()
}

// releaseMoved renews v's old slot of a and frees it (the vGPU now lives
// in dst), and hands the domain's registered settings to dst.
func (a *Aggregator) releaseMoved(v *VGPU, slot int, dst *Aggregator) {
	err := a.cleanSlot(a.layout.Slots[slot].VRAM)
	a.mu.Lock()
	if a.vgpus[slot] == v {
		a.vgpus[slot] = nil
	}
	if err != nil {
		a.broken[slot] = fmt.Sprintf("renewing the slot %s (domid %d) left: %v", v.Guest.Name, v.Guest.DomID, err)
		a.log.Error("slot out of service", "slot", slot, "reason", a.broken[slot])
	}
	s, ok := a.domains[v.Guest.DomID]
	if ok && a != dst {
		delete(a.domains, v.Guest.DomID)
	}
	a.mu.Unlock()
	if ok && a != dst {
		dst.mu.Lock()
		dst.domains[v.Guest.DomID] = s
		dst.mu.Unlock()
	}
}

// hold stops the dispatcher releasing v's work (it still queues);
// unhold undoes it. Holds nest (count per vGPU id).
func (d *dispatcher) hold(v *VGPU) {
	d.mu.Lock()
	if d.held == nil {
		d.held = map[int]int{}
	}
	d.held[v.ID]++
	d.mu.Unlock()
}

func (d *dispatcher) unhold(v *VGPU) {
	d.mu.Lock()
	if d.held[v.ID]--; d.held[v.ID] <= 0 {
		delete(d.held, v.ID)
	}
	d.mu.Unlock()
	d.signal()
}

// drain waits, without v.mu (the guest runs; the watchdog may stop a
// submission), until none of v's work is in flight, or ctx is done.
// Called with v held.
func (d *dispatcher) drain(ctx context.Context, v *VGPU) error {
	for {
		d.mu.Lock()
		busy := false
		for _, s := range d.inflight {
			busy = busy || s.v == v
		}
		d.mu.Unlock()
		if !busy {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(moveQuiesceNap)
	}
}

// quiesce waits until none of v's work is in flight (v is held: none is
// released), then takes v off the dispatcher (its queued submissions are
// forgotten: the move queues them again from the guest's GP_PUTs). A
// submission the watchdog is stopping is stopped here, as the watchdog
// would (its goroutine waits for v.mu, which the caller holds). Called
// with v.mu held. On error (ctx done) nothing changed.
func (d *dispatcher) quiesce(ctx context.Context, v *VGPU) error {
	for {
		d.mu.Lock()
		var kill []int
		busy := false
		for _, s := range d.inflight {
			if s.v == v {
				busy = true
				if s.stopping && !s.void {
					kill = append(kill, s.ch)
				}
			}
		}
		if !busy {
			v.leftAccount = d.accounts[v.ID] // the next board's addVM carries its totals
			d.forget(v)
			d.mu.Unlock()
			d.signal()
			return nil
		}
		d.mu.Unlock()
		for _, ch := range kill {
			if v.chans[ch].running {
				_ = v.stopChannel(ch)
				v.reportKilled(ch)
				v.ctr.watchdogStops.Add(1)
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(moveQuiesceNap)
	}
}

// forget takes v off the dispatcher as removeVM and dropVM do, with
// nothing of it in flight. Called with d.mu held.
func (d *dispatcher) forget(v *VGPU) {
	for _, s := range d.queues[v.ID] {
		delete(d.pending, chanKey{v.ID, s.ch})
	}
	d.nqueued -= len(d.queues[v.ID])
	delete(d.queues, v.ID)
	d.dropVMPoints(v)
	delete(d.accounts, v.ID)
	_ = d.policy.RemoveVM(sched.VMID(v.ID), d.clock.Now())
	delete(d.ended, v)
}

// move does the work of Move with v.mu held and v off src's dispatcher.
// It returns "" on success, else what failed (v must then be destroyed).
func (v *VGPU) move(src, dst *Aggregator, to Slot, st *MoveStats) (failed string, err error) {
	from := src.layout.Slots[v.Slot.Index]
	// Every channel of the slot stopped, each running one's state saved
	// as the board left it (evict.go).
	imgs, chans, failed, err := v.stopSaving(src)
	if failed != "" {
		return failed, err
	}
	pv, err := v.exportPV()
	if err != nil {
		return "describing its PV page tables", err
	}
	defer pv.scrub()
	if failed, err := v.leaveBoard(src, chans); failed != "" {
		return failed, err
	}
	if err := copyVRAM(src, from.VRAM, dst, to.VRAM.Base, st); err != nil {
		return "copying its VRAM", err
	}
	if err := src.gpu.UnregisterSystemMemory(v.ramBase); err != nil {
		return "unregistering its RAM from the old board", err
	}
	v.ramBase = 0
	v.setPlace(dst, to)
	if v.ramBase, err = dst.gpu.RegisterSystemMemory(v.ram); err != nil {
		v.ramBase = 0
		return "registering its RAM with the new board", err
	}
	gets, err := v.rebuild(src, imgs, pv)
	if err != nil {
		return "rebuilding it on the new slot", err
	}
	if err := dst.disp.addVM(v, dst.weightFor(v.Guest)); err != nil {
		return "joining the new board's scheduler", err
	}
	v.rewireEnded(dst)
	v.requeue(gets)
	return "", nil
}

// leaveBoard drops everything v had on src's GPU, as a reset does, with
// its channels stopped: error routes (after a last collection), instance
// words, poll pages, BAR slices, remap entries, shadows (reclaimed after
// the TLB flushes).
func (v *VGPU) leaveBoard(src *Aggregator, chans []int) (string, error) {
	for i := range v.chans {
		v.chans[i].running, v.chans[i].inList = false, false
	}
	v.ctr.carried.add(v.shadows.Counters())
	errs := v.dropPhysicalState(src, chans)
	if v.remap != nil {
		// Move revoked the device model's mapping already: no access of
		// it reaches the old slice (or it did not answer and traps
		// everything); rebindRemap turns this off (remap_rebind.go).
		v.remapOff = true
	}
	errs = append(errs, v.shadows.Close())
	v.reclaim()
	src.mu.Lock() // VGPUs reads v.shadows under it
	v.shadows, v.bars = nil, [2]*barShadow{}
	src.mu.Unlock()
	if err := errors.Join(errs...); err != nil {
		return "stopping its use of the old board", err
	}
	return "", nil
}

// copyVRAM copies the pages of from (on src) in use to the slice at base on
// dst, at the bus DMA rate of each board.
func copyVRAM(src *Aggregator, from Region, dst *Aggregator, base uint64, st *MoveStats) error {
	out, in := src.gpu.(VRAMMover), dst.gpu.(VRAMMover)
	t0 := time.Now()
	defer func() { st.Copy = time.Since(t0) }()
	ranges, err := out.VRAMResidentRanges(from.Base, from.Size)
	if err != nil {
		return err
	}
	buf := make([]byte, moveChunk)
	for _, r := range ranges {
		for off := r.Base; off < r.End(); {
			n := min(uint64(len(buf)), r.End()-off)
			if err := out.ExportVRAM(buf[:n], off); err != nil {
				return err
			}
			if err := in.ImportVRAM(buf[:n], base+off-from.Base); err != nil {
				return err
			}
			st.Bytes += n
			off += n
		}
	}
	return nil
}

// rebuild builds v's physical state on its new slot from its guest-visible
// state: translator, shadows and BAR spaces; BAR instances, or for a PV
// vGPU its PV tables and apertures (pv); channels with their saved state
// (imgs, for those that ran). Called with v.mu held.
func (v *VGPU) rebuild(src *Aggregator, imgs [][]uint32, pv *pvImage) (gets []int64, err error) {
	a := v.agg
	gets = make([]int64, len(v.chans))
	for i := range gets {
		gets[i] = -1
	}
	if v.tr, err = shadow.NewTranslator(shadow.Layout{
		SliceBase: v.Slot.VRAM.Base, SliceSize: v.Slot.VRAM.Size,
		RAMBase: v.ramBase, RAMSize: uint64(len(v.ram)),
		Reserved: []shadow.Range{{Base: a.layout.Reserved.Base, Size: a.layout.Reserved.Size}},
	}); err != nil {
		return gets, err
	}
	m, err := shadow.NewManager(shadow.Config{
		Memory: a.gpu, Allocator: reserveAllocator{a.phys}, Translator: v.tr,
		MaxShadowBytes: a.shadowBudget,
		TrapUserAreas:  !v.feat.PollDoorbells,
		UserAreaWrite:  v.userAreaWritten,
	})
	if err != nil {
		return gets, err
	}
	src.mu.Lock() // VGPUs reads v.shadows under it; v is still in src's list
	v.shadows = m
	src.mu.Unlock()
	v.bars[0] = newBARShadow(v, nvc0.BAR1, &a.phys.bar1, v.Slot.BAR1)
	v.bars[1] = newBARShadow(v, nvc0.BAR3, &a.phys.bar3, v.Slot.BAR3)
	v.synced = map[*shadow.Space]bool{}
	v.stale = map[*shadow.Space]bool{}
	v.remapAt, v.remapStale = 0, true
	if v.feat.PV {
		if err := v.importPV(pv); err != nil {
			return gets, fmt.Errorf("PV page tables: %w", err)
		}
	} else {
		v.bars[0].setInst(v.emu[nvc0.RegBAR1Inst])
		v.bars[1].setInst(v.emu[nvc0.RegBAR3Inst])
	}
	restorer := a.gpu.(ChannelStateMover)
	var errs []error
	for i := range v.chans {
		c := &v.chans[i]
		inst, enabled, put := c.inst, c.enabled, c.put
		c.inst, c.enabled = 0, false
		if inst&nvc0.ChanInstValid == 0 {
			c.inst = inst
			continue
		}
		if err := v.setChannelInst(i, inst); err != nil {
			errs = append(errs, fmt.Errorf("channel %d: %w", i, err))
			continue
		}
		c.enabled = enabled
		if imgs[i] == nil {
			c.put = put
			continue
		}
		if c.sh.Dirty() {
			_ = c.sh.Refresh()
		}
		if !c.sh.Valid() {
			// As an enable would (setChannelCtl): a channel whose shadow
			// is not valid never starts. A running channel's always is;
			// a state image's is checked here.
			errs = append(errs, fmt.Errorf("channel %d: its instance is not valid: %v", i, c.sh.Err()))
			continue
		}
		v.startChannel(i)
		c.put = put
		if err := restorer.RestoreChannelState(v.phys(i), imgs[i]); err != nil {
			errs = append(errs, fmt.Errorf("channel %d: restore state: %w", i, err))
			continue
		}
		// The GPU's GP_PUT where its GP_GET is: nothing runs until the
		// dispatcher releases the guest's queued work again (requeue).
		get := imgs[i][chanImageGPGet]
		var b [4]byte
		binary.LittleEndian.PutUint32(b[:], get)
		if err := a.gpu.WriteVRAM(b[:], c.sh.ShadowUserArea()+nvc0.UserGPPut); err != nil {
			errs = append(errs, fmt.Errorf("channel %d: shadow GP_PUT: %w", i, err))
			continue
		}
		gets[i] = int64(get)
	}
	return gets, errors.Join(errs...)
}

// chanImageGPGet is the index of GP_GET in a channel state image (the
// simulated board's layout: version, flags, GP_GET, ...).
const chanImageGPGet = 2

// requeue rings, through the normal doorbell path, each running channel
// whose guest GP_PUT is ahead of where the GPU stopped (gets, -1: not
// restarted): the work the guest had queued, or had in flight when a
// submission the move waited for was cut short.
func (v *VGPU) requeue(gets []int64) {
	for i, get := range gets {
		if c := &v.chans[i]; get >= 0 && c.running && int64(c.put) != get {
			v.doorbell(i, c.put)
		}
	}
}
