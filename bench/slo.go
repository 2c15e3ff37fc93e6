package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
)

// SLOBenchOptions configure gpuvm bench slo: one latency-sensitive VM (vm1,
// looping madd: one short kernel per submission, waiting for each) with a
// queue-wait objective beside throughput VMs (long-madd: Repeat kernels per
// submission), once under the policy alone and once with SLA feedback
// (Pegasus' SLAF), in one invocation, so both runs share the host's state.
type SLOBenchOptions struct {
	// Fairness carries the board, duration, loads' sizes, scheduler
	// parameters and VM command; its Policies, VMs, Weights, SLO and
	// Watch are set per run.
	Fairness FairnessOptions
	// Policy is the (weighted) policy of both runs.
	Policy string
	// VMs is how many VMs run: vm1 the latency VM, the others throughput
	// VMs; ≥ 2.
	VMs int
	// LatencyWeight and BulkWeight are the weights of vm1 and of the
	// others (a small profile beside big ones: 1 and 4, the built-in
	// quarter- and whole-slot profiles).
	LatencyWeight, BulkWeight int
	// SLO is each VM's queue-wait objective, by name (vm1, vm2, ...).
	SLO map[string]time.Duration
	// Feedback is SLA feedback in the second run (its Window > 0).
	Feedback aggregator.SLAFeedback
}

// SLOVM is one VM of one run: its objective and how its submissions'
// queue waits (doorbell to release, over the recorded run) met it.
type SLOVM struct {
	Name   string `json:"name"`
	Load   string `json:"load"`
	Weight int    `json:"weight"`
	// SLONs is its objective (0: none); Violations the recorded
	// submissions that waited longer, of Submissions.
	SLONs       int64   `json:"slo_ns,omitempty"`
	Submissions int     `json:"submissions"`
	Violations  int     `json:"violations"`
	ViolationPc float64 `json:"violation_pct"`
	// P50Ns, P99Ns and MaxNs are its queue waits' median, 99th percentile
	// and maximum.
	P50Ns int64 `json:"p50_wait_ns"`
	P99Ns int64 `json:"p99_wait_ns"`
	MaxNs int64 `json:"max_wait_ns"`
	// Throughput is its iterations per second; Share its part of the GPU
	// time the VMs used.
	Throughput float64 `json:"iterations_per_s"`
	Share      float64 `json:"share"`
	// MaxWeight is the highest weight the scheduler gave it (above Weight
	// only under SLA feedback); BoostedWindows the feedback windows that
	// ended with it boosted.
	MaxWeight      int    `json:"max_effective_weight"`
	BoostedWindows uint64 `json:"boosted_windows"`
}

// SLORun is one run: the policy, alone or with SLA feedback.
type SLORun struct {
	Policy   string  `json:"policy"`
	Feedback bool    `json:"sla_feedback"`
	VMs      []SLOVM `json:"vms"`
	GPUBusy  float64 `json:"gpu_busy"`
}

// SLOReport is gpuvm bench slo's output.
type SLOReport struct {
	DurationNs int64 `json:"duration_ns"`
	WindowNs   int64 `json:"sla_window_ns"`
	Boost      int   `json:"sla_boost"`
	MaxBoost   int   `json:"sla_max_boost"`
	// Runs are the policy alone, then with SLA feedback.
	Runs []SLORun `json:"runs"`
}

