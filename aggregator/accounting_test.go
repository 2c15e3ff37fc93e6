package aggregator

import (
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
)

// TestAccountShareWindow: GPU time counts toward the share window only
// while it is at most ShareWindow old.
func TestAccountShareWindow(t *testing.T) {
	var c account
	c.ran(30*time.Millisecond, 50*time.Millisecond)
	c.ran(20*time.Millisecond, 950*time.Millisecond)
	if got := c.recent(999 * time.Millisecond); got != 50*time.Millisecond {
		t.Errorf("recent at 0.999s = %v, want 50ms", got)
	}
	if got := c.recent(1050 * time.Millisecond); got != 20*time.Millisecond {
		t.Errorf("recent at 1.05s = %v, want 20ms (the first bucket has left the window)", got)
	}
	if got := c.recent(3 * time.Second); got != 0 {
		t.Errorf("recent at 3s = %v, want 0", got)
	}
	c.ran(5*time.Millisecond, 1050*time.Millisecond) // reuses the first bucket's slot
	if got := c.recent(1099 * time.Millisecond); got != 25*time.Millisecond {
		t.Errorf("recent at 1.099s = %v, want 25ms", got)
	}
	if got := window(1050 * time.Millisecond); got != 950*time.Millisecond {
		t.Errorf("window at 1.05s = %v, want 950ms (nine buckets and 50ms of the current)", got)
	}
	if c.submissions != 3 || c.gpuTime != 55*time.Millisecond {
		t.Errorf("totals %d submissions %v, want 3 and 55ms", c.submissions, c.gpuTime)
	}
	for _, w := range []time.Duration{5 * time.Microsecond, 10 * time.Microsecond, 11 * time.Microsecond, 2 * time.Second} {
		c.wait(w)
	}
	if want := [waitBuckets + 1]uint64{2, 1, 0, 0, 0, 0, 1}; c.waits != want {
		t.Errorf("wait buckets %v, want %v", c.waits, want)
	}
}

// TestSchedStatsFollowWork: the VM that computes gets GPU time, submissions
// and queue waits; the idle one none; its VRAM in use grows from zero.
func TestSchedStatsFollowWork(t *testing.T) {
	part := testPartition()
	layout, err := NewLayout(part, 2, 1<<30, 128)
	if err != nil {
		t.Fatal(err)
	}
	cfg := sim.DefaultConfig()
	cfg.VRAMSize, cfg.MemPartitions, cfg.VRAMSegments = 1<<30, 4, layout.Segments(1<<30)
	board, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { board.Close() })
	agg, err := New(board, Options{MaxVMs: 2, Partition: part, Channels: cfg.Channels})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { agg.Close() })
	busy := startGuest(t, agg, "busy", "fv-optimized")
	idle := startGuest(t, agg, "idle", "fv-optimized")
	before := agg.SchedStats()
	if s := before[busy.v]; s.Weight != 1 || s.Submissions != 0 {
		t.Fatalf("fresh account %+v", s)
	}
	w, err := workloads.New("madd", smallParams)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := w.Run(gdev.Nouveau(busy.dev)); err != nil {
			t.Fatal(err)
		}
	}
	after := agg.SchedStats()
	b, i := after[busy.v], after[idle.v]
	t.Logf("busy %+v", b)
	t.Logf("idle %+v", i)
	if b.Submissions == 0 || b.GPUTime <= 0 || b.Released < b.Submissions {
		t.Errorf("busy VM's account did not move: %+v", b)
	}
	var n uint64
	for _, c := range b.WaitBuckets {
		n += c
	}
	if n != b.Released {
		t.Errorf("wait buckets hold %d submissions, %d were released", n, b.Released)
	}
	if i.Submissions != 0 || i.GPUTime != 0 || i.Released != 0 || i.Share != 0 {
		t.Errorf("idle VM was charged: %+v", i)
	}
	if b.Share != 1 {
		t.Errorf("busy VM's share = %v, want 1 (the only VM that ran)", b.Share)
	}
	if u := busy.v.VRAMInUse(); u <= 0 {
		t.Errorf("busy VM's VRAM in use = %d, want > 0", u)
	}
	infos := agg.Infos()
	if len(infos) != 2 || infos[0].Sched.Weight != 1 {
		t.Errorf("Infos = %+v", infos)
	}
	// Once the VM leaves, its account goes with it.
	if err := agg.Detach(busy.v); err != nil {
		t.Fatal(err)
	}
	if _, ok := agg.SchedStats()[busy.v]; ok {
		t.Error("a detached vGPU still has an account")
	}
	// The slot's next tenant starts with an account of its own.
	next := startGuestAs(t, agg, 99, "next", "fv-optimized")
	if next.v.ID != busy.v.ID {
		t.Fatalf("next tenant in slot %d, want %d", next.v.ID, busy.v.ID)
	}
	if s := agg.SchedStats()[next.v]; s.Submissions != 0 || s.GPUTime != 0 || s.Released != 0 {
		t.Errorf("the slot's next tenant inherited %+v", s)
	}
	for _, info := range agg.Infos() {
		if info.Name == "next" && info.Sched.Submissions != 0 {
			t.Errorf("Infos gave the next tenant the previous one's account: %+v", info.Sched)
		}
	}
}
