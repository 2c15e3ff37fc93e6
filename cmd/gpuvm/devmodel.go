package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/bench"
	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/devmodel"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
	"github.com/gpuvm/gpuvm/ipc"
	"github.com/gpuvm/gpuvm/pvdrm"
)

func devmodelCommand() *cli.Command {
	return &cli.Command{
		Name:  "devmodel",
		Usage: "run a VM's device model with the guest driver and workloads on its virtual GPU",
		Description: "Connects a device model to the aggregator (`gpuvm serve`) as Xen domain --domid,\n" +
			"creating the guest's RAM and handing it over, then runs the guest driver and the given\n" +
			"workloads on the virtual GPU, verifying each result. This is the VM process of the\n" +
			"benchmark harness and a standalone check that an aggregator serves VMs correctly.\n" +
			"In the pvdrm modes the guest has no GPU registers and there is no device model: the\n" +
			"process is the pvdrm front end, handing over its GART heap (--ram) and a shared ring,\n" +
			"and Gdev runs on whole DRM operations sent to the aggregator's back end.\n" +
			"Closing it (or killing it) makes the aggregator tear the vGPU down. A save of its vGPU\n" +
			"(gpuvm vgpu save) does not end it: the guest keeps its RAM and driver state and pauses\n" +
			"until a daemon restores the image (gpuvm vgpu restore --domid N, on --resume-socket),\n" +
			"then goes on there (--resume-timeout bounds the wait; docs/protocol.md §13.7).",
		Flags: append([]cli.Flag{
			&cli.PathFlag{Name: "socket", Value: config.Default().Daemon.Socket, Usage: "the aggregator's device-model socket (gpuvm serve prints it)"},
			&cli.UintFlag{Name: "domid", Value: 1, Usage: "Xen domain id of the VM"},
			&cli.StringFlag{Name: "name", Value: "guest", Usage: "domain name"},
			&cli.StringFlag{Name: "mode", Value: "fv-optimized", Usage: "virtualization mode: " + strings.Join(aggregator.Modes(), ", ") + " (it must agree with the VM's [[vm]] mode in the daemon's configuration, if that sets one)"},
			&cli.StringFlag{Name: "ram", Value: "512MiB", Usage: "guest RAM size"},
			&cli.StringFlag{Name: "transport", Value: "shm", Usage: "MMIO transport to the aggregator: shm (shared-memory rings) or socket"},
			&cli.DurationFlag{Name: "trap-cost", Usage: "charge this much per trapped access: the hypervisor's share of a trap (VM exit, ioreq delivery) that runs without Xen do not pay; 0 = none (default: the aggregator's timing profile, e.g. 5us for fermi-xen)"},
			&cli.BoolFlag{Name: "posted-writes", Usage: "let trapped writes return before the aggregator handled them (by default a write completes first, as a Xen ioreq does)"},
			&cli.StringFlag{Name: "workloads", Aliases: []string{"w"}, Value: "nop", Usage: "comma-separated workloads, or all"},
			&cli.IntFlag{Name: "runs", Aliases: []string{"n"}, Value: 1, Usage: "measured runs per workload (after one warm-up run, unless --no-warmup)"},
			&cli.BoolFlag{Name: "json", Usage: "print the results as a JSON list"},
			&cli.BoolFlag{Name: "no-warmup", Usage: "leave out the warm-up run before each workload's measured runs"},
			&cli.BoolFlag{Name: "phase-counters", Usage: "also split each result's counters by the phase they grew in (phase_counters; thesis Fig. 4.4, 4.5)"},
			&cli.IntFlag{Name: "matrix-dim", Value: 1024, Usage: "n of the n×n matrices"},
			&cli.Uint64Flag{Name: "loop-iterations", Value: 1 << 24, Usage: "iterations of the loop kernel"},
			&cli.StringFlag{Name: "copy-size", Value: "64MiB", Usage: "bytes moved each way by cpy and pincpy"},
			&cli.IntFlag{Name: "rodinia-scale", Value: 1, Usage: "divide the linear input sizes of bp, hs, lud, nn, srad and srad2 by this (1: Rodinia's sizes)"},
			&cli.StringFlag{Name: "fairness", Usage: "instead of workloads, loop this fairness load (madd or long-madd) for --duration and print a JSON summary"},
			&cli.DurationFlag{Name: "duration", Value: 5 * time.Second, Usage: "how long a --fairness load runs"},
			&cli.BoolFlag{Name: "yield", Usage: "with --fairness long-madd: declare a scheduling point after each kernel (cooperative yield; PV and pvdrm modes)"},
			&cli.IntFlag{Name: "repeat", Value: 15, Usage: "kernels per long-madd submission; with --contexts, kernel runs per instance"},
			&cli.IntFlag{Name: "contexts", Usage: "instead of workloads, run this many madd applications at once, each in its own GPU context, its kernel run --repeat times, and print their phase times as JSON (the contexts experiment, thesis Fig. 4.10)"},
			&cli.PathFlag{Name: "start-gate", Usage: "with --fairness or --contexts: once set up, create DIR/ready-DOMID and start the load only when DIR/go exists (the fairness harness starts its VMs together this way)"},
			&cli.DurationFlag{Name: "resume-timeout", Value: defaultResumeTimeout, Usage: "after its vGPU was saved (gpuvm vgpu save), keep the guest and wait this long for a daemon to restore it (gpuvm vgpu restore --domid N), then come back to it (docs/protocol.md §13.7); the guest's accesses wait meanwhile; posted writes the daemon had not run are repeated (shm transport). 0: a save ends the VM"},
			&cli.StringSliceFlag{Name: "resume-socket", Usage: "after a save, look for the restored vGPU on this daemon's device-model socket (repeatable, tried in turn; default: --socket)"},
			&cli.BoolFlag{Name: "hold", Usage: "after the workloads, keep the vGPU attached until SIGTERM or SIGINT (then exit 0), as a domain's device model lives as long as its domain (gpuvm libvirt starts VMs this way); exit 1 if the vGPU goes first"},
		}, covertGuestFlags()...),
		Action: runDevmodel,
	}
}

