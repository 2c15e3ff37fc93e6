package sched

import (
	"math"
	"reflect"
	"testing"
	"time"
)

// release is one Started report: which VM's submission left the queue when.
type release struct {
	vm VMID
	at time.Duration
}

// releaseLog wraps a Policy and records every release and completion.
type releaseLog struct {
	Policy
	starts []release
	ends   []release // completion times
}

func (r *releaseLog) Started(id VMID, now time.Duration) error {
	r.starts = append(r.starts, release{id, now})
	return r.Policy.Started(id, now)
}

func (r *releaseLog) Completed(id VMID, gpuTime, now time.Duration) error {
	r.ends = append(r.ends, release{id, now})
	return r.Policy.Completed(id, gpuTime, now)
}

// of returns the release times of VM id.
func of(rs []release, id VMID) []time.Duration {
	var out []time.Duration
	for _, r := range rs {
		if r.vm == id {
			out = append(out, r.at)
		}
	}
	return out
}

// TestStrictSlots: a frame is one slot per VM in registration order, each
// Timeslice × weight long, anchored at time 0, whatever was queued.
func TestStrictSlots(t *testing.T) {
	p := mustNew(t, "strict", Params{Timeslice: 10 * ms}).(*strict)
	check(t, p.AddVM(7, 1, 0))
	check(t, p.AddVM(3, 2, 0))
	check(t, p.AddVM(5, 1, 0))
	for _, c := range []struct {
		at         time.Duration
		owner      VMID
		start, end time.Duration
	}{
		{0, 7, 0, 10 * ms},
		{10*ms - 1, 7, 0, 10 * ms},
		{10 * ms, 3, 10 * ms, 30 * ms},
		{29 * ms, 3, 10 * ms, 30 * ms},
		{30 * ms, 5, 30 * ms, 40 * ms},
		{40 * ms, 7, 40 * ms, 50 * ms},
		{1000*ms + 15*ms, 3, 1010 * ms, 1030 * ms},
	} {
		o, s, e := p.slotAt(c.at)
		if o == nil || o.id != c.owner || s != c.start || e != c.end {
			id := VMID(-1)
			if o != nil {
				id = o.id
			}
			t.Errorf("slot at %v: vm %d [%v, %v), want vm %d [%v, %v)", c.at, id, s, e, c.owner, c.start, c.end)
		}
	}
	check(t, p.RemoveVM(3, 0))
	if o, s, e := p.slotAt(35 * ms); o.id != 5 || s != 30*ms || e != 40*ms {
		t.Errorf("after removing vm 3: slot at 35ms is vm %d [%v, %v), want vm 5 [30ms, 40ms)", o.id, s, e)
	}
}

