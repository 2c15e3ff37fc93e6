package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/ipc"
	"github.com/gpuvm/gpuvm/sched"
)

// FairnessOptions configure the fairness harness.
type FairnessOptions struct {
	Board    sim.Config
	Policies []string
	VMs      []int
	// Modes are the VMs' virtualization modes, VM i running
	// Modes[i % len(Modes)] (default: all fv-optimized).
	Modes     []string
	Duration  time.Duration
	MatrixDim int // madd matrix dimension
	Repeat    int // kernels per long-madd submission (15 in the thesis)
	Sched     sched.Params
	Windows   []time.Duration // usage windows; default 500 ms and 100 ms
	// Weights are the VMs' scheduling weights, VM i getting
	// Weights[i % len(Weights)] (default: 1 each). Jain's index and the
	// min/max measures are taken over each VM's usage divided by its
	// weight, so 1 means every VM got its weighted share.
	Weights []int
	// Yield has the long-madd VMs declare a scheduling point after each
	// kernel (cooperative yield, GLoop): their modes must be PV.
	Yield bool
	// ServerSpin is the aggregator's IPC spin budget per VM connection
	// (ipc.ListenOptions.Spin; 0: the package default, negative: never).
	ServerSpin int
	Command    VMCommand
	Progress   func(msg string)
	Logger     *slog.Logger
	// SLO gives the VMs queue-wait objectives and tunes SLA feedback
	// (gpuvm bench slo).
	SLO aggregator.SLOOptions
	// Watch, if set, runs while the VMs load the GPU (from the moment the
	// run is recorded) with the run's aggregator, until ctx is done —
	// after the VMs ended, before their results are summarised.
	Watch func(ctx context.Context, agg *aggregator.Aggregator)
}

// FairnessRun is one (policy, VM count) experiment.
type FairnessRun struct {
	Policy string `json:"policy"`
	VMs    int    `json:"vms"`
	// Modes is each VM's mode, in VM order.
	Modes []string `json:"modes"`
	// Weights is each VM's scheduling weight, in VM order.
	Weights []int `json:"weights"`
	// Yield: the long-madd VMs declared a scheduling point after each
	// kernel.
	Yield bool `json:"yield,omitempty"`
	// Splits is how many submissions the dispatcher cut at a scheduling
	// point while the run was recorded (DispatchStats.Splits): with Yield,
	// evidence that the points took effect; without, 0.
	Splits uint64 `json:"splits"`
	// Share is each VM's share of the GPU time the VMs used over the run
	// (the first 500 ms window left out), and Target its weighted share,
	// weight / sum of weights: MinMaxRun is the smallest Share/Target over
	// the largest.
	Share  map[string]float64 `json:"share"`
	Target map[string]float64 `json:"target"`
	// Jain500 and Jain100 are Jain's fairness index of the VMs' GPU usage
	// divided by their weights, averaged over the 500 ms and 100 ms windows of the run (the first
	// window, the start-up, left out).
	Jain500 float64 `json:"jain_500ms"`
	Jain100 float64 `json:"jain_100ms"`
	// MinMax500 and MinMax100 are the least-served VM's GPU usage over the
	// most-served one's (FairGV's measure, stricter than Jain's: 0.98 Jain
	// for two VMs can still be a 25 % gap), averaged over the same windows;
	// MinMaxRun is the same ratio of the VMs' GPU time over the whole run
	// after the first 500 ms window.
	MinMax500 float64 `json:"min_max_500ms"`
	MinMax100 float64 `json:"min_max_100ms"`
	MinMaxRun float64 `json:"min_max_run"`
	// Usage is each VM's share of GPU time per window, by window length.
	Usage map[string]map[string][]float64 `json:"usage"`
	// Throughput is each VM's iterations per second.
	Throughput map[string]float64 `json:"throughput"`
	// MeanIterationNs is each load kind's mean iteration time.
	MeanIterationNs map[string]float64 `json:"mean_iteration_ns"`
	// OverheadVsFIFO is, per load kind, the mean iteration time with every
	// VM running that load under this policy over the same under FIFO, minus
	// 1 (thesis Fig. 4.13); absent without FIFO among the policies.
	OverheadVsFIFO map[string]float64 `json:"overhead_vs_fifo,omitempty"`
	GPUBusy        float64            `json:"gpu_busy"`
	// ThinkUs is each VM's mean time from a completion to its next
	// submission, in µs (what BAND's wait must cover).
	ThinkUs map[string]float64 `json:"think_us"`
	Loads   []GuestLoad        `json:"loads"`
}