func runDevmodel(c *cli.Context) error {
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	names, err := workloads.Parse(c.String("workloads"))
	if err != nil {
		return usageError("--workloads: %v", err)
	}
	ram, err := parseSize(c.String("ram"))
	if err != nil {
		return usageError("--ram: %v", err)
	}
	copySize, err := parseSize(c.String("copy-size"))
	if err != nil {
		return usageError("--copy-size: %v", err)
	}
	transport, err := parseTransport(c.String("transport"))
	if err != nil {
		return err
	}
	if c.Int("runs") < 1 {
		return usageError("--runs %d: want at least 1", c.Int("runs"))
	}
	cfg := devmodel.Config{Socket: c.Path("socket"), DomID: uint32(c.Uint("domid")), Name: c.String("name"),
		Mode: c.String("mode"), RAMSize: ram, Transport: transport, TrapCost: c.Duration("trap-cost"), TrapCostSet: c.IsSet("trap-cost"), PostedWrites: c.Bool("posted-writes"), Logger: log,
		ResumeTimeout: c.Duration("resume-timeout"), ResumeSockets: c.StringSlice("resume-socket")}
	if cfg.ResumeTimeout < 0 {
		return usageError("--resume-timeout %v: want 0 (off) or more", cfg.ResumeTimeout)
	}
	if cfg.PostedWrites && transport == ipc.TransportSocket && (c.IsSet("resume-timeout") && cfg.ResumeTimeout > 0 || c.IsSet("resume-socket")) {
		return usageError("--posted-writes over the socket transport cannot resume after a save: the daemon cannot say which posted writes it ran (docs/protocol.md §6.9), and one it had not would be lost")
	}
	if c.Bool("hold") {
		if c.IsSet("covert") || c.IsSet("fairness") {
			return usageError("--hold: runs workloads, not --covert or --fairness")
		}
		params := workloads.Params{MatrixDim: c.Int("matrix-dim"), LoopIterations: c.Uint64("loop-iterations"), CopyBytes: copySize, RodiniaScale: c.Int("rodinia-scale")}
		return runHeld(c, cfg, names, params)
	}
	if c.IsSet("covert") {
		return runCovertGuest(c, cfg)
	}
	if n := c.Int("contexts"); n != 0 {
		return runContextsGuest(c, cfg, n)
	}
	if kind := c.String("fairness"); kind != "" {
		load, err := bench.RunFairnessGuest(c.Context, cfg, kind, c.Int("matrix-dim"), c.Int("repeat"), c.Duration("duration"), c.Path("start-gate"), c.Bool("yield"))
		err = noDaemonHint(err, "gpuvm serve", "--socket")
		if jerr := bench.WriteJSONValue(c.App.Writer, load); jerr != nil {
			return jerr
		}
		if err != nil {
			return &exitError{code: exitFailure, err: err}
		}
		if !load.Verified {
			return &exitError{code: exitFailure, err: errors.New(load.Error)}
		}
		return nil
	}
	params := workloads.Params{MatrixDim: c.Int("matrix-dim"), LoopIterations: c.Uint64("loop-iterations"), CopyBytes: copySize, RodiniaScale: c.Int("rodinia-scale")}
	progress := newProgress(c.App.ErrWriter)
	rep, err := bench.RunGuest(c.Context, cfg, names, c.Int("runs"), params,
		bench.RunOptions{PhaseCounters: c.Bool("phase-counters"), NoWarmup: c.Bool("no-warmup")}, progress.update)
	results := rep.Results
	progress.done()
	err = noDaemonHint(err, "gpuvm serve", "--socket")
	if c.Bool("json") {
		if results == nil {
			results = []bench.Result{}
		}
		if jerr := writeJSONList(c, results); jerr != nil {
			return jerr
		}
	} else if len(results) > 0 {
		if terr := bench.WriteTable(c.App.Writer, rep); terr != nil {
			return terr
		}
	}
	if err != nil {
		return &exitError{code: exitFailure, err: err}
	}
	for _, r := range results {
		if !r.Verified {
			return &exitError{code: exitFailure, err: firstFailure(results)}
		}
	}
	return nil
}

