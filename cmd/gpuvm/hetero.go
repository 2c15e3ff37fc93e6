package main

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gpuvm/gpuvm/bench"
	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/host"
)

func heteroCommand() *cli.Command {
	return &cli.Command{
		Name:  "hetero",
		Usage: "placement and load balancing on a fast and a slow board under VMs looping verified madd and cpy",
		Description: "Becchi et al.'s heterogeneous pair (HPDC '12): one host of two simulated boards, a fast one\n" +
			"(--fast, fermi: a Quadro 6000 in a PCIe 2.0 x16 slot) and a slow one (--slow, fermi-x4: the same\n" +
			"board in an x4 slot, a quarter of the bus bandwidth), --vms VM processes over the real protocol\n" +
			"looping madd and cpy (--copy-size each way: copy-heavy), each run verified. Phases, each on a\n" +
			"fresh host with fresh VMs, --duration of load measured after a settling:\n" +
			"  fast-only           references: the host has only the fast board, or only the slow one\n" +
			"  slow-only\n" +
			"  static              both boards, the VMs where placement puts them, no balancer\n" +
			"  balanced            the same start, the load balancer on (host BalanceLoad): its moves\n" +
			"  slow-then-balanced  the fast board cordoned while the VMs attach (all land on the slow\n" +
			"                      one), back in service after a third of --duration, balancer on\n" +
			"Reports runs per second in total, per board and per VM (over the whole measurement and over\n" +
			"the placement each phase ended with), each board's median madd and cpy times, the balancer's\n" +
			"moves (from, to, pause) and where the VMs ended. Every ratio is taken from one run. The\n" +
			"simulator computes kernels in Go, slower than any modelled Fermi, so boards that differ only\n" +
			"in compute speed would not differ here; the bus does (docs/performance.md). Progress on stderr.\n\n" +
			"Exit status: 0 every result verified, 1 otherwise, 2 usage error.",
		Flags: []cli.Flag{
			&cli.DurationFlag{Name: "duration", Value: 10 * time.Second, Usage: "load measured per phase, at least 1s"},
			&cli.IntFlag{Name: "vms", Value: 4, Usage: "VMs per phase, 1..8 (each board has a slot for every VM)"},
			&cli.StringFlag{Name: "modes", Value: "fv-optimized", Usage: "the VMs' modes, VM i the i-th (cycled); full-virtualization or PV modes"},
			&cli.StringFlag{Name: "phases", Value: strings.Join(bench.HeteroPhases(), ","), Usage: "phases to run, in order: " + strings.Join(bench.HeteroPhases(), ", ")},
			&cli.IntFlag{Name: "matrix-dim", Value: 256, Usage: "madd matrix dimension"},
			&cli.StringFlag{Name: "copy-size", Value: "16MiB", Usage: "bytes moved each way by cpy"},
			&cli.StringFlag{Name: "fast", Value: string(config.TimingFermi), Usage: "the fast board's timing profile: " + strings.Join(sim.TimingNames(), ", ")},
			&cli.StringFlag{Name: "slow", Value: string(config.TimingFermiX4), Usage: "the slow board's timing profile"},
			&cli.DurationFlag{Name: "balance-interval", Value: host.DefaultBalanceInterval, Usage: "how often the balancer looks"},
			&cli.Float64Flag{Name: "balance-threshold", Value: host.DefaultBalanceThreshold, Usage: "load gap between the boards above which the balancer moves, 0..1"},
			&cli.DurationFlag{Name: "balance-hold", Value: host.DefaultBalanceHold, Usage: "how long a moved vGPU stays where it went"},
			&cli.IntFlag{Name: "ipc-spin", Value: 200, Usage: "aggregator IPC polling iterations before sleeping, per VM"},
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object (results, each phase's summary, ratios) instead of the tables"},
		},
		Action: runHeteroBench,
	}
}

// heteroFlags checks gpuvm bench hetero's flags, each problem a usage
// error.
func heteroFlags(c *cli.Context) (bench.HeteroOptions, error) {
	o := bench.HeteroOptions{Board: sim.DefaultConfig(), VMs: c.Int("vms"), Duration: c.Duration("duration"), MatrixDim: c.Int("matrix-dim"),
		ServerSpin: c.Int("ipc-spin"), Balance: host.BalanceOptions{Interval: c.Duration("balance-interval"),
			Threshold: c.Float64("balance-threshold"), Hold: c.Duration("balance-hold")}}
	for _, m := range strings.Split(c.String("modes"), ",") {
		m = strings.TrimSpace(m)
		if !config.Mode(m).Valid() || !slices.Contains(deviceModelModes(), m) {
			return o, usageError("--modes %q: want modes of a device-model VM (a pvdrm VM has a front end, not a device model): %s", m, strings.Join(deviceModelModes(), ", "))
		}
		o.Modes = append(o.Modes, m)
	}
	for _, p := range strings.Split(c.String("phases"), ",") {
		p = strings.TrimSpace(p)
		if !slices.Contains(bench.HeteroPhases(), p) || slices.Contains(o.Phases, p) {
			return o, usageError("--phases %q: want distinct phases of %s", p, strings.Join(bench.HeteroPhases(), ", "))
		}
		o.Phases = append(o.Phases, p)
	}
	var err error
	for _, t := range []struct {
		flag string
		to   *sim.Timing
	}{{"fast", &o.Fast}, {"slow", &o.Slow}} {
		if *t.to, err = sim.TimingByName(c.String(t.flag)); err != nil {
			return o, usageError("--%s: %v", t.flag, err)
		}
	}
	if o.CopyBytes, err = parseSize(c.String("copy-size")); err != nil {
		return o, usageError("--copy-size: %v", err)
	}
	checks := []struct {
		bad  bool
		flag string
		want string
		val  any
	}{
		{o.Duration < time.Second, "duration", "at least 1s", o.Duration},
		{o.VMs < 1 || o.VMs > 8, "vms", "1..8", o.VMs},
		{o.MatrixDim < 1 || o.MatrixDim > 2048, "matrix-dim", "1..2048", o.MatrixDim},
		{o.CopyBytes < 4<<10 || o.CopyBytes > 32<<20, "copy-size", "4KiB..32MiB (it must fit a VM's 64 MiB of RAM twice)", c.String("copy-size")},
		{o.Balance.Interval <= 0, "balance-interval", "longer than 0", o.Balance.Interval},
		{o.Balance.Threshold <= 0 || o.Balance.Threshold >= 1, "balance-threshold", "between 0 and 1", o.Balance.Threshold},
		{o.Balance.Hold <= 0, "balance-hold", "longer than 0", o.Balance.Hold},
	}
	for _, k := range checks {
		if k.bad {
			return o, usageError("--%s %v: want %s", k.flag, k.val, k.want)
		}
	}
	return o, nil
}

func runHeteroBench(c *cli.Context) error {
	o, err := heteroFlags(c)
	if err != nil {
		return err
	}
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	o.Command, o.Logger = selfCommand, log
	o.Progress = func(msg string) { fmt.Fprintln(c.App.ErrWriter, msg) }
	rep, err := bench.RunHetero(c.Context, o)
	if err != nil {
		return &exitError{code: exitFailure, err: err}
	}
	return writeBenchReport(c, "bench hetero", rep, func(w io.Writer) error { return writeHeteroTables(w, rep) }, rep.OK(), rep.Problems)
}

// countOn is "fast 2, slow 2".
func countOn(ps []bench.HeteroPlace) string {
	n := map[string]int{}
	for _, p := range ps {
		n[p.Board]++
	}
	var out []string
	for _, b := range []string{"fast", "slow"} {
		if n[b] > 0 {
			out = append(out, fmt.Sprintf("%s %d", b, n[b]))
		}
	}
	return strings.Join(out, ", ")
}

func fmtRate(m map[string]float64, k string) string {
	if v, ok := m[k]; ok {
		return fmt.Sprintf("%.2f", v)
	}
	return "–"
}

// writeHeteroTables prints the readable report: per phase the placement,
// throughput in total and per board, then the moves, per-VM throughput,
// each board's run times, the ratios and the results.
func writeHeteroTables(w io.Writer, rep bench.HeteroReport) error {
	fmt.Fprintf(w, "boards: fast = %s (%.3g GB/s DMA), slow = %s (%.3g GB/s DMA); %d VMs looping madd (%d×%d) and cpy (%.0f MiB each way), %v measured per phase\n\n",
		rep.Fast.Timing, rep.Fast.DMABytesPerSec/1e9, rep.Slow.Timing, rep.Slow.DMABytesPerSec/1e9, rep.VMs, rep.MatrixDim, rep.MatrixDim,
		float64(rep.CopyBytes)/(1<<20), time.Duration(rep.DurationNs))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PHASE\tBALANCER\tPLACED\tENDED\tMOVES\tRUNS/S\tFAST\tSLOW\tFINAL RUNS/S (FAST, SLOW; WINDOW)\tVERIFIED\t")
	for _, p := range rep.Phases {
		final := "–"
		if p.Final != nil {
			final = fmt.Sprintf("%.2f (%s, %s; last %.1fs)", p.Final.Total, fmtRate(p.Final.Boards, "fast"), fmtRate(p.Final.Boards, "slow"), float64(p.Final.Ns)/1e9)
		}
		fmt.Fprintf(tw, "%s\t%v\t%s\t%s\t%d\t%.2f\t%s\t%s\t%s\t%v\t\n", p.Name, p.Balance, countOn(p.Start), countOn(p.End), len(p.Moves),
			p.Whole.Total, fmtRate(p.Whole.Boards, "fast"), fmtRate(p.Whole.Boards, "slow"), final, p.Verified)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, p := range rep.Phases {
		if p.Before != nil {
			fmt.Fprintf(w, "%s: %.2f runs/s before the fast board came back (all on slow), fast back at %.1fs\n", p.Name, p.Before.Total, float64(p.UncordonNs)/1e9)
		}
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PHASE\tAT\tVM\tVGPU\tFROM\tTO\tVGPU LOAD\tGAP\tVRAM IN USE\tPAUSE\tCOPY\t")
	for _, p := range rep.Phases {
		for _, m := range p.Moves {
			fmt.Fprintf(tw, "%s\t%.1fs\t%s\t%d\t%s\t%s\t%.0f%%\t%.0f%%\t%.2fMiB\t%s\t%s\t%s\n", p.Name, float64(m.AtNs)/1e9, m.VM, m.VGPU, m.From, m.To,
				100*m.Load, 100*m.Gap, float64(m.Bytes)/(1<<20), fmtMs(m.DowntimeNs), fmtMs(m.CopyNs), map[bool]string{true: "FAILED"}[m.Failed])
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, p := range rep.Phases {
		if p.Looks != nil {
			var ks []string
			for k, n := range p.Looks {
				ks = append(ks, fmt.Sprintf("%s %d", k, n))
			}
			sort.Strings(ks)
			fmt.Fprintf(w, "%s: balancer looks: %s; largest gap %.1f%%; mean load fast %.1f%%, slow %.1f%%\n", p.Name, strings.Join(ks, ", "),
				100*p.MaxGap, 100*p.Loads["fast"], 100*p.Loads["slow"])
		}
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PHASE\tVM\tPLACED\tENDED\tRUNS/S\t")
	for _, p := range rep.Phases {
		for i, s := range p.Start {
			end := "–"
			if i < len(p.End) {
				end = p.End[i].Board
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.2f\t\n", p.Name, s.VM, s.Board, end, p.Whole.VMs[s.VM])
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PHASE\tBOARD\tWORKLOAD\tRUNS\tMEDIAN\t")
	for _, p := range rep.Phases {
		for _, r := range p.Runs {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t\n", p.Name, r.Board, r.Workload, r.Runs, fmtMs(r.MedianNs))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(rep.Ratios) > 0 {
		var ks []string
		for k := range rep.Ratios {
			ks = append(ks, k)
		}
		sort.Strings(ks)
		fmt.Fprintln(w, "\nratios (this run):")
		for _, k := range ks {
			fmt.Fprintf(w, "  %s: %.3f\n", k, rep.Ratios[k])
		}
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PHASE\tVM\tMODE\tWORKLOAD\tRUNS\tMEDIAN\tVERIFIED\t")
	for _, vm := range rep.VMList {
		for _, r := range vm.Results {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%v%s\t\n", vm.Phase, vm.Name, vm.Mode, r.Workload, r.Runs, fmtMs(r.TotalNs), r.Verified,
				errSuffix(cmp.Or(vm.Error, vm.Lost)))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, p := range rep.Problems {
		fmt.Fprintln(w, "PROBLEM:", p)
	}
	return nil
}
