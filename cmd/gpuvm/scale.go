package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/bench"
	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/internal/svgplot"
	"github.com/gpuvm/gpuvm/sched"
)

func scaleCommand() *cli.Command {
	return &cli.Command{
		Name:  "scale",
		Usage: "measure how the per-VM costs grow with the number of VMs (1 to 64 at once)",
		Description: "For each VM count: a fresh board and aggregator partitioned in small slices (32 MiB of\n" +
			"VRAM and 2 channels per VM, the BAR apertures divided by 64), and that many VM processes\n" +
			"over the real protocol, each looping a verified madd for --duration from a common start.\n" +
			"Over the middle of that period it measures the aggregate throughput and each VM's\n" +
			"iteration time, the aggregator's and the VMs' CPU time, the aggregator's heap and\n" +
			"resident set with the VMs attached less without, and the dispatcher's decision cost.\n" +
			"OVERHEAD/VM is the machine's time per iteration (1 / aggregate iterations per second)\n" +
			"against the smallest VM count's, minus 1: 0 when N VMs split the same throughput.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "vms", Value: "1,8,32,64", Usage: fmt.Sprintf("comma-separated VM counts, 1..%d", bench.ScaleMaxVMs)},
			&cli.DurationFlag{Name: "duration", Value: 4 * time.Second, Usage: "how long each VM loops (the middle 80% is measured)"},
			&cli.StringFlag{Name: "mode", Value: string(config.ModeFVOptimized), Usage: "every VM's virtualization mode: " + strings.Join(aggregator.Modes(), ", ")},
			&cli.StringFlag{Name: "policy", Value: "band", Usage: "scheduling policy: " + strings.Join(sched.Names(), ", ")},
			&cli.IntFlag{Name: "matrix-dim", Value: 64, Usage: "madd matrix dimension"},
			&cli.StringFlag{Name: "timing", Value: "none", Usage: "board timing model: none or fermi"},
			&cli.BoolFlag{Name: "json", Usage: "print JSON instead of the table"},
			&cli.PathFlag{Name: "svg", Usage: "write the scaling chart (scaling.svg) to this directory"},
			&cli.PathFlag{Name: "config", Aliases: []string{"c"}, Usage: "TOML config for the [scheduler] parameters"},
			&cli.IntFlag{Name: "ipc-spin", Usage: "aggregator IPC polling iterations before sleeping, per VM connection (default 0: the IPC package's 20000, as gpuvm serve uses; negative: never spin)"},
			&cli.IntFlag{Name: "setup-concurrency", Usage: "VMs setting up at once (default: one per CPU; the rest wait their turn)"},
			&cli.PathFlag{Name: "cpuprofile", Hidden: true, Usage: "write a CPU profile of the largest run's measured window to this file"},
		},
		Action: runScale,
	}
}

// parseScaleCounts parses --vms: counts 1..bench.ScaleMaxVMs.
func parseScaleCounts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > bench.ScaleMaxVMs {
			return nil, fmt.Errorf("%q: want counts 1..%d", f, bench.ScaleMaxVMs)
		}
		out = append(out, n)
	}
	return out, nil
}

func runScale(c *cli.Context) error {
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	vms, err := parseScaleCounts(c.String("vms"))
	if err != nil {
		return usageError("--vms %v", err)
	}
	mode := c.String("mode")
	if !slices.Contains(aggregator.Modes(), mode) {
		return usageError("--mode %q: have %s", mode, strings.Join(aggregator.Modes(), ", "))
	}
	policy := c.String("policy")
	if !slices.Contains(sched.Names(), policy) {
		return usageError("--policy %q: have %s", policy, strings.Join(sched.Names(), ", "))
	}
	if d := c.Duration("duration"); d < time.Second {
		return usageError("--duration %v: want at least 1s", d)
	}
	if d := c.Int("matrix-dim"); d < 1 || d > 1024 {
		return usageError("--matrix-dim %d: want 1..1024", d)
	}
	cfg := config.Default()
	if path := c.Path("config"); path != "" {
		if cfg, err = config.Load(path); err != nil {
			return usageError("%v", err)
		}
	}
	boardCfg, err := boardConfig(c)
	if err != nil {
		return err
	}
	o := bench.ScaleOptions{
		Board: boardCfg, VMs: vms, Mode: mode, Policy: policy, Sched: sched.FromConfig(cfg.Scheduler),
		Duration: c.Duration("duration"), MatrixDim: c.Int("matrix-dim"), ServerSpin: c.Int("ipc-spin"),
		SetupConcurrency: c.Int("setup-concurrency"), Command: selfCommand, Logger: log,
		Progress: func(msg string) { fmt.Fprintln(c.App.ErrWriter, msg) },
	}
	var profErr error
	if path := c.Path("cpuprofile"); path != "" {
		o.Profile = cpuProfiler(path, slices.Max(vms), &profErr)
	}
	rep, err := bench.RunScale(c.Context, o)
	if err != nil {
		return &exitError{code: exitFailure, err: err}
	}
	if profErr != nil {
		return fmt.Errorf("--cpuprofile: %w", profErr)
	}
	if dir := c.Path("svg"); dir != "" {
		if err := writeScaleSVG(dir, rep); err != nil {
			return fmt.Errorf("--svg: %w", err)
		}
		fmt.Fprintf(c.App.ErrWriter, "scale: chart written to %s\n", filepath.Join(dir, "scaling.svg"))
	}
	if c.Bool("json") {
		err = bench.WriteJSONValue(c.App.Writer, rep)
	} else {
		err = writeScaleTable(c.App.Writer, rep)
	}
	if err != nil {
		return err
	}
	for _, r := range rep.Runs {
		if !r.Verified {
			return &exitError{code: exitFailure, err: fmt.Errorf("%d VMs: a VM's result did not verify", r.VMs)}
		}
	}
	return nil
}

