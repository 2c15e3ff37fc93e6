package aggregator

import (
	"log/slog"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/sched"
)

// The SLO tests drive the real dispatcher on the deterministic model of
// fairness_test.go: a manual clock, the modelled GPU and closed-loop VMs.

// modelDispatcher returns a dispatcher over the modelled GPU with policy,
// the SLO options and vms registered (each its own channel).
func modelDispatcher(t *testing.T, policy string, slo SLOOptions, vms []*loadVM) (*dispatcher, *fakeGPU, *sched.ManualClock) {
	t.Helper()
	p, err := sched.New(policy, sched.Defaults())
	if err != nil {
		t.Fatal(err)
	}
	clock := &sched.ManualClock{}
	g := &fakeGPU{clock: clock, cost: map[int]time.Duration{}, chans: map[int]*fakeChannel{}}
	a := &Aggregator{gpu: g, log: slog.New(slog.DiscardHandler), faults: newPhysFaults(g, slog.New(slog.DiscardHandler)),
		phys: &physical{gpu: g, layout: Layout{PollArea: Region{0, nvc0.MaxChannels * nvc0.UserAreaSize}}}, opts: Options{SLO: slo}}
	d := newDispatcher(a, p, 0)
	d.clock = clock
	d.decisionCost = func(time.Time) time.Duration { return 0 }
	a.disp = d
	for i, vm := range vms {
		vm.v, vm.phys = &VGPU{ID: i, Guest: Guest{DomID: uint32(i + 1), Name: vm.name}}, i
		g.cost[i] = vm.cost
		g.channel(i, 0x100000+uint64(i)*nvc0.PageSize)
		if err := d.addVM(vm.v, vm.weight); err != nil {
			t.Fatal(err)
		}
	}
	return d, g, clock
}

// targets returns an SLOOptions.Target from SLOs by guest name.
func targets(m map[string]time.Duration) func(Guest) time.Duration {
	return func(g Guest) time.Duration { return m[g.Name] }
}

// runModel runs the closed-loop vms on d until horizon; a VM named in stop
// submits nothing from that time on. observe, if not nil, is called after
// every step.
func runModel(d *dispatcher, g *fakeGPU, clock *sched.ManualClock, vms []*loadVM, stop map[string]time.Duration, horizon time.Duration, observe func(now time.Duration)) {
	done := func(vm *loadVM) {
		if c := g.chans[vm.phys]; vm.waiting && c.get == vm.put {
			vm.waiting, vm.next = false, c.doneAt+vm.think
		}
	}
	for clock.Now() < horizon {
		now := clock.Now()
		for _, vm := range vms {
			done(vm)
			if s, ok := stop[vm.name]; ok && now >= s {
				continue
			}
			if !vm.waiting && vm.next <= now {
				vm.put = (vm.put + 1) % fakeEntries
				vm.waiting = true
				d.submit(g.submissionOf(vm.v, vm.phys, vm.put))
			}
		}
		busy, until := d.step()
		if observe != nil {
			observe(now)
		}
		next := horizon
		for _, vm := range vms {
			done(vm)
			if !vm.waiting {
				next = min(next, vm.next)
			}
		}
		if e := g.nextEvent(); e >= 0 {
			next = min(next, e)
		}
		if until >= 0 {
			next = min(next, until)
		}
		if busy {
			next = min(next, now+d.poll)
		}
		if next <= now {
			next = now + time.Microsecond
		}
		clock.Advance(next - now)
	}
}

// statsOf returns the SchedStats of the vGPU of vm.
func statsOf(d *dispatcher, vm *loadVM) SchedStats { return d.schedStats()[vm.v] }

