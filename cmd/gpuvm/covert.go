package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gpuvm/gpuvm/bench"
	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/devmodel"
	"github.com/gpuvm/gpuvm/internal/svgplot"
	"github.com/gpuvm/gpuvm/sched"
)

func covertCommand() *cli.Command {
	return &cli.Command{
		Name:  "covert",
		Usage: "measure the GPU timing channel between two VMs under each scheduling policy",
		Description: "For each policy: a fresh board and aggregator with that policy, and two VM processes over\n" +
			"the real protocol. The sender encodes a pseudo-random bit string (--seed) in its GPU load:\n" +
			"per bit period (--bit) it runs loop kernels back to back for a 1 and idles for a 0. The\n" +
			"receiver submits a short probe kernel back to back and times each probe from submission to\n" +
			"completion with its own clock, as any VM can. Both agree on the wall-clock time of bit 0\n" +
			"(the harness announces it to both, --lead after both are set up; attacker VMs can agree\n" +
			"over the network), the standard assumption of covert-channel measurements.\n\n" +
			"Decoding: each bit period's statistic is the mean latency of the probes submitted in it\n" +
			"(its first tenth ignored: the sender's last kernel of a 1 may run there). --preamble\n" +
			"alternating bits (1010...) calibrate a threshold, the midpoint on a log scale (geometric\n" +
			"mean) of the mean statistic of their 1s and of their 0s; each message bit is then 1 when\n" +
			"its statistic is above it. Reported per policy: the raw rate\n" +
			"(1/bit period), the bit error rate over the --bits message bits, the capacity of the binary\n" +
			"symmetric channel, rate x (1 - H2(BER)) bits/s, the probe latencies in 0- and 1-bit periods,\n" +
			"both VMs' throughput, and under strict how far the sender ran into the receiver's slots.\n" +
			"With --bits bits a BER near 0.5 is measured to about +-1/sqrt(bits): a capacity below\n" +
			"rate x (1 - H2(0.5 - 1/sqrt(bits))) is indistinguishable from none.\n\n" +
			"The default timing profile is fermi-xen, as for `gpuvm bench`. Exit status: 0 done and every\n" +
			"VM's kernels verified, 1 a run failed, 2 usage error.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "policy", Value: strings.Join(sched.Names(), ","), Usage: "comma-separated policies: " + strings.Join(sched.Names(), ", ")},
			&cli.DurationFlag{Name: "bit", Value: 50 * time.Millisecond, Usage: "bit period (raw rate = 1/bit)"},
			&cli.IntFlag{Name: "bits", Value: 128, Usage: "message bits after the preamble"},
			&cli.IntFlag{Name: "preamble", Value: 16, Usage: "alternating calibration bits before the message (at least 2)"},
			&cli.Uint64Flag{Name: "seed", Value: 1, Usage: "seed of the pseudo-random message"},
			&cli.Uint64Flag{Name: "send-iterations", Value: 2_000_000, Usage: "loop-kernel iterations of each sender kernel (2M: a few ms on a 2020s host core)"},
			&cli.Uint64Flag{Name: "probe-iterations", Value: 4096, Usage: "loop-kernel iterations of each receiver probe"},
			&cli.StringFlag{Name: "sender", Value: "gpu", Usage: "the sender's load in a 1-bit period: gpu (kernels back to back) or cpu (a control: it spins on its own CPU and submits nothing, so what it leaks goes through the host, not the GPU)"},
			&cli.DurationFlag{Name: "lead", Value: 250 * time.Millisecond, Usage: "time from both VMs being set up to bit 0"},
			&cli.StringFlag{Name: "timing", Value: "fermi-xen", Usage: "board timing model: none, fermi or fermi-xen"},
			&cli.PathFlag{Name: "config", Aliases: []string{"c"}, Usage: "TOML config for the [scheduler] parameters (timeslice: strict's slot; watchdog) and the [board]"},
			&cli.IntFlag{Name: "ipc-spin", Value: 200, Usage: "aggregator IPC polling iterations before sleeping, per VM"},
			&cli.BoolFlag{Name: "json", Usage: "print JSON instead of the table"},
			&cli.PathFlag{Name: "svg", Usage: "write per-policy charts of each bit period's mean probe latency to this directory"},
		},
		Action: runCovert,
	}
}

