package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gpuvm/gpuvm/bench"
	"github.com/gpuvm/gpuvm/bench/report"
	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
	"github.com/gpuvm/gpuvm/sched"
)

// reportSizes are the sizes of one kind of report run.
type reportSizes struct {
	params                 workloads.Params
	runs                   int
	noWarmup, oneVMPerMode bool
	contextCounts          []int
	contextDim, contextRep int
	fairVMs                []int
	fairPolicies           []string
	fairDuration           time.Duration
}

// fullSizes are the thesis' sizes (Table 4.2) with the fairness runs of
// docs/performance.md; the contexts experiment repeats madd 1000 times, not
// the thesis' 10000, at 256×256, so that 8 instances fit in minutes.
func fullSizes() reportSizes {
	return reportSizes{
		params: workloads.Params{MatrixDim: 1024, LoopIterations: 1 << 24, CopyBytes: 64 << 20}, runs: 10,
		contextCounts: []int{1, 2, 4, 8}, contextDim: 256, contextRep: 1000,
		fairVMs: []int{2, 4, 8}, fairPolicies: bench.DefaultFairnessPolicies(), fairDuration: 6 * time.Second,
	}
}

// quickSizes are CI's: every experiment and figure, on small inputs.
func quickSizes() reportSizes {
	return reportSizes{
		params: workloads.Params{MatrixDim: 64, LoopIterations: 1 << 12, CopyBytes: 256 << 10, RodiniaScale: 16}, runs: 1, noWarmup: true, oneVMPerMode: true,
		contextCounts: []int{1, 2, 4}, contextDim: 64, contextRep: 10,
		fairVMs: []int{2}, fairPolicies: []string{"fifo", "credit", "band"}, fairDuration: 1500 * time.Millisecond,
	}
}

func reportCommand() *cli.Command {
	return &cli.Command{
		Name:      "report",
		Usage:     "run the whole GPUvm evaluation (thesis §4.3) and write an HTML report",
		ArgsUsage: " ",
		Description: "Runs every experiment of the GPUvm thesis' §4.3 on the simulated board: every mode ×\n" +
			"every workload (Fig. 4.3-4.5, 4.8, 4.9, Tables 4.1 and 4.3), 1/2/4/8 madd applications in\n" +
			"one VM against one per VM (Fig. 4.10), and the schedulers' fairness and overhead\n" +
			"(Fig. 4.11-4.13). Writes DIR/index.html (self-contained: inline SVG figures, tables,\n" +
			"GPUvm's published values beside ours, machine, timing profile, commands),\n" +
			"DIR/evaluation.json (the numbers) and DIR/figures/*.svg. Progress and an estimate of\n" +
			"the remaining time go to stderr. A step that fails is reported on the page and the\n" +
			"rest still run.\n\n" +
			"The full run takes the thesis' sizes and lasts tens of minutes; --quick takes small\n" +
			"inputs and one run each (a few minutes; CI runs it).\n\n" +
			"Exit status: 0 everything ran and verified, 1 a step failed or a result did not verify,\n" +
			"2 usage error.",
		Flags: []cli.Flag{
			&cli.PathFlag{Name: "out", Aliases: []string{"o"}, Required: true, Usage: "directory to write the report into (created if missing)"},
			&cli.BoolFlag{Name: "quick", Usage: "small inputs, one measured run and no warm-up, one VM process per mode, fewer and shorter fairness runs: every figure, in minutes"},
			&cli.StringFlag{Name: "mode", Usage: "comma-separated modes of Fig. 4.8/4.9 (default: native and every mode)"},
			&cli.StringFlag{Name: "workloads", Aliases: []string{"w"}, Value: "all", Usage: "comma-separated workloads, or all"},
			&cli.IntFlag{Name: "runs", Aliases: []string{"n"}, Usage: "measured runs per workload (default 10, the thesis', or 1 with --quick)"},
			&cli.StringFlag{Name: "timing", Value: "fermi-xen", Usage: "board timing model of the mode runs and Fig. 4.10: none, fermi or fermi-xen"},
			&cli.StringFlag{Name: "fairness-timing", Value: "none", Usage: "board timing model of the fairness runs (docs/performance.md's runs use none)"},
			&cli.StringFlag{Name: "policy", Usage: "comma-separated scheduling policies of Fig. 4.11-4.13 (default fifo,credit,band,wfq,timeslice,dfq; fifo,credit,band with --quick)"},
			&cli.StringFlag{Name: "vms", Usage: "comma-separated even VM counts of Fig. 4.11-4.13 (default 2,4,8; 2 with --quick)"},
			&cli.DurationFlag{Name: "duration", Usage: "length of each fairness run (default 6s; 1.5s with --quick)"},
			&cli.PathFlag{Name: "from", Usage: "do not run anything: render the report again from a saved evaluation.json"},
		},
		Action: runReport,
	}
}

