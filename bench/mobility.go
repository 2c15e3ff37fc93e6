package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/host"
	"github.com/gpuvm/gpuvm/ipc"
)

// MobilityOptions configure gpuvm bench mobility (issue 17's "Must show"):
// moves between two boards under load, VRAM overcommit by eviction, and a
// board drain, a board failure and a vGPU reset, each with VM processes
// looping verified madd and cpy against an in-process host of simulated
// boards over the real protocol.
type MobilityOptions struct {
	// Board is each simulated board's configuration (its VRAM is sized
	// per phase from the slots it needs).
	Board sim.Config
	// Modes are the VMs' full-virtualization or PV modes, VM i running
	// Modes[i % len(Modes)]; VM 1, the first moved, should be a BAR-remap
	// mode (fv-optimized) so that a move's remap rebind is exercised.
	Modes []string
	// Duration is the length of each phase's load: the move phase cuts it
	// into quiet segments and segments that begin with a move, the
	// overcommit phase runs it with and again without overcommit.
	Duration time.Duration
	// Moves is how many moves the move phase makes (VMs 1 and 2 in turn,
	// each to the other board).
	Moves int
	// MatrixDim is madd's dimension, CopyBytes cpy's size each way.
	MatrixDim int
	CopyBytes uint64
	// Overcommit is the overcommitted board's factor (2: six VMs, each a
	// whole slot's reservation, on three slots); EvictIdle and
	// MinResidency its eviction options.
	Overcommit   float64
	EvictIdle    time.Duration
	MinResidency time.Duration
	// ServerSpin is the aggregator's IPC spin budget per VM connection.
	ServerSpin int
	Command    VMCommand
	Progress   func(msg string)
	Logger     *slog.Logger
}

// MobilityMove is one move a phase made.
type MobilityMove struct {
	VGPU      int    `json:"vgpu"`
	Name      string `json:"name"`
	Phase     string `json:"phase"`
	FromBoard string `json:"from_board"`
	ToBoard   string `json:"to_board"`
	FromSlot  int    `json:"from_slot"`
	ToSlot    int    `json:"to_slot"`
	// VRAMBytes is the VRAM in use that was copied; DowntimeNs how long the
	// guest was paused, CopyNs the copy's part of it.
	VRAMBytes  uint64 `json:"vram_bytes"`
	DowntimeNs int64  `json:"downtime_ns"`
	CopyNs     int64  `json:"copy_ns"`
	// Verified: every run of the moved VM verified.
	Verified bool   `json:"verified"`
	Error    string `json:"error,omitempty"`
}

// MobilityVM is one VM of one phase (MobilityGuest without each run's
// times).
type MobilityVM struct {
	Phase   string   `json:"phase"`
	Name    string   `json:"name"`
	Mode    string   `json:"mode"`
	VGPU    int      `json:"vgpu"`
	Results []Result `json:"results"`
	// Runs is how many runs it made.
	Runs  int    `json:"runs"`
	Lost  string `json:"lost,omitempty"`
	Error string `json:"error,omitempty"`
	// ExpectLost: its board was failed under it, so its device is expected
	// to be lost.
	ExpectLost bool `json:"expect_lost,omitempty"`
}

// MobilityThroughput compares VMs' runs per second in the move phase's
// quiet segments and in those that began with a move.
type MobilityThroughput struct {
	VMs []string `json:"vms"`
	// Before and During are the VMs' runs per second, summed, in the quiet
	// segments and in the moving ones; Ratio is During over Before (1:
	// unaffected).
	Before float64 `json:"quiet_runs_per_s"`
	During float64 `json:"moving_runs_per_s"`
	Ratio  float64 `json:"ratio"`
}

// MobilityMovePhase is the move phase's summary.
type MobilityMovePhase struct {
	Boards int `json:"boards"`
	VMs    int `json:"vms"`
	// Unaffected are the VMs not moved, Moved the moved ones: each's
	// throughput while moves went on against before.
	Unaffected MobilityThroughput `json:"unaffected"`
	Moved      MobilityThroughput `json:"moved"`
	// DowntimeNsPerMiB is the mean downtime per MiB of VRAM in use copied.
	DowntimeNsPerMiB float64 `json:"downtime_ns_per_mib"`
}

