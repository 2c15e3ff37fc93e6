package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/host"
)

// HeteroOptions configure gpuvm bench hetero (issue 17: placement and load
// balancing on a heterogeneous pair, as in Becchi et al., HPDC '12): a
// fast board and a slow one under one host, VM processes looping verified
// madd and cpy over the real protocol, placed by the host's placement,
// with and without its load balancer.
type HeteroOptions struct {
	// Board is both boards' configuration but for the timing (their VRAM
	// is sized from the slots, as gpuvm bench mobility's); Fast and Slow
	// are the two boards' timing profiles.
	Board      sim.Config
	Fast, Slow sim.Timing
	// VMs is how many VMs each phase runs; Modes their modes, VM i
	// Modes[i % len(Modes)].
	VMs   int
	Modes []string
	// Phases are the phases to run, in order (HeteroPhases names them).
	Phases []string
	// Duration is each phase's load, measured after Settle.
	Duration time.Duration
	// MatrixDim is madd's dimension, CopyBytes cpy's size each way.
	MatrixDim int
	CopyBytes uint64
	// Balance configures the balancer of the phases that use it (its
	// Policy is set by the phase).
	Balance host.BalanceOptions
	// ServerSpin is the aggregator's IPC spin budget per VM connection.
	ServerSpin int
	Command    VMCommand
	Progress   func(msg string)
	Logger     *slog.Logger
}

// Hetero phases.
const (
	// HeteroFastOnly and HeteroSlowOnly are references: the host has only
	// the fast board, or only the slow one, and every VM is on it.
	HeteroFastOnly = "fast-only"
	HeteroSlowOnly = "slow-only"
	// HeteroStatic: both boards, the VMs placed as placement chooses (it
	// spreads them), no balancer.
	HeteroStatic = "static"
	// HeteroBalanced: the same start, the load balancer on.
	HeteroBalanced = "balanced"
	// HeteroSlowFirst: the fast board cordoned while the VMs attach (so
	// all of them land on the slow one), then put back in service with the
	// balancer on: the work migrates from the slow GPU to the fast one.
	HeteroSlowFirst = "slow-then-balanced"
)

// HeteroPhases lists the phases, in the order they run by default.
func HeteroPhases() []string {
	return []string{HeteroFastOnly, HeteroSlowOnly, HeteroStatic, HeteroBalanced, HeteroSlowFirst}
}

// Board names of the hetero host.
const (
	heteroFast = "fast"
	heteroSlow = "slow"
)

// HeteroBoard is one board of a phase's host.
type HeteroBoard struct {
	Name   string `json:"name"`
	Timing string `json:"timing"`
	// DMABytesPerSec is its bus rate for copies to and from system memory.
	DMABytesPerSec float64 `json:"dma_bytes_per_s"`
}

// HeteroPlace is where a VM was.
type HeteroPlace struct {
	VM    string `json:"vm"`
	Mode  string `json:"mode"`
	VGPU  int    `json:"vgpu"`
	Board string `json:"board"`
}

// HeteroMove is one move the balancer made.
type HeteroMove struct {
	// AtNs is its time from the start of the phase's measurement.
	AtNs int64  `json:"at_ns"`
	VM   string `json:"vm"`
	VGPU int    `json:"vgpu"`
	From string `json:"from"`
	To   string `json:"to"`
	// Load is the vGPU's own load and Gap the boards' load gap the
	// balancer saw.
	Load float64 `json:"vgpu_load"`
	Gap  float64 `json:"gap"`
	// Bytes is the VRAM in use copied, DowntimeNs the guest's pause,
	// CopyNs the copy's part of it (0 if the aggregator's record of the
	// move was not found).
	Bytes      uint64 `json:"vram_bytes"`
	DowntimeNs int64  `json:"downtime_ns"`
	CopyNs     int64  `json:"copy_ns"`
	Failed     bool   `json:"failed,omitempty"`
	Reason     string `json:"reason"`
}

// HeteroRate is runs per second over a window: the phase's, per VM and
// per board.
type HeteroRate struct {
	// FromNs is the window's start from the start of the measurement, Ns
	// its length.
	FromNs int64 `json:"from_ns"`
	Ns     int64 `json:"ns"`
	// Total is every VM's runs per second, summed; Boards and VMs the same
	// per board (each run counted on the board it ran on, a run across a
	// move split by time) and per VM.
	Total  float64            `json:"runs_per_s"`
	Boards map[string]float64 `json:"board_runs_per_s"`
	VMs    map[string]float64 `json:"vm_runs_per_s"`
}

