package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/internal/racebuild"
)

// TestMain lets the bench re-execute this test binary as gpuvm (its VM
// processes), as the real binary re-executes itself.
//
// A race-detector build runs its VM processes from a plain build of gpuvm
// instead (GPUVM_SELF_EXE), as tests/ does: the daemon side, in this
// process, is what the detector watches, and instrumented VM processes
// made this package's race run several minutes longer.
func TestMain(m *testing.M) {
	if os.Getenv(reexecEnv) == "1" {
		os.Exit(run(os.Args))
	}
	if racebuild.Enabled && os.Getenv(selfExeEnv) == "" {
		dir, err := os.MkdirTemp("", "gpuvm-plain-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		exe := filepath.Join(dir, "gpuvm")
		cmd := exec.Command("go", "build", "-o", exe, ".")
		cmd.Env = append(os.Environ(), "GOFLAGS=")
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "go build of a plain gpuvm for the VM processes: %v\n%s", err, out)
			os.Exit(1)
		}
		os.Setenv(selfExeEnv, exe)
		code := m.Run()
		os.RemoveAll(dir)
		os.Exit(code)
	}
	os.Exit(m.Run())
}

func runApp(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	app := newApp()
	app.Writer, app.ErrWriter = &out, &errOut
	err = app.RunContext(context.Background(), append([]string{"gpuvm"}, args...))
	return out.String(), errOut.String(), err
}

