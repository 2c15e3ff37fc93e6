package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/ipc"
	"github.com/gpuvm/gpuvm/sched"
)

// ScaleMaxVMs is the most VMs the scaling harness runs at once: the board's
// channels at ScalePartition's two per VM.
const ScaleMaxVMs = nvc0.MaxChannels / 2

// ScaleOptions configure the scaling harness.
type ScaleOptions struct {
	Board sim.Config
	// VMs are the VM counts to run, each 1..ScaleMaxVMs.
	VMs []int
	// Mode is every VM's virtualization mode (default fv-optimized).
	Mode string
	// Policy is the scheduling policy (default band), with Sched.
	Policy string
	Sched  sched.Params
	// Duration is how long each VM loops its madd.
	Duration  time.Duration
	MatrixDim int // madd matrix dimension
	// ServerSpin is the aggregator's IPC spin budget per VM connection
	// (ipc.ListenOptions.Spin; 0: the package default, negative: never).
	ServerSpin int
	// SetupConcurrency is how many VMs set up at once (0: one per CPU).
	// Set-up is thousands of trapped accesses per VM; many VMs spinning
	// for their replies at once on a small host starve the aggregator that
	// answers them (see docs/scaling-draft.md), so the harness starts the
	// next VM when an earlier one is ready at the start gate.
	SetupConcurrency int
	Command          VMCommand
	// Profile, if set, is called as the measured window of a run with vms
	// VMs opens, and the function it returns as the window closes (the
	// CLI's --cpuprofile profiles the largest run this way).
	Profile  func(vms int) (stop func())
	Progress func(msg string)
	Logger   *slog.Logger
}

// ScalePartition is the partitioning of every scaling run: small slices
// that fit ScaleMaxVMs VMs on the board — 32 MiB of VRAM and 2 channels
// each, the BAR1 aperture (less the poll area) and the BAR3 aperture
// divided by ScaleMaxVMs. Every VM count uses the same slices, so a VM's
// own costs do not change with the count.
func ScalePartition() config.PartitionConfig {
	page := config.Size(nvc0.PageSize - 1)
	return config.PartitionConfig{
		VRAMPerVM: 32 << 20, ChannelsPerVM: 2,
		BAR1PerVM: ((config.BAR1Aperture - config.BAR1PollReserve) / ScaleMaxVMs) &^ page,
		BAR3PerVM: (config.BAR3Aperture / ScaleMaxVMs) &^ page,
		Reserved:  256 << 20,
	}
}

// RunScale runs, for each VM count, a fresh board and aggregator and that
// many VM processes over the real protocol, each looping a verified madd
// for the duration behind a common start gate, and measures per VM count:
// the aggregate throughput and each VM's iteration time, the aggregator's
// and the VMs' CPU time over the middle of the loop period, the
// aggregator's memory with the VMs attached against none, and the
// dispatcher's decisions and their cost. Overheads are relative to the
// smallest count.
func RunScale(ctx context.Context, o ScaleOptions) (ScaleReport, error) {
	rep := ScaleReport{CPUs: runtime.NumCPU()}
	if o.Mode == "" {
		o.Mode = string(config.ModeFVOptimized)
	}
	if o.Policy == "" {
		o.Policy = "band"
	}
	for _, n := range o.VMs {
		if n < 1 || n > ScaleMaxVMs {
			return rep, fmt.Errorf("scale: %d VMs: want 1..%d", n, ScaleMaxVMs)
		}
	}
	for _, n := range o.VMs {
		o.progress(fmt.Sprintf("scale: %d VMs (%s, %s) for %v", n, o.Mode, o.Policy, o.Duration))
		r, err := runScaleOne(ctx, o, n)
		if err != nil {
			return rep, fmt.Errorf("scale: %d VMs: %w", n, err)
		}
		o.progress(fmt.Sprintf("scale: %d VMs: %.0f iterations/s, %.2f ms per iteration, aggregator %.1f µs CPU per iteration, decision %.0f ns",
			n, r.IterationsPerS, r.IterationMs, r.AggCPUUsPerIteration, r.DecisionNs))
		rep.Runs = append(rep.Runs, r)
	}
	rep.BaseVMs = relateScale(rep.Runs)
	return rep, nil
}

func (o ScaleOptions) progress(msg string) {
	if o.Progress != nil {
		o.Progress(msg)
	}
}

// scaleWindow is the measured part of a loop period of d: its middle, a
// tenth (at most a second) left out at each end for the VMs' start and end.
func scaleWindow(d time.Duration) (skip, window time.Duration) {
	skip = min(d/10, time.Second)
	return skip, d - 2*skip
}

// cpuSample is the CPU clocks read at each end of the window.
type cpuSample struct {
	self, vms time.Duration
	host      hostCPU
	disp      aggregator.DispatchStats
	requests  uint64 // the vGPUs' trapped accesses and pvdrm requests
}

func sampleCPU(agg *aggregator.Aggregator, vms *scaleVMs) (cpuSample, error) {
	var s cpuSample
	var errs [3]error
	s.disp = agg.DispatchStats()
	for _, v := range agg.VGPUs() {
		c := v.Counters()
		s.requests += c.BAR0Reads + c.BAR0Writes + c.BAR1Reads + c.BAR1Writes + c.BAR3Reads + c.BAR3Writes + c.PVDRMRequests
	}
	s.self, errs[0] = selfCPU()
	s.vms, errs[1] = vms.cpu()
	s.host, errs[2] = readHostCPU()
	return s, errors.Join(errs[:]...)
}