// RunSLO runs the latency VM and the throughput VMs under o.Policy without
// and then with SLA feedback, and reports each VM's violations, queue-wait
// percentiles, throughput and share.
func RunSLO(ctx context.Context, o SLOBenchOptions) (SLOReport, error) {
	rep := SLOReport{DurationNs: int64(o.Fairness.Duration), WindowNs: int64(o.Feedback.Window), Boost: o.Feedback.Boost, MaxBoost: o.Feedback.MaxBoost}
	if o.VMs < 2 {
		return rep, fmt.Errorf("bench slo: %d VMs: want at least 2 (a latency VM and a throughput VM)", o.VMs)
	}
	if o.Feedback.Window <= 0 {
		return rep, fmt.Errorf("bench slo: SLA feedback window %v: want > 0", o.Feedback.Window)
	}
	kinds := make([]string, o.VMs)
	weights := make([]int, o.VMs)
	for i := range kinds {
		kinds[i], weights[i] = "long-madd", o.BulkWeight
	}
	kinds[0], weights[0] = "madd", o.LatencyWeight
	for _, fb := range []aggregator.SLAFeedback{{}, o.Feedback} {
		fo := o.Fairness
		fo.Policies, fo.VMs, fo.Weights = []string{o.Policy}, []int{o.VMs}, weights
		if len(fo.Windows) == 0 {
			fo.Windows = []time.Duration{500 * time.Millisecond, 100 * time.Millisecond}
		}
		fo.SLO = aggregator.SLOOptions{Target: func(g aggregator.Guest) time.Duration { return o.SLO[g.Name] }, Feedback: fb}
		w := &sloWatch{maxWeight: map[string]int{}, boosted: map[string]uint64{}}
		fo.Watch = w.watch
		if fo.Progress != nil {
			fo.Progress(fmt.Sprintf("slo: %s%s, %d VMs for %v", o.Policy, map[bool]string{true: " with SLA feedback"}[fb.Window > 0], o.VMs, fo.Duration))
		}
		fr, err := runLoads(ctx, fo, o.Policy, kinds, fo.Duration)
		if err != nil {
			return rep, fmt.Errorf("slo run (feedback %v): %w", fb.Window > 0, err)
		}
		rep.Runs = append(rep.Runs, w.summary(fr, o, fb.Window > 0))
	}
	return rep, nil
}

// sloWatch samples a run's scheduler accounts while it runs, and takes its
// recorded submissions when it ends.
type sloWatch struct {
	mu        sync.Mutex
	maxWeight map[string]int
	boosted   map[string]uint64
	usage     []aggregator.Usage
}

// watchEvery is how often sloWatch samples the effective weights: a
// tenth of the default SLA window.
const watchEvery = 10 * time.Millisecond

func (w *sloWatch) watch(ctx context.Context, agg *aggregator.Aggregator) {
	t := time.NewTicker(watchEvery)
	defer t.Stop()
	for {
		w.mu.Lock()
		for v, s := range agg.SchedStats() {
			w.maxWeight[v.Guest.Name] = max(w.maxWeight[v.Guest.Name], s.EffectiveWeight)
			w.boosted[v.Guest.Name] = max(w.boosted[v.Guest.Name], s.SLABoostedWindows)
		}
		w.mu.Unlock()
		select {
		case <-ctx.Done():
			usage, _ := agg.Recorded()
			w.mu.Lock()
			w.usage = usage
			w.mu.Unlock()
			return
		case <-t.C:
		}
	}
}

// summary turns a run's recorded waits and the fairness summary into SLOVMs.
func (w *sloWatch) summary(fr FairnessRun, o SLOBenchOptions, feedback bool) SLORun {
	w.mu.Lock()
	defer w.mu.Unlock()
	run := SLORun{Policy: fr.Policy, Feedback: feedback, GPUBusy: fr.GPUBusy}
	waits := map[string][]time.Duration{}
	for _, u := range w.usage {
		waits[u.Name] = append(waits[u.Name], u.Wait)
	}
	for i := range fr.VMs {
		name := vmName(i)
		vm := SLOVM{Name: name, Weight: fr.Weights[i], SLONs: int64(o.SLO[name]), Throughput: fr.Throughput[name], Share: fr.Share[name],
			MaxWeight: w.maxWeight[name], BoostedWindows: w.boosted[name]}
		if i < len(fr.Loads) {
			vm.Load = fr.Loads[i].Kind
		}
		ws := waits[name]
		slices.Sort(ws)
		vm.Submissions = len(ws)
		if n := len(ws); n > 0 {
			vm.P50Ns, vm.P99Ns, vm.MaxNs = int64(waitQuantile(ws, 0.50)), int64(waitQuantile(ws, 0.99)), int64(ws[n-1])
			if slo := o.SLO[name]; slo > 0 {
				for _, x := range ws {
					if x > slo {
						vm.Violations++
					}
				}
				vm.ViolationPc = 100 * float64(vm.Violations) / float64(n)
			}
		}
		run.VMs = append(run.VMs, vm)
	}
	return run
}

// waitQuantile returns the q-quantile of sorted (nearest rank).
func waitQuantile(sorted []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// watch starts o.Watch on agg, if set; the returned func stops it and
// waits for it to return.
func (o FairnessOptions) watch(agg *aggregator.Aggregator) func() {
	if o.Watch == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		o.Watch(ctx, agg)
	}()
	return func() {
		cancel()
		<-done
	}
}
