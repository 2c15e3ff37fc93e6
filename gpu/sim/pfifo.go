package sim

import (
	"context"
	"errors"
	"sync"

	"github.com/gpuvm/gpuvm/gpu/errreport"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// PFIFO: the channel table, the playlist, doorbells and the per-channel
// workers that fetch GPFIFO entries.
//
// A channel is schedulable when its instance word is valid, its control word
// has ChanCtlEnable, it is in the last submitted playlist, and it has not
// stopped on an error or being preempted. A doorbell (a GP_PUT write through the poll
// area) marks it as having work; its worker (one goroutine per channel,
// started on first use) then reads the RAMIN, and executes the GPFIFO entries
// from GP_GET to GP_PUT, publishing GP_GET after each entry's work is done.

// fifoState is board-wide PFIFO state (beyond the registers).
type fifoState struct {
	playlistMu sync.Mutex // serialises playlist submissions
}

// channel is one PFIFO channel.
type channel struct {
	b    *Board
	id   int
	kick chan struct{} // wakes the worker; buffered, never blocks

	mu         sync.Mutex
	done       *sync.Cond // signalled (with mu) when a run ends
	inst       uint32     // instance word as written
	ctl        uint32     // control word as written
	inList     bool       // in the last submitted playlist
	stopped    bool       // faulted: fetches nothing more until re-enabled
	preempting bool       // a preempt is waiting for the current run to end
	pending    bool       // a doorbell's work is not finished
	running    bool       // the worker is inside a run
	started    bool       // the worker goroutine exists
	bells      uint64     // doorbell generation
	epoch      uint64     // bumped by enable: a fresh channel (no method state)
	gen        uint64     // bumped by enable and preempt: a run of an older generation is void
	gpGet      uint32
	cancel     context.CancelFunc // cancels the current run: its waits and its engine operation

	// State of the current run and of the methods, owned by the worker.
	ramin      uint64 // the instance block the run started from
	instWord   uint32 // its channel-table word
	user       uint64 // the user area (VRAM) it names
	stateEpoch uint64
	subc       [nvc0.NumSubchannels]uint32
	sem        semState
	compute    computeState
	copy       [nvc0.NumCopyEngines]copyState
}

func newChannel(b *Board, id int) *channel {
	c := &channel{b: b, id: id, kick: make(chan struct{}, 1)}
	c.done = sync.NewCond(&c.mu)
	return c
}

// schedulable reports whether the channel may fetch work. Call with mu held.
func (c *channel) schedulable() bool {
	return c.inst&nvc0.ChanInstValid != 0 && c.ctl&nvc0.ChanCtlEnable != 0 &&
		c.inList && !c.stopped && !c.preempting
}

func (c *channel) readInst() uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.inst
}

// writeInst stores the instance word. A valid word naming memory other than
// VRAM is refused: it is stored without VALID and raises a channel-table
// error (INVALID_TARGET) as the hardware does for a target it cannot use.
func (c *channel) writeInst(v uint32) {
	if v&nvc0.ChanInstValid != 0 && nvc0.InstTarget(v) != nvc0.MemTargetVRAM {
		v &^= nvc0.ChanInstValid
		c.b.chanTableError(nvc0.ChanTableErrInvalidTarget)
	}
	c.mu.Lock()
	c.inst = v
	wake := c.schedulable() && c.pending
	c.mu.Unlock()
	if wake {
		c.wake()
	}
}

// readCtl returns the control word with ChanCtlPending set while the
// channel has work not done: a doorbell not yet served, a run in progress,
// or work left behind by an error.
func (c *channel) readCtl() uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	v := c.ctl &^ nvc0.ChanCtlPending
	if c.stopped || c.pending || c.running {
		v |= nvc0.ChanCtlPending
	}
	return v
}

