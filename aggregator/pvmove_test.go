package aggregator

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
)

// waitPasses waits until passes grows by one, failing if done reports
// first.
func waitPasses(t *testing.T, passes *atomic.Int64, done <-chan error, what string) {
	t.Helper()
	for want := passes.Load() + 1; passes.Load() < want; {
		select {
		case err := <-done:
			t.Fatalf("workloads ended before %s: %v", what, err)
		case <-time.After(time.Millisecond):
		}
	}
}

// TestMovePVDRMVGPU: a pvdrm VM whose front end computes without pause —
// a context held open across passes, every workload verified — is moved
// between two boards and back, to another slot, and evicted, while its
// back end serves it. Its driver state (files, buffers, channels, PV page
// tables) comes along; its CPU_PREP waiters are woken by the new board's
// completions (the fault poll that would otherwise find their fences is
// turned off: a waiter nobody wakes hangs the test); every slot it left
// holds nothing.
func TestMovePVDRMVGPU(t *testing.T) {
	for _, mode := range []string{"pvdrm", "pvdrm-pooling"} {
		t.Run(mode, func(t *testing.T) {
			a, b, ba, bb := twoBoards(t, 2)
			g := startPVDRMWith(t, a, "mover", mode, func(g *pvdrmGuest) { g.b.faultPoll = time.Hour })
			v := g.b.VGPU()
			ctx, err := gdev.NewContextOn(g.driver())
			if err != nil {
				t.Fatal(err)
			}
			defer ctx.Close()
			var stop atomic.Bool
			var passes atomic.Int64
			done := make(chan error, 1)
			go func() { done <- workloadLoopOn(g.driver(), ctx, &stop, &passes) }()
			boards := map[*Aggregator]*sim.Board{a: ba, b: bb}
			for i, to := range []*Aggregator{b, a, a, b} {
				waitPasses(t, &passes, done, fmt.Sprintf("hop %d", i))
				from, fromSlot := v.where()
				st, err := Move(context.Background(), v, to)
				if err != nil {
					t.Fatalf("hop %d: %v", i, err)
				}
				t.Logf("hop %d: %s/%d -> %s/%d, %d KiB, downtime %v", i, st.FromBoard, st.FromSlot, st.ToBoard, st.ToSlot, st.Bytes>>10, st.Downtime)
				if !slotClean(t, from, boards[from], fromSlot.Index) {
					t.Fatalf("hop %d: the slot it left still holds pages", i)
				}
			}
			waitPasses(t, &passes, done, "the eviction")
			on, slot := v.where()
			est, err := on.Evict(context.Background(), v, "test")
			if err != nil {
				t.Fatalf("evict: %v", err)
			}
			t.Logf("evicted from %s/%d: %d KiB out", est.Board, est.Slot, est.Bytes>>10)
			if !slotClean(t, on, boards[on], slot.Index) && !v.Evicted() {
				t.Fatal("evicted, yet its slot holds pages")
			}
			waitPasses(t, &passes, done, "the end") // its next request brought it back
			stop.Store(true)
			if err := <-done; err != nil {
				t.Fatalf("workloads across moves: %v", err)
			}
			c := v.Counters()
			if c.Moves != 4 || c.Evictions != 1 || c.Restores != 1 || c.Denied != 0 {
				t.Fatalf("counters: moves %d evictions %d restores %d denied %d", c.Moves, c.Evictions, c.Restores, c.Denied)
			}
		})
	}
}

// TestEvictPVTakingTurns: a PV VM (its page tables the aggregator's) and
// a pvdrm VM share a board of one slot at 2× overcommit and take turns in
// it while both compute; every result verifies, and the PV VM's marker in
// its VRAM survives its evictions.
func TestEvictPVTakingTurns(t *testing.T) {
	agg, _ := overcommitted(t, 30*time.Second)
	pv := startGuest(t, agg, "pv", "pv-multicall")
	verifiedWork(t, pv)
	marker := []uint32{0x9E0, 0x9E1, 0x9E2, 0x9E3}
	writeMarker(pv.v, markerAt, marker)
	time.Sleep(5 * time.Millisecond) // idle past EvictIdle
	drm := startPVDRM(t, agg, "drm", "pvdrm")
	if !pv.v.Evicted() {
		t.Fatal("the pvdrm VM attached to a full overcommitted board without evicting the PV one")
	}
	pvCtx := openContext(t, pv)
	drmCtx, err := gdev.NewContextOn(drm.driver())
	if err != nil {
		t.Fatal(err)
	}
	defer drmCtx.Close()
	runLoops(t, 1,
		func(stop *atomic.Bool, passes *atomic.Int64) error { return workloadLoop(pv, pvCtx, stop, passes) },
		func(stop *atomic.Bool, passes *atomic.Int64) error {
			return workloadLoopOn(drm.driver(), drmCtx, stop, passes)
		})
	for i, w := range readMarker(pv.v, markerAt, len(marker)) {
		if w != marker[i] {
			t.Fatalf("the PV VM's marker word %d reads %#x after its turns, want %#x", i, w, marker[i])
		}
	}
	c1, c2 := pv.v.Counters(), drm.b.VGPU().Counters()
	t.Logf("pv: %d evictions, %d restores; pvdrm: %d evictions, %d restores", c1.Evictions, c1.Restores, c2.Evictions, c2.Restores)
	if c1.Evictions < 1 || c1.Restores < 1 || c2.Evictions < 1 || c2.Restores < 1 {
		t.Fatalf("the VMs did not take turns: pv %d/%d, pvdrm %d/%d evictions/restores", c1.Evictions, c1.Restores, c2.Evictions, c2.Restores)
	}
	if c1.Denied != 0 || c2.Denied != 0 {
		t.Fatalf("denied accesses: %d, %d", c1.Denied, c2.Denied)
	}
}
