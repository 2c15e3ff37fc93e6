package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gpuvm/gpuvm/bench"
	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/internal/svgplot"
	"github.com/gpuvm/gpuvm/sched"
)

func fairnessCommand() *cli.Command {
	return &cli.Command{
		Name:  "fairness",
		Usage: "measure GPU time fairness of the scheduling policies (thesis Fig. 4.11-4.13)",
		Description: "For each VM count and policy: a fresh board and aggregator with that policy, and that\n" +
			"many VM processes over the real protocol, half looping madd (one kernel per submission),\n" +
			"half long-madd (--repeat kernels per submission: 15x the work). Reports each VM's GPU\n" +
			"usage over 500 ms and 100 ms windows, Jain's fairness index over those windows,\n" +
			"throughput, and each policy's execution-time overhead against FIFO.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "vms", Value: "2,4", Usage: "comma-separated VM counts, each even, 2..64 (half the VMs loop madd, half long-madd; with --modes or --weights any count: VM i loops madd if i is odd)"},
			&cli.StringFlag{Name: "weights", Usage: "comma-separated scheduling weights 1.." + strconv.Itoa(config.MaxWeight) + ", VM i getting the i-th modulo their number (e.g. 1,2,4 with --vms 3); Jain and min/max are then of usage / weight, and the JSON gives each VM's share and weighted target; default 1 each"},
			&cli.StringFlag{Name: "modes", Usage: "comma-separated virtualization modes, VM i running the i-th modulo their number (a mixed board); default fv-optimized: " + strings.Join(config.ModeNames(), ", ")},
			&cli.StringFlag{Name: "policy", Value: "fifo,band", Usage: "comma-separated policies: " + strings.Join(sched.Names(), ", ")},
			&cli.DurationFlag{Name: "duration", Value: 6 * time.Second, Usage: "length of each run"},
			&cli.IntFlag{Name: "matrix-dim", Value: 256, Usage: "madd matrix dimension"},
			&cli.IntFlag{Name: "repeat", Value: 15, Usage: "kernels per long-madd submission"},
			&cli.BoolFlag{Name: "yield", Usage: "long-madd declares a scheduling point after each kernel (GLoop's cooperative yield), so the scheduler may run another VM between them; needs --modes of PV modes (" + strings.Join(yieldModes(), ", ") + ")"},
			&cli.StringFlag{Name: "timing", Value: "none", Usage: "board timing model: none or fermi"},
			&cli.BoolFlag{Name: "json", Usage: "print JSON instead of the table"},
			&cli.PathFlag{Name: "svg", Usage: "write usage charts (SVG) to this directory"},
			&cli.PathFlag{Name: "config", Aliases: []string{"c"}, Usage: "TOML config for the [scheduler] parameters"},
			&cli.IntFlag{Name: "ipc-spin", Value: 200, Usage: "aggregator IPC polling iterations before sleeping, per VM (spinning peers starve VMs on small hosts)"},
		},
		Action: runFairness,
	}
}