// MobilityOvercommit is the overcommit phase's summary.
type MobilityOvercommit struct {
	Slots      int     `json:"slots"`
	VMs        int     `json:"vms"`
	Factor     float64 `json:"factor"`
	SlotVRAM   uint64  `json:"slot_vram_bytes"`
	Reserved   uint64  `json:"reserved_vram_bytes"` // the VMs' reservations summed
	Evictions  uint64  `json:"evictions"`
	Restores   uint64  `json:"restores"`
	OutBytes   uint64  `json:"evicted_bytes"`
	InBytes    uint64  `json:"restored_bytes"`
	RestoreWNs uint64  `json:"restore_wait_ns"` // every VM's wait for a restore, summed
	// EvictMeanNs and RestoreMeanNs are the mean pause of an eviction and
	// of a restore (copy and teardown or rebuild), P99 their 99th
	// percentiles; RestoreWaitMeanNs a guest's mean wait per restore.
	EvictMeanNs       int64 `json:"evict_mean_ns"`
	EvictP99Ns        int64 `json:"evict_p99_ns"`
	RestoreMeanNs     int64 `json:"restore_mean_ns"`
	RestoreP99Ns      int64 `json:"restore_p99_ns"`
	RestoreWaitMeanNs int64 `json:"restore_wait_mean_ns"`
	// Throughput is the overcommitted VMs' runs per second, summed;
	// BaselineVMs VMs (one per slot, no overcommit) made Baseline on the
	// same board.
	Throughput  float64 `json:"runs_per_s"`
	BaselineVMs int     `json:"baseline_vms"`
	Baseline    float64 `json:"baseline_runs_per_s"`
}

// MobilityOps is the drain, failure and reset phase's summary.
type MobilityOps struct {
	// Reset is the vGPU reset under its looping VM, RecoveredRuns the runs
	// its guest made again after re-initialising.
	ResetVGPU     int    `json:"reset_vgpu"`
	ResetVM       string `json:"reset_vm"`
	ResetNs       int64  `json:"reset_ns"`
	RecoveredRuns int    `json:"recovered_runs"`
	// Drained is the drained board, DrainMoved the vGPUs moved off it,
	// DrainLeft those left (with why), DrainNs the whole drain.
	Drained    string           `json:"drained_board"`
	DrainMoved int              `json:"drain_moved"`
	DrainLeft  []host.DrainLeft `json:"drain_left"`
	DrainNs    int64            `json:"drain_ns"`
	// Failed is the board failed by fault injection, DetectNs how long
	// its aggregator took to find it lost; Lost the VMs that lost their
	// device with it (expected), Survivors the VMs that went on.
	Failed    string   `json:"failed_board"`
	DetectNs  int64    `json:"detect_ns"`
	Lost      []string `json:"lost_vms"`
	Survivors []string `json:"surviving_vms"`
}

// MobilityReport is gpuvm bench mobility's output.
type MobilityReport struct {
	DurationNs int64 `json:"duration_ns"`
	// Results are every VM's results of every phase, in gpuvm bench's
	// shape (a VM that lost its device with a failed board contributes
	// the runs it made before).
	Results    []Result           `json:"results"`
	Moves      []MobilityMove     `json:"moves"`
	MovePhase  MobilityMovePhase  `json:"move_phase"`
	Overcommit MobilityOvercommit `json:"overcommit"`
	Ops        MobilityOps        `json:"ops"`
	VMs        []MobilityVM       `json:"vms"`
	// Problems are what went wrong: a result that did not verify, a VM
	// that failed, a move that failed, a device lost that should not have
	// been (or kept that should have).
	Problems []string `json:"problems,omitempty"`
}

// OK reports whether everything verified and went as expected.
func (r MobilityReport) OK() bool { return len(r.Problems) == 0 && len(r.Results) > 0 }