// runScaleOne runs n VM processes on a fresh board and aggregator.
func runScaleOne(ctx context.Context, o ScaleOptions, n int) (ScaleRun, error) {
	p, err := sched.New(o.Policy, o.Sched)
	if err != nil {
		return ScaleRun{}, err
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	srv, err := serveBoard(ctx, o.Board, aggregator.Options{Partition: ScalePartition(), MaxVMs: n, Policy: p, Logger: log},
		&ipc.ListenOptions{Spin: o.ServerSpin})
	if err != nil {
		return ScaleRun{}, err
	}
	defer srv.close()
	base, err := selfMemory()
	if err != nil {
		return ScaleRun{}, err
	}
	gate, err := os.MkdirTemp("", "gpuvm-scale-gate-")
	if err != nil {
		return ScaleRun{}, fmt.Errorf("start gate: %w", err)
	}
	defer os.RemoveAll(gate)
	// The VMs stop on their own after the duration; a failed run kills
	// them (the deferred cancel, before waiting for them).
	vctx, cancel := context.WithCancel(ctx)
	vms := newScaleVMs(n)
	defer vms.wait()
	defer cancel()
	fail := func(err error) (ScaleRun, error) {
		cancel()
		return ScaleRun{}, errors.Join(err, vms.wait())
	}
	k := o.SetupConcurrency
	if k <= 0 {
		k = runtime.NumCPU()
	}
	// A VM ready at the gate is paused (SIGSTOP, as Xen creates a domain
	// paused) until all are: waiting, it would poll the gate every
	// millisecond, and 63 of them polling slow the set-up of the last.
	w := &setupWatch{gate: gate, started: make([]time.Time, n), ready: make([]time.Time, n),
		onReady: func(i int) error { return vms.signal(i, unix.SIGSTOP) }}
	failed := func() bool { return vms.ended.Load() > 0 }
	for i := range n {
		// At most k VMs setting up: VM i starts once i-k+1 are ready.
		if err := w.waitReady(ctx, i-k+1, failed); err != nil {
			return fail(fmt.Errorf("start gate: %w", err))
		}
		args := []string{"devmodel", "--socket", srv.socket(), "--mode", o.Mode, "--domid", strconv.Itoa(i + 1), "--name", vmName(i),
			"--ram", "64MiB", "--fairness", "madd", "--duration", o.Duration.String(),
			"--matrix-dim", strconv.Itoa(o.MatrixDim), "--start-gate", gate, "--json"}
		w.started[i] = time.Now()
		if err := vms.start(o.Command(vctx, args), i); err != nil {
			return fail(err)
		}
	}
	if err := w.waitReady(ctx, n, failed); err != nil {
		return fail(fmt.Errorf("start gate: %w", err))
	}
	// Memory with every VM attached and set up, all paused: the heap and
	// resident sets as they are through the loop, read without disturbing it.
	loaded, err := selfMemory()
	if err != nil {
		return fail(err)
	}
	vmRSS, err := vms.rss()
	if err != nil {
		return fail(err)
	}
	err = os.WriteFile(filepath.Join(gate, "go"), nil, 0o644)
	for i := range n {
		err = errors.Join(err, vms.signal(i, unix.SIGCONT))
	}
	if err != nil {
		return fail(fmt.Errorf("start gate: %w", err))
	}
	opened := time.Now()
	o.progress(fmt.Sprintf("scale: %d VMs set up, looping", n))
	skip, window := scaleWindow(o.Duration)
	if err := sleepUntil(ctx, opened.Add(skip)); err != nil {
		return fail(err)
	}
	t0 := time.Now()
	c0, err := sampleCPU(srv.agg, vms)
	if err != nil {
		return fail(err)
	}
	var stopProfile func()
	if o.Profile != nil {
		stopProfile = o.Profile(n)
	}
	serr := sleepUntil(ctx, opened.Add(skip+window))
	if stopProfile != nil {
		stopProfile()
	}
	if serr != nil {
		return fail(serr)
	}
	t1 := time.Now()
	c1, err := sampleCPU(srv.agg, vms)
	if err != nil {
		return fail(err)
	}
	if early := vms.endedBefore(t1); early > 0 {
		// A VM gone before the window closed leaves it measuring fewer.
		return fail(fmt.Errorf("%d VMs ended within the measured window", early))
	}
	if err := vms.wait(); err != nil {
		return ScaleRun{}, err
	}
	disp := aggregator.DispatchStats{
		Decisions: c1.disp.Decisions - c0.disp.Decisions, NextTime: c1.disp.NextTime - c0.disp.NextTime,
		DecisionTime: c1.disp.DecisionTime - c0.disp.DecisionTime, Completed: c1.disp.Completed - c0.disp.Completed,
	}
	return summarizeScale(scaleSample{
		vms: n, mode: o.Mode, policy: o.Policy, cpus: runtime.NumCPU(), window: t1.Sub(t0), loads: vms.loads,
		aggCPU: c1.self - c0.self, vmCPU: c1.vms - c0.vms, hostBusy: busyFraction(c0.host, c1.host),
		base: base, loaded: loaded, vmRSS: vmRSS, disp: disp, requests: c1.requests - c0.requests, setup: w.setupTimes(),
	}), nil
}
