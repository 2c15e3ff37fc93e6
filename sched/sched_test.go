package sched

import (
	"errors"
	"math"
	"reflect"
	"testing"
	"time"
)

const ms = time.Millisecond

func mustNew(t testing.TB, name string, p Params) Policy {
	t.Helper()
	pol, err := New(name, p)
	if err != nil {
		t.Fatal(err)
	}
	return pol
}

func mustSim(t testing.TB, p Policy, loads []VMLoad, d time.Duration, opt SimOptions) SimResult {
	t.Helper()
	r, err := Simulate(p, loads, d, opt)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func check(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestJain(t *testing.T) {
	for _, c := range []struct {
		x    []float64
		want float64
	}{
		{[]float64{1, 1, 1, 1}, 1},
		{[]float64{1, 0, 0, 0}, 0.25},
		{[]float64{1, 2}, 0.9},
		{[]float64{1, 15}, 256.0 / 452},
		{[]float64{3, 0}, 0.5},
		{[]float64{0, 0}, 1},
		{nil, 0},
	} {
		if got := Jain(c.x); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("Jain(%v) = %v, want %v", c.x, got, c.want)
		}
	}
}

func TestManualClock(t *testing.T) {
	var c ManualClock
	if c.Now() != 0 {
		t.Fatal("zero clock not at 0")
	}
	c.Advance(5 * ms)
	c.Advance(-ms)
	c.Set(2 * ms)
	if got := c.Now(); got != 5*ms {
		t.Fatalf("Now = %v, want 5ms (monotonic)", got)
	}
	if got := c.Set(7 * ms); got != 7*ms {
		t.Fatalf("Set = %v", got)
	}
	r := NewRealClock()
	a := r.Now()
	if b := r.Now(); b < a {
		t.Fatal("real clock went backwards")
	}
}

func TestNewAndErrors(t *testing.T) {
	if _, err := New("lottery", Params{}); !errors.Is(err, ErrUnknownPolicy) {
		t.Errorf("unknown policy: %v", err)
	}
	if _, err := New("band", Params{BandPoll: ms, BandWait: 500 * time.Microsecond}); !errors.Is(err, ErrBadParam) {
		t.Errorf("poll > wait: %v", err)
	}
	if _, err := New("credit", Params{Period: -1}); !errors.Is(err, ErrBadParam) {
		t.Errorf("negative period: %v", err)
	}
	if got, want := Names(), []string{"fifo", "credit", "band", "wfq", "timeslice", "dfq", "strict"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Names = %v", got)
	}
	for _, name := range Names() {
		p := mustNew(t, name, Params{})
		if p.Name() != name {
			t.Errorf("%s: Name() = %q", name, p.Name())
		}
		check(t, p.AddVM(1, 1, 0))
		if err := p.AddVM(1, 1, 0); !errors.Is(err, ErrDuplicateVM) {
			t.Errorf("%s: duplicate: %v", name, err)
		}
		if err := p.AddVM(2, 0, 0); !errors.Is(err, ErrBadWeight) {
			t.Errorf("%s: weight 0: %v", name, err)
		}
		if err := p.Submitted(9, 0); !errors.Is(err, ErrUnknownVM) {
			t.Errorf("%s: unknown submitted: %v", name, err)
		}
		if err := p.Started(1, 0); !errors.Is(err, ErrNotQueued) {
			t.Errorf("%s: started with nothing queued: %v", name, err)
		}
		if err := p.Completed(1, ms, 0); !errors.Is(err, ErrNotQueued) {
			t.Errorf("%s: completed with nothing running: %v", name, err)
		}
		check(t, p.RemoveVM(1, 0))
		if err := p.RemoveVM(1, 0); !errors.Is(err, ErrUnknownVM) {
			t.Errorf("%s: remove twice: %v", name, err)
		}
		if d := p.Next(0); d.Action != Idle {
			t.Errorf("%s: empty policy decided %v", name, d.Action)
		}
	}
}

// TestFIFOOrder: releases follow submission order across VMs.
func TestFIFOOrder(t *testing.T) {
	p := mustNew(t, "fifo", Params{})
	for id := VMID(1); id <= 3; id++ {
		check(t, p.AddVM(id, int(id), 0))
	}
	order := []VMID{2, 1, 2, 3, 1}
	for i, id := range order {
		check(t, p.Submitted(id, time.Duration(i)))
	}
	var got []VMID
	now := 10 * ms
	for {
		d := p.Next(now)
		if d.Action != Dispatch {
			break
		}
		got = append(got, d.VM)
		check(t, p.Started(d.VM, now))
		now += ms
		check(t, p.Completed(d.VM, ms, now))
	}
	if !reflect.DeepEqual(got, order) {
		t.Fatalf("FIFO released %v, want %v", got, order)
	}
}

// TestWeightedShares: two backlogged VMs with weights 1:2 and equal request
// cost get GPU time 1:2 within 5 % under every weighted policy.
func TestWeightedShares(t *testing.T) {
	for _, name := range []string{"credit", "band", "wfq", "timeslice", "dfq"} {
		t.Run(name, func(t *testing.T) {
			loads := []VMLoad{
				{ID: 1, Weight: 1, Cost: ms, Think: 100 * time.Microsecond, Depth: 2},
				{ID: 2, Weight: 2, Cost: ms, Think: 100 * time.Microsecond, Depth: 2},
			}
			r := mustSim(t, mustNew(t, name, Params{}), loads, 10*time.Second, SimOptions{})
			ratio := float64(r.Usage[1]) / float64(r.Usage[0])
			t.Logf("usage %v ratio %.3f", r.Usage, ratio)
			if math.Abs(ratio-2)/2 > 0.05 {
				t.Errorf("usage ratio %.3f, want 2 ± 5%%", ratio)
			}
		})
	}
}

// maddLoads is the thesis' §4.3.3 workload: n VMs, half looping madd (1 ms
// kernels), half long-madd (15× longer), each waiting for its kernel and
// spending 100 µs of CPU time before launching the next.
func maddLoads(n int) []VMLoad {
	loads := make([]VMLoad, n)
	for i := range loads {
		cost := ms
		if i%2 == 1 {
			cost = 15 * ms
		}
		loads[i] = VMLoad{ID: VMID(i + 1), Cost: cost, Think: 100 * time.Microsecond}
	}
	return loads
}

// steadyMinJain is the smallest Jain index over the windows after the
// first (start-up: every VM begins with a full period of credit).
func steadyMinJain(ws WindowStats) float64 {
	m := 1.0
	for _, j := range ws.Jain[1:] {
		m = min(m, j)
	}
	return m
}

// TestMaddLongMadd reproduces thesis Fig. 4.11: over 500 ms windows BAND is
// fair in the 2-, 4- and 8-VM cases, and so is WFQ thanks to its
// anticipation window (without it, 2-VM WFQ was FIFO: Jain 0.566); CREDIT is unfair with 2 VMs (when the
// madd kernel completes only long-madd is queued, so CREDIT dispatches it
// without credit) but fair with 4 and 8; FIFO is unfair in all cases.
func TestMaddLongMadd(t *testing.T) {
	opt := SimOptions{Windows: []time.Duration{500 * ms, 100 * ms}, DecisionCost: 5 * time.Microsecond}
	for _, n := range []int{2, 4, 8} {
		res := map[string]SimResult{}
		for _, name := range Names() {
			r := mustSim(t, mustNew(t, name, Params{}), maddLoads(n), 10*time.Second, opt)
			res[name] = r
			t.Logf("%dVM %-9s Jain overall %.3f, 500ms windows min %.3f mean %.3f, 100ms windows min %.3f mean %.3f; min/max run %.3f 500ms %.3f 100ms %.3f; GPU busy %.1f%%",
				n, name, r.Jain, steadyMinJain(r.Windows[0]), r.Windows[0].MeanJain,
				steadyMinJain(r.Windows[1]), r.Windows[1].MeanJain,
				r.MinMax, r.Windows[0].MeanMinMax, r.Windows[1].MeanMinMax, 100*r.Busy.Seconds()/r.Duration.Seconds())
		}
		// BAND and WFQ (with its anticipation window): fair over 500 ms
		// windows by Jain, and by the strict measure over the run.
		for _, name := range []string{"band", "wfq"} {
			if j := steadyMinJain(res[name].Windows[0]); j < 0.95 {
				t.Errorf("%dVM: %s min Jain over 500 ms windows %.3f < 0.95", n, name, j)
			}
			// BAND at 8 VMs reaches 0.963: credit is replenished per
			// 100 ms period and a 15 ms non-preemptive submission exceeds
			// the 12.5 ms share, so its period accounting is coarser than
			// WFQ's per-submission virtual time.
			want := 0.97
			if name == "band" && n == 8 {
				want = 0.96
			}
			if mm := res[name].MinMax; mm < want {
				t.Errorf("%dVM: %s min/max share over the run %.3f < %.2f", n, name, mm, want)
			}
		}
		if j := res["fifo"].Windows[0].MeanJain; j > 0.7 {
			t.Errorf("%dVM: FIFO mean Jain %.3f, expected unfair (< 0.7)", n, j)
		}
		// DFQ: fair over 500 ms windows (NEON's denial rule gave 0.99, 0.91
		// and 0.79 here for 2, 4 and 8 VMs).
		if j := res["dfq"].Windows[0].MeanJain; j < 0.95 {
			t.Errorf("%dVM: DFQ mean Jain over 500 ms windows %.3f < 0.95", n, j)
		}
		credit := res["credit"].Windows[0].MeanJain
		if n == 2 && credit > 0.7 {
			t.Errorf("2VM: CREDIT mean Jain %.3f, expected unfair (< 0.7) as in the thesis", credit)
		}
		if n > 2 && credit < 0.95 {
			t.Errorf("%dVM: CREDIT mean Jain %.3f, expected fair (≥ 0.95) as in the thesis", n, credit)
		}
	}
}

// TestBandWait checks the wait itself: after VM 1's command completes, VM 2
// (over its share) is queued, and BAND polls for VM 1 up to band_wait.
func TestBandWait(t *testing.T) {
	p := mustNew(t, "band", Params{Period: 100 * ms})
	check(t, p.AddVM(1, 1, 0))
	check(t, p.AddVM(2, 1, 0))
	// VM 2 exhausts its 50 ms credit.
	check(t, p.Submitted(2, 0))
	check(t, p.Started(2, 0))
	check(t, p.Completed(2, 60*ms, 60*ms))
	check(t, p.Submitted(2, 60*ms))
	check(t, p.Submitted(1, 60*ms))
	if d := p.Next(60 * ms); d.Action != Dispatch || d.VM != 1 {
		t.Fatalf("decision %+v, want dispatch of VM 1 (has credit)", d)
	}
	check(t, p.Started(1, 60*ms))
	done := 61 * ms
	check(t, p.Completed(1, ms, done))
	d := p.Next(done)
	if d.Action != Wait || d.Until != done+50*time.Microsecond {
		t.Fatalf("after VM 1 completes: %+v, want wait one 50µs poll", d)
	}
	if d := p.Next(done + 450*time.Microsecond); d.Action != Wait || d.Until != done+500*time.Microsecond {
		t.Fatalf("late poll: %+v, want wait capped at band_wait", d)
	}
	// VM 1 submits within the wait: it runs, not VM 2.
	check(t, p.Submitted(1, done+100*time.Microsecond))
	if d := p.Next(done + 100*time.Microsecond); d.Action != Dispatch || d.VM != 1 {
		t.Fatalf("VM 1 arrived: %+v, want dispatch of VM 1", d)
	}
	check(t, p.Started(1, done+100*time.Microsecond))
	done2 := done + 1100*time.Microsecond
	check(t, p.Completed(1, ms, done2))
	// VM 1 does not come back: after band_wait VM 2 runs (work-conserving).
	if d := p.Next(done2 + 500*time.Microsecond); d.Action != Dispatch || d.VM != 2 {
		t.Fatalf("wait expired: %+v, want dispatch of VM 2", d)
	}
}

// TestBandChargesOverhead: scheduler time is charged equally to the VMs
// competing for the GPU (thesis §4.1.5).
func TestBandChargesOverhead(t *testing.T) {
	pol := mustNew(t, "band", Params{Period: 100 * ms})
	p := pol.(*band)
	for id := VMID(1); id <= 3; id++ {
		check(t, p.AddVM(id, 1, 0))
	}
	check(t, p.Submitted(1, 0))
	check(t, p.Submitted(2, 0))
	before := []time.Duration{p.byID[1].credit, p.byID[2].credit, p.byID[3].credit}
	p.Overhead(2*ms, ms)
	after := []time.Duration{p.byID[1].credit, p.byID[2].credit, p.byID[3].credit}
	want := []time.Duration{before[0] - ms, before[1] - ms, before[2]}
	if !reflect.DeepEqual(after, want) {
		t.Fatalf("credits after 2ms overhead %v, want %v", after, want)
	}
	// CREDIT does not account scheduler time.
	c := mustNew(t, "credit", Params{}).(*credit)
	check(t, c.AddVM(1, 1, 0))
	check(t, c.Submitted(1, 0))
	b := c.byID[1].credit
	c.Overhead(2*ms, ms)
	if c.byID[1].credit != b {
		t.Fatal("credit charged overhead")
	}
}

// TestNoBanking: a VM idle for 10 periods, then backlogged, gets no more
// than its share afterwards (CREDIT, BAND, WFQ).
func TestNoBanking(t *testing.T) {
	for _, name := range []string{"credit", "band", "wfq"} {
		t.Run(name, func(t *testing.T) {
			loads := []VMLoad{
				{ID: 1, Cost: ms, Depth: 2},
				{ID: 2, Cost: ms, Depth: 2, Start: time.Second}, // idle for 10 × 100 ms
			}
			r := mustSim(t, mustNew(t, name, Params{Period: 100 * ms}), loads, 3*time.Second, SimOptions{Windows: []time.Duration{100 * ms}})
			// In every 100 ms window after it wakes up, VM 2 gets at most
			// half the GPU plus one 1 ms request of rounding.
			for w := 10; w < 30; w++ {
				u := r.Windows[0].Usage[w]
				if u[1] > 51*ms {
					t.Errorf("window %d: idle-then-active VM used %v of %v (banked credit)", w, u[1], u[0]+u[1])
				}
			}
		})
	}
}

// TestWFQNewVMStart: a VM that becomes active starts at the minimum virtual
// time of the active VMs, so it shares instead of monopolising.
func TestWFQNewVMStart(t *testing.T) {
	p := mustNew(t, "wfq", Params{}).(*wfq)
	check(t, p.AddVM(1, 1, 0))
	check(t, p.AddVM(2, 2, 0))
	check(t, p.AddVM(3, 1, 0))
	now := time.Duration(0)
	run := func(n int) map[VMID]int {
		count := map[VMID]int{}
		for i := 0; i < n; i++ {
			d := p.Next(now)
			if d.Action != Dispatch {
				t.Fatalf("decision %+v", d)
			}
			count[d.VM]++
			check(t, p.Started(d.VM, now))
			now += ms
			check(t, p.Submitted(d.VM, now)) // stays backlogged
			check(t, p.Completed(d.VM, ms, now))
		}
		return count
	}
	check(t, p.Submitted(1, 0))
	check(t, p.Submitted(2, 0))
	run(300) // VMs 1 and 2 accumulate virtual time; VM 3 idle
	minVT := min(p.byID[1].vt, p.byID[2].vt)
	check(t, p.Submitted(3, now))
	if got := p.byID[3].vt; got != minVT {
		t.Fatalf("new VM virtual time %v, want min active %v", got, minVT)
	}
	c := run(400)
	// Shares 1:2:1 → 100:200:100.
	if c[3] < 90 || c[3] > 110 || c[2] < 190 || c[2] > 210 {
		t.Fatalf("dispatches after VM 3 joined %v, want ≈ 1:100 2:200 3:100", c)
	}
}

// TestTimesliceOveruse: a request that overruns the slice is deducted from
// the holder's next slice.
func TestTimesliceOveruse(t *testing.T) {
	p := mustNew(t, "timeslice", Params{Timeslice: 30 * ms})
	check(t, p.AddVM(1, 1, 0))
	check(t, p.AddVM(2, 1, 0))
	check(t, p.Submitted(1, 0))
	check(t, p.Submitted(2, 0))
	step := func(now time.Duration, want VMID) {
		t.Helper()
		d := p.Next(now)
		if d.Action != Dispatch || d.VM != want {
			t.Fatalf("at %v: %+v, want dispatch of VM %d", now, d, want)
		}
		check(t, p.Started(want, now))
	}
	step(0, 1) // VM 1's slice is [0, 30ms)
	check(t, p.Completed(1, 50*ms, 50*ms))
	check(t, p.Submitted(1, 50*ms)) // overran by 20 ms
	step(50*ms, 2)                  // VM 2's slice [50, 80)
	check(t, p.Completed(2, 30*ms, 80*ms))
	check(t, p.Submitted(2, 80*ms))
	step(80*ms, 1) // VM 1's slice is 30 - 20 = 10 ms: [80, 90)
	check(t, p.Completed(1, 5*ms, 85*ms))
	check(t, p.Submitted(1, 85*ms))
	step(85*ms, 1)
	check(t, p.Completed(1, 5*ms, 90*ms))
	check(t, p.Submitted(1, 90*ms))
	step(90*ms, 2) // penalised slice over; without overuse control VM 1 would keep the GPU

	// In simulation, a VM whose 45 ms requests overrun every 30 ms slice
	// gets the same GPU time as one with 1 ms requests, not 45:30.
	loads := []VMLoad{{ID: 1, Cost: 45 * ms, Depth: 2}, {ID: 2, Cost: ms, Depth: 2}}
	r := mustSim(t, mustNew(t, "timeslice", Params{}), loads, 10*time.Second, SimOptions{})
	ratio := float64(r.Usage[0]) / float64(r.Usage[1])
	if ratio > 1.1 {
		t.Errorf("overrunning VM got %.2f× the other's GPU time, want ≤ 1.1", ratio)
	}
}

// recorder wraps a Policy and records its decisions.
type recorder struct {
	Policy
	log []Decision
}

func (r *recorder) Next(now time.Duration) Decision {
	d := r.Policy.Next(now)
	d.Deny = append([]VMID(nil), d.Deny...)
	r.log = append(r.log, d)
	return d
}

// TestDFQHoldsBackHog: after sampling, a VM whose requests are 15× longer
// is denied during most free runs, which restores fairness that an unscheduled
// free run (the GPU's round-robin) would not give.
func TestDFQHoldsBackHog(t *testing.T) {
	loads := []VMLoad{
		{ID: 1, Cost: ms, Think: 100 * time.Microsecond},
		{ID: 2, Cost: 15 * ms, Think: 100 * time.Microsecond},
	}
	rec := &recorder{Policy: mustNew(t, "dfq", Params{})}
	r := mustSim(t, rec, loads, 10*time.Second, SimOptions{})
	var free, hogDenied, smallDenied int
	for _, d := range rec.log {
		if d.Action != FreeRun {
			continue
		}
		free++
		for _, id := range d.Deny {
			switch id {
			case 1:
				smallDenied++
			case 2:
				hogDenied++
			}
		}
	}
	t.Logf("free runs %d, hog denied in %d, small VM denied in %d; usage %v; Jain %.3f", free, hogDenied, smallDenied, r.Usage, r.Jain)
	// dfq denies whichever VM a free run would put more than a request
	// ahead: mostly the hog, sometimes (after a free run of its own) the
	// small VM.
	if hogDenied <= 2*smallDenied {
		t.Errorf("hog denied in %d free runs, small VM in %d: want the hog more than twice as often", hogDenied, smallDenied)
	}
	if r.Jain < 0.95 {
		t.Errorf("overall Jain %.3f < 0.95", r.Jain)
	}
}

// TestDFQFreeRunLength: one engagement sampling two VMs yields a 50 ms
// free run (NEON §5.3).
func TestDFQFreeRunLength(t *testing.T) {
	p := mustNew(t, "dfq", Params{})
	check(t, p.AddVM(1, 1, 0))
	check(t, p.AddVM(2, 1, 0))
	now := time.Duration(0)
	check(t, p.Submitted(1, now))
	check(t, p.Submitted(2, now))
	for i := 0; i < 1000; i++ {
		d := p.Next(now)
		switch d.Action {
		case Dispatch:
			check(t, p.Started(d.VM, now))
			now += ms
			check(t, p.Completed(d.VM, ms, now))
			check(t, p.Submitted(d.VM, now))
			continue
		case FreeRun:
			// Sampling: 5 ms per VM (5 × 1 ms < 32 requests).
			if now != 10*ms || d.Until != now+50*ms || len(d.Deny) != 0 {
				t.Fatalf("free run %+v at %v, want until %v with no denial", d, now, now+50*ms)
			}
			return
		default:
			t.Fatalf("unexpected %+v at %v", d, now)
		}
	}
	t.Fatal("no free run")
}

// TestSimulateDeterministic: two runs give identical results.
func TestSimulateDeterministic(t *testing.T) {
	for _, name := range Names() {
		opt := SimOptions{DecisionCost: 3 * time.Microsecond, SwitchCost: 20 * time.Microsecond}
		a := mustSim(t, mustNew(t, name, Params{}), maddLoads(4), 2*time.Second, opt)
		b := mustSim(t, mustNew(t, name, Params{}), maddLoads(4), 2*time.Second, opt)
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s: simulation not deterministic", name)
		}
	}
}