// FairnessReport is the harness' whole output.
type FairnessReport struct {
	Runs []FairnessRun `json:"runs"`
	// Published: GPUvm's scheduling overheads against FIFO (thesis §4.3.4).
	Published map[string]string `json:"gpuvm_published"`
}

func vmName(i int) string { return "vm" + strconv.Itoa(i+1) }

// fairnessPartition fits up to vms VMs on the board.
func fairnessPartition(vms int) config.PartitionConfig {
	bar1 := ((config.BAR1Aperture - config.BAR1PollReserve) / config.Size(vms)) &^ (4<<10 - 1)
	return config.PartitionConfig{VRAMPerVM: 128 << 20, ChannelsPerVM: 4, BAR1PerVM: min(bar1, 16<<20),
		BAR3PerVM: config.Size(16<<20/vms) &^ (4<<10 - 1), Reserved: 256 << 20}
}

// RunFairness runs every policy with every VM count: half the VMs loop madd,
// half long-madd, each a separate VM process over the real protocol, for
// the given duration, and reports GPU usage per window, Jain's index,
// throughput, and the overhead against FIFO.
func RunFairness(ctx context.Context, o FairnessOptions) (FairnessReport, error) {
	rep := FairnessReport{Published: map[string]string{
		"band_vs_fifo_madd": "≤30%", "band_vs_fifo_long_madd": "≤3%",
		"credit_vs_fifo_madd": "≤39%", "credit_vs_fifo_long_madd": "≤5%",
	}}
	if len(o.Windows) == 0 {
		o.Windows = []time.Duration{500 * time.Millisecond, 100 * time.Millisecond}
	}
	for _, n := range o.VMs {
		var runs []FairnessRun
		for _, pol := range o.Policies {
			if o.Progress != nil {
				o.Progress(fmt.Sprintf("fairness: %s with %d VMs for %v", pol, n, o.Duration))
			}
			r, err := runFairnessOne(ctx, o, pol, n)
			if err != nil {
				return rep, fmt.Errorf("%s with %d VMs: %w", pol, n, err)
			}
			runs = append(runs, r)
		}
		if err := overheads(ctx, o, n, runs); err != nil {
			return rep, err
		}
		rep.Runs = append(rep.Runs, runs...)
	}
	return rep, nil
}

// overheads measures each policy's execution-time overhead against FIFO as
// the thesis' Fig. 4.13 does: every VM runs the same load (all madd, then all
// long-madd), so the difference is the scheduler's cost, not a different
// split of the GPU. The runs last half the fairness duration.
func overheads(ctx context.Context, o FairnessOptions, n int, runs []FairnessRun) error {
	if !slices.Contains(o.Policies, "fifo") {
		return nil
	}
	mean := map[string]map[string]float64{} // policy -> kind -> mean iteration ns
	for _, pol := range o.Policies {
		mean[pol] = map[string]float64{}
		for _, kind := range FairnessKinds() {
			if o.Progress != nil {
				o.Progress(fmt.Sprintf("overhead: %s with %d × %s", pol, n, kind))
			}
			kinds := make([]string, n)
			for i := range kinds {
				kinds[i] = kind
			}
			r, err := runLoads(ctx, o, pol, kinds, o.Duration/2)
			if err != nil {
				return fmt.Errorf("overhead run %s %s: %w", pol, kind, err)
			}
			mean[pol][kind] = r.MeanIterationNs[kind]
		}
	}
	for i := range runs {
		runs[i].OverheadVsFIFO = map[string]float64{}
		for kind, v := range mean[runs[i].Policy] {
			if base := mean["fifo"][kind]; base > 0 {
				runs[i].OverheadVsFIFO[kind] = v/base - 1
			}
		}
	}
	return nil
}

