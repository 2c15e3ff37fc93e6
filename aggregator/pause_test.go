package aggregator

import (
	"context"
	"sync"
	"testing"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// TestPausesReported: a move, an eviction and the restore it leads to are
// each reported to Options.OnPause once, by the board the move left and
// the board that evicted and restored, with where the vGPU was and went
// and what was copied; the vGPU's scheduler totals (submissions, GPU time,
// queue wait) follow it to the new board.
func TestPausesReported(t *testing.T) {
	var mu sync.Mutex
	var got []Pause
	record := func(p Pause) { mu.Lock(); got = append(got, p); mu.Unlock() }
	reg := NewRegistry()
	a, _ := newTestAggregatorWith(t, Options{MaxVMs: 2, Registry: reg, Board: 0, BoardName: "a", OnPause: record})
	b, _ := newTestAggregatorWith(t, Options{MaxVMs: 2, Registry: reg, Board: 1, BoardName: "b", OnPause: record})
	g := startGuest(t, a, "paused", "fv-optimized")
	verifiedWork(t, g)
	before := g.v.SchedStats()
	if _, err := Move(context.Background(), g.v, b); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Evict(context.Background(), g.v, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := g.v.Read32(nvc0.BAR0, nvc0.RegBoot0); err != nil { // brings it back
		t.Fatal(err)
	}
	// Its scheduler totals came along (they never go back), and grow.
	after := g.v.SchedStats()
	if after.Submissions < before.Submissions || after.GPUTime < before.GPUTime || after.Released < before.Released || after.QueueWait < before.QueueWait {
		t.Errorf("scheduler totals went back across the move and eviction: %+v, were %+v", after, before)
	}
	verifiedWork(t, g)
	if later := g.v.SchedStats(); later.Submissions <= after.Submissions || later.GPUTime <= after.GPUTime {
		t.Errorf("scheduler totals did not grow with work on the new board: %+v, were %+v", later, after)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []Pause{
		{Kind: PauseMove, FromBoard: "a", ToBoard: "b", FromSlot: 0, ToSlot: 0},
		{Kind: PauseEvict, FromBoard: "b", ToBoard: "b", FromSlot: 0, ToSlot: -1},
		{Kind: PauseRestore, FromBoard: "b", ToBoard: "b", FromSlot: -1, ToSlot: 0},
	}
	if len(got) != len(want) {
		t.Fatalf("reported %+v, want %d pauses", got, len(want))
	}
	for i, w := range want {
		p := got[i]
		if p.Kind != w.Kind || p.VGPU != g.v.ID || p.FromBoard != w.FromBoard || p.ToBoard != w.ToBoard ||
			p.FromSlot != w.FromSlot || p.ToSlot != w.ToSlot || p.Bytes == 0 || p.Took <= 0 {
			t.Errorf("pause %d: %+v, want %+v for vGPU %d with bytes and a duration", i, p, w, g.v.ID)
		}
	}
	if got[0].Copy <= 0 || got[0].Copy > got[0].Took {
		t.Errorf("the move's copy %v against its pause %v", got[0].Copy, got[0].Took)
	}
}