// mobility partition: every slot 128 MiB of VRAM, 8 channels, small BAR
// slices (up to eight slots fit the apertures).
func mobilityPartition() config.PartitionConfig {
	return config.PartitionConfig{VRAMPerVM: 128 << 20, ChannelsPerVM: 8, BAR1PerVM: 16 << 20, BAR3PerVM: 2 << 20, Reserved: 64 << 20}
}

// boardSpec is one board of a phase's host.
type boardSpec struct {
	name       string
	slots      int
	overcommit float64
	// timing is its timing profile (a zero Name: the options' board's).
	timing sim.Timing
}

// mobilityHost is one phase's host: its boards, serving device models on
// a private socket, and the pauses its aggregators reported.
type mobilityHost struct {
	h      *host.Host
	sims   []*sim.Board
	ln     *ipc.Listener
	dir    string
	stop   context.CancelFunc
	done   chan error
	pauses *pauseLog
}

// pauseLog keeps every pause the aggregators of a host report
// (aggregator.Options.OnPause), in order.
type pauseLog struct {
	mu  sync.Mutex
	all []aggregator.Pause
}

func (l *pauseLog) add(p aggregator.Pause) {
	l.mu.Lock()
	l.all = append(l.all, p)
	l.mu.Unlock()
}

// of returns the pauses of kind k, in order.
func (l *pauseLog) of(k aggregator.PauseKind) []aggregator.Pause {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []aggregator.Pause
	for _, p := range l.all {
		if p.Kind == k {
			out = append(out, p)
		}
	}
	return out
}

// took returns how long each pause of kind k took.
func (l *pauseLog) took(k aggregator.PauseKind) []time.Duration {
	var out []time.Duration
	for _, p := range l.of(k) {
		out = append(out, p.Took)
	}
	return out
}

// newMobilityHost builds a host of boards for one phase, serving on a
// socket in a temporary directory until close; hopts are the host's
// options (its logger is set here).
func newMobilityHost(ctx context.Context, o MobilityOptions, specs []boardSpec, hopts host.Options) (m *mobilityHost, err error) {
	m = &mobilityHost{done: make(chan error, 1), pauses: &pauseLog{}}
	defer func() {
		if err != nil {
			err = errors.Join(err, m.close())
		}
	}()
	log := o.logger()
	reg := aggregator.NewRegistry()
	part := mobilityPartition()
	var boards []*host.Board
	for i, s := range specs {
		bc := o.Board
		if s.timing.Name != "" {
			bc.Timing = s.timing
		}
		// The slots, the reserve, rounded up to the memory partitions'
		// granule (a MiB per partition).
		gran := uint64(max(bc.MemPartitions, 1)) << 20
		bc.VRAMSize = (uint64(part.Reserved) + uint64(s.slots)*uint64(part.VRAMPerVM) + gran - 1) / gran * gran
		layout, err := aggregator.NewLayout(part, s.slots, bc.VRAMSize, bc.Channels)
		if err != nil {
			return m, fmt.Errorf("board %s: %w", s.name, err)
		}
		bc.VRAMSegments = layout.Segments(bc.VRAMSize)
		b, err := sim.New(bc)
		if err != nil {
			return m, fmt.Errorf("board %s: %w", s.name, err)
		}
		m.sims = append(m.sims, b)
		agg, err := aggregator.New(b, aggregator.Options{Partition: part, MaxVMs: s.slots, Channels: bc.Channels,
			BusReadNs: bc.Timing.MMIOReadNs, BusWriteNs: bc.Timing.MMIOWriteNs, TrapNs: bc.Timing.TrapNs, Timing: bc.Timing.Name,
			Registry: reg, Board: i, BoardName: s.name, HealthInterval: mobilityHealth, Logger: log.With("board", s.name),
			Overcommit: s.overcommit, EvictIdle: o.EvictIdle, MinResidency: o.MinResidency, OnPause: m.pauses.add})
		if err != nil {
			return m, fmt.Errorf("board %s: %w", s.name, err)
		}
		boards = append(boards, &host.Board{Index: i, Name: s.name, Timing: bc.Timing.Name, Agg: agg, FailBus: b.FailBus})
	}
	hopts.Logger = log
	if m.h, err = host.New(reg, boards, hopts); err != nil {
		for _, b := range boards {
			err = errors.Join(err, b.Agg.Close())
		}
		return m, err
	}
	if m.dir, err = os.MkdirTemp("", "gpuvm-mobility-"); err != nil {
		return m, err
	}
	if m.ln, err = ipc.Listen(filepath.Join(m.dir, "gpuvm.sock"), &ipc.ListenOptions{Spin: o.ServerSpin}); err != nil {
		return m, err
	}
	sctx, stop := context.WithCancel(ctx)
	m.stop = stop
	go func() { m.done <- m.h.Serve(sctx, m.ln) }()
	return m, nil
}