func runReport(c *cli.Context) error {
	if c.NArg() > 0 {
		return usageError("report takes no arguments (got %q); the directory is --out", c.Args().First())
	}
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	if from := c.Path("from"); from != "" {
		return rerenderReport(c, from)
	}
	sz := fullSizes()
	if c.Bool("quick") {
		sz = quickSizes()
	}
	if c.IsSet("runs") {
		sz.runs = c.Int("runs")
		if sz.runs < 1 || sz.runs > 1000 {
			return usageError("--runs %d: want 1..1000", sz.runs)
		}
	}
	if c.IsSet("duration") {
		sz.fairDuration = c.Duration("duration")
		if sz.fairDuration < time.Second {
			return usageError("--duration %v: want at least 1s (it is cut into 500 ms windows)", sz.fairDuration)
		}
	}
	modes := benchModes()
	if c.IsSet("mode") {
		if modes, err = parseModes(c.String("mode")); err != nil {
			return err
		}
	}
	names, err := workloads.Parse(c.String("workloads"))
	if err != nil {
		return usageError("--workloads: %v", err)
	}
	if c.IsSet("policy") {
		sz.fairPolicies = nil
		for _, p := range strings.Split(c.String("policy"), ",") {
			p = strings.TrimSpace(p)
			if !slices.Contains(sched.Names(), p) {
				return usageError("--policy %q: have %s", p, strings.Join(sched.Names(), ", "))
			}
			sz.fairPolicies = append(sz.fairPolicies, p)
		}
	}
	if c.IsSet("vms") {
		if sz.fairVMs, err = parseVMCounts(c.String("vms"), false); err != nil {
			return usageError("--vms %v", err)
		}
	}
	board, err := reportBoard(c.String("timing"), "--timing")
	if err != nil {
		return err
	}
	fairBoard, err := reportBoard(c.String("fairness-timing"), "--fairness-timing")
	if err != nil {
		return err
	}
	out := c.Path("out")
	if err := os.MkdirAll(out, 0o755); err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	var virt []string
	for _, m := range modes {
		if m != "native" {
			virt = append(virt, m)
		}
	}
	ctxModes := []string{}
	for _, m := range []string{string(config.ModeFVOptimized), string(config.ModePVMulticall), string(config.ModePVDRM)} {
		if slices.Contains(virt, m) {
			ctxModes = append(ctxModes, m)
		}
	}
	prog := newETA(c.App.ErrWriter)
	opts := bench.EvaluationOptions{
		Board: board, Quick: c.Bool("quick"), Modes: modes, Workloads: names, Runs: sz.runs, NoWarmup: sz.noWarmup, OneVMPerMode: sz.oneVMPerMode, Params: sz.params,
		Contexts: bench.ContextsOptions{Board: board, Modes: ctxModes, Counts: sz.contextCounts, MatrixDim: sz.contextDim, Repeat: sz.contextRep},
		Fairness: bench.FairnessOptions{Board: fairBoard, Policies: sz.fairPolicies, VMs: sz.fairVMs, Duration: sz.fairDuration,
			MatrixDim: 256, Repeat: 15, Sched: sched.FromConfig(config.Default().Scheduler), ServerSpin: 200},
		Command:  selfCommand,
		Commands: reportCommands(c, modes, names, board, fairBoard, sz),
		Progress: prog.update,
		Logger:   log,
	}
	ev, err := bench.RunEvaluation(c.Context, opts)
	prog.finish()
	if err != nil {
		return &exitError{code: exitFailure, err: err}
	}
	return writeReport(c, out, ev)
}

// rerenderReport is report --from: the page, figures and JSON again from a
// saved evaluation.
func rerenderReport(c *cli.Context, from string) error {
	js, err := os.ReadFile(from)
	if err != nil {
		return usageError("--from: %v", err)
	}
	var ev bench.Evaluation
	if err := json.Unmarshal(js, &ev); err != nil {
		return usageError("--from %s: not an evaluation: %v", from, err)
	}
	if ev.Version != bench.EvaluationVersion {
		return usageError("--from %s: evaluation version %d, this gpuvm reads %d", from, ev.Version, bench.EvaluationVersion)
	}
	return writeReport(c, c.Path("out"), ev)
}

