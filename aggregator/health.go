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
// interval (plus one read); a guest write the aggregator refused checks at
// once (confirmBoard). Then:
//
//   - the aggregator stops using the board: register sequences that would
//     wait for the board (channel stops, TLB flushes, playlist updates,
//     FECS commands) fail at once with ErrBoardLost instead of running into
//     their timeouts;
//   - Options.OnLost is told (the host takes the board out of placement);
//   - every vGPU resident on it becomes a lost device (lost.go): its
//     guest's reads return all ones from then on, as the absent device's
//     would, until a reset brings it back; a pvdrm vGPU, which cannot be
//     reset in place, is destroyed with the reason (its device model gets a
//     Bye). Nothing waits on the dead board: its channels count as never
//     stopped, so its slots go out of service instead of to a new tenant;
//     each VM's RAM is unregistered from the board (the host side, which
//     waits out DMA in flight), so the dead board reaches none of it.
//   - a vGPU parked by eviction keeps its image: the host restarts it on
//     another board (SetRehome), or it waits, reading as absent, for a
//     reset to find it one or for its board to come back.
//
// Attaching to a lost board is refused. A board that answers again
// (reseated, power-cycled) is brought back by Reinit.

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
	boot0  uint32    // the board's identity, read at start
	reason string    // why, once lost
	at     time.Time // when it was found
	// settled: the vGPUs were all taken off the lost board (loseBoard is
	// done); Reinit waits for it.
	settled bool
	checks  atomic.Uint64
	reinits atomic.Uint64
	// reinitMu makes one Reinit at a time.
	reinitMu sync.Mutex
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

// healthLoop checks the board every interval until ctx ends. While the
// board is lost it reads nothing; after a Reinit it checks again.
func (a *Aggregator) healthLoop(ctx context.Context, interval time.Duration, boot0 uint32) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		a.CheckHealth(boot0)
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

// confirmBoard reads the board's identity now, off the health loop's
// beat (when the loop runs at all): a guest access the board failed under
// finds the board lost at once instead of within HealthInterval. Called
// with no vGPU's lock held (loseBoard takes them).
func (a *Aggregator) confirmBoard() {
	if a.opts.HealthInterval < 0 { // no health checks (0 is the default interval)
		return
	}
	a.health.mu.Lock()
	boot0 := a.health.boot0
	a.health.mu.Unlock()
	a.CheckHealth(boot0)
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
		if a.restartElsewhere(v) || v.Evicted() {
			continue // parked: its image is not on the board (lost.go)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			reason := fmt.Sprintf("the vGPU is lost: its GPU (board %s) stopped answering (%s)", name, why)
			if a.loseVGPU(v, reason) {
				return
			}
			if err := a.Destroy(v, reason); err != nil {
				v.log.Warn("vGPU on a lost board torn down", "err", err)
			}
		}()
	}
	wg.Wait()
	a.health.mu.Lock()
	a.health.settled = true
	a.health.mu.Unlock()
}

// ErrBoardSettling is returned by Reinit for a lost board whose vGPUs are
// still being taken off it: try again in a moment.
var ErrBoardSettling = errors.New("its vGPUs are still being taken off; try again")

// ErrBoardAnswers is returned by Reinit for a board that was never lost.
var ErrBoardAnswers = errors.New("the board was not lost")

// Reinit brings a lost board back into service once it answers again — a
// reseated or power-cycled GPU (the simulated board's RepairBus): it must
// read its identity again. The aggregator's own structures are built
// afresh in the reserve (BAR tables, playlists), every slot is renewed
// (scrubbed, and any outside mapping of its old slice revoked: the board's
// VRAM held stale contents and old mappings may survive), the slots out of
// service return to it, and the health checks resume. The vGPUs parked on
// it stay parked: a lost device comes back with its reset, an evicted one
// with its guest's next access. It fails, leaving the board lost, while the
// board still does not answer or while its vGPUs are still being taken off.
func (a *Aggregator) Reinit() error {
	a.health.reinitMu.Lock()
	defer a.health.reinitMu.Unlock()
	name := a.opts.BoardName
	a.health.mu.Lock()
	lost, settled, boot0 := a.health.lost.Load(), a.health.settled, a.health.boot0
	a.health.mu.Unlock()
	if !lost {
		return fmt.Errorf("reinitialise board %s: %w", name, ErrBoardAnswers)
	}
	// A board that does not answer cannot be brought back, whatever else
	// is under way: that is the first thing an operator needs to hear.
	if got := a.gpu.Read32(nvc0.BAR0, nvc0.RegBoot0); got != boot0 {
		return fmt.Errorf("reinitialise board %s: PMC_BOOT_0 reads %#08x, not the board's %#08x: %w", name, got, boot0, ErrBoardLost)
	}
	if !settled {
		return fmt.Errorf("reinitialise board %s: %w", name, ErrBoardSettling)
	}
	a.mu.Lock()
	for i, v := range a.vgpus {
		if v != nil {
			a.mu.Unlock()
			return fmt.Errorf("reinitialise board %s: slot %d is still held by vGPU %d", name, i, v.ID)
		}
	}
	a.mu.Unlock()
	if err := a.phys.reinit(); err != nil {
		return fmt.Errorf("reinitialise board %s: %w", name, err)
	}
	a.faults.reset()
	a.mu.Lock()
	for slot, k := range a.kept {
		// Its VRAM goes with the reinitialisation: whoever comes for it
		// finds no slot keeping it (its restore fails).
		a.log.Warn("kept VRAM lost: the board is reinitialised", "slot", slot, "domid", k.domid, "name", k.name)
		delete(a.kept, slot)
	}
	a.mu.Unlock()
	for i, s := range a.layout.Slots {
		if err := a.cleanSlot(s.VRAM); err != nil {
			a.phys.lost.Store(true)
			return fmt.Errorf("reinitialise board %s: renewing slot %d: %w", name, i, err)
		}
	}
	a.mu.Lock()
	clear(a.broken)
	a.mu.Unlock()
	a.health.mu.Lock()
	was := a.health.reason
	a.health.reason, a.health.settled = "", false
	a.health.lost.Store(false)
	a.health.mu.Unlock()
	a.health.reinits.Add(1)
	a.log.Info("board reinitialised: back in service", "was_lost", was)
	return nil
}

// Reinits counts the times the board was brought back by Reinit.
func (a *Aggregator) Reinits() uint64 { return a.health.reinits.Load() }
