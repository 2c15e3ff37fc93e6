package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/bench"
	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/sched"
)

// sloOptions are the daemon's queue-wait objectives and SLA feedback from
// its configuration: each VM's slo ([[vm]] or its profile's) and
// [scheduler] sla_*. (aggregator.Options{..., SLO: sloOptions(cfg)}.)
func sloOptions(cfg config.Config) aggregator.SLOOptions {
	return aggregator.SLOOptions{
		Target:   func(g aggregator.Guest) time.Duration { return cfg.LookupVM(g.Name, int(g.DomID)).SLO.Duration },
		Feedback: aggregator.FeedbackFromConfig(cfg.Scheduler),
	}
}

func sloCommand() *cli.Command {
	d := config.Default().Scheduler
	return &cli.Command{
		Name:  "slo",
		Usage: "measure queue-wait objectives with and without SLA feedback (Pegasus' SLAF)",
		Description: "A latency-sensitive VM (vm1: madd, one short kernel per submission, waiting for each)\n" +
			"with a queue-wait objective beside throughput VMs (long-madd: --repeat kernels per\n" +
			"submission), each a VM process over the real protocol, run twice in one invocation: under\n" +
			"--policy alone, then with SLA feedback. Reports each VM's objective, violations, median\n" +
			"and 99th-percentile queue wait (doorbell to release), throughput, GPU share and the\n" +
			"highest weight the scheduler gave it.",
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "vms", Value: 3, Usage: "VMs, 2..64: vm1 the latency VM, the others throughput VMs"},
			&cli.StringFlag{Name: "policy", Value: "band", Usage: "weighted policy of both runs: " + strings.Join(weightedPolicies(), ", ")},
			&cli.StringFlag{Name: "slo", Value: "vm1=5ms", Usage: "comma-separated NAME=DURATION queue-wait objectives (names vm1..vmN)"},
			&cli.IntFlag{Name: "latency-weight", Value: 1, Usage: "vm1's weight (1: the built-in quarter-slot profile's)"},
			&cli.IntFlag{Name: "bulk-weight", Value: 4, Usage: "the throughput VMs' weight (4: the whole-slot profile's)"},
			&cli.DurationFlag{Name: "sla-window", Value: d.SLAWindow.Duration, Usage: "SLA feedback window ([scheduler] sla_window)"},
			&cli.IntFlag{Name: "sla-boost", Value: d.SLABoost, Usage: "SLA feedback factor per window, 2.." + strconv.Itoa(config.MaxSLABoost) + " ([scheduler] sla_boost)"},
			&cli.IntFlag{Name: "sla-max-boost", Value: d.SLAMaxBoost, Usage: "cap on the boost, 2.." + strconv.Itoa(config.MaxWeight) + " ([scheduler] sla_max_boost)"},
			&cli.DurationFlag{Name: "duration", Value: 6 * time.Second, Usage: "length of each run, at least 1s"},
			&cli.IntFlag{Name: "matrix-dim", Value: 256, Usage: "madd matrix dimension"},
			&cli.IntFlag{Name: "repeat", Value: 15, Usage: "kernels per long-madd submission"},
			&cli.StringFlag{Name: "timing", Value: "none", Usage: "board timing model: none or fermi"},
			&cli.BoolFlag{Name: "json", Usage: "print JSON instead of the table"},
			&cli.PathFlag{Name: "config", Aliases: []string{"c"}, Usage: "TOML config for the [scheduler] parameters"},
			&cli.IntFlag{Name: "ipc-spin", Value: 200, Usage: "aggregator IPC polling iterations before sleeping, per VM"},
		},
		Action: runSLOBench,
	}
}

// weightedPolicies are the policies SLA feedback can act on.
func weightedPolicies() []string {
	var out []string
	for _, p := range sched.Names() {
		if p != string(config.PolicyFIFO) && p != string(config.PolicyStrict) {
			out = append(out, p)
		}
	}
	return out
}

// parseSLOs parses --slo: NAME=DURATION pairs, names vm1..vm<vms>, each
// duration longer than 0, each name once.
func parseSLOs(s string, vms int) (map[string]time.Duration, error) {
	out := map[string]time.Duration{}
	for _, f := range strings.Split(s, ",") {
		name, dur, ok := strings.Cut(strings.TrimSpace(f), "=")
		if !ok {
			return nil, fmt.Errorf("%q: want NAME=DURATION, e.g. vm1=2ms", f)
		}
		n, err := strconv.Atoi(strings.TrimPrefix(name, "vm"))
		if !strings.HasPrefix(name, "vm") || err != nil || n < 1 || n > vms {
			return nil, fmt.Errorf("%q: name a VM of the run, vm1..vm%d", name, vms)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("%q: %s given twice", f, name)
		}
		d, err := config.ParseDuration(dur)
		if err != nil || d.Duration <= 0 {
			return nil, fmt.Errorf("%q: want a duration longer than 0, e.g. 2ms", dur)
		}
		out[name] = d.Duration
	}
	return out, nil
}