// HeteroBoardRuns is what ran on one board over a phase's measurement: runs
// of each workload wholly on it and their median wall-clock time.
type HeteroBoardRuns struct {
	Board    string `json:"board"`
	Workload string `json:"workload"`
	Runs     int    `json:"runs"`
	MedianNs int64  `json:"median_ns"`
}

// HeteroPhase is one phase's summary.
type HeteroPhase struct {
	Name    string        `json:"name"`
	Balance bool          `json:"balance"`
	Boards  []HeteroBoard `json:"boards"`
	// Start is where placement put each VM, End where it ended.
	Start []HeteroPlace `json:"start"`
	End   []HeteroPlace `json:"end"`
	Moves []HeteroMove  `json:"moves"`
	// UncordonNs is when the fast board was put back in service
	// (slow-then-balanced; from the start of the measurement).
	UncordonNs int64 `json:"uncordon_ns,omitempty"`
	// Whole is the throughput over the whole measurement; Final over its
	// part after the last change of placement (the last move, or the
	// uncordon) and the balancer's settling — the placement the phase
	// ended with (nil when that part is under a second).
	Whole HeteroRate  `json:"whole"`
	Final *HeteroRate `json:"final,omitempty"`
	// Before is slow-then-balanced's throughput before the uncordon (every
	// VM on the slow board).
	Before *HeteroRate `json:"before_uncordon,omitempty"`
	// Runs are each board's runs per workload.
	Runs []HeteroBoardRuns `json:"board_runs"`
	// Verified: every run of every VM of the phase verified.
	Verified bool `json:"verified"`
	// Looks counts the balancer's looks by outcome; MaxGap is the largest
	// load gap it saw, and Loads each board's load (the share of its time
	// its vGPUs kept it busy) averaged over its looks.
	Looks  map[string]int     `json:"balancer_looks,omitempty"`
	MaxGap float64            `json:"balancer_max_gap,omitempty"`
	Loads  map[string]float64 `json:"balancer_mean_load,omitempty"`
}

// HeteroReport is gpuvm bench hetero's output.
type HeteroReport struct {
	DurationNs int64       `json:"duration_ns"`
	VMs        int         `json:"vms"`
	CopyBytes  uint64      `json:"copy_bytes"`
	MatrixDim  int         `json:"matrix_dim"`
	Fast       HeteroBoard `json:"fast"`
	Slow       HeteroBoard `json:"slow"`
	// Results are every VM's results of every phase, in gpuvm bench's
	// shape (each with its phase in VMs).
	Results []Result           `json:"results"`
	Phases  []HeteroPhase      `json:"phases"`
	VMList  []MobilityVM       `json:"vm_results"`
	Ratios  map[string]float64 `json:"ratios"`
	// Problems are what went wrong: a result that did not verify, a VM
	// that failed or lost its device, a move that failed.
	Problems []string `json:"problems,omitempty"`
}

// OK reports whether every result verified and nothing went wrong.
func (r HeteroReport) OK() bool { return len(r.Problems) == 0 && len(r.Results) > 0 }

func (o HeteroOptions) mobility() MobilityOptions {
	return MobilityOptions{Board: o.Board, Modes: o.Modes, Duration: o.Duration, MatrixDim: o.MatrixDim, CopyBytes: o.CopyBytes,
		ServerSpin: o.ServerSpin, Command: o.Command, Progress: o.Progress, Logger: o.Logger}
}

func (o HeteroOptions) progress(format string, args ...any) { o.mobility().progress(format, args...) }

// settle is how long a phase lets its VMs run before it measures.
func (o HeteroOptions) settle() time.Duration { return min(o.Duration/4, 2*time.Second) }

// heteroHost is one phase's host with what its balancer did.
type heteroHost struct {
	*mobilityHost

	mu     sync.Mutex
	looks  []host.BalanceLook // the moved and failed ones
	count  map[string]int
	maxGap float64
	loads  map[string]float64 // summed over the looks
	nLooks int
}

