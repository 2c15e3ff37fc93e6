package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
	"github.com/gpuvm/gpuvm/ipc"
)

// ContextsOptions configure the contexts experiment (thesis §4.3.2, Fig.
// 4.10): 1, 2, 4, 8 madd applications natively, in one VM, and one per VM.
type ContextsOptions struct {
	Board     sim.Config
	Modes     []string // virtualized modes, e.g. fv-optimized, pv-multicall, pvdrm
	Counts    []int    // application instances (default 1, 2, 4, 8)
	MatrixDim int      // n of madd's n×n matrices
	Repeat    int      // kernel runs per instance (the thesis: 10000)
	Command   VMCommand
	Progress  func(msg string)
	Logger    *slog.Logger
}

// contextGuestRAM is the guest RAM per madd instance: its context's
// staging buffers, channel ring and the madd's inputs and output.
const contextGuestRAM = 64 << 20

// ContextsPoint is one configuration at one instance count: the mean over
// its instances of each phase and of the total.
type ContextsPoint struct {
	// Config names the configuration: "native", MODE (one instance per VM)
	// or "MODE (apps on 1 VM)".
	Config     string           `json:"config"`
	Mode       string           `json:"mode"`
	OneVM      bool             `json:"one_vm"`
	Count      int              `json:"count"`
	PhasesNs   map[string]int64 `json:"phases_ns"`
	TotalNs    int64            `json:"total_ns"`
	MinTotalNs int64            `json:"min_total_ns"`
	MaxTotalNs int64            `json:"max_total_ns"`
	Verified   bool             `json:"verified"`
	Error      string           `json:"error,omitempty"`
}

// ContextsReport is the contexts experiment's output.
type ContextsReport struct {
	MatrixDim int             `json:"matrix_dim"`
	Repeat    int             `json:"repeat"`
	Points    []ContextsPoint `json:"points"`
}

// Verified reports whether every instance of every point verified.
func (r ContextsReport) Verified() bool {
	for _, p := range r.Points {
		if !p.Verified {
			return false
		}
	}
	return len(r.Points) > 0
}

// RunContexts runs the contexts experiment: for every count, the instances
// natively on a fresh board; then for every mode, all of them in one VM
// process (its own GPU context each) and one VM process per instance,
// started together behind a gate.
func RunContexts(ctx context.Context, o ContextsOptions) (ContextsReport, error) {
	rep := ContextsReport{MatrixDim: o.MatrixDim, Repeat: o.Repeat}
	if len(o.Counts) == 0 {
		o.Counts = []int{1, 2, 4, 8}
	}
	say := func(format string, args ...any) {
		if o.Progress != nil {
			o.Progress(fmt.Sprintf(format, args...))
		}
	}
	for _, n := range o.Counts {
		say("contexts: native, %d instances", n)
		p, err := contextsNative(ctx, o, n)
		if err != nil {
			return rep, fmt.Errorf("native with %d instances: %w", n, err)
		}
		rep.Points = append(rep.Points, p)
	}
	for _, mode := range o.Modes {
		for _, oneVM := range []bool{true, false} {
			for _, n := range o.Counts {
				what := "VMs"
				if oneVM {
					what = "instances in 1 VM"
				}
				say("contexts: %s, %d %s", mode, n, what)
				p, err := contextsVirtual(ctx, o, mode, n, oneVM)
				if err != nil {
					return rep, fmt.Errorf("%s with %d %s: %w", mode, n, what, err)
				}
				rep.Points = append(rep.Points, p)
			}
		}
	}
	return rep, ctx.Err()
}

// contextsNative runs n instances with the driver straight on a board.
func contextsNative(ctx context.Context, o ContextsOptions, n int) (ContextsPoint, error) {
	native, err := OpenNative(o.Board, o.Logger)
	if err != nil {
		return ContextsPoint{}, err
	}
	defer native.Close()
	insts := RunMaddInstances(ctx, gdev.Nouveau(native.Device), n, o.MatrixDim, o.Repeat, 1)
	return summarizeInstances(ContextsPoint{Config: "native", Mode: "native", Count: n}, insts), nil
}

// contextsVirtual runs n instances in mode: all in one VM process, or one
// VM process each.
func contextsVirtual(ctx context.Context, o ContextsOptions, mode string, n int, oneVM bool) (ContextsPoint, error) {
	point := ContextsPoint{Config: mode, Mode: mode, OneVM: oneVM, Count: n}
	if oneVM {
		point.Config += " (apps on 1 VM)"
	}
	vms, perVM := n, 1
	part := fairnessPartition(n)
	ram := uint64(contextGuestRAM)
	if oneVM {
		vms, perVM = 1, n
		part = BenchPartition(o.Board.VRAMSize)
		ram *= uint64(n) // each context pins its own staging buffers and rings
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	srv, err := serveBoard(ctx, o.Board, aggregator.Options{Partition: part, MaxVMs: vms, Logger: log}, &ipc.ListenOptions{})
	if err != nil {
		return point, err
	}
	defer srv.close()
	gate, err := os.MkdirTemp("", "gpuvm-contexts-gate-")
	if err != nil {
		return point, err
	}
	defer os.RemoveAll(gate)

	results := make([][]Instance, vms)
	errs := make([]error, vms)
	var ended atomic.Int32
	var wg sync.WaitGroup
	for i := range vms {
		args := []string{"devmodel", "--socket", srv.socket(), "--mode", mode, "--domid", strconv.Itoa(i + 1), "--name", vmName(i),
			"--ram", strconv.FormatUint(ram, 10), "--contexts", strconv.Itoa(perVM), "--repeat", strconv.Itoa(o.Repeat),
			"--matrix-dim", strconv.Itoa(o.MatrixDim), "--start-gate", gate}
		wg.Go(func() {
			cmd := o.Command(ctx, args)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, os.Stderr
			rerr := cmd.Run()
			ended.Add(1)
			if jerr := json.Unmarshal(out.Bytes(), &results[i]); jerr != nil {
				errs[i] = errors.Join(fmt.Errorf("%s: %w", vmName(i), rerr), fmt.Errorf("its output is not an instance list: %w", jerr))
			}
		})
	}
	gerr := openGate(ctx, gate, vms, func() bool { return ended.Load() > 0 })
	wg.Wait()
	if err := errors.Join(append(errs, gerr)...); err != nil {
		return point, err
	}
	var all []Instance
	for _, r := range results {
		all = append(all, r...)
	}
	if len(all) != n {
		return point, fmt.Errorf("%d instances reported, want %d", len(all), n)
	}
	return summarizeInstances(point, all), nil
}

// summarizeInstances folds instances into a point: mean phases and total,
// the slowest and fastest total, and the first error.
func summarizeInstances(p ContextsPoint, insts []Instance) ContextsPoint {
	p.PhasesNs = map[string]int64{}
	p.Verified = len(insts) > 0
	for i, in := range insts {
		if !in.Verified {
			p.Verified = false
			if p.Error == "" {
				p.Error = fmt.Sprintf("instance %d: %s", i+1, in.Error)
			}
		}
		for _, ph := range workloads.PhaseNames() {
			p.PhasesNs[ph] += in.PhasesNs[ph]
		}
		p.TotalNs += in.TotalNs
		if i == 0 || in.TotalNs < p.MinTotalNs {
			p.MinTotalNs = in.TotalNs
		}
		p.MaxTotalNs = max(p.MaxTotalNs, in.TotalNs)
	}
	if k := int64(len(insts)); k > 0 {
		for ph := range p.PhasesNs {
			p.PhasesNs[ph] /= k
		}
		p.TotalNs /= k
	}
	return p
}