// TestStrictDecisions walks a few frames by hand: release in slot, Wait
// (the GPU idles) out of slot and in an empty slot, the guard, and the one
// release per slot of a VM whose guard exceeds its slot.
func TestStrictDecisions(t *testing.T) {
	p := mustNew(t, "strict", Params{Timeslice: 30 * ms})
	check(t, p.AddVM(1, 1, 0))
	check(t, p.AddVM(2, 1, 0))
	want := func(now time.Duration, d Decision) {
		t.Helper()
		got := p.Next(now)
		got.Deny = nil
		if !reflect.DeepEqual(got, d) {
			t.Fatalf("at %v: %+v, want %+v", now, got, d)
		}
	}
	want(0, Decision{Action: Idle}) // nothing queued
	// VM 2 queues in VM 1's slot: it waits for its own, the GPU idles.
	check(t, p.Submitted(2, ms))
	want(ms, Decision{Action: Wait, Until: 30 * ms})
	check(t, p.Submitted(1, 2*ms))
	want(2*ms, Decision{Action: Dispatch, VM: 1})
	check(t, p.Started(1, 2*ms))
	want(3*ms, Decision{Action: Idle}) // one at a time
	check(t, p.Completed(1, 5*ms, 7*ms))
	want(7*ms, Decision{Action: Wait, Until: 30 * ms}) // VM 1 has nothing queued: its slot stays idle
	// VM 1's guard is now 5 ms: released with 6 ms left, not with 4 ms.
	check(t, p.Submitted(1, 24*ms))
	want(24*ms, Decision{Action: Dispatch, VM: 1})
	check(t, p.Started(1, 24*ms))
	check(t, p.Completed(1, 5*ms, 29*ms))
	check(t, p.Submitted(1, 29*ms))
	want(29*ms, Decision{Action: Wait, Until: 30 * ms})
	// VM 2's slot: only VM 2 runs.
	want(30*ms, Decision{Action: Dispatch, VM: 2})
	check(t, p.Started(2, 30*ms))
	check(t, p.Completed(2, 40*ms, 70*ms)) // overran VM 1's next slot by 10 ms; guard 40 ms > slot
	check(t, p.Submitted(2, 70*ms))
	want(70*ms, Decision{Action: Dispatch, VM: 1}) // VM 1's slot [60, 90), shortened
	check(t, p.Started(1, 70*ms))
	check(t, p.Completed(1, 5*ms, 75*ms))
	want(75*ms, Decision{Action: Wait, Until: 90 * ms}) // VM 1 has nothing more; VM 2 waits
	// VM 2's guard (40 ms) exceeds its slot: it gets the slot's first
	// release, not a second one.
	want(91*ms, Decision{Action: Dispatch, VM: 2})
	check(t, p.Started(2, 91*ms))
	check(t, p.Completed(2, ms, 92*ms))
	check(t, p.Submitted(2, 92*ms))
	want(92*ms, Decision{Action: Wait, Until: 120 * ms})
	// Its next slot [150, 180): the submission queued at 92 ms goes at the
	// start; one queued within the slot waits for the next slot's start.
	want(150*ms, Decision{Action: Dispatch, VM: 2})
	check(t, p.Started(2, 150*ms))
	check(t, p.Completed(2, ms, 151*ms))
	want(210*ms, Decision{Action: Idle})
	check(t, p.Submitted(2, 211*ms)) // within its slot [210, 240)
	want(211*ms, Decision{Action: Wait, Until: 240 * ms})
	want(240*ms, Decision{Action: Wait, Until: 270 * ms})
	want(270*ms, Decision{Action: Dispatch, VM: 2})
}

// strictLoads are VM 1, a closed loop of 1 ms kernels, beside a VM 2 of
// the given kind (VM 1's slot is [0, 30 ms) of every 60 ms frame).
func strictLoads(vm2 VMLoad) []VMLoad {
	vm2.ID = 2
	return []VMLoad{{ID: 1, Cost: ms, Think: 100 * time.Microsecond}, vm2}
}

// TestStrictOwnerIndependentOfLoad: when VM 1's submissions are released
// does not depend on what VM 2 queues — idle, backlogged, bursty with short
// or long think times — as long as VM 2's submissions fit its slot; and no
// submission of either VM is released outside its own slot.
func TestStrictOwnerIndependentOfLoad(t *testing.T) {
	const horizon = 3 * time.Second
	others := map[string]VMLoad{
		"idle":       {Cost: ms, Start: 2 * horizon},
		"backlogged": {Cost: 3 * ms, Depth: 2},
		"bursty":     {Cost: 7 * ms, Think: 11 * ms, Start: 400 * ms, Stop: 2 * time.Second},
		"one-long":   {Cost: 29 * ms, Think: 50 * ms},
	}
	var base []time.Duration
	for _, name := range []string{"idle", "backlogged", "bursty", "one-long"} {
		log := &releaseLog{Policy: mustNew(t, "strict", Params{Timeslice: 30 * ms})}
		r := mustSim(t, log, strictLoads(others[name]), horizon, SimOptions{})
		sched := log.Policy.(*strict)
		for _, s := range log.starts {
			if o, _, _ := sched.slotAt(s.at); o.id != s.vm {
				t.Errorf("%s: vm %d released at %v in vm %d's slot", name, s.vm, s.at, o.id)
			}
		}
		got := of(log.starts, 1)
		t.Logf("%s: vm 1 %d releases, vm 2 %d; usage %v", name, len(got), len(of(log.starts, 2)), r.Usage)
		if base == nil {
			base = got
			if len(base) < 1000 {
				t.Fatalf("vm 1 released only %d submissions", len(base))
			}
			continue
		}
		if !reflect.DeepEqual(got, base) {
			t.Errorf("%s: vm 1's release times differ from when vm 2 is idle", name)
		}
	}
}