// TestBenchJSONAllWorkloads is the acceptance command at test sizes:
// every workload reports verified with the documented JSON shape.
func TestBenchJSONAllWorkloads(t *testing.T) {
	out, stderr, err := runApp(t, "bench", "--mode", "native", "--workloads", "all", "--runs", "2",
		"--timing", "none", "--json", "--matrix-dim", "48", "--loop-iterations", "1000", "--copy-size", "5MiB", "--rodinia-scale", "16", "--vram", "768MiB")
	if err != nil {
		t.Fatalf("bench: %v\nstderr:\n%s", err, stderr)
	}
	var rep struct {
		Board   map[string]any `json:"board"`
		Results []struct {
			Mode, Workload string
			Runs           int
			Verified       bool
			PhasesNs       map[string]int64 `json:"phases_ns"`
			TotalNs        int64            `json:"total_ns"`
			Counters       map[string]any   `json:"counters"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
	if rep.Board["kind"] != "sim" || rep.Board["timing"] != "none" {
		t.Errorf("board = %v", rep.Board)
	}
	want := []string{"nop", "loop", "madd", "mmul", "fmadd", "fmmul", "cpy", "pincpy", "bp", "hs", "lud", "nn", "srad", "srad2"}
	if len(rep.Results) != len(want) {
		t.Fatalf("%d results, want %d", len(rep.Results), len(want))
	}
	for i, r := range rep.Results {
		if r.Workload != want[i] || r.Mode != "native" || r.Runs != 2 || !r.Verified {
			t.Errorf("result %d = %+v", i, r)
		}
		for _, ph := range []string{"init", "htod", "launch", "dtoh", "close"} {
			if _, ok := r.PhasesNs[ph]; !ok {
				t.Errorf("%s: phase %s missing", r.Workload, ph)
			}
		}
		if r.TotalNs <= 0 || r.Counters == nil {
			t.Errorf("%s: total %d counters %v", r.Workload, r.TotalNs, r.Counters)
		}
	}
	if !strings.Contains(stderr, "bench: native madd") {
		t.Errorf("no progress on stderr: %q", stderr)
	}
}

func TestBenchUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "--mode", "warp-drive"},
		{"bench", "--workloads", "nop,frobnicate"},
		{"bench", "--runs", "0"},
		{"bench", "--timing", "slow"},
		{"bench", "--copy-size", "12XB"},
		{"--log-level", "loud", "bench"},
		// Only PV and pvdrm guests can declare scheduling points.
		{"bench", "fairness", "--yield"},
		{"bench", "fairness", "--yield", "--modes", "pv-multicall,fv-optimized"},
	} {
		_, _, err := runApp(t, args...)
		var ee *exitError
		if !errors.As(err, &ee) || ee.code != exitUsage {
			t.Errorf("%v: err = %v, want a usage error", args, err)
		}
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]uint64{"64MiB": 64 << 20, "6GiB": 6 << 30, "4096": 4096, "1 KiB": 1024, "7B": 7} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "MiB", "-1", "99999999999999999999GiB"} {
		if _, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) succeeded", in)
		}
	}
}

func TestBenchConfigFile(t *testing.T) {
	dir := t.TempDir()
	bad := dir + "/bad.toml"
	if err := os.WriteFile(bad, []byte("[board]\nvram = \"1GiB\"\ntimming = \"none\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err := runApp(t, "bench", "--config", bad, "-w", "nop", "--runs", "1")
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != exitUsage || !strings.Contains(err.Error(), "bad.toml:3:") {
		t.Fatalf("bad config: %v", err)
	}
	good := dir + "/good.toml"
	if err := os.WriteFile(good, []byte("[board]\nvram = \"768MiB\"\nmem_partitions = 3\ntiming = \"none\"\n"+
		"[daemon]\nmax_vms = 2\n[partition]\nvram_per_vm = \"256MiB\"\nreserved = \"64MiB\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, err := runApp(t, "bench", "--config", good, "-w", "nop", "--runs", "1", "--json")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, `"vram_bytes": 805306368`) || !strings.Contains(out, `"timing": "none"`) {
		t.Errorf("config not applied:\n%s", out)
	}
}

// The fairness harness end to end, small: real VM processes per policy,
// the documented JSON shape, every VM's result verified. (Fairness levels
// are asserted deterministically in package sched; a 1 s run on a shared
// machine is too noisy for a threshold.)
func TestBenchFairnessJSON(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 12 VM processes")
	}
	dir := t.TempDir()
	out, stderr, err := runApp(t, "bench", "fairness", "--vms", "2", "--policy", "fifo,band", "--duration", "1s",
		"--matrix-dim", "64", "--repeat", "4", "--json", "--svg", dir)
	if err != nil {
		t.Fatalf("fairness: %v\n%s", err, stderr)
	}
	var rep struct {
		Runs []struct {
			Policy         string
			VMs            int
			Jain500        float64                         `json:"jain_500ms"`
			Jain100        float64                         `json:"jain_100ms"`
			Usage          map[string]map[string][]float64 `json:"usage"`
			OverheadVsFIFO map[string]float64              `json:"overhead_vs_fifo"`
			Loads          []struct{ Verified bool }
		} `json:"runs"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if len(rep.Runs) != 2 || rep.Runs[0].Policy != "fifo" || rep.Runs[1].Policy != "band" {
		t.Fatalf("runs = %+v", rep.Runs)
	}
	for _, r := range rep.Runs {
		if r.VMs != 2 || len(r.Loads) != 2 || r.Jain500 <= 0 || r.Jain500 > 1 || len(r.Usage["500ms"]["vm1"]) == 0 || len(r.Usage["100ms"]["vm2"]) == 0 {
			t.Errorf("%s: %+v", r.Policy, r)
		}
		for _, l := range r.Loads {
			if !l.Verified {
				t.Errorf("%s: a VM's result did not verify", r.Policy)
			}
		}
		if _, ok := r.OverheadVsFIFO["madd"]; !ok {
			t.Errorf("%s: no overhead against FIFO", r.Policy)
		}
	}
	if _, err := os.Stat(dir + "/usage-band-2vms-500ms.svg"); err != nil {
		t.Errorf("chart not written: %v", err)
	}
}

// The virtualized modes end to end (each a real VM process over the IPC
// protocol), at test sizes: every result verifies, lazy shadowing scans
// fewer page-table entries than naive shadowing, and BAR remap traps fewer
// BAR3 accesses than naive.
func TestBenchVirtualizedModes(t *testing.T) {
	modes := "native,fv-naive,fv-lazy,fv-bar-remap,fv-optimized,fv-incremental"
	runs := "2"
	if testing.Short() {
		modes, runs = "native,fv-naive,fv-lazy,fv-bar-remap", "1"
	}
	out, stderr, err := runApp(t, "bench", "--mode", modes, "--workloads", "nop,madd,cpy", "--runs", runs,
		"--timing", "none", "--json", "--matrix-dim", "32", "--copy-size", "5MiB", "--vram", "3GiB")
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, stderr)
	}
	var rep struct {
		Results []struct {
			Mode, Workload string
			Verified       bool
			Error          string
			VsNative       float64        `json:"vs_native"`
			Counters       map[string]any `json:"counters"`
		}
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not JSON: %v", err)
	}
	c := map[string]map[string]float64{}
	num := func(v any) float64 { f, _ := v.(float64); return f }
	for _, r := range rep.Results {
		if !r.Verified {
			t.Errorf("%s %s: %s", r.Mode, r.Workload, r.Error)
		}
		if r.Mode != "native" && r.VsNative <= 0 {
			t.Errorf("%s %s: no ratio to native", r.Mode, r.Workload)
		}
		if r.Workload == "madd" && r.Mode != "native" {
			traps, _ := r.Counters["bar3_traps"].(map[string]any)
			c[r.Mode] = map[string]float64{"ptes_scanned": num(r.Counters["ptes_scanned"]), "scans": num(r.Counters["scans"]),
				"bar3_writes": num(traps["write"]), "denied": num(r.Counters["denied"])}
			for _, k := range []string{"bar0_traps", "bar1_traps", "bar3_traps", "denied", "tlb_flushes", "scans", "ptes_scanned", "shadow_ns"} {
				if _, ok := r.Counters[k]; !ok {
					t.Errorf("%s: counter %s missing", r.Mode, k)
				}
			}
		}
	}
	if c["fv-lazy"]["ptes_scanned"] >= c["fv-naive"]["ptes_scanned"] || c["fv-lazy"]["scans"] >= c["fv-naive"]["scans"] {
		t.Errorf("lazy scanned %v PTEs in %v scans, naive %v in %v", c["fv-lazy"]["ptes_scanned"], c["fv-lazy"]["scans"], c["fv-naive"]["ptes_scanned"], c["fv-naive"]["scans"])
	}
	if c["fv-bar-remap"]["bar3_writes"] >= c["fv-naive"]["bar3_writes"] {
		t.Errorf("remap trapped %v BAR3 writes, naive %v", c["fv-bar-remap"]["bar3_writes"], c["fv-naive"]["bar3_writes"])
	}
	if c["fv-naive"]["denied"] != 0 {
		t.Errorf("honest guest had %v accesses denied", c["fv-naive"]["denied"])
	}
}