// sloBenchFlags checks the flags of gpuvm bench slo, each problem a usage error.
func sloBenchFlags(c *cli.Context) (bench.SLOBenchOptions, error) {
	o := bench.SLOBenchOptions{Policy: c.String("policy"), VMs: c.Int("vms"), LatencyWeight: c.Int("latency-weight"), BulkWeight: c.Int("bulk-weight"),
		Feedback: aggregator.SLAFeedback{Window: c.Duration("sla-window"), Boost: c.Int("sla-boost"), MaxBoost: c.Int("sla-max-boost")}}
	checks := []struct {
		bad  bool
		flag string
		want string
		val  any
	}{
		{o.VMs < 2 || o.VMs > 64, "vms", "2..64", o.VMs},
		{!slices.Contains(weightedPolicies(), o.Policy), "policy", "a weighted policy: " + strings.Join(weightedPolicies(), ", "), o.Policy},
		{o.LatencyWeight < 1 || o.LatencyWeight > config.MaxWeight, "latency-weight", "1.." + strconv.Itoa(config.MaxWeight), o.LatencyWeight},
		{o.BulkWeight < 1 || o.BulkWeight > config.MaxWeight, "bulk-weight", "1.." + strconv.Itoa(config.MaxWeight), o.BulkWeight},
		{o.Feedback.Window <= 0, "sla-window", "longer than 0", o.Feedback.Window},
		{o.Feedback.Boost < 2 || o.Feedback.Boost > config.MaxSLABoost, "sla-boost", "2.." + strconv.Itoa(config.MaxSLABoost), o.Feedback.Boost},
		{o.Feedback.MaxBoost < 2 || o.Feedback.MaxBoost > config.MaxWeight, "sla-max-boost", "2.." + strconv.Itoa(config.MaxWeight), o.Feedback.MaxBoost},
		{c.Duration("duration") < time.Second, "duration", "at least 1s", c.Duration("duration")},
	}
	for _, k := range checks {
		if k.bad {
			return o, usageError("--%s %v: want %s", k.flag, k.val, k.want)
		}
	}
	slos, err := parseSLOs(c.String("slo"), o.VMs)
	if err != nil {
		return o, usageError("--slo %v", err)
	}
	o.SLO = slos
	return o, nil
}

func runSLOBench(c *cli.Context) error {
	o, err := sloBenchFlags(c)
	if err != nil {
		return err
	}
	log, err := newLogger(c)
	if err != nil {
		return err
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
	o.Fairness = bench.FairnessOptions{Board: boardCfg, Duration: c.Duration("duration"), MatrixDim: c.Int("matrix-dim"), Repeat: c.Int("repeat"),
		Sched: sched.FromConfig(cfg.Scheduler), Command: selfCommand, Logger: log, ServerSpin: c.Int("ipc-spin"),
		Progress: func(msg string) { fmt.Fprintln(c.App.ErrWriter, msg) }}
	rep, err := bench.RunSLO(c.Context, o)
	if err != nil {
		return &exitError{code: exitFailure, err: err}
	}
	if c.Bool("json") {
		return bench.WriteJSONValue(c.App.Writer, rep)
	}
	return writeSLOTable(c.App.Writer, rep)
}

func writeSLOTable(w io.Writer, rep bench.SLOReport) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "POLICY\tSLAF\tVM\tLOAD\tWEIGHT\tMAX WEIGHT\tSLO\tSUBMISSIONS\tVIOLATIONS\tP50 WAIT\tP99 WAIT\tMAX WAIT\tIT/S\tSHARE\t")
	ms := func(ns int64) string { return fmt.Sprintf("%.2fms", float64(ns)/1e6) }
	for _, r := range rep.Runs {
		fb := "off"
		if r.Feedback {
			fb = "on"
		}
		for _, v := range r.VMs {
			slo, viol := "–", "–"
			if v.SLONs > 0 {
				slo, viol = ms(v.SLONs), fmt.Sprintf("%d (%.1f%%)", v.Violations, v.ViolationPc)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%d\t%s\t%s\t%s\t%s\t%.1f\t%.3f\t\n", r.Policy, fb, v.Name, v.Load, v.Weight, v.MaxWeight,
				slo, v.Submissions, viol, ms(v.P50Ns), ms(v.P99Ns), ms(v.MaxNs), v.Throughput, v.Share)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\nSLA feedback: window %v, ×%d per window up to ×%d; waits are doorbell to release, over each recorded run\n",
		time.Duration(rep.WindowNs), rep.Boost, rep.MaxBoost)
	return err
}