// TestOverheadVsFIFO studies scheduling overhead (thesis §4.3.4) in the
// 2-VM madd/long-madd case with a per-decision CPU cost and a GPU context
// switch cost: BAND, which runs one context in batches, switches far less
// than CREDIT and FIFO, and every decision's cost is reported as overhead.
func TestOverheadVsFIFO(t *testing.T) {
	opt := SimOptions{DecisionCost: 20 * time.Microsecond, SwitchCost: 50 * time.Microsecond}
	res := map[string]SimResult{}
	for _, name := range []string{"fifo", "credit", "band"} {
		r := mustSim(t, mustNew(t, name, Params{}), maddLoads(2), 5*time.Second, opt)
		res[name] = r
		t.Logf("%-6s madd %4d long-madd %3d requests, %d decisions, %d switches, overhead %v, GPU busy %.1f%%",
			name, r.Requests[0], r.Requests[1], r.Decisions, r.Switches, r.Overhead, 100*r.Busy.Seconds()/r.Duration.Seconds())
		if min := time.Duration(r.Decisions) * opt.DecisionCost; r.Overhead < min {
			t.Errorf("%s: overhead %v < decisions × cost %v", name, r.Overhead, min)
		}
	}
	if b, c := res["band"].Switches, res["credit"].Switches; 3*b >= 2*c {
		t.Errorf("BAND switched %d times, CREDIT %d: want BAND batching to cut switches by a third or more", b, c)
	}
}