// gpuvm serve as a real daemon: a VM process runs workloads on it, the
// control API lists the vGPU, and SIGTERM shuts it down cleanly (exit 0).
func TestServeDaemon(t *testing.T) {
	dir := t.TempDir()
	conf := dir + "/gpuvm.toml"
	sock, ctl := dir+"/agg.sock", dir+"/ctl.sock"
	if err := os.WriteFile(conf, []byte(`[board]
vram = "1GiB"
mem_partitions = 4
[daemon]
socket = "`+sock+`"
control_socket = "`+ctl+`"
max_vms = 2
[partition]
vram_per_vm = "256MiB"
reserved = "128MiB"
bar1_per_vm = "32MiB"
bar3_per_vm = "8MiB"
[scheduler]
policy = "band"
watchdog = "5s"
[[vm]]
name = "guest1"
weight = 2
`), 0o644); err != nil {
		t.Fatal(err)
	}
	serve := selfCommand(context.Background(), []string{"serve", "--config", conf})
	var serr bytes.Buffer
	serve.Stderr = &serr
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	defer serve.Process.Kill()
	for i := 0; ; i++ {
		if _, err := os.Stat(ctl); err == nil {
			break
		}
		if i > 500 {
			t.Fatalf("daemon did not come up:\n%s", serr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	vm := selfCommand(context.Background(), []string{"devmodel", "--socket", sock, "--name", "guest1", "--domid", "5",
		"--mode", "fv-optimized", "--ram", "128MiB", "--workloads", "nop,madd", "--matrix-dim", "32", "--json"})
	if out, err := vm.Output(); err != nil {
		t.Fatalf("VM process: %v\n%s\ndaemon:\n%s", err, out, serr.String())
	}
	out, _, err := runApp(t, "vgpu", "layout", "--control-socket", ctl)
	if err != nil || !strings.Contains(out, `"slots"`) {
		t.Fatalf("control API layout: %v\n%s", err, out)
	}
	if err := serve.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := serve.Wait(); err != nil {
		t.Fatalf("daemon exit after SIGTERM: %v\n%s", err, serr.String())
	}
}

// The para-virtual modes end to end (each a real VM process): every result
// verifies, nothing is scanned or refused, and multicall cuts pincpy's
// hypercalls at least 50× (GPUvm's Table 4.1 shows 368×).
func TestBenchPVModes(t *testing.T) {
	results := benchResults(t, "--mode", "native,pv-naive,pv-multicall", "--workloads", "nop,madd,pincpy", "--runs", "1",
		"--timing", "none", "--json", "--matrix-dim", "32", "--copy-size", "16MiB", "--vram", "3GiB")
	calls := map[string]float64{}
	for _, r := range results {
		if !r.Verified {
			t.Errorf("%s %s: %s", r.Mode, r.Workload, r.Error)
		}
		if r.Mode == "native" {
			continue
		}
		num := func(k string) float64 { f, _ := r.Counters[k].(float64); return f }
		if num("hypercalls") == 0 || num("ptes_mapped") == 0 || num("scans") != 0 || num("pv_rejected") != 0 || num("denied") != 0 {
			t.Errorf("%s %s counters: %v", r.Mode, r.Workload, r.Counters)
		}
		if r.Workload == "pincpy" {
			calls[r.Mode] = num("hypercalls")
		}
	}
	if n, m := calls["pv-naive"], calls["pv-multicall"]; m == 0 || n < 50*m {
		t.Errorf("pincpy: %v hypercalls without multicall, %v with: want at least 50× fewer", n, m)
	}
	t.Logf("pincpy hypercalls: %v without multicall, %v with", calls["pv-naive"], calls["pv-multicall"])
}

// benchResult is one result of `gpuvm bench --json`, as the tests read it.
type benchResult struct {
	Mode, Workload string
	Verified       bool
	Error          string
	Counters       map[string]any `json:"counters"`
}

// benchResults runs `gpuvm bench` with args (which must ask for --json)
// and returns its results.
func benchResults(t *testing.T, args ...string) []benchResult {
	t.Helper()
	out, stderr, err := runApp(t, append([]string{"bench"}, args...)...)
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, stderr)
	}
	var rep struct{ Results []benchResult }
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not JSON: %v", err)
	}
	return rep.Results
}

