package bench

import (
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
)

// ScaleRun is one VM count of the scaling harness. Rates and CPU times are
// over the measured window (the middle of the VMs' common loop period);
// iteration times are each VM's own, over its whole loop.
type ScaleRun struct {
	VMs    int    `json:"vms"`
	Mode   string `json:"mode"`
	Policy string `json:"policy"`
	// WindowS is the measured window, in seconds.
	WindowS float64 `json:"window_s"`
	// IterationsPerS is the aggregate throughput: the sum over the VMs of
	// 1 / their mean iteration time.
	IterationsPerS float64 `json:"iterations_per_s"`
	// IterationMs is the VMs' mean iteration time (mean over the VMs), and
	// IterationMinMs and IterationMaxMs the fastest and slowest VM's.
	IterationMs    float64 `json:"iteration_ms"`
	IterationMinMs float64 `json:"iteration_min_ms"`
	IterationMaxMs float64 `json:"iteration_max_ms"`
	// CostPerIterationUs is 1 / IterationsPerS: the machine's wall time per
	// iteration of any VM. Flat in N means flat per-VM overhead: N VMs
	// split the same throughput, each iteration taking N times as long.
	CostPerIterationUs float64 `json:"cost_per_iteration_us"`
	// OverheadPerVM is CostPerIterationUs over the base run's, minus 1
	// (ScaleReport.BaseVMs: 1 VM by default). Equivalently, for VMs of
	// equal speed: (iteration time / N) over the base's, minus 1.
	OverheadPerVM float64 `json:"overhead_per_vm"`
	// AggCPUMsPerVMPerS is the aggregator process's CPU time per second
	// of the window, per VM.
	AggCPUMsPerVMPerS float64 `json:"aggregator_cpu_ms_per_vm_per_s"`
	// AggCPUUsPerIteration and VMCPUUsPerIteration are the aggregator's
	// and the VM processes' (all of them) CPU time per iteration of any
	// VM; CPUUsPerIteration is their sum, and CPUOverheadPerVM it over the
	// base run's, minus 1.
	AggCPUUsPerIteration float64 `json:"aggregator_cpu_us_per_iteration"`
	VMCPUUsPerIteration  float64 `json:"vm_cpu_us_per_iteration"`
	CPUUsPerIteration    float64 `json:"cpu_us_per_iteration"`
	CPUOverheadPerVM     float64 `json:"cpu_overhead_per_vm"`
	// CPUBusy is the aggregator's and VMs' CPU time over the window's
	// capacity (window × CPUs); HostBusy the whole host's busy share
	// (/proc/stat), which also counts other users of the machine.
	CPUBusy  float64 `json:"cpu_busy"`
	HostBusy float64 `json:"host_busy"`
	// HeapKiBPerVM and RSSKiBPerVM are the aggregator process's live Go
	// heap and resident set with the VMs attached, less without them, per
	// VM; AnonKiBPerVM is the resident set less its shared pages (the
	// board's VRAM and the guests' RAM memfds), per VM. VMRSSKiB is a VM
	// process's own resident set, the mean over the VMs.
	HeapKiBPerVM float64 `json:"heap_kib_per_vm"`
	RSSKiBPerVM  float64 `json:"rss_kib_per_vm"`
	AnonKiBPerVM float64 `json:"anon_kib_per_vm"`
	VMRSSKiB     float64 `json:"vm_rss_kib"`
	// DecisionNs is the dispatcher's mean decision time (the policy's Next,
	// the release and the overhead charge: aggregator.DispatchStats), and
	// NextNs the policy's Next alone; DecisionsPerS and SubmissionsPerS
	// are the decisions taken and the submissions completed per second.
	DecisionNs      float64 `json:"decision_ns"`
	NextNs          float64 `json:"next_ns"`
	DecisionsPerS   float64 `json:"decisions_per_s"`
	SubmissionsPerS float64 `json:"submissions_per_s"`
	// SetupMs is a VM's mean time from its process start to ready at the
	// start gate (attached, its guest driver and context set up, the madd
	// loaded), with ScaleOptions.SetupConcurrency setting up at once while
	// the VMs already ready poll the gate; SetupMaxMs the slowest VM's.
	SetupMs    float64 `json:"setup_ms"`
	SetupMaxMs float64 `json:"setup_max_ms"`
	// RequestsPerIteration is the VMs' requests to the aggregator (trapped
	// register and aperture accesses, pvdrm requests) per iteration, and
	// AggCPUUsPerRequest the aggregator's CPU time per request.
	RequestsPerIteration float64 `json:"requests_per_iteration"`
	AggCPUUsPerRequest   float64 `json:"aggregator_cpu_us_per_request"`
	// Verified: every VM's result verified.
	Verified bool        `json:"verified"`
	Loads    []GuestLoad `json:"loads"`
}

// ScaleReport is the scaling harness' whole output.
type ScaleReport struct {
	// CPUs is the host's CPU count.
	CPUs int `json:"cpus"`
	// BaseVMs is the run the overheads are relative to: the smallest VM
	// count (1 by default).
	BaseVMs int        `json:"base_vms"`
	Runs    []ScaleRun `json:"runs"`
}