// cpuProfiler profiles the measured window of the run with vms VMs into
// path; a failure lands in *errp.
func cpuProfiler(path string, vms int, errp *error) func(int) func() {
	return func(n int) func() {
		if n != vms {
			return func() {}
		}
		f, err := os.Create(path)
		if err != nil {
			*errp = err
			return func() {}
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			*errp = errors.Join(err, f.Close())
			return func() {}
		}
		return func() {
			pprof.StopCPUProfile()
			*errp = f.Close()
		}
	}
}

func writeScaleTable(w io.Writer, rep bench.ScaleReport) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "VMS\tIT/S TOTAL\tIT ms/VM\tOVERHEAD/VM\tCPU µs/IT\tAGG CPU ms/VM/s\tAGG CPU µs/IT\tREQ/IT\tHEAP KiB/VM\tRSS KiB/VM\tDECISION ns\tDECISIONS/s\tCPU BUSY\tHOST BUSY\tSETUP ms\t")
	for _, r := range rep.Runs {
		fmt.Fprintf(tw, "%d\t%.0f\t%.3f\t%+.1f%%\t%.1f\t%.2f\t%.1f\t%.1f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f%%\t%.0f%%\t%.0f\t\n",
			r.VMs, r.IterationsPerS, r.IterationMs, 100*r.OverheadPerVM, r.CPUUsPerIteration, r.AggCPUMsPerVMPerS, r.AggCPUUsPerIteration, r.RequestsPerIteration,
			r.HeapKiBPerVM, r.RSSKiBPerVM, r.DecisionNs, r.DecisionsPerS, 100*r.CPUBusy, 100*r.HostBusy, r.SetupMs)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(rep.Runs) > 0 {
		fmt.Fprintf(w, "\n%s, %s, %d CPUs; overheads against %d VM(s); CPU µs/IT: aggregator and VM processes; REQ/IT: requests to the aggregator (traps); BUSY: of all CPUs\n",
			rep.Runs[0].Mode, rep.Runs[0].Policy, rep.CPUs, rep.BaseVMs)
	}
	return nil
}

// writeScaleSVG draws scaling.svg: per-VM costs against the VM count,
// each relative to the base run's on a log10 axis (0 = flat, 1 = ten times
// the base's, 2 = a hundred times).
func writeScaleSVG(dir string, rep bench.ScaleReport) error {
	if len(rep.Runs) == 0 {
		return errors.New("no runs")
	}
	base := rep.Runs[0]
	for _, r := range rep.Runs {
		if r.VMs == rep.BaseVMs {
			base = r
		}
	}
	metrics := []struct {
		name string
		get  func(bench.ScaleRun) float64
	}{
		{"wall time per iteration (1 + overhead per VM)", func(r bench.ScaleRun) float64 { return r.CostPerIterationUs }},
		{"CPU time per iteration (aggregator + VMs)", func(r bench.ScaleRun) float64 { return r.CPUUsPerIteration }},
		{"aggregator CPU time per iteration", func(r bench.ScaleRun) float64 { return r.AggCPUUsPerIteration }},
		{"aggregator CPU time per request", func(r bench.ScaleRun) float64 { return r.AggCPUUsPerRequest }},
		{"aggregator heap per VM", func(r bench.ScaleRun) float64 { return r.HeapKiBPerVM }},
		{"dispatcher decision time (wall clock)", func(r bench.ScaleRun) float64 { return r.DecisionNs }},
	}
	runs := slices.Clone(rep.Runs)
	slices.SortFunc(runs, func(a, b bench.ScaleRun) int { return a.VMs - b.VMs })
	var series []svgplot.Series
next:
	for _, m := range metrics {
		b := m.get(base)
		s := svgplot.Series{Name: m.name}
		for _, r := range runs {
			v := m.get(r)
			if b <= 0 || v <= 0 {
				continue next // no ratio to draw on a log axis
			}
			s.X = append(s.X, float64(r.VMs))
			s.Y = append(s.Y, math.Log10(v/b))
		}
		series = append(series, s)
	}
	if len(series) == 0 {
		return errors.New("nothing measured to draw")
	}
	svg, err := svgplot.LineChart{
		Title:  fmt.Sprintf("Per-VM costs against VM count (%s, %s), relative to %d VM(s)", base.Mode, base.Policy, rep.BaseVMs),
		XLabel: "VMs", YLabel: "log10 of cost / base cost (0 = flat)", Series: series, Width: 960,
	}.SVG()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "scaling.svg"), svg, 0o644)
}