// TestBenchPVDRMModes: every workload verifies in pvdrm and pvdrm-pooling
// over the real handshake and ring, nothing of the guest traps, and pooling
// shares pincpy's pages less often than no pooling.
func TestBenchPVDRMModes(t *testing.T) {
	if testing.Short() {
		t.Skip("the pvdrm bench runs in the full suite; -short keeps the in-process pvdrm tests")
	}
	results := benchResults(t, "--mode", "native,pvdrm,pvdrm-pooling", "--workloads", "all", "--runs", "2",
		"--timing", "none", "--json", "--matrix-dim", "32", "--copy-size", "16MiB", "--loop-iterations", "1000", "--rodinia-scale", "16", "--vram", "3GiB")
	shares := map[string]float64{}
	for _, r := range results {
		if !r.Verified {
			t.Errorf("%s %s: %s", r.Mode, r.Workload, r.Error)
		}
		if r.Mode == "native" {
			continue
		}
		num := func(k string) float64 { f, _ := r.Counters[k].(float64); return f }
		if num("pvdrm_requests") == 0 || num("doorbells") == 0 || num("scans") != 0 || num("pvdrm_rejected") != 0 || num("denied") != 0 ||
			num("ring_round_trip_ns") <= 0 || num("mmio_round_trip_ns") <= 0 {
			t.Errorf("%s %s counters: %v", r.Mode, r.Workload, r.Counters)
		}
		if r.Workload == "pincpy" {
			shares[r.Mode] = num("pvdrm_shares")
			if r.Mode == "pvdrm-pooling" && num("pvdrm_pool_hits") == 0 {
				t.Errorf("pincpy with pooling: no pool hits: %v", r.Counters)
			}
		}
	}
	if s, p := shares["pvdrm"], shares["pvdrm-pooling"]; s == 0 || p >= s {
		t.Errorf("pincpy page shares per run: %v without pooling, %v with: want fewer with", s, p)
	}
	t.Logf("pincpy page shares per run: %v without pooling, %v with", shares["pvdrm"], shares["pvdrm-pooling"])
}
