package sim

import (
	"errors"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// ErrBusLost is what host-side VRAM access returns once the board fell off
// the bus (FailBus).
var ErrBusLost = errors.New("sim: the board fell off the bus")

// FailBus injects the failure of a GPU that fell off the bus (a surprise
// removal, a link down, a board that hung hard): from now on every MMIO read
// returns all ones, as a read of an absent PCI device does; writes are
// dropped; the engines stop — the entry a channel was running is abandoned,
// no submission completes, no report or interrupt is raised — and host-side
// VRAM access fails with ErrBusLost. Registering and unregistering system
// memory still work (they are the host's IOMMU bookkeeping, not the
// board's): unregistering a VM's RAM still waits out any DMA in flight, and
// after it the dead board can reach none of it. There is no way back but a
// new board.
func (b *Board) FailBus() {
	if !b.enter() {
		return
	}
	defer b.leave()
	if b.busLost.Swap(true) {
		return
	}
	for _, c := range b.chans {
		c.mu.Lock()
		if c.cancel != nil {
			c.cancel() // abandon the entry in progress; run sees busLost and stops
		}
		c.mu.Unlock()
	}
}

// BusLost reports whether FailBus was called.
func (b *Board) BusLost() bool { return b.busLost.Load() }

// ErrBusAnswers is what RepairBus returns for a board that never fell off
// the bus.
var ErrBusAnswers = errors.New("sim: the board is on the bus")

// RepairBus puts a board that fell off the bus back on it, as a reseated or
// power-cycled GPU comes back: every register at its power-on value (PMC
// engines off, BAR1 and BAR3 in direct mode, no poll area, no playlist,
// every channel's instance and control words zero, FECS idle, no error
// report latched), every TLB empty. VRAM is not cleared: DRAM across a
// power cycle holds undefined contents, and the sim keeps the stale ones —
// the hardest case for a driver, which must scrub what it hands out. It
// waits for the runs FailBus abandoned to end first. Counters and PTIMER
// go on.
func (b *Board) RepairBus() error {
	b.life.Lock() // no external operation is under way while the board comes back
	defer b.life.Unlock()
	if b.closed {
		return errClosed
	}
	if !b.busLost.Load() {
		return ErrBusAnswers
	}
	for _, c := range b.chans {
		c.mu.Lock()
		for c.running {
			c.done.Wait() // an abandoned run sees busLost and returns
		}
		c.inst, c.ctl, c.gpGet = 0, 0, 0
		c.inList, c.stopped, c.preempting, c.pending = false, false, false, false
		c.epoch++ // a fresh channel: no method state survives
		c.gen++
		c.mu.Unlock()
	}
	r := &b.r
	for _, a := range []interface{ Store(uint32) }{&r.pmcEnable, &r.praminWindow, &r.bar1Inst, &r.bar3Inst,
		&r.pollArea, &r.playlistAddr, &r.playlistSub, &r.preempt, &r.flushPD, &r.tlbTrigger, &r.mmuStatus,
		&r.sysmemFlush, &r.gpcMMUDebug[0], &r.gpcMMUDebug[1]} {
		a.Store(0)
	}
	r.bar1VM.Store(nil)
	r.bar3VM.Store(nil)
	r.fecs.mu.Lock()
	r.fecs.data, r.fecs.cmd, r.fecs.status, r.fecs.reglist, r.fecs.chanNext = 0, 0, 0, 0, 0
	r.fecs.rec = FECSRecord{}
	r.fecs.mu.Unlock()
	b.intr.Clear()
	b.mmu.flush(0, nvc0.TLBFlushAllPDB)
	b.busLost.Store(false)
	return nil
}
