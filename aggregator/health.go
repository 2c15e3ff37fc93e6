package aggregator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// A board that falls off the bus (a surprise removal, a link down, a hard
// hang) answers every read with all ones and does nothing it is told. The
// aggregator finds out by reading PMC_BOOT_0 — the chip's identity, which
// nothing changes — every HealthInterval: a board that no longer returns
// the identity it had at start is lost. Detection is bounded by one
// interval (plus one read). Then:
//
//   - the aggregator stops using the board: register sequences that would
//     wait for the board (channel stops, TLB flushes, playlist updates,
//     FECS commands) fail at once with ErrBoardLost instead of running into
//     their timeouts;
//   - Options.OnLost is told (the host takes the board out of placement);
//   - every vGPU on it is destroyed with the reason: its device model gets
//     a Bye saying the GPU was lost, and the guest's reads return all ones
//     from then on, as the absent device's would. Nothing waits on the
//     dead board: its channels count as never stopped, so its slots go out
//     of service instead of to a new tenant; each VM's RAM is unregistered
//     from the board (the host side, which waits out DMA in flight), so the
//     dead board reaches none of it.
//
// Attaching to a lost board is refused.

// ErrBoardLost is the error of every operation on a board that stopped
// answering.
var ErrBoardLost = errors.New("the board stopped answering (fell off the bus)")

// DefaultHealthInterval is how often the board's identity is read unless
// Options.HealthInterval says otherwise: often enough that a lost board is
// found long before a guest's fence wait gives up (the guest driver's
// default is seconds), rarely enough that the reads cost nothing measurable
// (one MMIO read, ~1 µs on the fermi timing profile, per 100 ms).
const DefaultHealthInterval = 100 * time.Millisecond

// health is the aggregator's view of its board's liveness.
type health struct {
	lost   atomic.Bool
	mu     sync.Mutex
	reason string    // why, once lost
	at     time.Time // when it was found
	checks atomic.Uint64
}

// Lost reports whether the board was found lost, and why.
func (a *Aggregator) Lost() (bool, string) {
	if !a.health.lost.Load() {
		return false, ""
	}
	a.health.mu.Lock()
	defer a.health.mu.Unlock()
	return true, a.health.reason
}

// HealthChecks counts the identity reads made so far.
func (a *Aggregator) HealthChecks() uint64 { return a.health.checks.Load() }

// healthLoop checks the board every interval until ctx ends or the board is
// lost.
func (a *Aggregator) healthLoop(ctx context.Context, interval time.Duration, boot0 uint32) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if a.CheckHealth(boot0) {
			return
		}
	}
}

// CheckHealth reads the board's identity once and, if it is not boot0 any
// more, declares the board lost. It reports whether the board is lost.
func (a *Aggregator) CheckHealth(boot0 uint32) bool {
	if a.health.lost.Load() {
		return true
	}
	a.health.checks.Add(1)
	got := a.gpu.Read32(nvc0.BAR0, nvc0.RegBoot0)
	if got == boot0 {
		return false
	}
	what := fmt.Sprintf("PMC_BOOT_0 reads %#08x, not the board's %#08x", got, boot0)
	if got == 0xFFFFFFFF {
		what = "every read returns all ones: the board fell off the bus"
	}
	a.loseBoard(what)
	return true
}

// loseBoard declares the board lost and takes every vGPU off it.
func (a *Aggregator) loseBoard(why string) {
	a.health.mu.Lock()
	if a.health.lost.Load() {
		a.health.mu.Unlock()
		return
	}
	a.health.reason, a.health.at = why, time.Now()
	a.health.lost.Store(true)
	a.phys.lost.Store(true)
	a.health.mu.Unlock()
	a.log.Error("board lost", "reason", why)
	if a.opts.OnLost != nil {
		a.opts.OnLost(why)
	}
	name := a.opts.BoardName
	if name == "" {
		name = fmt.Sprint(a.opts.Board)
	}
	var wg sync.WaitGroup
	for _, v := range a.VGPUs() {
		if a.restartElsewhere(v) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			reason := fmt.Sprintf("the vGPU is lost: its GPU (board %s) stopped answering (%s)", name, why)
			if err := a.Destroy(v, reason); err != nil {
				v.log.Warn("vGPU on a lost board torn down", "err", err)
			}
		}()
	}
	wg.Wait()
}