// scaleSample is what the harness measured of one run.
type scaleSample struct {
	vms          int
	mode, policy string
	cpus         int
	window       time.Duration
	loads        []GuestLoad
	aggCPU       time.Duration // the aggregator process, over the window
	vmCPU        time.Duration // the VM processes together, over the window
	hostBusy     float64
	base, loaded memSample // the aggregator without VMs, and with them
	vmRSS        []uint64  // each VM process's resident set
	disp         aggregator.DispatchStats
	setup        []time.Duration // each VM's set-up time
	requests     uint64          // the VMs' requests to the aggregator, over the window
}

// kib is bytes (as a signed difference) in KiB.
func kib(b float64) float64 { return b / 1024 }

// summarizeScale turns a run's sample into its row.
func summarizeScale(s scaleSample) ScaleRun {
	r := ScaleRun{VMs: s.vms, Mode: s.mode, Policy: s.policy, WindowS: s.window.Seconds(), Loads: s.loads, Verified: len(s.loads) == s.vms}
	var sumMs float64
	for i, l := range s.loads {
		r.Verified = r.Verified && l.Verified
		if l.MeanIterNs > 0 {
			r.IterationsPerS += 1e9 / l.MeanIterNs
		}
		ms := l.MeanIterNs / 1e6
		sumMs += ms
		if i == 0 || ms < r.IterationMinMs {
			r.IterationMinMs = ms
		}
		r.IterationMaxMs = max(r.IterationMaxMs, ms)
	}
	if len(s.loads) > 0 {
		r.IterationMs = sumMs / float64(len(s.loads))
	}
	w := s.window.Seconds()
	n := float64(max(s.vms, 1))
	iters := r.IterationsPerS * w // of all the VMs, in the window
	if r.IterationsPerS > 0 {
		r.CostPerIterationUs = 1e6 / r.IterationsPerS
	}
	if w > 0 {
		r.AggCPUMsPerVMPerS = float64(s.aggCPU.Microseconds()) / 1e3 / w / n
		r.CPUBusy = (s.aggCPU + s.vmCPU).Seconds() / (w * float64(max(s.cpus, 1)))
		r.DecisionsPerS = float64(s.disp.Decisions) / w
		r.SubmissionsPerS = float64(s.disp.Completed) / w
	}
	if iters > 0 {
		r.AggCPUUsPerIteration = float64(s.aggCPU.Nanoseconds()) / 1e3 / iters
		r.VMCPUUsPerIteration = float64(s.vmCPU.Nanoseconds()) / 1e3 / iters
		r.CPUUsPerIteration = r.AggCPUUsPerIteration + r.VMCPUUsPerIteration
		r.RequestsPerIteration = float64(s.requests) / iters
	}
	if s.requests > 0 {
		r.AggCPUUsPerRequest = float64(s.aggCPU.Nanoseconds()) / 1e3 / float64(s.requests)
	}
	r.HostBusy = s.hostBusy
	r.HeapKiBPerVM = kib(float64(s.loaded.Heap)-float64(s.base.Heap)) / n
	r.RSSKiBPerVM = kib(float64(s.loaded.Resident)-float64(s.base.Resident)) / n
	anon := func(m memSample) float64 { return float64(m.Resident) - float64(m.Shared) }
	r.AnonKiBPerVM = kib(anon(s.loaded)-anon(s.base)) / n
	if len(s.vmRSS) > 0 {
		var sum uint64
		for _, b := range s.vmRSS {
			sum += b
		}
		r.VMRSSKiB = kib(float64(sum)) / float64(len(s.vmRSS))
	}
	if s.disp.Decisions > 0 {
		r.DecisionNs = float64(s.disp.DecisionTime.Nanoseconds()) / float64(s.disp.Decisions)
		r.NextNs = float64(s.disp.NextTime.Nanoseconds()) / float64(s.disp.Decisions)
	}
	if len(s.setup) > 0 {
		var sum time.Duration
		for _, d := range s.setup {
			sum += d
			r.SetupMaxMs = max(r.SetupMaxMs, float64(d.Microseconds())/1e3)
		}
		r.SetupMs = float64(sum.Microseconds()) / 1e3 / float64(len(s.setup))
	}
	return r
}

// relateScale sets the overheads of runs against the run with the fewest
// VMs, and returns that count (0 without runs).
func relateScale(runs []ScaleRun) int {
	if len(runs) == 0 {
		return 0
	}
	base := runs[0]
	for _, r := range runs[1:] {
		if r.VMs < base.VMs {
			base = r
		}
	}
	for i := range runs {
		if base.CostPerIterationUs > 0 {
			runs[i].OverheadPerVM = runs[i].CostPerIterationUs/base.CostPerIterationUs - 1
		}
		if base.CPUUsPerIteration > 0 {
			runs[i].CPUOverheadPerVM = runs[i].CPUUsPerIteration/base.CPUUsPerIteration - 1
		}
	}
	return base.VMs
}
