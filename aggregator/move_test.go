package aggregator

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
)

// twoBoards is two aggregators of one host sharing a registry, as package
// host builds them.
func twoBoards(t *testing.T, maxVMs int) (a, b *Aggregator, ba, bb *sim.Board) {
	t.Helper()
	reg := NewRegistry()
	a, ba = newTestAggregatorWith(t, Options{MaxVMs: maxVMs, Registry: reg, Board: 0, BoardName: "a"})
	b, bb = newTestAggregatorWith(t, Options{MaxVMs: maxVMs, Registry: reg, Board: 1, BoardName: "b"})
	return a, b, ba, bb
}

// workloadLoop runs passes until stop is set (at least one), counting
// them; the first error ends it. A pass is four madds on ctx, a context
// kept open across passes (so a move finds its channel running, with work
// queued or in flight), then every workload once (each in a context of its
// own). Every result is verified.
func workloadLoop(g *guestVM, ctx *gdev.Context, stop *atomic.Bool, passes *atomic.Int64) error {
	return workloadLoopOn(gdev.Nouveau(g.dev), ctx, stop, passes)
}

// workloadLoopOn is workloadLoop through driver drv (ctx one of its
// contexts): a guest driver, or a pvdrm front end.
func workloadLoopOn(drv gdev.Driver, ctx *gdev.Context, stop *atomic.Bool, passes *atomic.Int64) error {
	for {
		for range 4 {
			if err := maddOnce(ctx, 48); err != nil {
				return fmt.Errorf("madd: %w", err)
			}
		}
		for _, name := range workloads.Names() {
			w, err := workloads.New(name, smallParams)
			if err != nil {
				return err
			}
			if _, err := w.Run(drv); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
		passes.Add(1)
		if stop.Load() {
			return nil
		}
	}
}

// openContext opens a gdev context on g, closed at the test's end.
func openContext(t *testing.T, g *guestVM) *gdev.Context {
	t.Helper()
	ctx, err := gdev.NewContext(g.dev)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctx.Close() })
	return ctx
}

// slotClean reports whether a slot of board bd holds no page (reads zeros).
func slotClean(t *testing.T, agg *Aggregator, bd *sim.Board, slot int) bool {
	t.Helper()
	s := agg.Layout().Slots[slot].VRAM
	r, err := bd.VRAMResidentRanges(s.Base, s.Size)
	if err != nil {
		t.Fatal(err)
	}
	return len(r) == 0
}

// workEnded waits until g's work has ended on the aggregator its vGPU is
// on: none of it queued or in flight, so each submission's GP_GET reached
// its put (or its channel was stopped), and the board counted its entries.
// The guest's fence passes inside an entry (its semaphore release), before
// the board publishes GP_GET and counts the entry: a count read as soon as
// the guest saw its last fence may miss that entry.
func workEnded(t *testing.T, g *guestVM) {
	t.Helper()
	busy := func() bool {
		agg, _ := g.v.where()
		d := agg.disp
		d.mu.Lock()
		defer d.mu.Unlock()
		if len(d.queues[g.v.ID]) > 0 {
			return true
		}
		for _, s := range d.inflight {
			if s.v == g.v {
				return true
			}
		}
		return false
	}
	// A hang guard, not a bound on the board's speed.
	for deadline := time.Now().Add(time.Minute); busy(); time.Sleep(100 * time.Microsecond) {
		if time.Now().After(deadline) {
			t.Fatal("the guest's work was still queued or in flight a minute after its last fence")
		}
	}
}

