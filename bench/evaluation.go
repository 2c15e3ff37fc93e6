package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
	"github.com/gpuvm/gpuvm/ipc"
)

// EvaluationVersion is the version of the Evaluation JSON layout.
const EvaluationVersion = 1

// EvaluationOptions configure RunEvaluation, the whole of the GPUvm
// thesis' §4.3 in one run.
type EvaluationOptions struct {
	Board     sim.Config
	Quick     bool
	Modes     []string // modes of Fig. 4.8/4.9, native first
	Workloads []string
	Runs      int
	// NoWarmup leaves out each workload's warm-up run (--quick).
	NoWarmup bool
	// OneVMPerMode runs every workload of a mode in one VM process (and
	// natively on one board) instead of one per workload: fewer set-ups
	// (--quick), but a failure takes the mode's remaining workloads with it.
	OneVMPerMode bool
	Params       workloads.Params
	// Contexts and Fairness configure Fig. 4.10 and Fig. 4.11-4.13 (each
	// with its own board); their Command, Logger and Progress are filled in.
	Contexts ContextsOptions
	Fairness FairnessOptions
	Command  VMCommand
	// Commands are the exact command lines that reproduce the run, for the
	// report (the caller knows how it was invoked).
	Commands []string
	// Progress is called before each step and once at the end, with the
	// step's description, the weight of the steps done and of all steps
	// (each step is weighted by its expected cost, so done/total estimates
	// the fraction of the time spent).
	Progress func(msg string, done, total float64)
	Logger   *slog.Logger
}

// Machine describes the host an evaluation ran on.
type Machine struct {
	CPUModel  string `json:"cpu_model"`
	CPUs      int    `json:"cpus"`
	MemBytes  uint64 `json:"mem_bytes"`
	Kernel    string `json:"kernel"`
	GoVersion string `json:"go_version"`
	OS        string `json:"os"`
	Revision  string `json:"gpuvm_revision,omitempty"`
}

// Evaluation is everything `gpuvm bench report` measured: the JSON behind
// the HTML report.
type Evaluation struct {
	Version    int       `json:"version"`
	Quick      bool      `json:"quick"`
	Started    time.Time `json:"started"`
	DurationNs int64     `json:"duration_ns"`
	Machine    Machine   `json:"machine"`
	Commands   []string  `json:"commands"`
	// Params are the workload sizes of the Modes runs.
	Params workloads.Params `json:"params"`
	// Modes: every mode × every workload (Fig. 4.3-4.5, 4.8, 4.9, Table
	// 4.1 and 4.3).
	Modes Report `json:"modes"`
	// Contexts: Fig. 4.10.
	Contexts ContextsReport `json:"contexts"`
	// Fairness: Fig. 4.11-4.13, and the timing profile of its board.
	Fairness       FairnessReport `json:"fairness"`
	FairnessTiming string         `json:"fairness_timing"`
	// FairnessMatrixDim and FairnessRepeat size its madd and long-madd.
	FairnessMatrixDim int    `json:"fairness_matrix_dim"`
	FairnessRepeat    int    `json:"fairness_repeat"`
	ContextsTiming    string `json:"contexts_timing"`
	// Failures lists every step that failed, in words.
	Failures []string `json:"failures,omitempty"`
}

// Verified reports whether every measured result verified and no step
// failed.
func (e Evaluation) Verified() bool {
	return len(e.Failures) == 0 && e.Modes.Verified() && e.Contexts.Verified()
}

// modeWeight is the expected cost of one workload run in a mode relative to
// native, for the progress estimate (from the ratios the bench measures:
// fv-naive is the slowest).
func modeWeight(mode string) float64 {
	switch mode {
	case "native":
		return 1
	case "fv-naive":
		return 12
	case "fv-bar-remap", "fv-lazy":
		return 6
	case "fv-optimized", "fv-incremental":
		return 3
	case "pv-naive":
		return 3
	}
	return 1.5
}

// step is one part of the evaluation.
type step struct {
	msg    string
	weight float64
	run    func(ctx context.Context) error
}

