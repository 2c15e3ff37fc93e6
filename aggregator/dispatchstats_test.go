package aggregator

import (
	"log/slog"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/sched"
)

// DispatchStats counts one decision per call of the policy's Next and one
// completion per submission that ended, and its times add up: the whole
// decision includes Next. Driven on the modelled GPU of fairness_test.go
// with a manual clock (the costs themselves are on the wall clock, so only
// their relation is checked).
func TestDispatchStats(t *testing.T) {
	const vms = 8
	p, err := sched.New("fifo", sched.Defaults())
	if err != nil {
		t.Fatal(err)
	}
	clock := &sched.ManualClock{}
	g := &fakeGPU{clock: clock, cost: map[int]time.Duration{}, chans: map[int]*fakeChannel{}}
	a := &Aggregator{gpu: g, log: slog.New(slog.DiscardHandler), faults: newPhysFaults(g, slog.New(slog.DiscardHandler)),
		phys: &physical{gpu: g, layout: Layout{PollArea: Region{0, nvc0.MaxChannels * nvc0.UserAreaSize}}}}
	d := newDispatcher(a, p, 0)
	d.clock = clock
	d.decisionCost = func(time.Time) time.Duration { return 0 }
	a.disp = d
	if s := a.DispatchStats(); s != (DispatchStats{}) {
		t.Fatalf("a fresh dispatcher has stats %+v", s)
	}
	for i := range vms {
		v := &VGPU{ID: i, Guest: Guest{DomID: uint32(i + 1), Name: "vm"}}
		g.cost[i] = time.Millisecond
		g.channel(i, 0x100000+uint64(i)*nvc0.PageSize)
		if err := d.addVM(v, 1); err != nil {
			t.Fatal(err)
		}
		d.submit(g.submissionOf(v, i, 1))
	}
	idleSteps := 0 // steps that found nothing in flight: each asks the policy
	for range 4 * vms {
		d.mu.Lock()
		d.reap()
		idle := len(d.inflight) == 0
		d.mu.Unlock()
		if idle {
			idleSteps++
		}
		d.step()
		clock.Advance(time.Millisecond)
	}
	s := a.DispatchStats()
	if s.Completed != vms {
		t.Errorf("Completed = %d, want %d (one per submission)", s.Completed, vms)
	}
	if s.Decisions != uint64(idleSteps) || s.Decisions < vms {
		t.Errorf("Decisions = %d, want one per step with nothing in flight (%d), at least %d dispatches", s.Decisions, idleSteps, vms)
	}
	if s.NextTime < 0 || s.DecisionTime < s.NextTime {
		t.Errorf("NextTime %v, DecisionTime %v: a decision's time includes its Next", s.NextTime, s.DecisionTime)
	}
}

// The dispatcher's count of queued submissions follows the queues through
// arrivals, a doorbell that only raises a queued submission's put,
// releases and a VM's departure.
func TestQueuedCount(t *testing.T) {
	p, err := sched.New("fifo", sched.Defaults())
	if err != nil {
		t.Fatal(err)
	}
	clock := &sched.ManualClock{}
	g := &fakeGPU{clock: clock, cost: map[int]time.Duration{}, chans: map[int]*fakeChannel{}}
	a := &Aggregator{gpu: g, log: slog.New(slog.DiscardHandler), faults: newPhysFaults(g, slog.New(slog.DiscardHandler)),
		phys: &physical{gpu: g, layout: Layout{PollArea: Region{0, nvc0.MaxChannels * nvc0.UserAreaSize}}}}
	d := newDispatcher(a, p, 0)
	d.clock = clock
	d.decisionCost = func(time.Time) time.Duration { return 0 }
	a.disp = d
	check := func(when string) {
		t.Helper()
		n := 0
		for _, q := range d.queues {
			n += len(q)
		}
		if d.queued() != n {
			t.Errorf("%s: queued() = %d, the queues hold %d", when, d.queued(), n)
		}
	}
	vms := make([]*VGPU, 3)
	for i := range vms {
		vms[i] = &VGPU{ID: i, Guest: Guest{DomID: uint32(i + 1), Name: "vm"}}
		g.cost[i] = time.Millisecond
		g.channel(i, 0x100000+uint64(i)*nvc0.PageSize)
		if err := d.addVM(vms[i], 1); err != nil {
			t.Fatal(err)
		}
		d.submit(g.submissionOf(vms[i], i, 1))
	}
	check("after three arrivals")
	d.submit(g.submissionOf(vms[1], 1, 2)) // raises vm 1's queued put
	check("after a doorbell on a queued channel")
	if d.queued() != 3 {
		t.Errorf("queued() = %d after three arrivals and a raised put, want 3", d.queued())
	}
	d.step() // releases one
	check("after a release")
	d.removeVM(vms[2])
	check("after a departure")
	for range 8 {
		clock.Advance(time.Millisecond)
		d.step()
	}
	check("after the rest ran")
	if d.queued() != 0 {
		t.Errorf("queued() = %d with everything run, want 0", d.queued())
	}
}
