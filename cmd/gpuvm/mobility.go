package main

import (
	"cmp"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/bench"
	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/devmodel"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
	"github.com/gpuvm/gpuvm/internal/svgplot"
)

func mobilityCommand() *cli.Command {
	return &cli.Command{
		Name:  "mobility",
		Usage: "move, evict, drain, fail and reset vGPUs under VMs looping verified madd and cpy",
		Description: "Three phases, each on a fresh in-process host of simulated boards with VM processes over\n" +
			"the real protocol, every VM looping madd and cpy, each run verified:\n" +
			"  moves       two boards, four VMs; --duration cut into quiet segments and segments that\n" +
			"              begin with a move, in turn: --moves moves of VMs 1 and 2 in turn to the other\n" +
			"              board; VMs 3 and 4 are never moved, and their throughput in the two kinds of\n" +
			"              segment is the cost of a move to its neighbours\n" +
			"  overcommit  one board of three slots with --overcommit 2: six VMs, each reserving a whole\n" +
			"              slot, take turns by eviction for --duration; then three VMs on the same board\n" +
			"              without overcommit for as long\n" +
			"  ops         two boards, four VMs: a vGPU reset under its VM (the guest re-initialises and\n" +
			"              makes the run again), a drain of gpu1 (its VMs move to gpu0), two VMs moved back\n" +
			"              onto gpu1, which then falls off the bus: those two lose their device (expected,\n" +
			"              reported as lost, not as a wrong result), the others go on.\n" +
			"Reports each move's downtime against the VRAM in use it copied, eviction and restore\n" +
			"latency, and the unaffected VMs' slowdown during moves. Progress on stderr.\n\n" +
			"Exit status: 0 every result verified and every phase went as expected, 1 otherwise, 2 usage error.",
		Flags: []cli.Flag{
			&cli.DurationFlag{Name: "duration", Value: 4 * time.Second, Usage: "load per phase, at least 1s"},
			&cli.IntFlag{Name: "moves", Value: 8, Usage: "moves in the moves phase, 1..1000"},
			&cli.StringFlag{Name: "modes", Value: "fv-optimized,fv-lazy,fv-bar-remap,fv-incremental", Usage: "the VMs' modes, VM i the i-th (cycled); full-virtualization or PV modes, the first a BAR-remap one"},
			&cli.IntFlag{Name: "matrix-dim", Value: 256, Usage: "madd matrix dimension"},
			&cli.StringFlag{Name: "copy-size", Value: "8MiB", Usage: "bytes moved each way by cpy"},
			&cli.Float64Flag{Name: "overcommit", Value: 2, Usage: "the overcommit phase's factor: its VMs' reservations over the board's VRAM, 1..4"},
			&cli.DurationFlag{Name: "evict-idle", Value: 50 * time.Millisecond, Usage: "overcommit phase: a vGPU idle this long may be evicted"},
			&cli.DurationFlag{Name: "min-residency", Value: 200 * time.Millisecond, Usage: "overcommit phase: a busy vGPU keeps its slot this long before a waiting one takes it"},
			&cli.StringFlag{Name: "timing", Value: "none", Usage: "board timing model: none, fermi or fermi-xen"},
			&cli.IntFlag{Name: "ipc-spin", Value: 200, Usage: "aggregator IPC polling iterations before sleeping, per VM"},
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object (results, moves, each phase's summary) instead of the tables"},
			&cli.PathFlag{Name: "svg", Usage: "write a chart of each move's downtime against the VRAM in use it copied (mobility-downtime.svg) to this directory"},
		},
		Action: runMobilityBench,
	}
}

// mobilityGuestCommand is the VM process of gpuvm bench mobility (hidden:
// the harness starts it).
func mobilityGuestCommand() *cli.Command {
	return &cli.Command{
		Name:   "mobility-guest",
		Usage:  "one VM of gpuvm bench mobility: loop verified madd and cpy until the harness says stop",
		Hidden: true,
		Flags: []cli.Flag{
			&cli.PathFlag{Name: "socket", Required: true},
			&cli.UintFlag{Name: "domid", Value: 1},
			&cli.StringFlag{Name: "name", Value: "guest"},
			&cli.StringFlag{Name: "mode", Value: "fv-optimized"},
			&cli.StringFlag{Name: "ram", Value: "64MiB"},
			&cli.IntFlag{Name: "matrix-dim", Value: 256},
			&cli.StringFlag{Name: "copy-size", Value: "8MiB"},
			&cli.PathFlag{Name: "start-gate", Required: true},
		},
		Action: runMobilityGuest,
	}
}

func runMobilityGuest(c *cli.Context) error {
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	ram, err := parseSize(c.String("ram"))
	if err != nil {
		return usageError("--ram: %v", err)
	}
	copySize, err := parseSize(c.String("copy-size"))
	if err != nil {
		return usageError("--copy-size: %v", err)
	}
	cfg := devmodel.Config{Socket: c.Path("socket"), DomID: uint32(c.Uint("domid")), Name: c.String("name"), Mode: c.String("mode"), RAMSize: ram, Logger: log}
	params := workloads.Params{MatrixDim: c.Int("matrix-dim"), CopyBytes: copySize, LoopIterations: 1 << 16, RodiniaScale: 1}
	g, err := bench.RunMobilityGuest(c.Context, cfg, params, c.Path("start-gate"))
	if err != nil && g.Error == "" {
		g.Error = err.Error()
	}
	if g.Results == nil {
		g.Results = []bench.Result{}
	}
	if jerr := bench.WriteJSONValue(c.App.Writer, g); jerr != nil {
		return jerr
	}
	if g.Error != "" {
		return &exitError{code: exitFailure, err: fmt.Errorf("%s: %s", cfg.Name, g.Error)}
	}
	return nil
}

// mobilityFlags checks gpuvm bench mobility's flags, each problem a usage
// error.
func mobilityFlags(c *cli.Context) (bench.MobilityOptions, error) {
	o := bench.MobilityOptions{Duration: c.Duration("duration"), Moves: c.Int("moves"), MatrixDim: c.Int("matrix-dim"),
		Overcommit: c.Float64("overcommit"), EvictIdle: c.Duration("evict-idle"), MinResidency: c.Duration("min-residency"), ServerSpin: c.Int("ipc-spin")}
	for _, m := range strings.Split(c.String("modes"), ",") {
		m = strings.TrimSpace(m)
		if !config.Mode(m).Valid() || !slices.Contains(deviceModelModes(), m) {
			return o, usageError("--modes %q: want modes of a device-model VM (a pvdrm VM has a front end, not a device model): %s", m, strings.Join(deviceModelModes(), ", "))
		}
		o.Modes = append(o.Modes, m)
	}
	cs, err := parseSize(c.String("copy-size"))
	if err != nil {
		return o, usageError("--copy-size: %v", err)
	}
	o.CopyBytes = cs
	checks := []struct {
		bad  bool
		flag string
		want string
		val  any
	}{
		{o.Duration < time.Second, "duration", "at least 1s", o.Duration},
		{o.Moves < 1 || o.Moves > 1000, "moves", "1..1000", o.Moves},
		{o.MatrixDim < 1 || o.MatrixDim > 2048, "matrix-dim", "1..2048", o.MatrixDim},
		{o.CopyBytes < 4<<10 || o.CopyBytes > 32<<20, "copy-size", "4KiB..32MiB (it must fit a VM's 64 MiB of RAM twice)", c.String("copy-size")},
		{o.Overcommit < 1 || o.Overcommit > 4, "overcommit", "1..4", o.Overcommit},
		{o.EvictIdle <= 0, "evict-idle", "longer than 0", o.EvictIdle},
		{o.MinResidency <= 0, "min-residency", "longer than 0", o.MinResidency},
	}
	for _, k := range checks {
		if k.bad {
			return o, usageError("--%s %v: want %s", k.flag, k.val, k.want)
		}
	}
	return o, nil
}

// deviceModelModes are the modes of VMs the bench runs (each a device
// model process): the full-virtualization and PV modes.
func deviceModelModes() []string {
	var out []string
	for _, m := range aggregator.Modes() {
		if f, err := aggregator.FeaturesFor(m); err == nil && !f.PVDRM {
			out = append(out, m)
		}
	}
	return out
}

func runMobilityBench(c *cli.Context) error {
	o, err := mobilityFlags(c)
	if err != nil {
		return err
	}
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	if o.Board, err = boardConfig(c); err != nil {
		return err
	}
	o.Command, o.Logger = selfCommand, log
	o.Progress = func(msg string) { fmt.Fprintln(c.App.ErrWriter, msg) }
	rep, err := bench.RunMobility(c.Context, o)
	if err != nil {
		return &exitError{code: exitFailure, err: err}
	}
	if dir := c.Path("svg"); dir != "" {
		if err := writeMobilitySVG(dir, rep); err != nil {
			return err
		}
		fmt.Fprintf(c.App.ErrWriter, "mobility: chart written to %s\n", dir)
	}
	return writeBenchReport(c, "bench mobility", rep, func(w io.Writer) error { return writeMobilityTables(w, rep) }, rep.OK(), rep.Problems)
}

// writeBenchReport prints a bench's report as JSON (--json) or as its
// tables, then fails with exit status 1 naming the problems unless ok.
func writeBenchReport(c *cli.Context, name string, rep any, tables func(io.Writer) error, ok bool, problems []string) error {
	var err error
	if c.Bool("json") {
		err = bench.WriteJSONValue(c.App.Writer, rep)
	} else {
		err = tables(c.App.Writer)
	}
	if err != nil {
		return err
	}
	if !ok {
		return &exitError{code: exitFailure, err: fmt.Errorf("%s: %d problems: %s", name, len(problems), strings.Join(problems, "; "))}
	}
	return nil
}

// writeMobilitySVG charts each move's downtime against the VRAM it copied.
func writeMobilitySVG(dir string, rep bench.MobilityReport) error {
	moves := slices.Clone(rep.Moves)
	slices.SortFunc(moves, func(a, b bench.MobilityMove) int { return cmp.Compare(a.VRAMBytes, b.VRAMBytes) })
	var s svgplot.Series
	s.Name = "move downtime"
	for _, m := range moves {
		if m.Error == "" {
			s.X = append(s.X, float64(m.VRAMBytes)/(1<<20))
			s.Y = append(s.Y, float64(m.DowntimeNs)/1e6)
		}
	}
	svg, err := svgplot.LineChart{Title: "vGPU move downtime against VRAM in use", XLabel: "VRAM in use copied (MiB)", YLabel: "downtime (ms)",
		Series: []svgplot.Series{s}}.SVG()
	if err != nil {
		return fmt.Errorf("mobility chart: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("mobility chart: %w", err)
	}
	return os.WriteFile(filepath.Join(dir, "mobility-downtime.svg"), svg, 0o644)
}

func fmtMs(ns int64) string { return fmt.Sprintf("%.2fms", float64(ns)/1e6) }

// writeMobilityTables prints the readable report: the moves (downtime
// against VRAM in use), the neighbours' slowdown, eviction and restore
// latency, the operations phase and the results.
func writeMobilityTables(w io.Writer, rep bench.MobilityReport) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "MOVE\tPHASE\tVM\tVGPU\tFROM\tTO\tVRAM IN USE\tDOWNTIME\tCOPY\tDOWNTIME/MiB\tVERIFIED\t")
	for i, m := range rep.Moves {
		perMiB := "–"
		if m.VRAMBytes >= 1<<20 { // below a MiB the fixed part of the pause dominates
			perMiB = fmtMs(int64(float64(m.DowntimeNs) / (float64(m.VRAMBytes) / (1 << 20))))
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s:%d\t%s:%d\t%.2fMiB\t%s\t%s\t%s\t%v%s\t\n", i+1, m.Phase, m.Name, m.VGPU, m.FromBoard, m.FromSlot, m.ToBoard, m.ToSlot,
			float64(m.VRAMBytes)/(1<<20), fmtMs(m.DowntimeNs), fmtMs(m.CopyNs), perMiB, m.Verified, errSuffix(m.Error))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	mp := rep.MovePhase
	fmt.Fprintf(w, "\nmoves: %d VMs on %d boards; mean downtime %.2f ms per MiB of VRAM in use\n", mp.VMs, mp.Boards, mp.DowntimeNsPerMiB/1e6)
	for _, t := range []struct {
		what string
		t    bench.MobilityThroughput
	}{{"unaffected VMs", mp.Unaffected}, {"moved VMs", mp.Moved}} {
		fmt.Fprintf(w, "  %s %s: %.2f runs/s in the quiet segments, %.2f in those with a move (×%.3f, slowdown %.1f%%)\n", t.what, strings.Join(t.t.VMs, ","),
			t.t.Before, t.t.During, t.t.Ratio, 100*(1-t.t.Ratio))
	}
	oc := rep.Overcommit
	fmt.Fprintf(w, "\novercommit: %d VMs on %d slots of %d MiB (reservations %d MiB, ×%g)\n", oc.VMs, oc.Slots, oc.SlotVRAM>>20, oc.Reserved>>20, oc.Factor)
	fmt.Fprintf(w, "  %d evictions (%.1f MiB out), %d restores (%.1f MiB in)\n", oc.Evictions, float64(oc.OutBytes)/(1<<20), oc.Restores, float64(oc.InBytes)/(1<<20))
	fmt.Fprintf(w, "  eviction pause mean %s p99 %s; restore pause mean %s p99 %s; a guest's wait per restore %s\n",
		fmtMs(oc.EvictMeanNs), fmtMs(oc.EvictP99Ns), fmtMs(oc.RestoreMeanNs), fmtMs(oc.RestoreP99Ns), fmtMs(oc.RestoreWaitMeanNs))
	ratio := 0.0
	if oc.Baseline > 0 {
		ratio = oc.Throughput / oc.Baseline
	}
	fmt.Fprintf(w, "  throughput %.1f runs/s with %d VMs overcommitted, %.1f with %d VMs without (×%.3f)\n", oc.Throughput, oc.VMs, oc.Baseline, oc.BaselineVMs, ratio)
	ops := rep.Ops
	fmt.Fprintf(w, "\nops: reset %s (vGPU %d) in %s, %d runs made again after it\n", ops.ResetVM, ops.ResetVGPU, fmtMs(ops.ResetNs), ops.RecoveredRuns)
	fmt.Fprintf(w, "  drain of %s in %s: %d moved, %d left\n", ops.Drained, fmtMs(ops.DrainNs), ops.DrainMoved, len(ops.DrainLeft))
	fmt.Fprintf(w, "  %s failed: found lost after %s; lost devices (expected): %s; went on: %s\n", ops.Failed, fmtMs(ops.DetectNs),
		cmp.Or(strings.Join(ops.Lost, ","), "none"), cmp.Or(strings.Join(ops.Survivors, ","), "none"))
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PHASE\tVM\tMODE\tWORKLOAD\tRUNS\tRECOVERED\tMEDIAN\tVERIFIED\tLOST\t")
	for _, vm := range rep.VMs {
		for _, r := range vm.Results {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%v\t%s\t\n", vm.Phase, vm.Name, vm.Mode, r.Workload, r.Runs, r.Recovered, fmtMs(r.TotalNs), r.Verified,
				cmp.Or(firstLine(vm.Lost), "–"))
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

func errSuffix(e string) string {
	if e == "" {
		return ""
	}
	return " (" + e + ")"
}

// firstLine shortens a lost device's message for the table.
func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 60 {
		s = s[:57] + "..."
	}
	return s
}
