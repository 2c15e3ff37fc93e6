package bench

import (
	"math"
	"os"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
)

func nearScale(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

// The scaling summary's arithmetic on a made-up sample: throughput as the
// sum of the VMs' rates, CPU and memory per VM and per iteration, the
// decision cost per decision.
func TestSummarizeScale(t *testing.T) {
	const kib = 1024
	s := scaleSample{
		vms: 2, mode: "fv-optimized", policy: "band", cpus: 2, window: 2 * time.Second,
		loads: []GuestLoad{
			{Kind: "madd", Iterations: 2000, MeanIterNs: 1e6, Verified: true}, // 1000 it/s
			{Kind: "madd", Iterations: 1000, MeanIterNs: 2e6, Verified: true}, // 500 it/s
		},
		aggCPU: time.Second, vmCPU: 2 * time.Second, hostBusy: 0.9,
		base:   memSample{Heap: 1000, statm: statm{Resident: 10000 * kib, Shared: 4000 * kib}},
		loaded: memSample{Heap: 1000 + 2*2*kib, statm: statm{Resident: 10000*kib + 2*8*kib, Shared: 4000*kib + 2*3*kib}},
		vmRSS:  []uint64{20 * kib, 30 * kib},
		disp: aggregator.DispatchStats{Decisions: 100, DecisionTime: 100 * time.Microsecond,
			NextTime: 20 * time.Microsecond, Completed: 50},
		setup:    []time.Duration{time.Second, 3 * time.Second},
		requests: 3000,
	}
	r := summarizeScale(s)
	want := []struct {
		name      string
		got, want float64
	}{
		{"iterations/s", r.IterationsPerS, 1500},
		{"iteration ms", r.IterationMs, 1.5},
		{"fastest VM ms", r.IterationMinMs, 1},
		{"slowest VM ms", r.IterationMaxMs, 2},
		{"cost per iteration µs", r.CostPerIterationUs, 1e6 / 1500},
		{"aggregator CPU ms per VM per s", r.AggCPUMsPerVMPerS, 250},            // 1 s over 2 s, 2 VMs
		{"aggregator CPU µs per iteration", r.AggCPUUsPerIteration, 1e6 / 3000}, // 1500 it/s × 2 s
		{"VM CPU µs per iteration", r.VMCPUUsPerIteration, 2e6 / 3000},
		{"CPU µs per iteration", r.CPUUsPerIteration, 3e6 / 3000},
		{"CPU busy", r.CPUBusy, 0.75}, // 3 s of 2 s × 2 CPUs
		{"host busy", r.HostBusy, 0.9},
		{"heap KiB per VM", r.HeapKiBPerVM, 2},
		{"RSS KiB per VM", r.RSSKiBPerVM, 8},
		{"anonymous KiB per VM", r.AnonKiBPerVM, 5},
		{"VM RSS KiB", r.VMRSSKiB, 25},
		{"decision ns", r.DecisionNs, 1000},
		{"Next ns", r.NextNs, 200},
		{"decisions/s", r.DecisionsPerS, 50},
		{"submissions/s", r.SubmissionsPerS, 25},
		{"requests per iteration", r.RequestsPerIteration, 1},
		{"aggregator CPU µs per request", r.AggCPUUsPerRequest, 1e6 / 3000},
		{"set-up ms", r.SetupMs, 2000},
		{"slowest set-up ms", r.SetupMaxMs, 3000},
		{"window s", r.WindowS, 2},
	}
	for _, w := range want {
		if !nearScale(w.got, w.want) {
			t.Errorf("%s = %v, want %v", w.name, w.got, w.want)
		}
	}
	if !r.Verified || r.VMs != 2 || r.Mode != "fv-optimized" || r.Policy != "band" || len(r.Loads) != 2 {
		t.Errorf("run = %+v", r)
	}

	s.loads[1].Verified = false
	if summarizeScale(s).Verified {
		t.Error("a VM that did not verify: the run says verified")
	}
	s.loads = s.loads[:1]
	s.loads[0].Verified = true
	if summarizeScale(s).Verified {
		t.Error("one VM's summary missing: the run says verified")
	}
}

// Overheads are relative to the run with the fewest VMs, wherever it is in
// the list.
func TestRelateScale(t *testing.T) {
	if relateScale(nil) != 0 {
		t.Error("no runs: a base VM count")
	}
	runs := []ScaleRun{
		{VMs: 8, CostPerIterationUs: 200, CPUUsPerIteration: 400},
		{VMs: 1, CostPerIterationUs: 100, CPUUsPerIteration: 100},
		{VMs: 64, CostPerIterationUs: 100, CPUUsPerIteration: 50},
	}
	if base := relateScale(runs); base != 1 {
		t.Errorf("base = %d VMs, want 1", base)
	}
	for i, want := range [][2]float64{{1, 3}, {0, 0}, {0, -0.5}} {
		if !nearScale(runs[i].OverheadPerVM, want[0]) || !nearScale(runs[i].CPUOverheadPerVM, want[1]) {
			t.Errorf("%d VMs: overhead %v, CPU overhead %v; want %v", runs[i].VMs, runs[i].OverheadPerVM, runs[i].CPUOverheadPerVM, want)
		}
	}
}

// The measured window is the middle of the loop period.
func TestScaleWindow(t *testing.T) {
	for _, c := range []struct{ d, skip, window time.Duration }{
		{4 * time.Second, 400 * time.Millisecond, 3200 * time.Millisecond},
		{time.Second, 100 * time.Millisecond, 800 * time.Millisecond},
		{30 * time.Second, time.Second, 28 * time.Second},
	} {
		if skip, window := scaleWindow(c.d); skip != c.skip || window != c.window {
			t.Errorf("scaleWindow(%v) = %v, %v; want %v, %v", c.d, skip, window, c.skip, c.window)
		}
	}
}

// The /proc readers read this process.
func TestScaleProc(t *testing.T) {
	if _, err := procCPU(os.Getpid()); err != nil {
		t.Error(err)
	}
	m, err := selfMemory()
	if err != nil || m.Resident == 0 || m.Heap == 0 || m.Shared > m.Resident {
		t.Errorf("selfMemory = %+v, %v", m, err)
	}
	a, err := readHostCPU()
	if err != nil || a.total == 0 || a.busy > a.total {
		t.Errorf("readHostCPU = %+v, %v", a, err)
	}
	if f := busyFraction(hostCPU{busy: 10, total: 100}, hostCPU{busy: 60, total: 200}); !nearScale(f, 0.5) {
		t.Errorf("busyFraction = %v, want 0.5", f)
	}
	if f := busyFraction(a, a); f != 0 {
		t.Errorf("busyFraction over no time = %v", f)
	}
}