// defaultResumeTimeout is how long a VM whose vGPU was saved waits for its
// restore by default.
const defaultResumeTimeout = 2 * time.Minute

// maxGuestContexts bounds --contexts: a vGPU's channels bound it anyway.
const maxGuestContexts = 64

// runContextsGuest is `devmodel --contexts N`.
func runContextsGuest(c *cli.Context, cfg devmodel.Config, n int) error {
	if n < 1 || n > maxGuestContexts {
		return usageError("--contexts %d: want 1..%d", n, maxGuestContexts)
	}
	if r := c.Int("repeat"); r < 1 || r > 1_000_000 {
		return usageError("--repeat %d: want 1..1000000", r)
	}
	if d := c.Int("matrix-dim"); d < 1 || d > nvc0.MaxKernelMatrixDim {
		return usageError("--matrix-dim %d: want 1..%d", d, nvc0.MaxKernelMatrixDim)
	}
	insts, err := bench.RunContextsGuest(c.Context, cfg, n, c.Int("matrix-dim"), c.Int("repeat"), c.Path("start-gate"))
	err = noDaemonHint(err, "gpuvm serve", "--socket")
	if insts == nil {
		insts = []bench.Instance{}
	}
	if jerr := bench.WriteJSONValue(c.App.Writer, insts); jerr != nil {
		return jerr
	}
	if err != nil {
		return &exitError{code: exitFailure, err: err}
	}
	for i, in := range insts {
		if !in.Verified {
			return &exitError{code: exitFailure, err: fmt.Errorf("instance %d: %s", i+1, in.Error)}
		}
	}
	return nil
}

// firstFailure says that results failed, with the first one's error on the
// same line (with --json the table that shows it is not printed; a VM whose
// vGPU was destroyed says so here).
func firstFailure(results []bench.Result) error {
	for _, r := range results {
		if r.Error != "" {
			return fmt.Errorf("some results failed or did not verify; %s: %s", r.Workload, strings.ReplaceAll(r.Error, "\n", "; "))
		}
	}
	return errors.New("some results did not verify")
}

func writeJSONList(c *cli.Context, results []bench.Result) error {
	return bench.WriteJSONValue(c.App.Writer, results)
}

func parseTransport(s string) (ipc.Transport, error) {
	switch s {
	case "shm":
		return ipc.TransportShm, nil
	case "socket":
		return ipc.TransportSocket, nil
	}
	return 0, usageError("--transport %q: want shm or socket", s)
}

// noDaemonHint adds a hint to an error that says nothing listens on a socket.
func noDaemonHint(err error, daemon, flag string) error {
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("%w (is %s running, on the socket %s names?)", err, daemon, flag)
	}
	return err
}

// heldGuest is a VM attached to its vGPU: the guest driver (or the pvdrm
// front end), what the aggregator granted, and how to let go.
type heldGuest struct {
	drv      gdev.Driver
	welcome  ipc.Welcome
	counters bench.CounterSource
	// probe asks the aggregator something: it fails once the vGPU is gone.
	probe func() error
	close func() error
}

