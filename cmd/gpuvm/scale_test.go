package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuvm/gpuvm/bench"
)

// The scaling harness end to end, small: 1 and 4 real VM processes, every
// VM's result verified, the documented JSON fields present and sane, the
// chart written. (How the costs grow is a measurement, not asserted: a 1 s
// run on a shared machine is too noisy for a threshold.)
func TestBenchScaleJSON(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 5 VM processes")
	}
	dir := t.TempDir()
	// In a process of its own, as an operator runs it: its memory figures
	// (the process's live heap with the VMs attached, less before) must not
	// count what the other tests of this binary free meanwhile.
	cmd := selfCommand(context.Background(), []string{"bench", "scale", "--vms", "1,4", "--duration", "1s", "--json", "--svg", dir})
	var stdout, stderrBuf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderrBuf
	if err := cmd.Run(); err != nil {
		t.Fatalf("scale: %v\n%s", err, stderrBuf.String())
	}
	out := stdout.String()
	var rep struct {
		CPUs    int              `json:"cpus"`
		BaseVMs int              `json:"base_vms"`
		Runs    []map[string]any `json:"runs"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if rep.CPUs < 1 || rep.BaseVMs != 1 || len(rep.Runs) != 2 {
		t.Fatalf("report: cpus %d, base %d VMs, %d runs", rep.CPUs, rep.BaseVMs, len(rep.Runs))
	}
	positive := []string{"window_s", "iterations_per_s", "iteration_ms", "cost_per_iteration_us",
		"aggregator_cpu_ms_per_vm_per_s", "aggregator_cpu_us_per_iteration", "vm_cpu_us_per_iteration", "cpu_us_per_iteration",
		"heap_kib_per_vm", "vm_rss_kib", "decision_ns", "next_ns", "decisions_per_s", "submissions_per_s",
		"requests_per_iteration", "setup_ms"}
	present := []string{"overhead_per_vm", "cpu_overhead_per_vm", "rss_kib_per_vm", "anon_kib_per_vm", "cpu_busy", "host_busy"}
	for i, r := range rep.Runs {
		vms := []float64{1, 4}[i]
		if r["vms"] != vms || r["mode"] != "fv-optimized" || r["policy"] != "band" || r["verified"] != true {
			t.Errorf("run %d: vms %v mode %v policy %v verified %v", i, r["vms"], r["mode"], r["policy"], r["verified"])
		}
		for _, k := range positive {
			if v, ok := r[k].(float64); !ok || !(v > 0) {
				t.Errorf("%v VMs: %s = %v, want a positive number", vms, k, r[k])
			}
		}
		for _, k := range present {
			if _, ok := r[k].(float64); !ok {
				t.Errorf("%v VMs: %s = %v, want a number", vms, k, r[k])
			}
		}
		if r["decision_ns"].(float64) < r["next_ns"].(float64) {
			t.Errorf("%v VMs: a decision (%v ns) shorter than its Next (%v ns)", vms, r["decision_ns"], r["next_ns"])
		}
		if b := r["cpu_busy"].(float64); b <= 0 {
			t.Errorf("%v VMs: cpu_busy %v", vms, b)
		}
		loads, _ := r["loads"].([]any)
		if len(loads) != int(vms) {
			t.Fatalf("%v VMs: %d loads", vms, len(loads))
		}
		for _, l := range loads {
			if l.(map[string]any)["verified"] != true {
				t.Errorf("%v VMs: a VM's result did not verify: %v", vms, l)
			}
		}
	}
	if r := rep.Runs[0]; r["overhead_per_vm"] != 0.0 || r["cpu_overhead_per_vm"] != 0.0 {
		t.Errorf("the base run's overheads: %v, %v", r["overhead_per_vm"], r["cpu_overhead_per_vm"])
	}
	svg, err := os.ReadFile(filepath.Join(dir, "scaling.svg"))
	if err != nil || !bytes.Contains(svg, []byte("<svg")) || !bytes.Contains(svg, []byte("decision time")) {
		t.Errorf("scaling.svg: %v\n%.200s", err, svg)
	}
}

// --vms takes counts 1..64 and refuses the rest as usage errors, before
// starting anything.
func TestBenchScaleVMCounts(t *testing.T) {
	for _, bad := range []string{"0", "65", "1,x", ""} {
		_, _, err := runApp(t, "bench", "scale", "--vms", bad)
		var ee *exitError
		if !errors.As(err, &ee) || ee.code != exitUsage || !strings.Contains(err.Error(), "1..64") {
			t.Errorf("--vms %q: %v, want a usage error naming 1..64", bad, err)
		}
	}
	if got, err := parseScaleCounts("1, 8,32,64"); err != nil || len(got) != 4 || got[3] != 64 {
		t.Errorf("parseScaleCounts = %v, %v", got, err)
	}
}

// The table has a row per run and the columns the issue asks for.
func TestScaleTable(t *testing.T) {
	var b bytes.Buffer
	rep := bench.ScaleReport{CPUs: 2, BaseVMs: 1, Runs: []bench.ScaleRun{
		{VMs: 1, Mode: "fv-optimized", Policy: "band", IterationsPerS: 1000, IterationMs: 1},
		{VMs: 8, Mode: "fv-optimized", Policy: "band", IterationsPerS: 900, IterationMs: 8.9, OverheadPerVM: 0.111},
	}}
	if err := writeScaleTable(&b, rep); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"IT/S TOTAL", "IT ms/VM", "OVERHEAD/VM", "AGG CPU ms/VM/s", "HEAP KiB/VM", "RSS KiB/VM", "DECISION ns", "DECISIONS/s", "+11.1%", "overheads against 1 VM"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
	if n := strings.Count(b.String(), "\n"); n != 5 {
		t.Errorf("%d lines:\n%s", n, b.String())
	}
}

// scaling.svg draws one line per measured cost, as the log of its ratio to
// the base run's; a cost the base did not measure is left out.
func TestScaleSVG(t *testing.T) {
	run := func(vms int, k float64) bench.ScaleRun {
		return bench.ScaleRun{VMs: vms, Mode: "fv-optimized", Policy: "band", CostPerIterationUs: 100 * k, CPUUsPerIteration: 200 * k,
			AggCPUUsPerIteration: 50 * k, AggCPUUsPerRequest: 50, HeapKiBPerVM: 2000, DecisionNs: 300 * k}
	}
	rep := bench.ScaleReport{CPUs: 2, BaseVMs: 1, Runs: []bench.ScaleRun{run(8, 10), run(1, 1), run(64, 100)}}
	dir := t.TempDir()
	if err := writeScaleSVG(dir, rep); err != nil {
		t.Fatal(err)
	}
	svg, err := os.ReadFile(filepath.Join(dir, "scaling.svg"))
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(svg, []byte(`class="series"`)); n != 6 {
		t.Errorf("%d lines, want 6", n)
	}
	rep.Runs[1].DecisionNs = 0
	if err := writeScaleSVG(dir, rep); err != nil {
		t.Fatal(err)
	}
	svg, _ = os.ReadFile(filepath.Join(dir, "scaling.svg"))
	if n := bytes.Count(svg, []byte(`class="series"`)); n != 5 || bytes.Contains(svg, []byte("decision time")) {
		t.Errorf("with no decision time at the base: %d lines", n)
	}
	if err := writeScaleSVG(dir, bench.ScaleReport{}); err == nil {
		t.Error("no runs: a chart")
	}
}
