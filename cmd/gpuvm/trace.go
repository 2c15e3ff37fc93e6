package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/internal/bpftrace"
)

func traceCommand() *cli.Command {
	return &cli.Command{
		Name:  "trace",
		Usage: "trace a running daemon with eBPF: per-VM trap latency, doorbell-to-release wait, device-model CPU time",
		Description: "Attaches to a running `gpuvm serve` without restarting or pausing it: uprobes on its probe\n" +
			"points time every trapped guest access and record every submission's wait from doorbell to\n" +
			"release, and the sched_switch tracepoint adds up the CPU time of each VM's device model and of\n" +
			"the daemon. Every --interval it prints, per vGPU, log2 histograms (as bpftrace's hist) of trap\n" +
			"latency and of the wait, the counts by BAR, and the device model's CPU time and share of a\n" +
			"CPU; --json prints one JSON object per interval instead. It stops after --duration or at\n" +
			"SIGINT, detaching everything. The daemon is the peer of its control socket unless --pid\n" +
			"names it; the VMs' names and device-model processes come from the control API, asked again\n" +
			"every second. Needs root (CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN) on linux/amd64;\n" +
			"docs/tracing.md tells what each number includes.",
		Flags: []cli.Flag{
			&cli.PathFlag{Name: "control-socket", Value: config.Default().Daemon.ControlSocket, Usage: "the daemon's control socket: who the daemon is and its vGPUs"},
			&cli.IntFlag{Name: "pid", Usage: "the daemon's process id; 0: the control socket's peer (SO_PEERCRED)"},
			&cli.DurationFlag{Name: "duration", Usage: "stop after this long; 0: at SIGINT"},
			&cli.DurationFlag{Name: "interval", Value: 5 * time.Second, Usage: "print a report this often (and at the end)"},
			&cli.BoolFlag{Name: "json", Usage: "print each report as one line of JSON"},
			&cli.BoolFlag{Name: "no-cpu", Usage: "leave out CPU times (attach no scheduler tracepoint)"},
		},
		Action: runTrace,
	}
}

func runTrace(c *cli.Context) error {
	interval, duration := c.Duration("interval"), c.Duration("duration")
	if interval < 100*time.Millisecond {
		return usageHint(c, "--interval %v: want at least 100ms", interval)
	}
	if duration < 0 {
		return usageHint(c, "--duration %v: want a positive duration, or none to run until interrupted", duration)
	}
	if duration > 0 {
		interval = min(interval, duration)
	}
	if err := bpftrace.CheckPrivileges(); err != nil {
		return &exitError{code: exitFailure, err: err}
	}
	ctl := c.Path("control-socket")
	pid := c.Int("pid")
	if pid == 0 {
		var err error
		if pid, err = controlSocketPeer(ctl); err != nil {
			return &exitError{code: exitFailure, err: fmt.Errorf("finding the daemon: %w", err)}
		}
	} else if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return &exitError{code: exitFailure, err: fmt.Errorf("--pid %d: no such process", pid)}
	}
	vms := newVMList(ctl)
	if err := vms.refresh(c.Context); err != nil {
		if !c.IsSet("pid") {
			return &exitError{code: exitFailure, err: err}
		}
		fmt.Fprintf(c.App.ErrWriter, "gpuvm trace: %v; vGPUs are shown by id only\n", err)
	}

	tr, err := bpftrace.Attach(bpftrace.Options{PID: pid, NoCPU: c.Bool("no-cpu")})
	if err != nil {
		return &exitError{code: exitFailure, err: err}
	}
	defer func() {
		if err := tr.Close(); err != nil {
			fmt.Fprintf(c.App.ErrWriter, "gpuvm trace: detaching: %v\n", err)
		} else {
			fmt.Fprintf(c.App.ErrWriter, "gpuvm trace: detached from daemon pid %d\n", pid)
		}
	}()
	watch := func() {
		if c.Bool("no-cpu") {
			return
		}
		if err := tr.Watch(append(vms.pids(), pid)); err != nil {
			fmt.Fprintf(c.App.ErrWriter, "gpuvm trace: %v\n", err)
		}
	}
	watch()
	exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	header := fmt.Sprintf("gpuvm trace: daemon pid %d (%s): uprobes on TrapBegin, TrapEnd, Release", pid, exe)
	if via := tr.SchedVia(); via != "" {
		header += "\ngpuvm trace: CPU time by " + via
	}
	header += fmt.Sprintf("\ngpuvm trace: a report every %v", interval)
	if duration > 0 {
		header += fmt.Sprintf(" for %v", duration)
	} else {
		header += "; SIGINT stops"
	}
	headerOut := c.App.Writer
	if c.Bool("json") {
		headerOut = c.App.ErrWriter
	}
	fmt.Fprintln(headerOut, header)

	prev, err := tr.Snapshot()
	if err != nil {
		return err
	}
	start := prev.At
	var stop <-chan time.Time
	if duration > 0 {
		t := time.NewTimer(duration)
		defer t.Stop()
		stop = t.C
	}
	tick := time.NewTicker(min(interval, time.Second))
	defer tick.Stop()
	for {
		final, why := false, ""
		select {
		case <-c.Context.Done():
			final = true
		case <-stop:
			final = true
		case <-tick.C:
			// A tick at the end is the end (not a last report of nothing).
			final = duration > 0 && time.Since(start) >= duration-interval/20
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			final, why = true, fmt.Sprintf("gpuvm trace: daemon pid %d exited", pid)
		} else if err := vms.refresh(context.WithoutCancel(c.Context)); err != nil && !final {
			fmt.Fprintf(c.App.ErrWriter, "gpuvm trace: %v\n", err)
		}
		cur, err := tr.Snapshot()
		if err != nil {
			return err
		}
		// After the snapshot: a process no longer watched keeps the time
		// read now, and what it ran since shows in the next report.
		watch()
		if elapsed := cur.At.Sub(prev.At); final || elapsed >= interval-interval/20 {
			rep := buildTraceReport(cur.Sub(prev), elapsed, pid, vms)
			if err := rep.write(c.App.Writer, c.Bool("json")); err != nil {
				return err
			}
			prev = cur
		}
		if final {
			if why != "" {
				fmt.Fprintln(c.App.ErrWriter, why)
			}
			return nil
		}
	}
}