// A VM computing without pause is moved between two boards and back, and to
// another slot of one board, while its workloads run: each of them
// verifies, its id stays, and every slot it left holds nothing.
//
// The GPU must run each GPFIFO entry the guest submitted exactly once: a
// channel re-created on the new board without its state would run its ring
// again from entry 0 (results of idempotent work would still verify), so the
// entries both boards ran are counted against a run of the same passes on
// one board without moves.
func TestMoveRunningVGPU(t *testing.T) {
	modes := []string{"fv-naive", "fv-optimized", "fv-incremental", "pv-naive", "pv-multicall"}
	if testing.Short() {
		// A full-virtualization and a PV mode (the race run's: each mode
		// takes half a minute there); the plain run moves every one.
		modes = []string{"fv-optimized", "pv-multicall"}
	}
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			// The baseline: GPFIFO entries of the driver's open, and of one
			// pass over the workloads.
			base, bbase := newTestAggregator(t, 1)
			g0 := startGuest(t, base, "mover", mode)
			ctx0 := openContext(t, g0)
			workEnded(t, g0)
			open := bbase.Stats().GPFIFOEntries
			var stop0 atomic.Bool
			var runs0 atomic.Int64
			stop0.Store(true)
			if err := workloadLoop(g0, ctx0, &stop0, &runs0); err != nil {
				t.Fatal(err)
			}
			workEnded(t, g0)
			perPass := bbase.Stats().GPFIFOEntries - open // one pass

			a, b, ba, bb := twoBoards(t, 2)
			g := startGuest(t, a, "mover", mode)
			ctx := openContext(t, g)
			id := g.v.ID
			var stop atomic.Bool
			var runs atomic.Int64
			done := make(chan error, 1)
			go func() { done <- workloadLoop(g, ctx, &stop, &runs) }()
			// The control API's readers run while the vGPU moves (for the
			// race detector): its info, board, scheduler account, lists.
			watched := make(chan struct{})
			go func() {
				defer close(watched)
				for !stop.Load() {
					_ = g.v.Info()
					_, _ = g.v.Board()
					_ = a.Infos()
					_ = b.VGPUs()
					time.Sleep(100 * time.Microsecond)
				}
			}()
			defer func() { stop.Store(true); <-watched }()
			type hop struct {
				to    *Aggregator
				board *sim.Board
			}
			hops := []hop{{b, bb}, {a, ba}, {a, ba}, {b, bb}}
			var moved uint64
			for i, h := range hops {
				// Let the guest get some work going on its board first.
				for want := runs.Load() + 1; runs.Load() < want; {
					select {
					case err := <-done:
						t.Fatalf("workloads ended before hop %d: %v", i, err)
					default:
						time.Sleep(time.Millisecond)
					}
				}
				from, fromSlot := g.v.where()
				st, err := Move(context.Background(), g.v, h.to)
				if err != nil {
					t.Fatalf("hop %d: %v", i, err)
				}
				moved += st.Bytes
				t.Logf("hop %d: %s/%d -> %s/%d, %d KiB, downtime %v (copy %v)", i, st.FromBoard, st.FromSlot, st.ToBoard, st.ToSlot, st.Bytes>>10, st.Downtime, st.Copy)
				if g.v.ID != id {
					t.Fatalf("hop %d: id %d, was %d", i, g.v.ID, id)
				}
				if cur, _ := g.v.where(); cur != h.to {
					t.Fatalf("hop %d: not on the target board", i)
				}
				fromBoard := ba
				if from == b {
					fromBoard = bb
				}
				if !slotClean(t, from, fromBoard, fromSlot.Index) {
					t.Fatalf("hop %d: the slot it left still holds pages", i)
				}
				for _, v := range from.VGPUs() {
					if v == g.v && from != h.to {
						t.Fatalf("hop %d: still listed on the board it left", i)
					}
				}
			}
			stop.Store(true)
			if err := <-done; err != nil {
				t.Fatalf("workloads across moves: %v", err)
			}
			if moved == 0 {
				t.Fatal("no VRAM was copied")
			}
			workEnded(t, g) // the boards it left stopped its channels
			ran := ba.Stats().GPFIFOEntries + bb.Stats().GPFIFOEntries
			if want := open + perPass*uint64(runs.Load()); ran != want {
				t.Fatalf("the boards ran %d GPFIFO entries; %d passes submit %d", ran, runs.Load(), want)
			}
			if c := g.v.Counters(); c.Moves != uint64(len(hops)) || c.Denied != 0 {
				t.Fatalf("counters after the moves: moves %d denied %d", c.Moves, c.Denied)
			}
			// The vacated slots hold nothing: their next tenant reads zeros.
			for slot := range a.Layout().Slots {
				if cur, s := g.v.where(); cur == a && s.Index == slot {
					continue
				}
				if !slotClean(t, a, ba, slot) {
					t.Fatalf("slot %d of board a holds pages after the vGPU left it", slot)
				}
			}
		})
	}
}

func TestMoveRefused(t *testing.T) {
	t.Run("full board", func(t *testing.T) {
		a, b, _, _ := twoBoards(t, 1)
		g := startGuest(t, a, "vm1", "fv-optimized")
		startGuest(t, b, "vm2", "fv-optimized")
		if _, err := Move(context.Background(), g.v, b); !errors.Is(err, ErrNoSlot) {
			t.Fatalf("move to a full board: %v", err)
		}
		runAllWorkloads(t, g, "fv-optimized")
	})
	t.Run("failed board", func(t *testing.T) {
		a, b, _, bb := twoBoards(t, 2)
		g := startGuest(t, a, "vm1", "fv-optimized")
		bb.FailBus()
		for lost, _ := b.Lost(); !lost; lost, _ = b.Lost() {
			time.Sleep(10 * time.Millisecond)
		}
		if _, err := Move(context.Background(), g.v, b); !errors.Is(err, ErrBoardLost) {
			t.Fatalf("move to a failed board: %v", err)
		}
		runAllWorkloads(t, g, "fv-optimized")
	})
}