// writeCtl stores the control word. Enabling a disabled channel makes it a
// fresh channel: GP_GET (in the channel and in its user area) is 0, any stop
// is forgotten and the subchannel bindings are cleared.
func (c *channel) writeCtl(v uint32) {
	c.mu.Lock()
	old := c.ctl
	c.ctl = v &^ nvc0.ChanCtlPending
	enabling := old&nvc0.ChanCtlEnable == 0 && v&nvc0.ChanCtlEnable != 0
	if enabling {
		c.epoch++
		c.gen++
		c.gpGet = 0
		c.stopped = false
		c.pending = false
		if c.inst&nvc0.ChanInstValid != 0 {
			if user, ok := c.b.userArea(nvc0.InstDecode(c.inst)); ok {
				c.b.physWrite32(phys{addr: user + nvc0.UserGPGet}, 0)
			}
		}
	}
	wake := c.schedulable() && c.pending
	c.mu.Unlock()
	if wake {
		c.wake()
	}
}

// userArea returns the VRAM address of the user area named by a RAMIN; ok
// is false if it names another memory target.
func (b *Board) userArea(ramin uint64) (addr uint64, ok bool) {
	addr, target := nvc0.RAMINAddrDecode(b.vramRead32(ramin+nvc0.RAMINUserLo), b.vramRead32(ramin+nvc0.RAMINUserHi))
	return addr, target == nvc0.MemTargetVRAM
}

// chanTableError latches a channel-table error (PFIFO_INTR bit 0, code in
// RegChanTableError).
func (b *Board) chanTableError(code uint32) {
	b.intr.ChanTableError(code)
}

// doorbell records that channel ch has new work and wakes its worker.
func (b *Board) doorbell(ch int) {
	if ch < 0 || ch >= len(b.chans) {
		return
	}
	b.st.doorbells.Add(1)
	c := b.chans[ch]
	c.mu.Lock()
	c.bells++
	wake := false
	if !c.stopped {
		c.pending = true
		wake = c.schedulable()
	}
	c.mu.Unlock()
	if wake {
		c.wake()
	}
}