// controlSocketPeer is the process listening on the control socket path:
// the daemon (SO_PEERCRED of a connection to it).
func controlSocketPeer(path string) (int, error) {
	conn, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		return 0, noDaemonHint(fmt.Errorf("control socket: %w", err), "gpuvm serve", "--control-socket")
	}
	defer conn.Close()
	raw, err := conn.(*net.UnixConn).SyscallConn()
	if err != nil {
		return 0, fmt.Errorf("control socket %s: %w", path, err)
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return 0, fmt.Errorf("control socket %s: %w", path, err)
	}
	if cerr != nil {
		return 0, fmt.Errorf("control socket %s: peer credentials: %w", path, cerr)
	}
	if cred.Pid <= 0 {
		return 0, fmt.Errorf("control socket %s: the daemon's process is in another pid namespace; name it with --pid", path)
	}
	return int(cred.Pid), nil
}

// vmList is what the control API says of the vGPUs, remembered after they
// go (a report covers an interval in which a VM may have left).
type vmList struct {
	socket string
	known  map[int]aggregator.VGPUInfo
	live   map[int]bool
}

func newVMList(socket string) *vmList {
	return &vmList{socket: socket, known: map[int]aggregator.VGPUInfo{}, live: map[int]bool{}}
}

// refresh asks the control API for the vGPUs.
func (l *vmList) refresh(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://aggregator/v1/vgpus", nil)
	if err != nil {
		return err
	}
	resp, err := controlClient(l.socket).Do(req)
	if err != nil {
		return noDaemonHint(fmt.Errorf("control API: %w", err), "gpuvm serve", "--control-socket")
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("control API: GET /v1/vgpus: %s", resp.Status)
	}
	var infos []aggregator.VGPUInfo
	if err := json.NewDecoder(resp.Body).Decode(&infos); err != nil {
		return fmt.Errorf("control API: GET /v1/vgpus: %w", err)
	}
	clear(l.live)
	for _, in := range infos {
		l.known[in.ID] = in
		l.live[in.ID] = true
	}
	return nil
}

// pids are the live vGPUs' device-model processes.
func (l *vmList) pids() []int {
	var out []int
	for id := range l.live {
		if p := l.known[id].PID; p > 0 {
			out = append(out, int(p))
		}
	}
	return out
}

