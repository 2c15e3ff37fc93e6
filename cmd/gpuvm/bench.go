package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/bench"
	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
)

// benchModes are the execution modes bench can run.
func benchModes() []string { return append([]string{"native"}, aggregator.Modes()...) }

func benchCommand() *cli.Command {
	return &cli.Command{
		Name:  "bench",
		Usage: "run the GPUvm evaluation workloads and report per-phase times",
		Description: "Runs each workload once to warm up and then --runs times, timing the phases\n" +
			"init / htod / launch / dtoh / close (GPUvm thesis Fig. 4.9), and verifies every result\n" +
			"against a host reference. With no flags: every workload, natively and in fv-optimized\n" +
			"(the guest in its own VM process behind a device model), on the simulated Fermi board\n" +
			"with the fermi-xen timing profile, 3 measured runs; a table with each total normalised\n" +
			"to native beside GPUvm's published ratio, then a one-line summary per mode.\n\n" +
			"Workloads: " + workloadHelp() + "\n\n" +
			"Exit status: 0 all verified, 1 a run failed or did not verify, 2 usage error.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "mode", Value: "native,fv-optimized", Usage: "comma-separated modes: " + strings.Join(benchModes(), ", ")},
			&cli.StringFlag{Name: "workloads", Aliases: []string{"w"}, Value: "all", Usage: "comma-separated workloads, or all"},
			&cli.IntFlag{Name: "runs", Aliases: []string{"n"}, Value: 3, Usage: "measured runs per workload (after one warm-up run)"},
			&cli.StringFlag{Name: "timing", Value: "fermi-xen", Usage: "board timing model: none (as fast as possible), fermi (Quadro 6000 on PCIe 2.0) or fermi-xen (fermi, and each trapped access also pays the hypervisor's share of a Xen trap)"},
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object instead of the table"},
			&cli.IntFlag{Name: "matrix-dim", Value: 1024, Usage: "n of the n×n matrices of madd, mmul, fmadd, fmmul"},
			&cli.Uint64Flag{Name: "loop-iterations", Value: 1 << 24, Usage: "iterations of the loop kernel"},
			&cli.StringFlag{Name: "copy-size", Value: "64MiB", Usage: "bytes moved each way by cpy and pincpy"},
			&cli.IntFlag{Name: "rodinia-scale", Value: 1, Usage: "divide the linear input sizes of bp, hs, lud, nn, srad and srad2 by this (1: Rodinia's sizes)"},
			&cli.StringFlag{Name: "vram", Value: "6GiB", Usage: "VRAM of the simulated board"},
			&cli.PathFlag{Name: "config", Aliases: []string{"c"}, Usage: "TOML config (see examples/gpuvm.toml) for the board; explicit flags override it"},
			&cli.PathFlag{Name: "svg", Usage: "write a chart of each mode's time normalised to native (vs-native.svg) to this directory"},
			&cli.StringFlag{Name: "transport", Value: "shm", Usage: "virtualized modes: device model to aggregator transport, shm or socket"},
			&cli.DurationFlag{Name: "trap-cost", Usage: "virtualized modes: charge this per trapped access for the hypervisor's VM exit and ioreq delivery, which runs without Xen do not pay; 0 = none (default: the timing profile's, 5us for fermi-xen)"},
			&cli.BoolFlag{Name: "posted-writes", Usage: "virtualized modes: trapped writes return before the aggregator handled them (default: they complete first, as a Xen ioreq does)"},
			&cli.StringFlag{Name: "doorbell", Value: "trap", Usage: "virtualized modes: trap (every GP_PUT write traps) or poll (the aggregator polls the guests' user areas, no trap per doorbell)"},
		},
		Action:      runBench,
		Subcommands: []*cli.Command{fairnessCommand(), covertCommand(), scaleCommand(), reportCommand(), sloCommand(), mobilityCommand(), mobilityGuestCommand(), heteroCommand()},
	}
}

// runNative runs the workloads with the guest driver straight on a board.
func runNative(ctx context.Context, cfg sim.Config, wls []workloads.Workload, runs int, progress bench.Progress, log *slog.Logger) ([]bench.Result, error) {
	native, err := bench.OpenNative(cfg, log)
	if err != nil {
		return nil, err
	}
	defer native.Close()
	var out []bench.Result
	for _, w := range wls {
		out = append(out, bench.RunWorkload(ctx, "native", gdev.Nouveau(native.Device), w, runs, native.Counters, progress))
		if ctx.Err() != nil {
			break
		}
	}
	return out, nil
}

func workloadHelp() string {
	var parts []string
	for _, n := range workloads.Names() {
		parts = append(parts, fmt.Sprintf("%s (%s)", n, workloads.Describe(n)))
	}
	return strings.Join(parts, ", ")
}

