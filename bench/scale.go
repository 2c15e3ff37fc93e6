package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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

// scaleVMs are the VM processes of one run.
type scaleVMs struct {
	wg    sync.WaitGroup
	ended atomic.Int32
	pids  []int
	loads []GuestLoad
	errs  []error
}

// start starts VM i with args; its JSON summary lands in loads[i].
func (s *scaleVMs) start(cmd *exec.Cmd, i int) error {
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	if err := cmd.Start(); err != nil {
		s.ended.Add(1)
		return fmt.Errorf("%s: %w", vmName(i), err)
	}
	s.pids[i] = cmd.Process.Pid
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		rerr := cmd.Wait()
		s.ended.Add(1)
		if jerr := json.Unmarshal(out.Bytes(), &s.loads[i]); jerr != nil {
			s.errs[i] = errors.Join(fmt.Errorf("%s: %w", vmName(i), rerr), jerr)
		} else if !s.loads[i].Verified {
			s.errs[i] = fmt.Errorf("%s: %s", vmName(i), s.loads[i].Error)
		}
	}()
	return nil
}

// signal sends VM i signal sig.
func (s *scaleVMs) signal(i int, sig unix.Signal) error {
	if err := unix.Kill(s.pids[i], sig); err != nil {
		return fmt.Errorf("%s: %v: %w", vmName(i), sig, err)
	}
	return nil
}

// cpu is the VM processes' CPU time so far.
func (s *scaleVMs) cpu() (time.Duration, error) {
	var sum time.Duration
	for i, pid := range s.pids {
		t, err := procCPU(pid)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", vmName(i), err)
		}
		sum += t
	}
	return sum, nil
}

// rss is each VM process's resident set now.
func (s *scaleVMs) rss() ([]uint64, error) {
	out := make([]uint64, len(s.pids))
	for i, pid := range s.pids {
		m, err := readStatm(strconv.Itoa(pid))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", vmName(i), err)
		}
		out[i] = m.Resident
	}
	return out, nil
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
	// The VMs stop on their own after the duration; a failed run stops them
	// early (the gate's go never comes, or the context ends).
	vctx, cancel := context.WithCancel(ctx)
	vms := &scaleVMs{pids: make([]int, n), loads: make([]GuestLoad, n), errs: make([]error, n)}
	defer vms.wg.Wait()
	defer cancel()
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
			cancel()
			vms.wg.Wait()
			return ScaleRun{}, errors.Join(append(vms.errs, err)...)
		}
		args := []string{"devmodel", "--socket", srv.socket(), "--mode", o.Mode, "--domid", strconv.Itoa(i + 1), "--name", vmName(i),
			"--ram", "64MiB", "--fairness", "madd", "--duration", o.Duration.String(),
			"--matrix-dim", strconv.Itoa(o.MatrixDim), "--start-gate", gate, "--json"}
		w.started[i] = time.Now()
		if err := vms.start(o.Command(vctx, args), i); err != nil {
			cancel()
			vms.wg.Wait()
			return ScaleRun{}, err
		}
	}
	err = w.waitReady(ctx, n, failed)
	if err == nil {
		err = os.WriteFile(filepath.Join(gate, "go"), nil, 0o644)
	}
	for i := range n {
		err = errors.Join(err, vms.signal(i, unix.SIGCONT))
	}
	if err != nil {
		cancel()
		vms.wg.Wait()
		return ScaleRun{}, errors.Join(append(vms.errs, fmt.Errorf("start gate: %w", err))...)
	}
	opened := time.Now()
	o.progress(fmt.Sprintf("scale: %d VMs set up, looping", n))
	skip, window := scaleWindow(o.Duration)
	if err := sleepUntil(ctx, opened.Add(skip)); err != nil {
		return ScaleRun{}, err
	}
	c0, err := sampleCPU(srv.agg, vms)
	if err != nil {
		return ScaleRun{}, err
	}
	t0 := time.Now()
	var stopProfile func()
	if o.Profile != nil {
		stopProfile = o.Profile(n)
	}
	serr := sleepUntil(ctx, opened.Add(skip+window))
	if stopProfile != nil {
		stopProfile()
	}
	if serr != nil {
		return ScaleRun{}, serr
	}
	c1, err := sampleCPU(srv.agg, vms)
	if err != nil {
		return ScaleRun{}, err
	}
	t1 := time.Now()
	loaded, merr := selfMemory()
	vmRSS, rerr := vms.rss()
	if ended := vms.ended.Load(); ended > 0 {
		// A VM gone before the window closed leaves it measuring fewer.
		vms.wg.Wait()
		return ScaleRun{}, errors.Join(append(vms.errs, fmt.Errorf("%d VMs ended within the measured window", ended))...)
	}
	vms.wg.Wait()
	if err := errors.Join(append(vms.errs, merr, rerr)...); err != nil {
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

// setupWatch follows the VMs' set-up through the start gate: when each
// started, and when its ready-DOMID file appeared there (seen by polling
// every millisecond).
type setupWatch struct {
	gate           string
	started, ready []time.Time
	onReady        func(i int) error // called as VM i is seen ready
	nready         int
	lastProgress   time.Time
}

// poll records the ready files that appeared since the last poll.
func (w *setupWatch) poll() error {
	ents, err := os.ReadDir(w.gate)
	if err != nil {
		return err
	}
	now := time.Now()
	for _, e := range ents {
		id, ok := strings.CutPrefix(e.Name(), "ready-")
		if !ok {
			continue
		}
		domid, err := strconv.Atoi(id)
		if err != nil || domid < 1 || domid > len(w.ready) || !w.ready[domid-1].IsZero() {
			continue
		}
		w.ready[domid-1] = now
		w.nready++
		w.lastProgress = now
		if w.onReady != nil {
			if err := w.onReady(domid - 1); err != nil {
				return err
			}
		}
	}
	return nil
}

// waitReady waits until at least want VMs are ready at the gate. It fails
// if a VM ended (failed returns true), ctx ends, or no VM got ready for
// gateTimeout.
func (w *setupWatch) waitReady(ctx context.Context, want int, failed func() bool) error {
	if w.lastProgress.IsZero() {
		w.lastProgress = time.Now()
	}
	for {
		if err := w.poll(); err != nil {
			return err
		}
		if w.nready >= want {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if failed() {
			return errors.New("a VM ended before the start")
		}
		if time.Since(w.lastProgress) > gateTimeout {
			return fmt.Errorf("%d of %d VMs ready, none more for %v", w.nready, want, gateTimeout)
		}
		time.Sleep(time.Millisecond)
	}
}

// setupTimes is each VM's time from its start to ready at the gate.
func (w *setupWatch) setupTimes() []time.Duration {
	out := make([]time.Duration, len(w.ready))
	for i := range out {
		out[i] = w.ready[i].Sub(w.started[i])
	}
	return out
}