// attachGuest connects a VM to the aggregator in cfg.Mode (see
// bench.RunGuest, which does the same for one run of workloads).
func attachGuest(ctx context.Context, cfg devmodel.Config) (*heldGuest, error) {
	names := aggregator.CounterNames()
	countersOf := func(get func([]string) (map[string]uint64, error)) bench.CounterSource {
		return func() map[string]uint64 {
			c, err := get(names)
			if err != nil {
				return map[string]uint64{}
			}
			return c
		}
	}
	if config.Mode(cfg.Mode).IsPVDRM() {
		fe, err := pvdrm.DialLocal(ctx, pvdrm.DialConfig{Socket: cfg.Socket, DomID: cfg.DomID, Name: cfg.Name, Mode: cfg.Mode, GARTSize: cfg.RAMSize, Logger: cfg.Logger,
			ResumeTimeout: cfg.ResumeTimeout, ResumeSockets: cfg.ResumeSockets})
		if err != nil {
			return nil, err
		}
		return &heldGuest{drv: gdev.PVDRM(fe.Client, fe.Shares), welcome: fe.Welcome(), counters: countersOf(fe.Counters),
			probe: func() error { _, err := fe.Counters(names[:1]); return err }, close: fe.Close}, nil
	}
	dev, err := devmodel.Connect(ctx, cfg)
	if err != nil {
		return nil, err
	}
	bar1, bar3 := dev.BARSizes()
	drv, err := nouveau.Open(dev, dev.RAM(), nouveau.Options{BAR1Size: bar1, BAR3Size: bar3, PV: bench.DriverPVMode(cfg.Mode), Logger: cfg.Logger})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("guest driver: %w (device: %v)", err, dev.Err()), dev.Close())
	}
	probe := func() error {
		if err := dev.Err(); err != nil {
			return err
		}
		_, err := dev.Counters(names[:1])
		return err
	}
	return &heldGuest{drv: gdev.Nouveau(drv), welcome: dev.Welcome(), counters: countersOf(dev.Counters), probe: probe,
		close: func() error { return errors.Join(drv.Close(), dev.Close()) }}, nil
}

// holdProbe is how often a held vGPU is checked for still being there.
const holdProbe = 500 * time.Millisecond

// runHeld is devmodel --hold: the workloads as without it, and then the
// vGPU stays attached until SIGINT or SIGTERM (exit 0), or until the
// aggregator takes it away (exit 1). Stopped before it holds (while
// attaching or running the workloads), it exits as interrupted (130).
func runHeld(c *cli.Context, cfg devmodel.Config, names []string, params workloads.Params) error {
	ctx := c.Context
	g, err := attachGuest(ctx, cfg)
	if err != nil {
		if ctx.Err() != nil {
			// Told to stop while still attaching: exit as interrupted
			// (exitCode), not as failed.
			return fmt.Errorf("stopped while attaching the vGPU: %w", err)
		}
		return &exitError{code: exitFailure, err: noDaemonHint(err, "gpuvm serve", "--socket")}
	}
	rep := bench.Report{Board: bench.VGPUBoardInfo(g.welcome, cfg.Mode), Warmup: 1}
	progress := newProgress(c.App.ErrWriter)
	for _, name := range names {
		w, err := workloads.New(name, params)
		if err != nil {
			return errors.Join(err, g.close())
		}
		rep.Results = append(rep.Results, bench.RunWorkload(ctx, cfg.Mode, g.drv, w, c.Int("runs"), g.counters, progress.update))
	}
	progress.done()
	if ctx.Err() != nil {
		// Told to stop before holding (its domain went while the
		// workloads ran): exit as interrupted, not as failed.
		return errors.Join(fmt.Errorf("stopped during the workloads: %w", context.Cause(ctx)), g.close())
	}
	var werr error
	if c.Bool("json") {
		werr = writeJSONList(c, rep.Results)
	} else {
		werr = bench.WriteTable(c.App.Writer, rep)
	}
	if werr != nil {
		return errors.Join(werr, g.close())
	}
	for _, r := range rep.Results {
		if !r.Verified {
			return &exitError{code: exitFailure, err: errors.Join(firstFailure(rep.Results), g.close())}
		}
	}
	fmt.Fprintf(c.App.ErrWriter, "gpuvm devmodel: holding vGPU %d of domain %d (%s) until SIGTERM or SIGINT\n", g.welcome.VGPU, cfg.DomID, cfg.Name)
	t := time.NewTicker(holdProbe)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if err := g.close(); err != nil {
				return &exitError{code: exitFailure, err: fmt.Errorf("releasing the vGPU: %w", err)}
			}
			fmt.Fprintf(c.App.ErrWriter, "gpuvm devmodel: vGPU %d released (%v)\n", g.welcome.VGPU, context.Cause(ctx))
			return nil
		case <-t.C:
		}
		if err := g.probe(); err != nil {
			return &exitError{code: exitFailure, err: errors.Join(fmt.Errorf("the vGPU went while held: %w", err), g.close())}
		}
	}
}
