// Package bench runs the GPUvm evaluation's workloads on a target (natively on
// the simulated board now; on virtual GPUs as the virtualization modes land),
// with one warm-up and N measured runs each, and reports per-phase medians,
// minima and maxima as a table or as JSON.
package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
)

// Result is one (mode, workload) row of a report. Durations are nanoseconds;
// PhasesNs and TotalNs are medians over the measured runs.
type Result struct {
	Mode     string `json:"mode"`
	Workload string `json:"workload"`
	Runs     int    `json:"runs"`
	Verified bool   `json:"verified"`
	Error    string `json:"error,omitempty"`
	// Recovered counts the runs retried after the device was reset under
	// them and the driver re-initialised (RunOptions.Recover).
	Recovered   int              `json:"recovered,omitempty"`
	PhasesNs    map[string]int64 `json:"phases_ns"`
	PhasesMinNs map[string]int64 `json:"phases_min_ns"`
	PhasesMaxNs map[string]int64 `json:"phases_max_ns"`
	TotalNs     int64            `json:"total_ns"`
	TotalMinNs  int64            `json:"total_min_ns"`
	TotalMaxNs  int64            `json:"total_max_ns"`
	Counters    map[string]any   `json:"counters"`
	// PhaseCounters, when asked for, splits Counters by the phase in which
	// they grew (thesis Fig. 4.4, 4.5): phase -> counters per run.
	PhaseCounters map[string]map[string]any `json:"phase_counters,omitempty"`
	// VsNative is TotalNs over the native run's TotalNs of the same workload
	// in the same report (0 when there is none); Published is GPUvm's ratio
	// for the same mode and workload (thesis Fig. 4.8), when known.
	VsNative  float64 `json:"vs_native,omitempty"`
	Published float64 `json:"gpuvm_vs_native,omitempty"`
}

// BoardInfo describes the physical (simulated) board a report was made on.
type BoardInfo struct {
	Name       string         `json:"name"`
	Kind       string         `json:"kind"`
	VRAMBytes  uint64         `json:"vram_bytes"`
	Channels   int            `json:"channels"`
	Timing     string         `json:"timing"`
	TimingInfo map[string]any `json:"timing_constants,omitempty"`
}

// Report is the whole output of a bench invocation.
type Report struct {
	Board   BoardInfo `json:"board"`
	Warmup  int       `json:"warmup"`
	Results []Result  `json:"results"`
}

// Normalize fills VsNative and Published of every result from the native
// results of the same report.
func (r *Report) Normalize() {
	native := map[string]int64{}
	for _, res := range r.Results {
		if res.Mode == "native" && res.Verified {
			native[res.Workload] = res.TotalNs
		}
	}
	for i := range r.Results {
		res := &r.Results[i]
		if n := native[res.Workload]; n > 0 && res.Verified {
			res.VsNative = float64(res.TotalNs) / float64(n)
		}
		res.Published, _ = PublishedRatio(res.Mode, res.Workload)
	}
}

// Verified reports whether every result verified.
func (r Report) Verified() bool {
	for _, res := range r.Results {
		if !res.Verified {
			return false
		}
	}
	return len(r.Results) > 0
}

// Progress receives one call before each run (run 0 is the warm-up).
type Progress func(mode, workload string, run, runs int)

// CounterSource snapshots a target's counters (monotonic totals).
type CounterSource func() map[string]uint64

// shapeCounters turns per-run counter deltas into the report's shape:
// barN_reads/barN_writes become barN_traps {"read", "write"} (for a vGPU,
// every BAR access that reached the aggregator trapped; natively they are
// the board's MMIO counts, reported as barN_mmio).
func shapeCounters(c map[string]uint64) map[string]any {
	out := aggregator.Report(c)
	if _, virt := c["scans"]; !virt {
		for _, bar := range []string{"bar0", "bar1", "bar3"} {
			if v, ok := out[bar+"_traps"]; ok {
				delete(out, bar+"_traps")
				out[bar+"_mmio"] = v
			}
		}
	}
	return out
}

// RunWorkload runs w once to warm up and then runs times on dev, and folds the
// measured runs into a Result. counters, if not nil, is sampled around the
// measured runs and reported per run.
func RunWorkload(ctx context.Context, mode string, drv gdev.Driver, w workloads.Workload, runs int, counters CounterSource, progress Progress) Result {
	return RunWorkloadWith(ctx, mode, drv, w, runs, counters, progress, RunOptions{})
}