// traceReport is one interval of `gpuvm trace` (the --json object).
type traceReport struct {
	Time         time.Time      `json:"time"`
	IntervalNs   int64          `json:"interval_ns"`
	DaemonPID    int            `json:"daemon_pid"`
	DaemonCPUNs  uint64         `json:"daemon_cpu_ns"`
	DaemonCPUPct float64        `json:"daemon_cpu_pct"`
	VGPUs        []traceVGPU    `json:"vgpus"`
	Dropped      bpftrace.Stats `json:"dropped"`
	cpu          bool
}

// traceVGPU is one vGPU's interval.
type traceVGPU struct {
	ID    int    `json:"id"`
	DomID uint32 `json:"domid"`
	Name  string `json:"name"`
	Mode  string `json:"mode"`
	PID   int32  `json:"devmodel_pid,omitempty"`
	// Gone: the vGPU was no longer listed at the end of the interval.
	Gone           bool       `json:"gone,omitempty"`
	Traps          traceHist  `json:"traps"`
	ByBAR          []barCount `json:"traps_by_bar"`
	Wait           traceHist  `json:"wait"`
	DevmodelCPUNs  uint64     `json:"devmodel_cpu_ns"`
	DevmodelCPUPct float64    `json:"devmodel_cpu_pct"`
}

// barCount is the trapped accesses to one BAR.
type barCount struct {
	BAR    int    `json:"bar"`
	Reads  uint64 `json:"reads"`
	Writes uint64 `json:"writes"`
	SumNs  uint64 `json:"sum_ns"` // their latencies added up
}

// traceHist is a histogram with its summary; P50 and P99 are upper bounds
// (the end of the log2 slot the quantile falls in).
type traceHist struct {
	Count   uint64            `json:"count"`
	SumNs   uint64            `json:"sum_ns"`
	MeanNs  int64             `json:"mean_ns"`
	P50Ns   int64             `json:"p50_below_ns"`
	P99Ns   int64             `json:"p99_below_ns"`
	Buckets []bpftrace.Bucket `json:"hist"`
	h       bpftrace.Hist
}

func newTraceHist(h bpftrace.Hist) traceHist {
	return traceHist{Count: h.Count, SumNs: h.SumNs, MeanNs: int64(h.Mean()), P50Ns: int64(h.Quantile(0.5)),
		P99Ns: int64(h.Quantile(0.99)), Buckets: h.Buckets(), h: h}
}

// buildTraceReport joins an interval's counters with what the control API
// said of each vGPU: every listed vGPU and every one that counted anything.
func buildTraceReport(d bpftrace.Snapshot, elapsed time.Duration, daemon int, vms *vmList) traceReport {
	pct := func(ns uint64) float64 {
		if elapsed <= 0 {
			return 0
		}
		return float64(ns) * 100 / float64(elapsed)
	}
	rep := traceReport{Time: d.At, IntervalNs: int64(elapsed), DaemonPID: daemon, DaemonCPUNs: d.CPUNs[uint32(daemon)],
		Dropped: d.Stats, cpu: d.CPUNs != nil && len(d.CPUNs) > 0}
	rep.DaemonCPUPct = pct(rep.DaemonCPUNs)
	ids := map[int]bool{}
	for id := range vms.live {
		ids[id] = true
	}
	type acc struct {
		traps, wait bpftrace.Hist
		bars        map[int]*barCount
	}
	per := map[int]*acc{}
	for k, h := range d.Hists {
		id := int(k.VGPU)
		ids[id] = true
		a := per[id]
		if a == nil {
			a = &acc{bars: map[int]*barCount{}}
			per[id] = a
		}
		switch k.Kind {
		case bpftrace.KindWait:
			a.wait.Add(h)
			continue
		}
		a.traps.Add(h)
		b := a.bars[int(k.BAR)]
		if b == nil {
			b = &barCount{BAR: int(k.BAR)}
			a.bars[int(k.BAR)] = b
		}
		if k.Kind == bpftrace.KindWrite {
			b.Writes += h.Count
		} else {
			b.Reads += h.Count
		}
		b.SumNs += h.SumNs
	}
	for id := range ids {
		in, ok := vms.known[id]
		v := traceVGPU{ID: id, DomID: in.DomID, Name: in.Name, Mode: in.Mode, PID: in.PID, Gone: ok && !vms.live[id]}
		if a := per[id]; a != nil {
			v.Traps, v.Wait = newTraceHist(a.traps), newTraceHist(a.wait)
			for _, b := range a.bars {
				v.ByBAR = append(v.ByBAR, *b)
			}
			slices.SortFunc(v.ByBAR, func(x, y barCount) int { return cmp.Compare(x.BAR, y.BAR) })
		}
		if v.PID > 0 {
			v.DevmodelCPUNs = d.CPUNs[uint32(v.PID)]
			v.DevmodelCPUPct = pct(v.DevmodelCPUNs)
		}
		rep.VGPUs = append(rep.VGPUs, v)
	}
	slices.SortFunc(rep.VGPUs, func(x, y traceVGPU) int { return cmp.Compare(x.ID, y.ID) })
	return rep
}