func runFairnessOne(ctx context.Context, o FairnessOptions, policy string, n int) (FairnessRun, error) {
	kinds := make([]string, n)
	for i := range kinds {
		kinds[i] = FairnessKinds()[i%2]
	}
	return runLoads(ctx, o, policy, kinds, o.Duration)
}

// runLoads runs one VM process per entry of kinds under policy for duration.
func runLoads(ctx context.Context, o FairnessOptions, policy string, kinds []string, duration time.Duration) (FairnessRun, error) {
	n := len(kinds)
	run := FairnessRun{Policy: policy, VMs: n, Yield: o.Yield, Usage: map[string]map[string][]float64{}, Throughput: map[string]float64{}, MeanIterationNs: map[string]float64{},
		Share: map[string]float64{}, Target: map[string]float64{}}
	weightOf := map[string]int{}
	for i := range n {
		w := 1
		if len(o.Weights) > 0 {
			w = o.Weights[i%len(o.Weights)]
		}
		run.Weights = append(run.Weights, w)
		weightOf[vmName(i)] = w
	}
	p, err := sched.New(policy, o.Sched)
	if err != nil {
		return run, err
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// Many VMs share 2 cores here: a server goroutine per VM spinning after
	// every request would starve the VMs themselves, so spin briefly.
	// Weights reach the dispatcher as a toolstack's would: the aggregator
	// asks Options.Weight for each guest as its vGPU is created.
	srv, err := serveBoard(ctx, o.Board, aggregator.Options{Partition: fairnessPartition(n), MaxVMs: n, Policy: p, Logger: log,
		Weight: func(g aggregator.Guest) int { return max(weightOf[g.Name], 1) }, SLO: o.SLO},
		&ipc.ListenOptions{Spin: o.ServerSpin})
	if err != nil {
		return run, err
	}
	defer srv.close()
	agg := srv.agg
	gate, err := os.MkdirTemp("", "gpuvm-fairness-gate-")
	if err != nil {
		return run, err
	}
	defer os.RemoveAll(gate)
	var ended atomic.Int32
	loads := make([]GuestLoad, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	modes := o.Modes
	if len(modes) == 0 {
		modes = []string{string(config.ModeFVOptimized)}
	}
	for i := range n {
		kind, mode := kinds[i], modes[i%len(modes)]
		run.Modes = append(run.Modes, mode)
		args := []string{"devmodel", "--socket", srv.socket(), "--mode", mode, "--domid", strconv.Itoa(i + 1), "--name", vmName(i),
			"--ram", "64MiB", "--fairness", kind, "--duration", duration.String(),
			"--matrix-dim", strconv.Itoa(o.MatrixDim), "--repeat", strconv.Itoa(o.Repeat), "--start-gate", gate, "--json"}
		if o.Yield {
			args = append(args, "--yield")
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := o.Command(ctx, args)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, os.Stderr
			rerr := cmd.Run()
			ended.Add(1)
			if jerr := json.Unmarshal(out.Bytes(), &loads[i]); jerr != nil {
				errs[i] = errors.Join(fmt.Errorf("%s: %w", vmName(i), rerr), jerr)
			} else if !loads[i].Verified {
				errs[i] = fmt.Errorf("%s: %s", vmName(i), loads[i].Error)
			}
		}()
	}
	// Record from the moment every VM is set up and loads the GPU.
	gerr := openGate(ctx, gate, n, func() bool { return ended.Load() > 0 })
	agg.StartRecording()
	unwatch := o.watch(agg)
	splits := agg.DispatchStats().Splits
	wg.Wait()
	unwatch()
	run.Splits = agg.DispatchStats().Splits - splits
	if err := errors.Join(append(errs, gerr)...); err != nil {
		return run, err
	}
	usage, end := agg.Recorded()
	run.ThinkUs = map[string]float64{}
	for name, t := range agg.ThinkTimes() {
		if t.Count > 0 {
			run.ThinkUs[name] = float64(t.Total.Microseconds()) / float64(t.Count)
		}
	}
	run.Loads = loads
	return summarizeFairness(run, usage, end, o, duration)
}

// minOverMax returns the smallest value over the largest, and false when
// the largest is not positive.
func minOverMax(v []float64) (float64, bool) {
	if len(v) == 0 {
		return 0, false
	}
	lo, hi := v[0], v[0]
	for _, x := range v[1:] {
		lo, hi = min(lo, x), max(hi, x)
	}
	if hi <= 0 {
		return 0, false
	}
	return lo / hi, true
}

// summarizeFairness turns the recorded GPU usage into per-window shares.
func summarizeFairness(run FairnessRun, usage []aggregator.Usage, end time.Duration, o FairnessOptions, duration time.Duration) (FairnessRun, error) {
	if len(usage) == 0 {
		return run, errors.New("no GPU usage was recorded")
	}
	start := usage[0].Start
	for _, u := range usage {
		start = min(start, u.Start)
		end = max(end, u.End)
	}
	var busy time.Duration
	for _, u := range usage {
		busy += u.End - u.Start
	}
	run.GPUBusy = float64(busy) / float64(end-start)
	if run.Share == nil {
		run.Share = map[string]float64{}
	}
	if run.Target == nil {
		run.Target = map[string]float64{}
	}
	weight := func(i int) int {
		if i < len(run.Weights) && run.Weights[i] > 0 {
			return run.Weights[i]
		}
		return 1
	}
	for _, w := range o.Windows {
		nw := int((end - start) / w)
		shares := make([][]float64, run.VMs)
		for i := range shares {
			shares[i] = make([]float64, nw)
		}
		index := map[string]int{}
		for i := range run.VMs {
			index[vmName(i)] = i
		}
		for _, u := range usage {
			vm, ok := index[u.Name]
			if !ok {
				continue
			}
			for k := int((u.Start - start) / w); k < nw; k++ {
				ws, we := start+time.Duration(k)*w, start+time.Duration(k+1)*w
				if u.Start >= we {
					break
				}
				if u.End <= ws {
					continue
				}
				shares[vm][k] += float64(min(u.End, we)-max(u.Start, ws)) / float64(w)
			}
		}
		key := fmt.Sprintf("%dms", w.Milliseconds())
		run.Usage[key] = map[string][]float64{}
		for i := range shares {
			run.Usage[key][vmName(i)] = shares[i]
		}
		var sum, mmSum float64
		cnt, mmCnt := 0, 0
		totals := make([]float64, run.VMs)
		for k := 1; k < nw; k++ { // window 0 is start-up
			col := make([]float64, run.VMs)
			for i := range shares {
				col[i] = shares[i][k] / float64(weight(i))
				totals[i] += shares[i][k]
			}
			sum += sched.Jain(col)
			cnt++
			if mm, ok := minOverMax(col); ok {
				mmSum += mm
				mmCnt++
			}
		}
		j, mm := 0.0, 0.0
		if cnt > 0 {
			j = sum / float64(cnt)
		}
		if mmCnt > 0 {
			mm = mmSum / float64(mmCnt)
		}
		switch w {
		case 500 * time.Millisecond:
			run.Jain500, run.MinMax500 = j, mm
			var sum, wsum float64
			for i := range totals {
				sum += totals[i]
				wsum += float64(weight(i))
			}
			norm := make([]float64, run.VMs)
			for i := range totals {
				if sum > 0 {
					run.Share[vmName(i)] = totals[i] / sum
				}
				run.Target[vmName(i)] = float64(weight(i)) / wsum
				norm[i] = totals[i] / float64(weight(i))
			}
			run.MinMaxRun, _ = minOverMax(norm)
		case 100 * time.Millisecond:
			run.Jain100, run.MinMax100 = j, mm
		}
	}
	kinds := map[string][]float64{}
	for i, l := range run.Loads {
		run.Throughput[vmName(i)] = float64(l.Iterations) / duration.Seconds()
		kinds[l.Kind] = append(kinds[l.Kind], l.MeanIterNs)
	}
	for k, v := range kinds {
		var s float64
		for _, x := range v {
			s += x
		}
		run.MeanIterationNs[k] = s / float64(len(v))
	}
	return run, nil
}