// wake starts the worker if needed and pokes it. Callers are inside an MMIO
// access (holding the board's life lock).
func (c *channel) wake() {
	c.mu.Lock()
	if !c.started {
		c.started = true
		c.b.goTracked(c.worker)
	}
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// submitPlaylist replaces the set of schedulable channels with the count
// entries of the playlist RegPlaylistAddr names. A playlist outside VRAM is
// refused with a scheduler error and changes nothing.
func (b *Board) submitPlaylist(reg uint32, count int) {
	addr, target := nvc0.PlaylistAddrDecode(reg)
	if target != nvc0.MemTargetVRAM {
		b.intr.SchedError(nvc0.SchedErrorInvalidTarget)
		return
	}
	b.fifo.playlistMu.Lock()
	defer b.fifo.playlistMu.Unlock()
	in := make([]bool, len(b.chans))
	for i := range count {
		ch := b.vramRead32(addr + uint64(i)*nvc0.PlaylistEntrySize)
		if int(ch) < len(in) {
			in[ch] = true
		}
	}
	for i, c := range b.chans {
		c.mu.Lock()
		c.inList = in[i]
		wake := c.schedulable() && c.pending
		c.mu.Unlock()
		if wake {
			c.wake()
		}
	}
	b.intr.RunlistDone()
}

// preempt takes channel v's context off the engines (RegPreempt): its
// current run ends at the next method boundary and the engine operation in
// progress is abandoned — a kernel stops at its next check between blocks
// of work, a copy between pages, a semaphore wait at once. GP_GET keeps the
// index of the interrupted entry. RegPreempt reads PreemptPending until the
// run has ended. A channel still enabled, listed and with work pending is
// rescheduled afterwards and restarts the interrupted entry.
//
// On a GF100 a preempt waits for the engine to reach a context-switch
// point; a compute grid is not one, so nouveau falls back to its recovery
// (a context-switch timeout, then an MMU fault on the engine and an engine
// reset). The board folds that recovery into the preempt.
func (b *Board) preempt(v uint32) {
	ch := int(v & nvc0.PreemptChanMask)
	if v&^uint32(nvc0.PreemptChanMask) != 0 || ch >= len(b.chans) {
		b.r.preempt.Store(v &^ nvc0.PreemptPending)
		return
	}
	b.r.preempt.Store(uint32(ch) | nvc0.PreemptPending)
	c := b.chans[ch]
	c.mu.Lock()
	c.gen++
	if c.cancel != nil {
		c.cancel()
	}
	running := c.running
	c.preempting = running
	c.mu.Unlock()
	finish := func() {
		c.mu.Lock()
		for c.running {
			c.done.Wait()
		}
		c.preempting = false
		wake := c.schedulable() && c.pending
		c.mu.Unlock()
		b.st.preempts.Add(1)
		b.r.preempt.CompareAndSwap(uint32(ch)|nvc0.PreemptPending, uint32(ch))
		if wake {
			c.wake()
		}
	}
	if !running {
		finish()
		return
	}
	b.goTracked(finish)
}

// reportFault files an MMU fault record for the fault's unit (PFIFO_INTR
// bit 28 and RegFaultUnitMask follow). inst is the instance word of the
// faulting context: address >> 12 and target.
func (b *Board) reportFault(inst uint32, fe *faultError) {
	src := fe.source()
	typ := fe.reason&nvc0.FaultTypeReasonMask | (src.client&nvc0.FaultTypeClientMask)<<nvc0.FaultTypeClientShift
	if src.hub {
		typ |= nvc0.FaultTypeHub
	}
	if fe.write {
		typ |= nvc0.FaultTypeWrite
	}
	b.intr.AddFault(src.unit, errreport.Fault{
		Inst: inst & (nvc0.ChanInstMask | 3<<nvc0.ChanInstTargetShift),
		VALo: uint32(fe.va), VAHi: uint32(fe.va >> 32), Type: typ,
	})
}

// reportMethodError files a PBDMA error for channel ch.
func (b *Board) reportMethodError(ch int, me *methodError) {
	b.intr.AddPBDMA(me.pbdma, errreport.PBDMAError{
		Intr:   me.intr,
		Method: nvc0.PBDMAMethodValid | me.subc<<nvc0.PBDMAMethodSubcShift | me.method&nvc0.PBDMAMethodMask,
		Data:   me.data,
		Chan:   uint32(ch)&nvc0.PBDMAChanMask | nvc0.PBDMAChanActive,
	})
}

// worker is the channel's goroutine.
func (c *channel) worker() {
	for {
		select {
		case <-c.b.ctx.Done():
			return
		case <-c.kick:
		}
		c.run()
	}
}

// run executes the channel's GPFIFO entries until GP_GET reaches GP_PUT, the
// channel stops being schedulable, or an error stops it.
func (c *channel) run() {
	b := c.b
	c.mu.Lock()
	if !c.schedulable() || b.busLost.Load() {
		c.mu.Unlock()
		return
	}
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	c.running, c.cancel = true, cancel
	bells, epoch, gen, get, inst := c.bells, c.epoch, c.gen, c.gpGet, c.inst
	c.mu.Unlock()

	idle := false
	defer func() {
		c.mu.Lock()
		c.running, c.cancel = false, nil
		// The ring was found empty: every doorbell before the run is
		// served. A preempt since (gen) does not undo that — the work is
		// done, and a stopped channel must not read as having any (a
		// host's stop lands just after a run's last GP_GET); a re-enable
		// (epoch) made a fresh channel, whose flag is its own.
		if idle && c.bells == bells && c.epoch == epoch {
			c.pending = false
		}
		c.done.Broadcast()
		c.mu.Unlock()
	}()

	ramin := nvc0.InstDecode(inst)
	if sig := b.vramRead32(ramin + nvc0.RAMINSignature); sig&nvc0.RAMINSignatureMask != nvc0.RAMINSignatureValue {
		c.fail(gen, inst, &methodError{pbdma: nvc0.PBDMAGR, intr: nvc0.PBDMAIntrSigMismatch, data: sig})
		return
	}
	user, ok := b.userArea(ramin)
	if !ok {
		c.fail(gen, inst, &faultError{reason: nvc0.FaultReasonTargetUnsupported})
		return
	}
	ringVA, entries := nvc0.GPFIFODecode(b.vramRead32(ramin+nvc0.RAMINGPFIFOLo), b.vramRead32(ramin+nvc0.RAMINGPFIFOHi))
	v, err := b.vmFromRAMIN(ramin, false)
	if err != nil {
		c.fail(gen, inst, err)
		return
	}
	c.ramin, c.instWord, c.user = ramin, inst, user
	if c.stateEpoch != epoch { // a fresh channel: no bindings, no method state
		c.stateEpoch = epoch
		c.subc = [nvc0.NumSubchannels]uint32{}
		c.sem, c.compute, c.copy = semState{}, computeState{}, [nvc0.NumCopyEngines]copyState{}
	}
	for {
		if b.busLost.Load() {
			return // fell off the bus: nothing more runs, nothing is reported
		}
		put, ok := b.physRead32(phys{addr: user + nvc0.UserGPPut})
		if !ok {
			c.fail(gen, inst, &faultError{va: user, reason: nvc0.FaultReasonNoMemory})
			return
		}
		if put >= entries {
			c.fail(gen, inst, &methodError{va: ringVA, pbdma: nvc0.PBDMAGR, intr: nvc0.PBDMAIntrIBPutOverflow, data: put})
			return
		}
		if put == get {
			idle = true
			return
		}
		c.mu.Lock()
		ok = c.schedulable() && c.gen == gen
		c.mu.Unlock()
		if !ok {
			return
		}
		end, err := c.entry(ctx, v, ringVA+uint64(get)*nvc0.GPFIFOEntrySize)
		if err != nil {
			if ctx.Err() == nil && !b.busLost.Load() {
				c.fail(gen, inst, err)
			}
			return // otherwise cancelled: preempted or board closing
		}
		get = (get + 1) % entries
		c.mu.Lock()
		// The entry's work is done (its fence may be visible already): a
		// preempt that came after it does not take it back — it would run
		// again on resume — only a re-enable (a fresh channel) voids it.
		if c.epoch != epoch {
			c.mu.Unlock()
			return
		}
		c.gpGet = get
		// Counted before GP_GET moves: whoever sees GP_GET move sees the
		// entry counted. DMA_GET (and its high word) follow the push-buffer
		// fetch; GP_GET last, so whoever sees GP_GET move sees DMA_GET of
		// that entry.
		b.st.gpEntries.Add(1)
		b.physWrite32(phys{addr: user + nvc0.UserDMAGet}, uint32(end))
		b.physWrite32(phys{addr: user + nvc0.UserDMAGetHi}, uint32(end>>32))
		b.physWrite32(phys{addr: user + nvc0.UserGPGet}, get)
		c.mu.Unlock()
		if b.afterPublish != nil {
			b.afterPublish(c.id)
		}
	}
}

// entry fetches and executes the push buffer of the GPFIFO entry at va, and
// returns the address just past the push buffer.
func (c *channel) entry(ctx context.Context, v *vm, va uint64) (uint64, error) {
	var e [nvc0.GPFIFOEntrySize]byte
	if err := c.b.vmRead(v, e[:], va); err != nil {
		return 0, err
	}
	pbVA, words := nvc0.GPFIFODecodeEntry(load32(e[:4]), load32(e[4:]))
	if words == 0 {
		return 0, &methodError{va: va, pbdma: nvc0.PBDMAGR, intr: nvc0.PBDMAIntrIBEntryInvalid, data: load32(e[4:])}
	}
	pb := make([]byte, uint64(words)*4)
	if err := c.b.vmRead(v, pb, pbVA); err != nil {
		return 0, err
	}
	return pbVA + uint64(words)*4, c.exec(ctx, v, pbVA, pb)
}

// fail stops the channel (unless a preempt or re-enable overtook the run)
// and reports the error: an MMU fault record, or a PBDMA error.
func (c *channel) fail(gen uint64, inst uint32, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen != gen {
		return
	}
	// Report before stopping, so whoever sees the channel stopped finds the report.
	var fe *faultError
	var me *methodError
	switch {
	case errors.As(err, &fe):
		c.b.reportFault(inst, fe)
	case errors.As(err, &me):
		c.b.reportMethodError(c.id, me)
	default:
		return
	}
	c.stopped = true
	c.pending = false
	c.b.st.chanFaults.Add(1)
}