// write prints the report: text (histograms as bpftrace draws them) or
// one line of JSON.
func (r traceReport) write(w io.Writer, asJSON bool) error {
	if asJSON {
		return json.NewEncoder(w).Encode(r)
	}
	var sb strings.Builder
	elapsed := time.Duration(r.IntervalNs)
	fmt.Fprintf(&sb, "\n=== %s  interval %.2fs", r.Time.Format("15:04:05"), elapsed.Seconds())
	if r.cpu {
		fmt.Fprintf(&sb, "  daemon pid %d on CPU %v (%.1f%% of a CPU)", r.DaemonPID, round(time.Duration(r.DaemonCPUNs)), r.DaemonCPUPct)
	}
	sb.WriteString("\n")
	if len(r.VGPUs) == 0 {
		sb.WriteString("no vGPUs\n")
	}
	for _, v := range r.VGPUs {
		name := v.Name
		if name == "" {
			name = "(not listed by the control API)"
		}
		fmt.Fprintf(&sb, "vGPU %d  %s", v.ID, name)
		if v.Mode != "" {
			fmt.Fprintf(&sb, "  domid %d  %s", v.DomID, v.Mode)
		}
		if v.Gone {
			sb.WriteString("  (gone)")
		}
		sb.WriteString("\n")
		if v.PID > 0 && r.cpu {
			fmt.Fprintf(&sb, "  device model pid %d: on CPU %v, %.1f%% of a CPU\n", v.PID, round(time.Duration(v.DevmodelCPUNs)), v.DevmodelCPUPct)
		}
		if v.Traps.Count == 0 {
			sb.WriteString("  trapped accesses: none\n")
		} else {
			var bars []string
			for _, b := range v.ByBAR {
				bars = append(bars, fmt.Sprintf("BAR%d %d r %d w mean %v", b.BAR, b.Reads, b.Writes,
					round(time.Duration(b.SumNs/max(b.Reads+b.Writes, 1)))))
			}
			fmt.Fprintf(&sb, "  trapped accesses: %d (%.0f/s; %s)\n", v.Traps.Count, float64(v.Traps.Count)/elapsed.Seconds(), strings.Join(bars, ", "))
			fmt.Fprintf(&sb, "  trap latency, ns: mean %v, p50 < %v, p99 < %v\n", round(time.Duration(v.Traps.MeanNs)), round(time.Duration(v.Traps.P50Ns)), round(time.Duration(v.Traps.P99Ns)))
			_ = v.Traps.h.Render(&sb, "  ")
		}
		if v.Wait.Count == 0 {
			sb.WriteString("  doorbell-to-release wait: no submissions released\n")
		} else {
			fmt.Fprintf(&sb, "  doorbell-to-release wait, ns: %d released, mean %v, p50 < %v, p99 < %v\n", v.Wait.Count,
				round(time.Duration(v.Wait.MeanNs)), round(time.Duration(v.Wait.P50Ns)), round(time.Duration(v.Wait.P99Ns)))
			_ = v.Wait.h.Render(&sb, "  ")
		}
	}
	if r.Dropped != (bpftrace.Stats{}) {
		fmt.Fprintf(&sb, "not timed: %d (under way at attach), %d (no histogram room), %d (arguments unreadable)\n",
			r.Dropped.UnmatchedEnds, r.Dropped.HistFull, r.Dropped.BadReads)
	}
	_, err := io.WriteString(w, sb.String())
	return err
}

// round shortens a duration for reading.
func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	case d >= time.Microsecond:
		return d.Round(10 * time.Nanosecond)
	}
	return d
}