// TestSLOViolations: under FIFO, a submission that waits longer than its
// VM's SLO behind another VM's is one violation; one that waits exactly
// the SLO, or not at all, is none; a VM without an SLO has none.
func TestSLOViolations(t *testing.T) {
	const ms = time.Millisecond
	lat := &loadVM{name: "lat", weight: 1, cost: ms}
	bulk := &loadVM{name: "bulk", weight: 1, cost: 4 * ms}
	vms := []*loadVM{lat, bulk}
	d, g, clock := modelDispatcher(t, "fifo", SLOOptions{Target: targets(map[string]time.Duration{"lat": 2 * ms})}, vms)
	submit := func(vm *loadVM) {
		vm.put = (vm.put + 1) % fakeEntries
		d.submit(g.submissionOf(vm.v, vm.phys, vm.put))
	}
	at := func(t time.Duration) {
		clock.Advance(t - clock.Now())
		d.step()
	}
	at(0)
	submit(bulk) // runs 0–4 ms
	at(0)
	at(100 * time.Microsecond)
	submit(lat) // released at 4 ms: waited 3.9 ms, a violation
	at(4 * ms)
	at(4*ms + 100*time.Microsecond)
	submit(bulk) // runs 5–9 ms
	at(5 * ms)
	at(7 * ms)
	submit(lat) // released at 9 ms: waited exactly 2 ms, met
	at(9 * ms)
	at(11 * ms)
	submit(bulk) // runs 11–15 ms
	at(11 * ms)
	at(11*ms + 500*time.Microsecond)
	submit(lat) // released at 15 ms: waited 3.5 ms, a violation
	at(15 * ms)
	at(17 * ms)
	submit(lat) // the GPU is idle: released at once
	at(17 * ms)
	at(20 * ms)

	s := statsOf(d, lat)
	if s.SLO != 2*ms || s.SLOViolations != 2 || s.Released != 4 {
		t.Errorf("lat: SLO %v, violations %d of %d released; want 2ms, 2 of 4", s.SLO, s.SLOViolations, s.Released)
	}
	if s.EffectiveWeight != 1 || s.SLABoostedWindows != 0 {
		t.Errorf("lat without feedback: effective weight %d, boosted windows %d; want 1, 0", s.EffectiveWeight, s.SLABoostedWindows)
	}
	if b := statsOf(d, bulk); b.SLO != 0 || b.SLOViolations != 0 || b.Released != 3 {
		t.Errorf("bulk: SLO %v, violations %d of %d released; want none, 0 of 3", b.SLO, b.SLOViolations, b.Released)
	}
}

// feedback is the SLA feedback of the tests: 10 ms windows, ×2 up to ×8.
var testFeedback = SLAFeedback{Window: 10 * time.Millisecond, Boost: 2, MaxBoost: 8}