// mobilityHealth is how often the boards' health is checked: a failed
// board is found within it.
const mobilityHealth = 10 * time.Millisecond

// close stops serving and releases everything.
func (m *mobilityHost) close() error {
	var errs []error
	if m.stop != nil {
		m.stop()
		<-m.done
	}
	if m.ln != nil {
		errs = append(errs, m.ln.Close())
	}
	if m.h != nil {
		errs = append(errs, m.h.Close())
	}
	for _, b := range m.sims {
		errs = append(errs, b.Close())
	}
	if m.dir != "" {
		errs = append(errs, os.RemoveAll(m.dir))
	}
	return errors.Join(errs...)
}

// vgpu returns the vGPU of the VM called name and its board, or nils.
func (m *mobilityHost) vgpu(name string) (*host.Board, *aggregator.VGPU) {
	for _, v := range m.h.VGPUs() {
		if v.Guest.Name == name {
			return m.h.Lookup(v.ID)
		}
	}
	return nil, nil
}

func (o MobilityOptions) logger() *slog.Logger {
	if o.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return o.Logger
}

func (o MobilityOptions) progress(format string, args ...any) {
	if o.Progress != nil {
		o.Progress(fmt.Sprintf(format, args...))
	}
}

// mobilityVMs are the VM processes of one phase.
type mobilityVMs struct {
	gate  string
	wg    sync.WaitGroup
	ended atomic.Int32
	names []string
	out   []MobilityGuest
	errs  []error
	// endedAt is closed per VM as its process ends.
	endedAt []chan struct{}
}

// startMobilityVMs starts one VM process per mode, named prefix1..N with
// domids from 1, against sock, each waiting at a fresh start gate.
func startMobilityVMs(ctx context.Context, o MobilityOptions, sock, prefix string, modes []string) (*mobilityVMs, error) {
	gate, err := os.MkdirTemp("", "gpuvm-mobility-gate-")
	if err != nil {
		return nil, err
	}
	s := &mobilityVMs{gate: gate, out: make([]MobilityGuest, len(modes)), errs: make([]error, len(modes))}
	for i, mode := range modes {
		name := prefix + strconv.Itoa(i+1)
		s.names = append(s.names, name)
		done := make(chan struct{})
		s.endedAt = append(s.endedAt, done)
		args := []string{"bench", "mobility-guest", "--socket", sock, "--mode", mode, "--domid", strconv.Itoa(i + 1), "--name", name,
			"--ram", "64MiB", "--matrix-dim", strconv.Itoa(o.MatrixDim), "--copy-size", strconv.FormatUint(o.CopyBytes, 10), "--start-gate", gate}
		cmd := o.Command(ctx, args)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, os.Stderr
		if err := cmd.Start(); err != nil {
			s.ended.Add(1)
			close(done)
			s.errs[i] = fmt.Errorf("%s: %w", name, err)
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer close(done)
			rerr := cmd.Wait()
			s.ended.Add(1)
			if jerr := json.Unmarshal(out.Bytes(), &s.out[i]); jerr != nil {
				s.errs[i] = errors.Join(fmt.Errorf("%s: %w", name, rerr), fmt.Errorf("%s: its output is not a mobility summary: %w", name, jerr))
				s.out[i].Name, s.out[i].Mode = name, mode
			}
		}()
	}
	return s, nil
}