// RunEvaluation runs every experiment of the thesis' §4.3 and returns what
// it measured. A failed step is recorded in Failures and the rest still
// run; the error is only for a cancelled context.
func RunEvaluation(ctx context.Context, o EvaluationOptions) (Evaluation, error) {
	ev := Evaluation{Version: EvaluationVersion, Quick: o.Quick, Started: time.Now().UTC(), Machine: DescribeMachine(),
		Commands: o.Commands, Params: o.Params, FairnessTiming: o.Fairness.Board.Timing.Name, ContextsTiming: o.Contexts.Board.Timing.Name,
		FairnessMatrixDim: o.Fairness.MatrixDim, FairnessRepeat: o.Fairness.Repeat}
	ev.Modes = Report{Board: BoardInfoFor(o.Board), Warmup: 1}
	if o.NoWarmup {
		ev.Modes.Warmup = 0
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var steps []step
	// Fig. 4.8/4.9 and the counters: one VM process per (mode, workload),
	// so a failure stays in its cell and progress is fine-grained.
	// With OneVMPerMode, one VM process runs every workload of a mode.
	groups := make([][]string, 0, len(o.Workloads))
	if o.OneVMPerMode {
		groups = append(groups, o.Workloads)
	} else {
		for _, wl := range o.Workloads {
			groups = append(groups, []string{wl})
		}
	}
	for _, mode := range o.Modes {
		for _, wls := range groups {
			steps = append(steps, step{
				msg:    fmt.Sprintf("%s %s", mode, strings.Join(wls, ",")),
				weight: modeWeight(mode) * float64((o.Runs+ev.Modes.Warmup)*len(wls)),
				run: func(ctx context.Context) error {
					res, err := runModeWorkloads(ctx, o, mode, wls, log)
					ev.Modes.Results = append(ev.Modes.Results, res...)
					return err
				},
			})
		}
	}
	// Fig. 4.10.
	co := o.Contexts
	co.Command, co.Logger = o.Command, log
	steps = append(steps, step{
		msg:    "contexts in one VM against one per VM",
		weight: float64(len(co.Counts)*(1+2*len(co.Modes))) * 2,
		run: func(ctx context.Context) (err error) {
			co.Progress = func(msg string) { o.progress(msg, -1, -1) }
			ev.Contexts, err = RunContexts(ctx, co)
			return err
		},
	})
	// Fig. 4.11-4.13.
	fo := o.Fairness
	fo.Command, fo.Logger = o.Command, log
	fairSeconds := fo.Duration.Seconds() * float64(len(fo.VMs)*len(fo.Policies)) * 2
	steps = append(steps, step{
		msg:    "GPU time fairness of the schedulers",
		weight: fairSeconds * 10,
		run: func(ctx context.Context) (err error) {
			fo.Progress = func(msg string) { o.progress(msg, -1, -1) }
			ev.Fairness, err = RunFairness(ctx, fo)
			return err
		},
	})

	total := 0.0
	for _, s := range steps {
		total += s.weight
	}
	done := 0.0
	start := time.Now()
	for _, s := range steps {
		if err := ctx.Err(); err != nil {
			return ev, err
		}
		o.progress(s.msg, done, total)
		if err := s.run(ctx); err != nil {
			if ctx.Err() != nil {
				return ev, ctx.Err()
			}
			log.Warn("evaluation step failed", "step", s.msg, "err", err)
			ev.Failures = append(ev.Failures, fmt.Sprintf("%s: %v", s.msg, err))
		}
		done += s.weight
	}
	o.progress("done", total, total)
	ev.Modes.Normalize()
	ev.DurationNs = int64(time.Since(start))
	return ev, nil
}

// runOptions are the options of every workload run: counters by phase, and
// no warm-up when the options say so.
func (o EvaluationOptions) runOptions() RunOptions {
	return RunOptions{PhaseCounters: true, NoWarmup: o.NoWarmup}
}

func (o EvaluationOptions) progress(msg string, done, total float64) {
	if o.Progress != nil {
		o.Progress(msg, done, total)
	}
}

// runModeWorkloads measures workloads in one mode: natively in this
// process, or in a VM process of their own.
func runModeWorkloads(ctx context.Context, o EvaluationOptions, mode string, wls []string, log *slog.Logger) ([]Result, error) {
	if mode == "native" {
		native, err := OpenNative(o.Board, log)
		if err != nil {
			return nil, err
		}
		defer native.Close()
		var out []Result
		for _, wl := range wls {
			w, err := workloads.New(wl, o.Params)
			if err != nil {
				return out, err
			}
			out = append(out, RunWorkloadWith(ctx, "native", gdev.Nouveau(native.Device), w, o.Runs, native.Counters, nil, o.runOptions()))
		}
		return out, nil
	}
	var stderr bytes.Buffer
	res, err := RunVirtualized(ctx, mode, wls, o.Runs, o.Params, VirtualOptions{
		Board: o.Board, Partition: BenchPartition(o.Board.VRAMSize), RAMSize: GuestRAM,
		Transport: ipc.TransportShm, Command: o.Command, Logger: log, Stderr: &stderr, Run: o.runOptions(),
	})
	if err != nil {
		return nil, fmt.Errorf("%w; VM process said: %s", err, lastLines(stderr.String(), 5))
	}
	return res, nil
}

// GuestRAM is the RAM of a benchmark VM: room for pincpy's two 64 MiB
// pinned buffers, the staging buffers and the channel rings.
const GuestRAM = 512 << 20

// lastLines returns the last n lines of s, joined with "; ".
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "; ")
}

// DefaultFairnessPolicies are the schedulers the evaluation compares.
func DefaultFairnessPolicies() []string {
	return []string{"fifo", "credit", "band", "wfq", "timeslice", "dfq"}
}

// DescribeMachine describes this host.
func DescribeMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Sysname[:]) + " " + unix.ByteSliceToString(u.Release[:])
	}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil {
		m.MemBytes = uint64(si.Totalram) * uint64(si.Unit)
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				m.Revision = s.Value
			}
		}
	}
	return m
}
