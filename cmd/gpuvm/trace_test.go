package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/internal/bpftrace"
)

// traceApp is the app with the trace command, whether or not main.go
// lists it yet.
func traceApp() *cli.App {
	app := newApp()
	for _, c := range app.Commands {
		if c.Name == "trace" {
			return app
		}
	}
	cmd := traceCommand()
	strictUsage([]*cli.Command{cmd})
	app.Commands = append(app.Commands, cmd)
	return app
}

func runTraceApp(ctx context.Context, args ...string) (stdout, stderr string, err error) {
	var out, errOut bytes.Buffer
	app := traceApp()
	app.Writer, app.ErrWriter = &out, &errOut
	err = app.RunContext(ctx, append([]string{"gpuvm", "trace"}, args...))
	return out.String(), errOut.String(), err
}

func TestTraceUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--interval", "0"},
		{"--interval", "10ms"},
		{"--duration", "-1s"},
		{"--frobnicate"},
		{"extra-argument"},
	} {
		_, _, err := runTraceApp(context.Background(), args...)
		var ee *exitError
		if !errors.As(err, &ee) || ee.code != exitUsage {
			t.Errorf("%v: err = %v, want a usage error", args, err)
		}
	}
	// No daemon: said so (or, without privileges, that first).
	_, _, err := runTraceApp(context.Background(), "--control-socket", t.TempDir()+"/none.sock", "--duration", "1s")
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != exitFailure ||
		!(strings.Contains(err.Error(), "is gpuvm serve running") || strings.Contains(err.Error(), "CAP_BPF")) {
		t.Errorf("no daemon: %v", err)
	}
}

// The report joins the counters with the control API's vGPUs: one that
// left during the interval is shown as gone, one the API never listed by
// id, and the histograms as bpftrace draws them.
func TestTraceReport(t *testing.T) {
	vms := newVMList("")
	vms.known[0] = aggregator.VGPUInfo{ID: 0, DomID: 7, Name: "guest1", Mode: "fv-optimized", PID: 4300}
	vms.known[1] = aggregator.VGPUInfo{ID: 1, DomID: 8, Name: "guest2", Mode: "pv-multicall", PID: 4400}
	vms.live[0] = true
	var r0, w0, w3, wait bpftrace.Hist
	for range 30 {
		r0.Observe(1500)
	}
	for range 10 {
		w0.Observe(3000)
	}
	w3.Observe(70000)
	for range 4 {
		wait.Observe(20000)
	}
	d := bpftrace.Snapshot{
		At: time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC),
		Hists: map[bpftrace.HistKey]bpftrace.Hist{
			{VGPU: 0, Kind: bpftrace.KindRead, BAR: 0}:  r0,
			{VGPU: 0, Kind: bpftrace.KindWrite, BAR: 0}: w0,
			{VGPU: 0, Kind: bpftrace.KindWrite, BAR: 3}: w3,
			{VGPU: 0, Kind: bpftrace.KindWait}:          wait,
			{VGPU: 1, Kind: bpftrace.KindRead, BAR: 0}:  r0,
			{VGPU: 5, Kind: bpftrace.KindRead, BAR: 0}:  r0,
		},
		CPUNs: map[uint32]uint64{4300: 500_000_000, 4400: 10_000_000, 99: 1_000_000_000},
		Stats: bpftrace.Stats{UnmatchedEnds: 1},
	}
	rep := buildTraceReport(d, 2*time.Second, 99, vms)
	if len(rep.VGPUs) != 3 || rep.VGPUs[0].ID != 0 || rep.VGPUs[1].ID != 1 || rep.VGPUs[2].ID != 5 {
		t.Fatalf("vGPUs %+v", rep.VGPUs)
	}
	v := rep.VGPUs[0]
	if v.Traps.Count != 41 || v.Wait.Count != 4 || v.DevmodelCPUNs != 500_000_000 || v.DevmodelCPUPct != 25 {
		t.Errorf("vGPU 0: %+v", v)
	}
	if len(v.ByBAR) != 2 || v.ByBAR[0] != (barCount{BAR: 0, Reads: 30, Writes: 10, SumNs: 75000}) || v.ByBAR[1] != (barCount{BAR: 3, Writes: 1, SumNs: 70000}) {
		t.Errorf("vGPU 0 by BAR: %+v", v.ByBAR)
	}
	if !rep.VGPUs[1].Gone || rep.VGPUs[2].Gone || rep.DaemonCPUPct != 50 {
		t.Errorf("gone flags or daemon share wrong: %+v", rep)
	}

	var text bytes.Buffer
	if err := rep.write(&text, false); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"=== 15:04:05  interval 2.00s  daemon pid 99 on CPU 1s (50.0% of a CPU)\n",
		"vGPU 0  guest1  domid 7  fv-optimized\n",
		"  device model pid 4300: on CPU 500ms, 25.0% of a CPU\n",
		"  trapped accesses: 41 (20/s; BAR0 30 r 10 w mean 1.88µs, BAR3 0 r 1 w mean 70µs)\n",
		"  trap latency, ns: mean 3.54µs, p50 < 2.05µs, p99 < 131.07µs\n",
		"  [1K, 2K)               30 |" + strings.Repeat("@", 52) + "|\n",
		"  [2K, 4K)               10 |" + strings.Repeat("@", 17) + strings.Repeat(" ", 35) + "|\n",
		"  doorbell-to-release wait, ns: 4 released, mean 20µs, p50 < 32.77µs, p99 < 32.77µs\n",
		"  [16K, 32K)              4 |",
		"vGPU 1  guest2  domid 8  pv-multicall  (gone)\n",
		"vGPU 5  (not listed by the control API)\n",
		"  doorbell-to-release wait: no submissions released\n",
		"not timed: 1 (under way at attach), 0 (no histogram room), 0 (arguments unreadable)\n",
	} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("no %q in\n%s", want, text.String())
		}
	}

	var js bytes.Buffer
	if err := rep.write(&js, true); err != nil {
		t.Fatal(err)
	}
	var back struct {
		DaemonCPUPct float64 `json:"daemon_cpu_pct"`
		VGPUs        []struct {
			ID    int    `json:"id"`
			Name  string `json:"name"`
			PID   int    `json:"devmodel_pid"`
			Traps struct {
				Count uint64            `json:"count"`
				Hist  []bpftrace.Bucket `json:"hist"`
			} `json:"traps"`
			CPUPct float64 `json:"devmodel_cpu_pct"`
		} `json:"vgpus"`
	}
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || strings.Count(js.String(), "\n") != 1 {
		t.Fatalf("JSON %v:\n%s", err, js.String())
	}
	if back.DaemonCPUPct != 50 || back.VGPUs[0].Name != "guest1" || back.VGPUs[0].PID != 4300 || back.VGPUs[0].Traps.Count != 41 ||
		len(back.VGPUs[0].Traps.Hist) != 7 || back.VGPUs[0].Traps.Hist[0] != (bpftrace.Bucket{Lo: 1024, Hi: 2048, Count: 30}) {
		t.Errorf("JSON round trip: %+v", back)
	}
}