func runCovert(c *cli.Context) error {
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	var policies []string
	for _, p := range strings.Split(c.String("policy"), ",") {
		p = strings.TrimSpace(p)
		if !slices.Contains(sched.Names(), p) {
			return usageError("--policy %q: have %s", p, strings.Join(sched.Names(), ", "))
		}
		policies = append(policies, p)
	}
	bit, bits, pre := c.Duration("bit"), c.Int("bits"), c.Int("preamble")
	switch {
	case bit < time.Millisecond || bit > time.Minute:
		return usageError("--bit %v: want 1ms..1m", bit)
	case bits < 1 || bits > 100_000:
		return usageError("--bits %d: want 1..100000", bits)
	case pre < 2 || pre > 1000:
		return usageError("--preamble %d: want 2..1000", pre)
	case c.Uint64("send-iterations") == 0 || c.Uint64("probe-iterations") == 0:
		return usageError("--send-iterations and --probe-iterations must be at least 1")
	case c.String("sender") != "gpu" && c.String("sender") != "cpu":
		return usageError("--sender %q: want gpu or cpu", c.String("sender"))
	case c.Duration("lead") < 10*time.Millisecond || c.Duration("lead") > time.Minute:
		return usageError("--lead %v: want 10ms..1m", c.Duration("lead"))
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
	rep, err := bench.RunCovert(c.Context, bench.CovertOptions{
		Board: boardCfg, Policies: policies, Bit: bit, Bits: bits, Preamble: pre, Seed: c.Uint64("seed"),
		SendIterations: c.Uint64("send-iterations"), ProbeIterations: c.Uint64("probe-iterations"),
		CPUSender: c.String("sender") == "cpu", Lead: c.Duration("lead"), Sched: sched.FromConfig(cfg.Scheduler),
		Watchdog: cfg.Scheduler.Watchdog.Duration, ServerSpin: c.Int("ipc-spin"), Command: selfCommand, Logger: log,
		Progress: func(msg string) { fmt.Fprintln(c.App.ErrWriter, msg) },
	})
	if err != nil {
		return &exitError{code: exitFailure, err: err}
	}
	if dir := c.Path("svg"); dir != "" {
		if err := writeCovertSVGs(dir, rep); err != nil {
			return fmt.Errorf("--svg: %w", err)
		}
		fmt.Fprintf(c.App.ErrWriter, "covert: charts written to %s\n", dir)
	}
	if c.Bool("json") {
		return bench.WriteJSONValue(c.App.Writer, rep)
	}
	return writeCovertTable(c.App.Writer, rep)
}

func writeCovertTable(w io.Writer, rep bench.CovertReport) error {
	sender := fmt.Sprintf("sender kernels of %d loop iterations", rep.SendIterations)
	if rep.CPUSender {
		sender = "CPU-only control sender (no GPU use)"
	}
	fmt.Fprintf(w, "%d message bits (seed %d) after a %d-bit preamble, %v per bit; %s; board timing %s; strict slot %v, watchdog %v\n\n",
		rep.Bits, rep.Seed, rep.Preamble, time.Duration(rep.BitPeriodNs), sender, rep.Board.Timing, time.Duration(rep.TimesliceNs), time.Duration(rep.WatchdogNs))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "POLICY\tBITS/S\tBER\tCAPACITY b/s\tLAT 0 mean/p95 µs\tLAT 1 mean/p95 µs\tSENDER k/s\tPROBES/s\tGPU BUSY\tSTRICT OVERRUN\t")
	for _, r := range rep.Runs {
		over := "–"
		if o := r.SenderOverrun; o != nil {
			over = fmt.Sprintf("%d, %.1f ms (max %.1f)", o.Count, o.TotalMs, o.MaxMs)
		}
		fmt.Fprintf(tw, "%s\t%.1f\t%.3f\t%.2f\t%.0f / %.0f\t%.0f / %.0f\t%.0f\t%.0f\t%.0f%%\t%s\t\n", r.Policy, r.BitsPerSec, r.BER, r.CapacityBps,
			r.Latency0.MeanUs, r.Latency0.P95Us, r.Latency1.MeanUs, r.Latency1.P95Us, r.SenderKernelsPerSec, r.ProbesPerSec, 100*r.GPUBusy, over)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nBER over the message bits; capacity = bits/s x (1 - H2(BER)); SENDER k/s: sender kernels per second of 1-bit time.")
	return nil
}

// writeCovertSVGs draws, per policy, each bit period's mean probe latency
// beside the calibrated threshold and the bit sent.
func writeCovertSVGs(dir string, rep bench.CovertReport) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, r := range rep.Runs {
		xs := make([]float64, len(r.Periods))
		med, thr, sent := make([]float64, len(xs)), make([]float64, len(xs)), make([]float64, len(xs))
		top := r.ThresholdUs
		for _, p := range r.Periods {
			top = max(top, p.MeanUs)
		}
		for i, p := range r.Periods {
			xs[i] = float64(i)
			med[i], thr[i], sent[i] = p.MeanUs, r.ThresholdUs, float64(p.Sent)*top
		}
		zero := 0.0
		svg, err := svgplot.LineChart{
			Title:  fmt.Sprintf("%s: mean probe latency per bit period (BER %.3f, %.2f bits/s)", r.Policy, r.BER, r.CapacityBps),
			XLabel: "bit period", YLabel: "µs", YMin: &zero,
			Series: []svgplot.Series{{Name: "mean probe latency", X: xs, Y: med}, {Name: "threshold", X: xs, Y: thr}, {Name: "bit sent (1 = top)", X: xs, Y: sent}},
		}.SVG()
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "covert-"+r.Policy+".svg"), svg, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// covertGuestFlags are devmodel's flags for a VM of `gpuvm bench covert`.
func covertGuestFlags() []cli.Flag {
	const cat = "covert-channel harness"
	return []cli.Flag{
		&cli.StringFlag{Name: "covert", Category: cat, Usage: "instead of workloads, be the covert-channel " + strings.Join(bench.CovertRoles(), " or ") + " (gpuvm bench covert) and print a JSON summary"},
		&cli.TimestampFlag{Name: "covert-start", Category: cat, Layout: time.RFC3339Nano, Usage: "wall-clock time bit period 0 begins (RFC 3339), agreed with the other VM; without it the VM writes '" + bench.CovertReadyLine + "' on stderr once set up and reads the time as a line on stdin"},
		&cli.DurationFlag{Name: "covert-bit", Category: cat, Value: 50 * time.Millisecond, Usage: "bit period"},
		&cli.StringFlag{Name: "covert-message", Category: cat, Usage: "sender: the bits to send (0 and 1)"},
		&cli.IntFlag{Name: "covert-periods", Category: cat, Usage: "receiver: how many bit periods to probe"},
		&cli.BoolFlag{Name: "covert-cpu-only", Category: cat, Usage: "sender: spin on the CPU through a 1-bit period instead of using the GPU (a control)"},
	}
}

// runCovertGuest is `gpuvm devmodel --covert ROLE`: one VM of the
// covert-channel harness, its kernels sized by --loop-iterations. It prints
// its summary as one JSON object (the receiver's samples in it).
func runCovertGuest(c *cli.Context, cfg devmodel.Config) error {
	role := c.String("covert")
	if !slices.Contains(bench.CovertRoles(), role) {
		return usageError("--covert %q: want %s", role, strings.Join(bench.CovertRoles(), " or "))
	}
	o := bench.CovertGuestOptions{Role: role, Bit: c.Duration("covert-bit"), Message: c.String("covert-message"),
		Periods: c.Int("covert-periods"), Iterations: c.Uint64("loop-iterations"), CPUOnly: c.Bool("covert-cpu-only"),
		AwaitStart: func(context.Context) (time.Time, error) {
			fmt.Fprintln(c.App.ErrWriter, bench.CovertReadyLine)
			line, err := bufio.NewReader(c.App.Reader).ReadString('\n')
			if err != nil {
				return time.Time{}, fmt.Errorf("read the start time from stdin: %w", err)
			}
			return time.Parse(time.RFC3339Nano, strings.TrimSpace(line))
		}}
	if start := c.Timestamp("covert-start"); start != nil {
		o.Start = *start
	}
	g, err := bench.RunCovertGuest(c.Context, cfg, o)
	err = noDaemonHint(err, "gpuvm serve", "--socket")
	if err != nil && g.Error == "" {
		g.Error = err.Error()
	}
	if jerr := json.NewEncoder(c.App.Writer).Encode(g); jerr != nil {
		return fmt.Errorf("write the covert %s's summary: %w", role, jerr)
	}
	if err != nil {
		return &exitError{code: exitFailure, err: err}
	}
	if !g.Verified {
		return &exitError{code: exitFailure, err: errors.New(g.Error)}
	}
	return nil
}