// parseVMCounts parses --vms: even counts 2..64, because half the VMs of
// a run loop madd and half long-madd (an odd count would not split) —
// unless odd counts are allowed (a mixed board of --modes).
func parseVMCounts(s string, odd bool) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 2 || n > 64 || (n%2 != 0 && !odd) {
			return nil, fmt.Errorf("%q: want even counts 2..64 (half the VMs loop madd, half long-madd)", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func runFairness(c *cli.Context) error {
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	var modes []string
	if c.IsSet("modes") {
		for _, m := range strings.Split(c.String("modes"), ",") {
			m = strings.TrimSpace(m)
			if !config.Mode(m).Valid() {
				return usageError("--modes %q: have %s", m, strings.Join(config.ModeNames(), ", "))
			}
			modes = append(modes, m)
		}
	}
	if c.Bool("yield") {
		if len(modes) == 0 {
			return usageError("--yield: give --modes, each one of %s", strings.Join(yieldModes(), ", "))
		}
		for _, m := range modes {
			if !slices.Contains(yieldModes(), m) {
				return usageError("--yield: mode %s cannot declare scheduling points (have %s)", m, strings.Join(yieldModes(), ", "))
			}
		}
	}
	var weights []int
	if c.IsSet("weights") {
		for _, f := range strings.Split(c.String("weights"), ",") {
			w, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || w < 1 || w > config.MaxWeight {
				return usageError("--weights %q: want integers 1..%d", f, config.MaxWeight)
			}
			weights = append(weights, w)
		}
	}
	vms, err := parseVMCounts(c.String("vms"), len(modes) > 0 || len(weights) > 0)
	if err != nil {
		return usageError("--vms %v", err)
	}
	var policies []string
	for _, p := range strings.Split(c.String("policy"), ",") {
		p = strings.TrimSpace(p)
		if !slices.Contains(sched.Names(), p) {
			return usageError("--policy %q: have %s", p, strings.Join(sched.Names(), ", "))
		}
		policies = append(policies, p)
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
	if c.Duration("duration") < time.Second {
		return usageError("--duration %v: want at least 1s (it is cut into 500 ms windows)", c.Duration("duration"))
	}
	rep, err := bench.RunFairness(c.Context, bench.FairnessOptions{
		Board: boardCfg, Policies: policies, VMs: vms, Modes: modes, Weights: weights, Duration: c.Duration("duration"),
		MatrixDim: c.Int("matrix-dim"), Repeat: c.Int("repeat"), Sched: sched.FromConfig(cfg.Scheduler), Yield: c.Bool("yield"),
		Command: selfCommand, Logger: log, ServerSpin: c.Int("ipc-spin"),
		Progress: func(msg string) { fmt.Fprintln(c.App.ErrWriter, msg) },
	})
	if err != nil {
		return &exitError{code: exitFailure, err: err}
	}
	if dir := c.Path("svg"); dir != "" {
		if err := writeFairnessSVGs(dir, rep); err != nil {
			return err
		}
		fmt.Fprintf(c.App.ErrWriter, "fairness: charts written to %s\n", dir)
	}
	if c.Bool("json") {
		return bench.WriteJSONValue(c.App.Writer, rep)
	}
	return writeFairnessTable(c.App.Writer, rep)
}

// yieldModes are the modes whose guests can declare scheduling points
// (the YIELD_POINTS hypercall; pvdrm's PushYield).
func yieldModes() []string {
	return []string{string(config.ModePVNaive), string(config.ModePVMulticall), string(config.ModePVDRM), string(config.ModePVDRMPooling)}
}

func writeFairnessTable(w io.Writer, rep bench.FairnessReport) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "POLICY\tVMS\tJAIN 500ms\tJAIN 100ms\tMIN/MAX run\tMIN/MAX 500ms\tMIN/MAX 100ms\tGPU BUSY\tMADD it/s\tLONG it/s\tOVERHEAD madd\tOVERHEAD long\tMODES\tSHARE/TARGET\t")
	for _, r := range rep.Runs {
		var madd, long float64
		for i, l := range r.Loads {
			tp := r.Throughput["vm"+strconv.Itoa(i+1)]
			if l.Kind == "madd" {
				madd += tp
			} else {
				long += tp
			}
		}
		ov := func(k string) string {
			if v, ok := r.OverheadVsFIFO[k]; ok {
				return fmt.Sprintf("%+.1f%%", 100*v)
			}
			return "–"
		}
		// Each VM's share of the GPU time over the run against its
		// weighted target (weight / sum of weights).
		var st []string
		for i := range r.VMs {
			name := "vm" + strconv.Itoa(i+1)
			if t := r.Target[name]; t > 0 {
				st = append(st, fmt.Sprintf("%.3f/%.3f", r.Share[name], t))
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%.0f%%\t%.1f\t%.1f\t%s\t%s\t%s\t%s\t\n", r.Policy, r.VMs, r.Jain500, r.Jain100, r.MinMaxRun, r.MinMax500, r.MinMax100, 100*r.GPUBusy, madd, long, ov("madd"), ov("long-madd"), modesOf(r), strings.Join(st, " "))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nGPUvm (thesis §4.3.4): overhead vs FIFO with madd: CREDIT %s, BAND %s; with long-madd: CREDIT %s, BAND %s\n",
		rep.Published["credit_vs_fifo_madd"], rep.Published["band_vs_fifo_madd"], rep.Published["credit_vs_fifo_long_madd"], rep.Published["band_vs_fifo_long_madd"])
	return nil
}

// writeFairnessSVGs draws, per run and window length, each VM's GPU usage
// over time (the thesis' Fig. 4.11/4.12), and the overheads against FIFO.
func writeFairnessSVGs(dir string, rep bench.FairnessReport) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	one := 1.0
	zero := 0.0
	var bars []svgplot.Bar
	for _, r := range rep.Runs {
		for win, byVM := range r.Usage {
			step, _ := time.ParseDuration(win)
			var series []svgplot.Series
			for i := range r.VMs {
				name := "vm" + strconv.Itoa(i+1)
				ys := byVM[name]
				xs := make([]float64, len(ys))
				for k := range ys {
					xs[k] = float64(k) * step.Seconds()
				}
				series = append(series, svgplot.Series{Name: fmt.Sprintf("%s (%s)", name, r.Loads[i].Kind), X: xs, Y: ys})
			}
			chart := svgplot.LineChart{
				Title:  fmt.Sprintf("%s, %d VMs: GPU usage per %s window (Jain %.3f)", r.Policy, r.VMs, win, map[string]float64{"500ms": r.Jain500, "100ms": r.Jain100}[win]),
				XLabel: "time (s)", YLabel: "GPU usage", Series: series, YMin: &zero, YMax: &one,
			}
			svg, err := chart.SVG()
			if err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("usage-%s-%dvms-%s.svg", r.Policy, r.VMs, win)), svg, 0o644); err != nil {
				return err
			}
		}
		for k, v := range r.OverheadVsFIFO {
			if r.Policy != "fifo" {
				bars = append(bars, svgplot.Bar{Group: fmt.Sprintf("%s %dVM", k, r.VMs), Label: r.Policy, Value: 100 * v})
			}
		}
	}
	if len(bars) > 0 {
		slices.SortFunc(bars, func(a, b svgplot.Bar) int { return strings.Compare(a.Group+a.Label, b.Group+b.Label) })
		svg, err := svgplot.BarChart{Title: "Execution-time overhead against FIFO", YLabel: "overhead (%)", Bars: bars}.SVG()
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, "overhead-vs-fifo.svg"), svg, 0o644)
	}
	return nil
}

// modesOf is a run's MODES column: the VMs' modes, and whether the
// long-madd VMs yielded (with how many submissions were cut).
func modesOf(r bench.FairnessRun) string {
	m := strings.Join(r.Modes, ",")
	if r.Yield {
		m += fmt.Sprintf(" +yield (%d cuts)", r.Splits)
	}
	return m
}