// writeReport writes the report of ev into out and says what is missing
// or failed; any of that makes the exit status 1.
func writeReport(c *cli.Context, out string, ev bench.Evaluation) error {
	missing, err := report.Write(out, ev)
	if err != nil {
		return err
	}
	fmt.Fprintf(c.App.ErrWriter, "report: %s written (the evaluation took %v)\n", filepath.Join(out, report.IndexFile), time.Duration(ev.DurationNs).Round(time.Second))
	for _, m := range missing {
		fmt.Fprintf(c.App.ErrWriter, "report: figure not drawn: %s\n", m)
	}
	var problems []string
	problems = append(problems, ev.Failures...)
	for _, r := range ev.Modes.Results {
		if !r.Verified {
			problems = append(problems, fmt.Sprintf("%s %s: %s", r.Mode, r.Workload, r.Error))
		}
	}
	for _, p := range ev.Contexts.Points {
		if !p.Verified {
			problems = append(problems, fmt.Sprintf("contexts %s ×%d: %s", p.Config, p.Count, p.Error))
		}
	}
	if len(problems) > 0 || len(missing) > 0 {
		return &exitError{code: exitFailure, err: errors.New("the report is incomplete: " + strings.Join(append(problems, missing...), "; "))}
	}
	return nil
}

// reportBoard is the default simulated board with a timing profile.
func reportBoard(timing, flag string) (sim.Config, error) {
	cfg := sim.DefaultConfig()
	t, err := sim.TimingByName(timing)
	if err != nil {
		return cfg, usageError("%s: %v", flag, err)
	}
	cfg.Timing = t
	return cfg, nil
}

// reportCommands are the commands that reproduce each part of a report.
func reportCommands(c *cli.Context, modes, names []string, board, fairBoard sim.Config, sz reportSizes) []string {
	join := func(xs []int) string {
		var s []string
		for _, x := range xs {
			s = append(s, strconv.Itoa(x))
		}
		return strings.Join(s, ",")
	}
	self := []string{"gpuvm", "bench", "report"}
	for _, f := range c.Command.Flags {
		name := f.Names()[0]
		if !c.IsSet(name) {
			continue
		}
		switch v := c.Value(name).(type) {
		case bool:
			if v {
				self = append(self, "--"+name)
			}
		default:
			self = append(self, "--"+name, fmt.Sprint(v))
		}
	}
	cmds := []string{strings.Join(quoteArgs(self), " ")}
	cmds = append(cmds,
		fmt.Sprintf("gpuvm bench --mode %s -w %s --runs %d --timing %s --matrix-dim %d --loop-iterations %d --copy-size %d --rodinia-scale %d --json",
			strings.Join(modes, ","), strings.Join(names, ","), sz.runs, board.Timing.Name, sz.params.MatrixDim, sz.params.LoopIterations, sz.params.CopyBytes, max(sz.params.RodiniaScale, 1)),
		fmt.Sprintf("gpuvm bench fairness --vms %s --policy %s --duration %v --timing %s --json",
			join(sz.fairVMs), strings.Join(sz.fairPolicies, ","), sz.fairDuration, fairBoard.Timing.Name))
	return cmds
}

// quoteArgs quotes the arguments a shell would split or expand.
func quoteArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\n'\"\\$`*?[]{}()<>|&;#~") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		out[i] = a
	}
	return out
}

// eta prints the report's progress with an estimate of the time left: on a
// terminal one line rewritten in place, otherwise one line per step.
type eta struct {
	p     *progress
	w     io.Writer
	start time.Time
}

func newETA(w io.Writer) *eta { return &eta{p: newProgress(w), w: w, start: time.Now()} }

// update is bench.EvaluationOptions.Progress: done < 0 is a message within
// the current step.
func (e *eta) update(msg string, done, total float64) {
	line := "report: " + msg
	if done >= 0 && total > 0 {
		left := "estimating time left"
		if done > 0 {
			el := time.Since(e.start)
			rem := time.Duration(float64(el) * (total - done) / done).Round(time.Second)
			left = fmt.Sprintf("about %v left", rem)
		}
		line = fmt.Sprintf("report: [%3.0f%%, %v, %s] %s", 100*done/total, time.Since(e.start).Round(time.Second), left, msg)
	}
	if e.p.tty {
		fmt.Fprintf(e.w, "\r\033[K%s", line)
		return
	}
	fmt.Fprintln(e.w, line)
}

func (e *eta) finish() { e.p.done() }