// TestSLAFRaisesThenDecays: under BAND, a latency VM (weight 1, 1 ms
// submissions, SLO 2 ms) beside two bulk VMs (weight 4, 15 ms submissions)
// misses its SLO; SLA feedback doubles its weight each window up to the
// cap (8) and never beyond; once the bulk VMs stop, it meets the SLO and
// its weight halves each window back to 1. The policy's weight is the
// reported one throughout.
func TestSLAFRaisesThenDecays(t *testing.T) {
	const ms = time.Millisecond
	lat := &loadVM{name: "lat", weight: 1, cost: ms, think: 100 * time.Microsecond}
	vms := []*loadVM{lat, {name: "bulk1", weight: 4, cost: 15 * ms}, {name: "bulk2", weight: 4, cost: 15 * ms}}
	d, g, clock := modelDispatcher(t, "band", SLOOptions{Target: targets(map[string]time.Duration{"lat": 2 * ms}), Feedback: testFeedback}, vms)
	stopAt := 300 * ms
	var seq []int // lat's weight, each time it changed
	top := 0
	runModel(d, g, clock, vms, map[string]time.Duration{"bulk1": stopAt, "bulk2": stopAt}, 500*ms, func(now time.Duration) {
		w := statsOf(d, lat).EffectiveWeight
		if pw, err := d.policy.Weight(sched.VMID(lat.v.ID)); err != nil || pw != w {
			t.Fatalf("at %v: policy weight %d, %v; reported %d", now, pw, err, w)
		}
		top = max(top, w)
		if len(seq) == 0 || seq[len(seq)-1] != w {
			seq = append(seq, w)
		}
	})
	t.Logf("lat's weights: %v", seq)
	if top != 8 {
		t.Errorf("lat's highest weight %d, want the cap 8", top)
	}
	// Up by doubling to the cap, then (once the bulk VMs stopped) down by
	// halving; it may dip and rise again on the way while it sometimes
	// meets the SLO.
	want := []int{1, 2, 4, 8}
	if len(seq) < len(want)+3 || !equalInts(seq[:4], want) || !equalInts(seq[len(seq)-4:], []int{8, 4, 2, 1}) {
		t.Errorf("lat's weights %v: want 1 2 4 8 first and 8 4 2 1 last", seq)
	}
	s := statsOf(d, lat)
	if s.EffectiveWeight != 1 || s.Weight != 1 || s.SLOViolations == 0 || s.SLABoostedWindows == 0 {
		t.Errorf("lat at the end: %+v; want weight 1 again after violations and boosted windows", s)
	}
	for _, vm := range vms[1:] {
		if s := statsOf(d, vm); s.EffectiveWeight != 4 || s.SLABoostedWindows != 0 {
			t.Errorf("%s without an SLO: effective weight %d, boosted windows %d; want 4, 0", vm.name, s.EffectiveWeight, s.SLABoostedWindows)
		}
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestSLAFCannotStarve: a VM with an SLO it can never meet (1 ns) is
// boosted to the cap and stays there, but no further: under every weighted
// policy, a backlogged VM of the same weight beside it keeps its share
// 1/(1+8) of the GPU, within 3 points (credit, which degenerates to
// alternation with two closed loops, gives it half), and never waits
// longer than the greedy VM's capped slice.
func TestSLAFCannotStarve(t *testing.T) {
	const ms = time.Millisecond
	for _, policy := range []string{"credit", "band", "wfq", "timeslice", "dfq"} {
		t.Run(policy, func(t *testing.T) {
			greedy := &loadVM{name: "greedy", weight: 1, cost: ms}
			victim := &loadVM{name: "victim", weight: 1, cost: ms}
			vms := []*loadVM{greedy, victim}
			d, g, clock := modelDispatcher(t, policy, SLOOptions{Target: targets(map[string]time.Duration{"greedy": time.Nanosecond}), Feedback: testFeedback}, vms)
			d.a.StartRecording()
			top := 0
			runModel(d, g, clock, vms, nil, 3*time.Second, func(time.Duration) {
				top = max(top, statsOf(d, greedy).EffectiveWeight)
			})
			if top != 8 {
				t.Errorf("greedy's highest weight %d, want the cap 8", top)
			}
			used := map[string]time.Duration{}
			var gap, last time.Duration
			for _, u := range d.usage {
				if u.Start < 100*ms { // feedback reaches the cap in 3 windows
					continue
				}
				used[u.Name] += u.End - u.Start
				if u.Name == "victim" {
					if last > 0 {
						gap = max(gap, u.Start-last)
					}
					last = u.End
				}
			}
			share := float64(used["victim"]) / float64(used["victim"]+used["greedy"])
			t.Logf("victim's share %.3f, longest gap %v", share, gap)
			if share < 1.0/9-0.03 {
				t.Errorf("victim's share %.3f under a capped boost, want ≥ 1/9 - 0.03", share)
			}
			// The victim waits at most for the greedy VM's capped share of
			// a credit period (band, credit), or its slice of 8 × 30 ms
			// (timeslice), and no longer.
			if gap > 300*ms {
				t.Errorf("victim waited %v between submissions", gap)
			}
		})
	}
}

// TestSLAFAgainstBand: on the model, SLA feedback cuts the latency VM's
// violations against plain BAND (the bulk VMs pay with GPU time).
func TestSLAFAgainstBand(t *testing.T) {
	const ms = time.Millisecond
	run := func(fb SLAFeedback) (violations uint64, bulk time.Duration) {
		lat := &loadVM{name: "lat", weight: 1, cost: ms, think: 100 * time.Microsecond}
		vms := []*loadVM{lat, {name: "bulk1", weight: 4, cost: 15 * ms}, {name: "bulk2", weight: 4, cost: 15 * ms}}
		d, g, clock := modelDispatcher(t, "band", SLOOptions{Target: targets(map[string]time.Duration{"lat": 20 * ms}), Feedback: fb}, vms)
		d.a.StartRecording()
		runModel(d, g, clock, vms, nil, 2*time.Second, nil)
		for _, u := range d.usage {
			if u.Name != "lat" {
				bulk += u.End - u.Start
			}
		}
		return statsOf(d, lat).SLOViolations, bulk
	}
	plainV, plainBulk := run(SLAFeedback{})
	slafV, slafBulk := run(testFeedback)
	t.Logf("violations: band %d, band+slaf %d; bulk GPU time %v, %v", plainV, slafV, plainBulk, slafBulk)
	if plainV == 0 || slafV >= plainV {
		t.Errorf("violations: band %d, band+slaf %d; want fewer with feedback", plainV, slafV)
	}
}

// TestSLAFStrictKeepsWeights: a policy that refuses new weights (strict)
// leaves the VM at its own weight; feedback gives up on it.
func TestSLAFStrictKeepsWeights(t *testing.T) {
	const ms = time.Millisecond
	lat := &loadVM{name: "lat", weight: 1, cost: ms}
	vms := []*loadVM{lat, {name: "bulk", weight: 1, cost: 5 * ms}}
	d, g, clock := modelDispatcher(t, "strict", SLOOptions{Target: targets(map[string]time.Duration{"lat": time.Nanosecond}), Feedback: testFeedback}, vms)
	runModel(d, g, clock, vms, nil, 300*ms, nil)
	s := statsOf(d, lat)
	if s.EffectiveWeight != 1 || s.SLOViolations == 0 {
		t.Errorf("strict: %+v; want weight 1 and violations counted", s)
	}
	if w, _ := d.policy.Weight(sched.VMID(lat.v.ID)); w != 1 {
		t.Errorf("strict's weight %d, want 1", w)
	}
}