// open waits until every VM is ready at the gate, then lets them go.
func (s *mobilityVMs) open(ctx context.Context) error {
	return openGate(ctx, s.gate, len(s.names), func() bool { return s.ended.Load() > 0 })
}

// stop tells the VMs to end their loops and waits for them (at most
// stopWait; then they are killed by cancel).
func (s *mobilityVMs) stop(cancel context.CancelFunc) error {
	err := os.WriteFile(filepath.Join(s.gate, stopFile), nil, 0o644)
	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(stopWait):
		cancel()
		<-done
		err = errors.Join(err, fmt.Errorf("VMs still running %v after the stop: killed", stopWait))
	}
	return errors.Join(err, os.RemoveAll(s.gate))
}

// stopWait bounds the wait for the VMs to finish their runs after a stop.
const stopWait = time.Minute

// runsIn is how many runs VM i made within [from, to): each run counts
// with the part of it that fell in the window, so a window only a few
// runs long still measures the rate.
func (s *mobilityVMs) runsIn(i int, from, to time.Time) float64 {
	var n float64
	f, t := from.UnixNano(), to.UnixNano()
	for _, it := range s.out[i].Iters {
		if it.EndNs <= it.StartNs {
			continue
		}
		if in := min(it.EndNs, t) - max(it.StartNs, f); in > 0 {
			n += float64(in) / float64(it.EndNs-it.StartNs)
		}
	}
	return n
}

// window is a span of the run, [from, to).
type window struct{ from, to time.Time }

// throughput is the runs per second of the VMs idx over the windows.
func (s *mobilityVMs) throughput(idx []int, ws ...window) float64 {
	var n, secs float64
	for _, w := range ws {
		if !w.to.After(w.from) {
			continue
		}
		secs += w.to.Sub(w.from).Seconds()
		for _, i := range idx {
			n += s.runsIn(i, w.from, w.to)
		}
	}
	if secs == 0 {
		return 0
	}
	return n / secs
}

// collect adds the phase's VMs to rep: their results, and a problem for
// each VM that failed, a result that did not verify, and a device lost
// against expectLost.
func (s *mobilityVMs) collect(rep *MobilityReport, phase string, expectLost map[string]bool) {
	for i, g := range s.out {
		vm := MobilityVM{Phase: phase, Name: s.names[i], Mode: g.Mode, VGPU: g.VGPU, Results: g.Results, Runs: len(g.Iters), Lost: g.Lost,
			Error: g.Error, ExpectLost: expectLost[s.names[i]]}
		rep.VMs = append(rep.VMs, vm)
		rep.Results = append(rep.Results, g.Results...)
		if s.errs[i] != nil {
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s %s: %v", phase, vm.Name, s.errs[i]))
		}
		if g.Error != "" {
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s %s: %s", phase, vm.Name, g.Error))
		}
		for _, r := range g.Results {
			if !r.Verified {
				rep.Problems = append(rep.Problems, fmt.Sprintf("%s %s: %s did not verify: %s", phase, vm.Name, r.Workload, r.Error))
			}
		}
		switch {
		case g.Lost != "" && !vm.ExpectLost:
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s %s: lost its device unexpectedly: %s", phase, vm.Name, g.Lost))
		case g.Lost == "" && vm.ExpectLost:
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s %s: its board failed but it did not report a lost device", phase, vm.Name))
		}
		if len(g.Results) == 0 && !vm.ExpectLost {
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s %s: made no run", phase, vm.Name))
		}
	}
}

// verified reports whether the VM called name made runs that all verified
// and neither failed nor lost its device.
func (s *mobilityVMs) verified(name string) bool {
	for i, g := range s.out {
		if s.names[i] != name {
			continue
		}
		if s.errs[i] != nil || g.Error != "" || g.Lost != "" || len(g.Results) == 0 {
			return false
		}
		for _, r := range g.Results {
			if !r.Verified {
				return false
			}
		}
		return true
	}
	return false
}

// percentile returns the q-quantile of d (nearest rank; 0 when empty).
func percentile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	slices.Sort(s)
	return waitQuantile(s, q)
}

func meanDuration(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	return sum / time.Duration(len(d))
}