// newHeteroHost builds a host of the boards in specs, each with slots for
// every VM, its balancer set by bal, serving on a private socket.
func newHeteroHost(ctx context.Context, o HeteroOptions, specs []boardSpec, bal host.BalanceOptions) (*heteroHost, error) {
	hh := &heteroHost{count: map[string]int{}, loads: map[string]float64{}}
	for i := range specs {
		specs[i].slots = o.VMs
	}
	bal.Looked = func(l host.BalanceLook) {
		hh.mu.Lock()
		defer hh.mu.Unlock()
		hh.count[l.Outcome]++
		hh.maxGap = max(hh.maxGap, l.Gap)
		hh.nLooks++
		for _, c := range l.Boards {
			hh.loads[c.Board] += c.Load
		}
		if l.Outcome == host.LookMoved || l.Outcome == host.LookFailed {
			hh.looks = append(hh.looks, l)
		}
	}
	m, err := newMobilityHost(ctx, o.mobility(), specs, host.Options{Balance: bal})
	if err != nil {
		return nil, err
	}
	hh.mobilityHost = m
	return hh, nil
}

// places returns where each VM of vms is now.
func (hh *heteroHost) places(vms *mobilityVMs, modes []string) []HeteroPlace {
	out := make([]HeteroPlace, len(vms.names))
	for i, name := range vms.names {
		out[i] = HeteroPlace{VM: name, Mode: modes[i], VGPU: -1}
		if b, v := hh.vgpu(name); v != nil {
			out[i].VGPU, out[i].Board = v.ID, b.Name
		}
	}
	return out
}

// RunHetero runs the phases of gpuvm bench hetero, each on a fresh host
// with fresh VM processes. A phase that could not run at all is an error;
// what went wrong inside one (a run that did not verify, a move that
// failed) is in the report's Problems.
func RunHetero(ctx context.Context, o HeteroOptions) (HeteroReport, error) {
	rep := HeteroReport{DurationNs: int64(o.Duration), VMs: o.VMs, CopyBytes: o.CopyBytes, MatrixDim: o.MatrixDim,
		Fast:    HeteroBoard{Name: heteroFast, Timing: o.Fast.Name, DMABytesPerSec: o.Fast.DMABytesPerSec},
		Slow:    HeteroBoard{Name: heteroSlow, Timing: o.Slow.Name, DMABytesPerSec: o.Slow.DMABytesPerSec},
		Results: []Result{}, Phases: []HeteroPhase{}, Ratios: map[string]float64{}}
	if len(o.Modes) == 0 || o.VMs < 1 || len(o.Phases) == 0 {
		return rep, errors.New("bench hetero: no modes, VMs or phases")
	}
	for _, name := range o.Phases {
		if !slices.Contains(HeteroPhases(), name) {
			return rep, fmt.Errorf("bench hetero: unknown phase %q (have %v)", name, HeteroPhases())
		}
		ph, err := runHeteroPhase(ctx, o, name, &rep)
		if err != nil {
			return rep, fmt.Errorf("bench hetero: %s phase: %w", name, err)
		}
		rep.Phases = append(rep.Phases, ph)
	}
	rep.Ratios = heteroRatios(rep.Phases)
	return rep, nil
}

// heteroRatios are the comparisons between the phases of this one run:
// each phase's total throughput over static's (whole measurement and
// final placement), and the fast board's runs per VM over the slow one's
// in the static phase.
func heteroRatios(phases []HeteroPhase) map[string]float64 {
	out := map[string]float64{}
	var static *HeteroPhase
	for i := range phases {
		if phases[i].Name == HeteroStatic {
			static = &phases[i]
		}
	}
	if static == nil || static.Whole.Total == 0 {
		return out
	}
	for _, p := range phases {
		if p.Name == HeteroStatic {
			continue
		}
		out[p.Name+"_over_static"] = p.Whole.Total / static.Whole.Total
		if p.Final != nil && static.Final != nil && static.Final.Total > 0 {
			out[p.Name+"_final_over_static"] = p.Final.Total / static.Final.Total
		}
	}
	// Per VM on each board in the static phase.
	per := map[string]int{}
	for _, pl := range static.Start {
		per[pl.Board]++
	}
	if per[heteroFast] > 0 && per[heteroSlow] > 0 && static.Whole.Boards[heteroSlow] > 0 {
		out["static_fast_over_slow_per_vm"] = (static.Whole.Boards[heteroFast] / float64(per[heteroFast])) /
			(static.Whole.Boards[heteroSlow] / float64(per[heteroSlow]))
	}
	return out
}