// gpuvm trace against a live daemon with a VM computing: the reports
// count the VM's traps and releases and its device model's CPU time, and
// the daemon is untouched (it serves on, and stops cleanly).
func TestTraceDaemon(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a daemon and a VM (-short)")
	}
	if err := bpftrace.CheckPrivileges(); err != nil {
		t.Skipf("tracing: %v", err)
	}
	dir := t.TempDir()
	sock, ctl := dir+"/agg.sock", dir+"/ctl.sock"
	d := startDaemon(t, daemonConfig(t, dir, sock, ctl, ""), ctl)
	vm := selfCommand(context.Background(), []string{"devmodel", "--socket", sock, "--name", "traced", "--domid", "9",
		"--mode", "fv-optimized", "--ram", "128MiB", "--workloads", "madd", "--matrix-dim", "32", "--runs", "1000000"})
	var vmErr bytes.Buffer
	vm.Stderr = &vmErr
	if err := vm.Start(); err != nil {
		t.Fatal(err)
	}
	vmDone := make(chan error, 1)
	go func() { vmDone <- vm.Wait() }()
	defer func() {
		vm.Process.Kill()
		<-vmDone
	}()
	waitComputing(t, ctl, "traced") // until the VM has its vGPU and submits

	out, stderr, err := runTraceApp(context.Background(), "--control-socket", ctl, "--duration", "2s", "--interval", "1s", "--json")
	var ee *exitError
	if errors.As(err, &ee) && (strings.Contains(err.Error(), "does not support") || strings.Contains(err.Error(), "operation not permitted")) {
		t.Skipf("the kernel refuses: %v", err)
	}
	if err != nil {
		t.Fatalf("trace: %v\n%s", err, stderr)
	}
	if !strings.Contains(stderr, "detached from daemon pid") {
		t.Errorf("no detach on stderr: %q", stderr)
	}
	var reports []map[string]any
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(nil, 1<<20)
	var traps, released, cpu float64
	for sc.Scan() {
		var rep struct {
			VGPUs []struct {
				Name          string  `json:"name"`
				DevmodelCPUNs float64 `json:"devmodel_cpu_ns"`
				Traps         struct {
					Count float64 `json:"count"`
				} `json:"traps"`
				Wait struct {
					Count float64 `json:"count"`
				} `json:"wait"`
			} `json:"vgpus"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rep); err != nil {
			t.Fatalf("not JSON: %v\n%s", err, sc.Text())
		}
		reports = append(reports, nil)
		for _, v := range rep.VGPUs {
			if v.Name == "traced" {
				traps += v.Traps.Count
				released += v.Wait.Count
				cpu += v.DevmodelCPUNs
			}
		}
	}
	if len(reports) != 2 {
		t.Errorf("%d reports in 2s at 1s intervals, want 2:\n%s", len(reports), out)
	}
	t.Logf("traced 2s: %.0f trapped accesses, %.0f submissions released, device model on CPU %v", traps, released, time.Duration(cpu))
	if traps == 0 || released == 0 || cpu == 0 {
		t.Errorf("counted %.0f traps, %.0f releases, %.0f ns of device-model CPU: want all non-zero\n%s", traps, released, cpu, out)
	}
	select {
	case err := <-vmDone:
		t.Fatalf("the VM stopped while traced: %v\n%s", err, vmErr.String())
	default:
	}
	if _, err := os.Stat(ctl); err != nil {
		t.Fatal(err)
	}
	vm.Process.Kill()
	d.stop(t)
}