func runBench(c *cli.Context) error {
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	modes, err := parseModes(c.String("mode"))
	if err != nil {
		return err
	}
	names, err := workloads.Parse(c.String("workloads"))
	if err != nil {
		return usageError("--workloads: %v", err)
	}
	runs := c.Int("runs")
	if runs < 1 || runs > 1000 {
		return usageError("--runs %d: want 1..1000", runs)
	}
	copySize, err := parseSize(c.String("copy-size"))
	if err != nil {
		return usageError("--copy-size: %v", err)
	}
	boardCfg, err := boardConfig(c)
	if err != nil {
		return err
	}
	doorbell := config.Doorbell(c.String("doorbell"))
	if !doorbell.Valid() {
		return usageError("--doorbell %q: want trap or poll", doorbell)
	}
	transport, err := parseTransport(c.String("transport"))
	if err != nil {
		return err
	}
	params := workloads.Params{MatrixDim: c.Int("matrix-dim"), LoopIterations: c.Uint64("loop-iterations"), CopyBytes: copySize, RodiniaScale: c.Int("rodinia-scale")}
	var wls []workloads.Workload
	for _, n := range names {
		w, err := workloads.New(n, params)
		if err != nil {
			return usageError("%v", err)
		}
		wls = append(wls, w)
	}

	report := bench.Report{Board: bench.BoardInfoFor(boardCfg), Warmup: 1}
	progress := newProgress(c.App.ErrWriter)
	for _, mode := range modes {
		var results []bench.Result
		if mode == "native" {
			results, err = runNative(c.Context, boardCfg, wls, runs, progress.update, log)
		} else {
			progress.done()
			results, err = bench.RunVirtualized(c.Context, mode, names, runs, params, bench.VirtualOptions{
				Board: boardCfg, Partition: bench.BenchPartition(boardCfg.VRAMSize), RAMSize: bench.GuestRAM,
				Transport: transport, TrapCost: c.Duration("trap-cost"), TrapCostSet: c.IsSet("trap-cost"),
				PostedWrites: c.Bool("posted-writes"), Command: selfCommand, Logger: log,
				PollDoorbells: doorbell == config.DoorbellPoll,
			})
		}
		if err != nil {
			progress.done()
			return &exitError{code: exitFailure, err: fmt.Errorf("%s: %w", mode, err)}
		}
		report.Results = append(report.Results, results...)
		if c.Context.Err() != nil {
			progress.done()
			return c.Context.Err()
		}
	}
	progress.done()
	report.Normalize()
	if dir := c.Path("svg"); dir != "" {
		svg, err := bench.ChartVsNative(report)
		if err != nil {
			return fmt.Errorf("--svg: %w (it needs native and at least one other mode)", err)
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "vs-native.svg"), svg, 0o644); err != nil {
			return err
		}
	}
	if c.Bool("json") {
		err = bench.WriteJSON(c.App.Writer, report)
	} else {
		err = bench.WriteTable(c.App.Writer, report)
		fmt.Fprintln(c.App.Writer)
		bench.WriteSummary(c.App.Writer, report)
	}
	if err != nil {
		return err
	}
	if !report.Verified() {
		return &exitError{code: exitFailure, err: errors.New("some results failed or did not verify")}
	}
	return nil
}

// boardConfig builds the simulated board's configuration: the defaults, then
// the --config file's [board] table, then explicitly set flags.
func boardConfig(c *cli.Context) (sim.Config, error) {
	cfg := sim.DefaultConfig()
	timing, vram := c.String("timing"), c.String("vram")
	if path := c.Path("config"); path != "" {
		file, err := config.Load(path)
		if err != nil {
			return cfg, usageError("%v", err)
		}
		if file.Board.Kind != config.BoardSim {
			return cfg, usageError("%s: bench runs on the simulated board; board.kind = %q", path, file.Board.Kind)
		}
		cfg.VRAMSize, cfg.Channels, cfg.MemPartitions = uint64(file.Board.VRAM), file.Board.Channels, file.Board.MemPartitions
		if !c.IsSet("timing") {
			timing = string(file.Board.Timing)
		}
		if !c.IsSet("vram") {
			vram = file.Board.VRAM.String()
		}
	}
	t, err := sim.TimingByName(timing)
	if err != nil {
		return cfg, usageError("--timing: %v", err)
	}
	cfg.Timing = t
	if cfg.VRAMSize, err = parseSize(vram); err != nil {
		return cfg, usageError("--vram: %v", err)
	}
	return cfg, nil
}

func parseSize(s string) (uint64, error) {
	n, err := config.ParseSize(s)
	return uint64(n), err
}

func parseModes(s string) ([]string, error) {
	var out []string
	for _, m := range strings.Split(s, ",") {
		m = strings.TrimSpace(m)
		if m == "" {
			continue
		}
		if !slices.Contains(benchModes(), m) {
			return nil, usageError("--mode %q: this build runs %s", m, strings.Join(benchModes(), ", "))
		}
		out = append(out, m)
	}
	if len(out) == 0 {
		return nil, usageError("--mode: no mode given")
	}
	return out, nil
}

// progress prints a one-line status on stderr: rewritten in place on a
// terminal, one line per workload otherwise.
type progress struct {
	w    io.Writer
	tty  bool
	last string
}

func newProgress(w io.Writer) *progress {
	p := &progress{w: w}
	if f, ok := w.(*os.File); ok {
		_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
		p.tty = err == nil
	}
	return p
}

func (p *progress) update(mode, workload string, run, runs int) {
	what := fmt.Sprintf("run %d/%d", run, runs)
	if run == 0 {
		what = "warm-up"
	}
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K%s %s: %s", mode, workload, what)
		return
	}
	if key := mode + " " + workload; key != p.last {
		fmt.Fprintf(p.w, "bench: %s %s (1 warm-up run + %s)\n", mode, workload, countOf(runs, "measured run"))
		p.last = key
	}
}

func (p *progress) done() {
	if p.tty {
		fmt.Fprint(p.w, "\r\033[K")
	}
}

// countOf is "1 measured run", "3 measured runs".
func countOf(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