// TestStrictResidual documents what strict cannot close: a VM 2 whose
// submissions outlast its slot overruns into VM 1's (the GPU is not
// preemptible), and VM 1's first release of a slot is delayed by exactly
// the overrun — the channel that remains, bounded by the watchdog.
func TestStrictResidual(t *testing.T) {
	log := &releaseLog{Policy: mustNew(t, "strict", Params{Timeslice: 30 * ms})}
	mustSim(t, log, strictLoads(VMLoad{Cost: 45 * ms, Think: 100 * time.Microsecond}), time.Second, SimOptions{})
	// VM 2 runs one 45 ms submission from each of its slot starts (30, 90,
	// ... ms): VM 1's slots [60, 90), [120, 150) ... begin 15 ms late.
	firsts := map[time.Duration]time.Duration{} // VM 1's slot start → first release
	for _, at := range of(log.starts, 1) {
		s := at - at%(60*ms)
		if _, ok := firsts[s]; !ok {
			firsts[s] = at
		}
	}
	for s := 60 * ms; s < 900*ms; s += 60 * ms {
		if got := firsts[s] - s; got != 15*ms {
			t.Errorf("vm 1's slot at %v: first release after %v, want the 15 ms overrun", s, got)
		}
	}
	for _, at := range of(log.starts, 2) {
		if at%(60*ms) != 30*ms {
			t.Errorf("vm 2 released at %v, not at its slot start", at)
		}
	}
}

// TestStrictGuardKeepsHonestVMsInSlot: VMs with steady submission lengths
// never run past their slot after their first submission.
func TestStrictGuardKeepsHonestVMsInSlot(t *testing.T) {
	log := &releaseLog{Policy: mustNew(t, "strict", Params{Timeslice: 10 * ms})}
	loads := []VMLoad{
		{ID: 1, Weight: 1, Cost: 3 * ms, Think: 200 * time.Microsecond},
		{ID: 2, Weight: 2, Cost: 7 * ms, Depth: 2},
		{ID: 3, Weight: 1, Cost: 700 * time.Microsecond, Think: 50 * time.Microsecond},
	}
	mustSim(t, log, loads, 2*time.Second, SimOptions{})
	p := log.Policy.(*strict)
	if len(log.starts) != len(log.ends) && len(log.starts) != len(log.ends)+1 {
		t.Fatalf("%d releases, %d completions", len(log.starts), len(log.ends))
	}
	for i, e := range log.ends {
		s := log.starts[i]
		_, _, end := p.slotAt(s.at)
		if e.at > end {
			t.Errorf("vm %d released at %v completed at %v, after its slot's end %v", s.vm, s.at, e.at, end)
		}
	}
}

// TestStrictShares: backlogged VMs get GPU time in proportion to their
// weights, and a VM alone gets no more than its slots (not work-conserving).
func TestStrictShares(t *testing.T) {
	loads := []VMLoad{
		{ID: 1, Weight: 1, Cost: ms, Depth: 2},
		{ID: 2, Weight: 2, Cost: ms, Depth: 2},
	}
	r := mustSim(t, mustNew(t, "strict", Params{}), loads, 10*time.Second, SimOptions{})
	if ratio := float64(r.Usage[1]) / float64(r.Usage[0]); math.Abs(ratio-2)/2 > 0.05 {
		t.Errorf("usage ratio %.3f, want 2 ± 5%%", ratio)
	}
	loads[1].Start = time.Hour // VM 2 registered but idle
	r = mustSim(t, mustNew(t, "strict", Params{}), loads, 9*time.Second, SimOptions{})
	if share := r.Usage[0].Seconds() / r.Duration.Seconds(); share > 1.0/3+0.01 {
		t.Errorf("lone VM used %.3f of the GPU, want at most its slot share 1/3", share)
	}
}