func TestSimulateRejectsBadInput(t *testing.T) {
	p := mustNew(t, "fifo", Params{})
	if _, err := Simulate(p, []VMLoad{{ID: 1}}, time.Second, SimOptions{}); !errors.Is(err, ErrSim) {
		t.Errorf("zero cost: %v", err)
	}
	p = mustNew(t, "fifo", Params{})
	if _, err := Simulate(p, []VMLoad{{ID: 1, Cost: ms}, {ID: 1, Cost: ms}}, time.Second, SimOptions{}); !errors.Is(err, ErrSim) {
		t.Errorf("duplicate: %v", err)
	}
}

// TestWeighted124MaddLongMadd: three VMs with weights 1, 2 and 4 running
// madd, long-madd and madd (the harness' `gpuvm bench fairness --vms 3
// --weights 1,2,4`) get GPU time 1:2:4 under BAND and WFQ: usage/weight
// min/max ≥ 0.95 over the run.
func TestWeighted124MaddLongMadd(t *testing.T) {
	loads := maddLoads(3)
	for i, w := range []int{1, 2, 4} {
		loads[i].Weight = w
	}
	opt := SimOptions{Windows: []time.Duration{500 * ms, 100 * ms}, DecisionCost: 5 * time.Microsecond}
	for _, name := range []string{"band", "wfq", "credit", "dfq", "timeslice"} {
		r := mustSim(t, mustNew(t, name, Params{}), loads, 10*time.Second, opt)
		t.Logf("%-9s usage %v; usage/weight min/max run %.3f, 500 ms %.3f, 100 ms %.3f", name, r.Usage, r.MinMax, r.Windows[0].MeanMinMax, r.Windows[1].MeanMinMax)
		if (name == "band" || name == "wfq") && r.MinMax < 0.95 {
			t.Errorf("%s: usage/weight min/max over the run %.3f < 0.95", name, r.MinMax)
		}
	}
}