// RunOptions are RunWorkloadWith's optional behaviours.
type RunOptions struct {
	// PhaseCounters also splits the counters by phase
	// (Result.PhaseCounters): the measured runs sample the counters as
	// each phase ends, outside the phase's time.
	PhaseCounters bool
	// NoWarmup leaves out the warm-up run (a smoke run's saving; the first
	// measured run then pays for what a warm-up would have).
	NoWarmup bool
	// Recover, if set, is asked about a run that failed: it reports
	// whether the device was reset under the run and the driver brought
	// it up again, and the run is then made again (at most maxRecoveries
	// times in a row) instead of failing the workload.
	Recover func(error) bool
}

// maxRecoveries bounds the retries of one run: a device reset over and
// over fails the workload rather than looping.
const maxRecoveries = 3

// runRecovering runs w once, again after each failure Recover recovers from.
func runRecovering(w workloads.Workload, drv gdev.Driver, opts RunOptions, res *Result) (workloads.Phases, error) {
	for tries := 0; ; tries++ {
		ph, err := w.Run(drv)
		if err == nil || opts.Recover == nil || tries == maxRecoveries || !opts.Recover(err) {
			return ph, err
		}
		res.Recovered++
	}
}

// RunWorkloadWith is RunWorkload with options.
func RunWorkloadWith(ctx context.Context, mode string, drv gdev.Driver, w workloads.Workload, runs int, counters CounterSource, progress Progress, opts RunOptions) Result {
	byPhase := opts.PhaseCounters && counters != nil
	res := Result{Mode: mode, Workload: w.Name(), Runs: runs, Counters: map[string]any{}}
	if progress == nil {
		progress = func(string, string, int, int) {}
	}
	if !opts.NoWarmup {
		progress(mode, w.Name(), 0, runs)
		if _, err := runRecovering(w, drv, opts, &res); err != nil {
			res.Error = fmt.Sprintf("warm-up: %v", err)
			return res
		}
	}
	var before map[string]uint64
	if counters != nil {
		before = counters()
	}
	var all []workloads.Phases
	measured := drv
	phaseSums := map[string]map[string]uint64{}
	if byPhase {
		last := before
		measured = workloads.Observe(drv, func(phase string) {
			now := counters()
			if phaseSums[phase] == nil {
				phaseSums[phase] = map[string]uint64{}
			}
			for k, v := range now {
				phaseSums[phase][k] += v - last[k]
			}
			last = now
		})
	}
	for i := 1; i <= runs; i++ {
		if err := ctx.Err(); err != nil {
			res.Error = err.Error()
			return res
		}
		progress(mode, w.Name(), i, runs)
		ph, err := runRecovering(w, measured, opts, &res)
		if err != nil {
			res.Error = fmt.Sprintf("run %d: %v", i, err)
			if errors.Is(err, workloads.ErrVerify) {
				res.Error = fmt.Sprintf("run %d: verification failed: %v", i, err)
			}
			return res
		}
		all = append(all, ph)
	}
	if counters != nil {
		after := counters()
		perRun := map[string]uint64{}
		for k, v := range after {
			perRun[k] = (v - before[k]) / uint64(max(runs, 1))
		}
		res.Counters = shapeCounters(perRun)
		if byPhase {
			res.PhaseCounters = map[string]map[string]any{}
			for phase, sums := range phaseSums {
				for k := range sums {
					sums[k] /= uint64(max(runs, 1))
				}
				res.PhaseCounters[phase] = shapeCounters(sums)
			}
		}
	}
	res.Verified = true
	summarize(&res, all)
	return res
}

func summarize(res *Result, all []workloads.Phases) {
	res.PhasesNs, res.PhasesMinNs, res.PhasesMaxNs = map[string]int64{}, map[string]int64{}, map[string]int64{}
	for _, name := range workloads.PhaseNames() {
		ds := make([]time.Duration, len(all))
		for i, ph := range all {
			ds[i] = ph.Get(name)
		}
		res.PhasesNs[name] = int64(workloads.Median(ds))
		res.PhasesMinNs[name], res.PhasesMaxNs[name] = minMax(ds)
	}
	totals := make([]time.Duration, len(all))
	for i, ph := range all {
		totals[i] = ph.Total()
	}
	res.TotalNs = int64(workloads.Median(totals))
	res.TotalMinNs, res.TotalMaxNs = minMax(totals)
}

func minMax(ds []time.Duration) (lo, hi int64) {
	for i, d := range ds {
		if i == 0 || int64(d) < lo {
			lo = int64(d)
		}
		if int64(d) > hi {
			hi = int64(d)
		}
	}
	return lo, hi
}
