// Package hwseq holds the short register sequences a Fermi driver performs,
// written once as nouveau performs them: TLB flush, playlist submission, FECS
// context bind, channel stop and preempt. Both the guest driver (on its virtual GPU) and
// the aggregator (on the physical one) run them, over gpu.MMIO.
package hwseq

import (
	"errors"
	"fmt"
	"time"

	"github.com/gpuvm/gpuvm/gpu"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// Errors a caller may classify with errors.Is.
var (
	ErrTimeout    = errors.New("timed out waiting for the GPU")
	ErrDeviceGone = errors.New("device reads all-ones: gone")
)

// GoneAfter is how long a register must keep reading all-ones
// (nvc0.ReadAllOnes) before Wait decides the device is gone. None of the
// status registers waited on reads all-ones on a live board, so this only
// rides out a glitch; the point is not to spend the whole timeout: a device
// model whose aggregator destroyed its vGPU reads all-ones from then on, and
// a driver tearing down (a preempt, then a playlist update) used to spend
// two full 10 s timeouts finding that out.
const GoneAfter = time.Millisecond

// Wait polls BAR0 register reg until cond holds or timeout passes. A register
// that keeps reading all-ones for GoneAfter means the device is gone
// (ErrDeviceGone), without waiting for the timeout.
func Wait(m gpu.MMIO, what string, reg uint32, timeout time.Duration, cond func(uint32) bool) error {
	start := time.Now()
	deadline := start.Add(timeout)
	var onesSince time.Time // zero: the last read was not all-ones
	for i := 0; ; i++ {
		// The time is taken before the read: the device is gone only if a
		// read that began GoneAfter after the first all-ones one still
		// reads all-ones (a pause between a read and this check proves
		// nothing).
		at := time.Now()
		v := m.Read32(nvc0.BAR0, uint64(reg))
		if cond(v) {
			return nil
		}
		if v != nvc0.ReadAllOnes {
			onesSince = time.Time{}
		} else if onesSince.IsZero() {
			onesSince = at
		} else if at.Sub(onesSince) >= min(GoneAfter, timeout) {
			return fmt.Errorf("%s: %w", what, ErrDeviceGone)
		}
		if i&63 == 63 && time.Now().After(deadline) {
			return fmt.Errorf("%s (reg %#x = %#x): %w", what, reg, v, ErrTimeout)
		}
	}
}

func wr(m gpu.MMIO, reg, v uint32) { m.Write32(nvc0.BAR0, uint64(reg), v) }

// FlushTLB invalidates cached translations of the address space whose page
// directory is at pd (bar: the BAR1/BAR3 spaces), following nouveau's gf100
// sequence: wait for a free flush slot, write the page directory and the
// trigger, wait for the flush to complete. Callers serialise flushes.
func FlushTLB(m gpu.MMIO, pd uint64, bar bool, timeout time.Duration) error {
	if err := Wait(m, "TLB flush slot", nvc0.RegMMUStatus, timeout, func(v uint32) bool { return v&nvc0.MMUStatusFreeSlots != 0 }); err != nil {
		return err
	}
	typ := uint32(nvc0.TLBFlushTypeVM)
	if bar {
		typ = nvc0.TLBFlushTypeBAR
	}
	wr(m, nvc0.RegTLBFlushPD, nvc0.TLBFlushPDEncode(pd))
	wr(m, nvc0.RegTLBFlushTrigger, nvc0.TLBFlushTrigger|typ)
	return Wait(m, "TLB flush", nvc0.RegMMUStatus, timeout, func(v uint32) bool { return v&nvc0.MMUStatusFlushDone != 0 })
}

// SubmitPlaylist points PFIFO at a playlist of count entries at VRAM address
// addr and waits until the update is no longer pending.
func SubmitPlaylist(m gpu.MMIO, addr uint64, count int, timeout time.Duration) error {
	wr(m, nvc0.RegPlaylistAddr, nvc0.PlaylistAddrEncode(addr))
	wr(m, nvc0.RegPlaylistSubmit, nvc0.PlaylistSubmitEncode(count))
	return Wait(m, "playlist update", nvc0.RegPlaylistStatus, timeout, func(v uint32) bool { return v&nvc0.PlaylistPending == 0 })
}

// FECSBind asks the context-switch firmware to bind the graphics/compute
// context of the channel whose instance block is at ramin.
func FECSBind(m gpu.MMIO, ramin uint64, timeout time.Duration) error {
	return FECSCommand(m, nvc0.FECSCmdBindPointer, nvc0.InstEncode(ramin, nvc0.FECSBindValid), timeout)
}

// FECSCommand runs a FECS command with its data word and waits until FECS
// reports it done.
func FECSCommand(m gpu.MMIO, cmd, data uint32, timeout time.Duration) error {
	wr(m, nvc0.RegFECSClear, nvc0.FECSDone)
	wr(m, nvc0.RegFECSData, data)
	wr(m, nvc0.RegFECSCmd, cmd)
	return Wait(m, fmt.Sprintf("FECS command %#x", cmd), nvc0.RegFECSStatus, timeout, func(v uint32) bool { return v&nvc0.FECSDone != 0 })
}

// FECSQuery runs a FECS size query (nvc0.FECSCmdImageSize and the like)
// and returns the answer, as gf100_gr_fecs_ctx_size does: clear the
// mailbox, issue the command, wait for a non-zero value.
func FECSQuery(m gpu.MMIO, cmd uint32, timeout time.Duration) (uint32, error) {
	wr(m, nvc0.RegFECSStatus, 0)
	wr(m, nvc0.RegFECSData, 0)
	wr(m, nvc0.RegFECSCmd, cmd)
	if err := Wait(m, fmt.Sprintf("FECS query %#x", cmd), nvc0.RegFECSStatus, timeout, func(v uint32) bool { return v != 0 }); err != nil {
		return 0, err
	}
	return m.Read32(nvc0.BAR0, nvc0.RegFECSStatus), nil
}

// DisableChannel clears channel ch's enable bit, as nouveau's
// gf100_chan_stop does: the channel fetches nothing new, but what it runs
// keeps running until it is preempted.
func DisableChannel(m gpu.MMIO, ch int) {
	ctl := m.Read32(nvc0.BAR0, uint64(nvc0.ChanCtl(ch)))
	wr(m, nvc0.ChanCtl(ch), ctl&^nvc0.ChanCtlEnable)
}

// Preempt takes channel ch's context off the engines (gf100_chan_preempt)
// and waits until the preempt is no longer pending
// (gf100_runl_preempt_pending). Callers serialise preempts: the register is
// one for the whole board.
func Preempt(m gpu.MMIO, ch int, timeout time.Duration) error {
	wr(m, nvc0.RegPreempt, uint32(ch))
	return Wait(m, fmt.Sprintf("preempt of channel %d", ch), nvc0.RegPreempt, timeout,
		func(v uint32) bool { return v&nvc0.PreemptPending == 0 })
}

// StopChannel stops channel ch: DisableChannel, then Preempt. When it
// returns nil the channel runs nothing and fetches nothing; a driver then
// takes it off the playlist and may reuse what it used.
func StopChannel(m gpu.MMIO, ch int, timeout time.Duration) error {
	DisableChannel(m, ch)
	return Preempt(m, ch, timeout)
}
