package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/host"
)

// RunMobility runs the three phases of gpuvm bench mobility, each on a
// fresh host with fresh VM processes: moves back and forth between two
// boards, six VMs taking turns on an overcommitted board (and the same
// board without overcommit), then a reset, a drain and a board failure.
// A phase that could not run at all is an error; what went wrong inside
// one (a run that did not verify, a move that failed) is in the report's
// Problems.
func RunMobility(ctx context.Context, o MobilityOptions) (MobilityReport, error) {
	rep := MobilityReport{DurationNs: int64(o.Duration), Results: []Result{}, Moves: []MobilityMove{}}
	if len(o.Modes) == 0 {
		return rep, errors.New("bench mobility: no modes")
	}
	if o.Moves < 1 {
		return rep, fmt.Errorf("bench mobility: %d moves: want at least 1", o.Moves)
	}
	phases := []struct {
		name string
		run  func(context.Context, MobilityOptions, *MobilityReport) error
	}{
		{"moves", runMovePhase},
		{"overcommit", runOvercommitPhase},
		{"ops", runOpsPhase},
	}
	for _, p := range phases {
		if err := p.run(ctx, o, &rep); err != nil {
			return rep, fmt.Errorf("bench mobility: %s phase: %w", p.name, err)
		}
	}
	return rep, nil
}

// modes returns n VMs' modes.
func (o MobilityOptions) modes(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = o.Modes[i%len(o.Modes)]
	}
	return out
}

// phaseRun is one phase's host and VMs, set up and started.
type phaseRun struct {
	m      *mobilityHost
	vms    *mobilityVMs
	cancel context.CancelFunc
	start  time.Time // the gate opened
}

// startPhase builds a host of specs, starts a VM per mode and opens the
// gate once all are set up.
func startPhase(ctx context.Context, o MobilityOptions, specs []boardSpec, prefix string, modes []string) (*phaseRun, error) {
	vctx, cancel := context.WithCancel(ctx)
	m, err := newMobilityHost(ctx, o, specs, host.Options{})
	if err != nil {
		cancel()
		return nil, err
	}
	vms, err := startMobilityVMs(vctx, o, m.ln.Addr(), prefix, modes)
	if err != nil {
		cancel()
		return nil, errors.Join(err, m.close())
	}
	p := &phaseRun{m: m, vms: vms, cancel: cancel}
	if err := vms.open(ctx); err != nil {
		cancel() // the VMs waiting at the gate are killed, not told to stop
		return nil, errors.Join(fmt.Errorf("start gate: %w", err), p.end(), vms.errsJoined())
	}
	p.start = time.Now()
	return p, nil
}

// end stops the VMs and the host.
func (p *phaseRun) end() error {
	err := p.vms.stop(p.cancel)
	p.cancel()
	return errors.Join(err, p.m.close())
}

func (s *mobilityVMs) errsJoined() error { return errors.Join(s.errs...) }

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// settle is how long a phase lets its VMs run before it measures: their
// first runs pay for set-up.
func (o MobilityOptions) settle() time.Duration { return min(o.Duration/4, time.Second) }

// moveVM moves the VM called name to board to and records the move.
func moveVM(ctx context.Context, m *mobilityHost, name, to, phase string) MobilityMove {
	mv := MobilityMove{Name: name, Phase: phase, ToBoard: to, VGPU: -1}
	b, v := m.vgpu(name)
	if v == nil {
		mv.Error = "no vGPU"
		return mv
	}
	mv.VGPU, mv.FromBoard = v.ID, b.Name
	mctx, cancel := context.WithTimeout(ctx, moveTimeout)
	defer cancel()
	r, err := m.h.Move(mctx, v.ID, to)
	mv.FromSlot, mv.ToSlot, mv.VRAMBytes, mv.DowntimeNs, mv.CopyNs = r.FromSlot, r.ToSlot, r.BytesCopied, r.DowntimeNs, r.CopyNs
	if err != nil {
		mv.Error = err.Error()
	}
	return mv
}

// moveTimeout bounds one move's wait for the VM's work in flight.
const moveTimeout = 10 * time.Second

// runMovePhase: two boards, four VMs looping madd and cpy for o.Duration,
// cut into quiet segments and segments that begin with a move, in turn:
// o.Moves moves of VMs 1 and 2 in turn, each to the other board. VMs 3 and
// 4 are never moved: their throughput in the moving segments against the
// quiet ones is the moves' cost to the VMs beside.
func runMovePhase(ctx context.Context, o MobilityOptions, rep *MobilityReport) error {
	const n = 4
	specs := []boardSpec{{name: "gpu0", slots: n}, {name: "gpu1", slots: n}}
	o.progress("mobility: moves: 2 boards, %d VMs (%v), %d moves over %v", n, o.modes(n), o.Moves, o.Duration)
	p, err := startPhase(ctx, o, specs, "mv", o.modes(n))
	if err != nil {
		return err
	}
	var moves []MobilityMove
	// The load is cut into 2×Moves segments: a quiet one, then one that
	// begins with a move, in turn, so that the two kinds share the run's
	// drift (the VMs' first runs, the host's other load).
	var quiet, moving []window
	err = func() error {
		if err := sleep(ctx, o.settle()); err != nil {
			return err
		}
		seg := o.Duration / time.Duration(2*o.Moves)
		for k := range o.Moves {
			q := window{from: time.Now()}
			if err := sleep(ctx, seg); err != nil {
				return err
			}
			q.to = time.Now()
			quiet = append(quiet, q)
			name := p.vms.names[k%2]
			b, _ := p.m.vgpu(name)
			to := "gpu0"
			if b != nil && b.Name == "gpu0" {
				to = "gpu1"
			}
			w := window{from: time.Now()}
			mv := moveVM(ctx, p.m, name, to, "moves")
			o.progress("mobility: move %d/%d: %s (vGPU %d) %s → %s: %d KiB in use, paused %v%s", k+1, o.Moves, name, mv.VGPU, mv.FromBoard, mv.ToBoard,
				mv.VRAMBytes>>10, time.Duration(mv.DowntimeNs).Round(time.Microsecond), errSuffix(mv.Error))
			moves = append(moves, mv)
			if err := sleep(ctx, time.Until(w.from.Add(seg))); err != nil {
				return err
			}
			w.to = time.Now()
			moving = append(moving, w)
		}
		return nil
	}()
	if eerr := p.end(); err != nil || eerr != nil {
		return errors.Join(err, eerr)
	}
	p.vms.collect(rep, "moves", nil)
	ph := &rep.MovePhase
	ph.Boards, ph.VMs = len(specs), n
	ph.Moved = p.vms.throughputs([]int{0, 1}, quiet, moving)
	ph.Unaffected = p.vms.throughputs([]int{2, 3}, quiet, moving)
	var down, mib float64
	for i := range moves {
		moves[i].Verified = moves[i].Error == "" && p.vms.verified(moves[i].Name)
		if moves[i].Error != "" {
			rep.Problems = append(rep.Problems, fmt.Sprintf("moves: move of %s to %s: %s", moves[i].Name, moves[i].ToBoard, moves[i].Error))
			continue
		}
		down += float64(moves[i].DowntimeNs)
		mib += float64(moves[i].VRAMBytes) / (1 << 20)
	}
	if mib > 0 {
		ph.DowntimeNsPerMiB = down / mib
	}
	rep.Moves = append(rep.Moves, moves...)
	return nil
}

func errSuffix(e string) string {
	if e == "" {
		return ""
	}
	return " (failed: " + e + ")"
}

// throughputs compares VMs idx over the quiet and the moving windows.
func (s *mobilityVMs) throughputs(idx []int, quiet, moving []window) MobilityThroughput {
	t := MobilityThroughput{Before: s.throughput(idx, quiet...), During: s.throughput(idx, moving...)}
	for _, i := range idx {
		t.VMs = append(t.VMs, s.names[i])
	}
	if t.Before > 0 {
		t.Ratio = t.During / t.Before
	}
	return t
}

// runOvercommitPhase: one board of three slots with overcommit o.Overcommit
// and twice as many VMs as slots, each reserving a whole slot, all looping
// for o.Duration (the aggregator evicts the idle and, after MinResidency,
// the longest resident); then the same board without overcommit and one
// VM per slot for as long.
func runOvercommitPhase(ctx context.Context, o MobilityOptions, rep *MobilityReport) error {
	const slots = 3
	f := max(o.Overcommit, 1)
	n := int(float64(slots) * f)
	oc := &rep.Overcommit
	oc.Slots, oc.VMs, oc.Factor, oc.BaselineVMs = slots, n, f, slots
	oc.SlotVRAM = uint64(mobilityPartition().VRAMPerVM)
	oc.Reserved = uint64(n) * oc.SlotVRAM
	o.progress("mobility: overcommit: %d VMs on %d slots (×%g) for %v", n, slots, f, o.Duration)
	p, err := startPhase(ctx, o, []boardSpec{{name: "gpu0", slots: slots, overcommit: f}}, "oc", o.modes(n))
	if err != nil {
		return err
	}
	var t0, t1 time.Time
	counters := map[string]aggregator.Counters{}
	err = func() error {
		if err := sleep(ctx, o.settle()); err != nil {
			return err
		}
		t0 = time.Now()
		if err := sleep(ctx, o.Duration); err != nil {
			return err
		}
		t1 = time.Now()
		for _, v := range p.m.h.VGPUs() {
			counters[v.Guest.Name] = v.Counters()
		}
		return nil
	}()
	if eerr := p.end(); err != nil || eerr != nil {
		return errors.Join(err, eerr)
	}
	p.vms.collect(rep, "overcommit", nil)
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	oc.Throughput = p.vms.throughput(all, window{t0, t1})
	for _, c := range counters {
		oc.Evictions += c.Evictions
		oc.Restores += c.Restores
		oc.OutBytes += c.EvictedBytes
		oc.InBytes += c.RestoredBytes
		oc.RestoreWNs += c.RestoreWaitNs
	}
	if oc.Restores > 0 {
		oc.RestoreWaitMeanNs = int64(oc.RestoreWNs / oc.Restores)
	}
	evictions, restores := p.m.pauses.took(aggregator.PauseEvict), p.m.pauses.took(aggregator.PauseRestore)
	oc.EvictMeanNs, oc.EvictP99Ns = int64(meanDuration(evictions)), int64(percentile(evictions, 0.99))
	oc.RestoreMeanNs, oc.RestoreP99Ns = int64(meanDuration(restores)), int64(percentile(restores, 0.99))
	if oc.Evictions == 0 {
		rep.Problems = append(rep.Problems, "overcommit: no vGPU was evicted")
	}
	o.progress("mobility: overcommit: %d evictions, %d restores; baseline: %d VMs on %d slots for %v", oc.Evictions, oc.Restores, slots, slots, o.Duration)
	base, err := startPhase(ctx, o, []boardSpec{{name: "gpu0", slots: slots}}, "base", o.modes(slots))
	if err != nil {
		return err
	}
	var b0, b1 time.Time
	err = func() error {
		if err := sleep(ctx, o.settle()); err != nil {
			return err
		}
		b0 = time.Now()
		err := sleep(ctx, o.Duration)
		b1 = time.Now()
		return err
	}()
	if eerr := base.end(); err != nil || eerr != nil {
		return errors.Join(err, eerr)
	}
	base.vms.collect(rep, "baseline", nil)
	oc.Baseline = base.vms.throughput(all[:slots], window{b0, b1})
	return nil
}

// runOpsPhase: two boards of four slots, four VMs looping; a reset of a
// VM on gpu0, a drain of gpu1 (its VMs move to gpu0), gpu1 back in service
// and two VMs moved onto it, then gpu1 fails: those two lose their device,
// the others go on and verify.
func runOpsPhase(ctx context.Context, o MobilityOptions, rep *MobilityReport) error {
	const n = 4
	specs := []boardSpec{{name: "gpu0", slots: n}, {name: "gpu1", slots: n}}
	o.progress("mobility: drain, failure, reset: 2 boards, %d VMs for about %v", n, o.Duration)
	p, err := startPhase(ctx, o, specs, "op", o.modes(n))
	if err != nil {
		return err
	}
	ops := &rep.Ops
	expectLost := map[string]bool{}
	var moves []MobilityMove
	step := o.Duration / 4
	err = func() error {
		if err := sleep(ctx, o.settle()+step); err != nil {
			return err
		}
		// A reset of a vGPU under its looping VM.
		b, v := p.m.vgpu(p.vms.names[0])
		if v == nil {
			return fmt.Errorf("%s has no vGPU", p.vms.names[0])
		}
		ops.ResetVGPU, ops.ResetVM = v.ID, v.Guest.Name
		t := time.Now()
		if err := b.Agg.Reset(v, "gpuvm bench mobility"); err != nil {
			rep.Problems = append(rep.Problems, fmt.Sprintf("ops: reset of %s: %v", v.Guest.Name, err))
		}
		ops.ResetNs = int64(time.Since(t))
		o.progress("mobility: reset %s (vGPU %d) in %v", ops.ResetVM, ops.ResetVGPU, time.Duration(ops.ResetNs).Round(time.Microsecond))
		if err := sleep(ctx, step); err != nil {
			return err
		}
		// A drain of gpu1: its VMs to gpu0.
		ops.Drained = "gpu1"
		t = time.Now()
		dr, err := p.m.h.Drain(ctx, ops.Drained)
		ops.DrainNs = int64(time.Since(t))
		if err != nil {
			rep.Problems = append(rep.Problems, fmt.Sprintf("ops: drain of %s: %v", ops.Drained, err))
		}
		ops.DrainMoved, ops.DrainLeft = len(dr.Moved), dr.Left
		for _, l := range dr.Left {
			rep.Problems = append(rep.Problems, fmt.Sprintf("ops: drain left %s on %s: %s", l.Name, ops.Drained, l.Reason))
		}
		for _, r := range dr.Moved {
			_, v := p.m.h.Lookup(r.ID)
			name := ""
			if v != nil {
				name = v.Guest.Name
			}
			moves = append(moves, MobilityMove{VGPU: r.ID, Name: name, Phase: "drain", FromBoard: r.FromBoard, ToBoard: r.ToBoard, FromSlot: r.FromSlot,
				ToSlot: r.ToSlot, VRAMBytes: r.BytesCopied, DowntimeNs: r.DowntimeNs, CopyNs: r.CopyNs})
		}
		o.progress("mobility: drained %s in %v: %d moved, %d left", ops.Drained, time.Duration(ops.DrainNs).Round(time.Microsecond), ops.DrainMoved, len(ops.DrainLeft))
		if err := sleep(ctx, step); err != nil {
			return err
		}
		// gpu1 back in service, two VMs onto it, then it fails.
		if err := p.m.h.SetState("gpu1", host.StateActive); err != nil {
			return err
		}
		for _, name := range p.vms.names[2:] {
			mv := moveVM(ctx, p.m, name, "gpu1", "ops")
			moves = append(moves, mv)
			if mv.Error == "" {
				expectLost[name] = true
			}
		}
		if err := sleep(ctx, step/2); err != nil {
			return err
		}
		ops.Failed = "gpu1"
		failed := p.m.h.Board(ops.Failed)
		t = time.Now()
		failed.FailBus()
		for lost, _ := failed.Agg.Lost(); !lost; lost, _ = failed.Agg.Lost() {
			if time.Since(t) > 10*time.Second {
				return errors.New("the failed board was not found lost within 10 s")
			}
			time.Sleep(100 * time.Microsecond)
		}
		ops.DetectNs = int64(time.Since(t))
		o.progress("mobility: %s failed, found lost after %v", ops.Failed, time.Duration(ops.DetectNs).Round(time.Microsecond))
		// The VMs that lost their device end; the others go on.
		for i, name := range p.vms.names {
			if !expectLost[name] {
				continue
			}
			select {
			case <-p.vms.endedAt[i]:
			case <-time.After(stopWait):
				rep.Problems = append(rep.Problems, fmt.Sprintf("ops: %s still running %v after its board failed", name, stopWait))
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return sleep(ctx, step)
	}()
	if eerr := p.end(); err != nil || eerr != nil {
		return errors.Join(err, eerr)
	}
	p.vms.collect(rep, "ops", expectLost)
	for i, name := range p.vms.names {
		g := p.vms.out[i]
		if g.Lost != "" {
			ops.Lost = append(ops.Lost, name)
		} else {
			ops.Survivors = append(ops.Survivors, name)
		}
		if name == ops.ResetVM {
			for _, r := range g.Results {
				ops.RecoveredRuns += r.Recovered
			}
		}
	}
	for i := range moves {
		// A VM moved onto the board that failed lost its device later,
		// as expected: its move verified if its runs did.
		moves[i].Verified = moves[i].Error == "" && (p.vms.verified(moves[i].Name) || expectLost[moves[i].Name] && p.vms.verifiedBeforeLoss(moves[i].Name))
		if moves[i].Error != "" {
			rep.Problems = append(rep.Problems, fmt.Sprintf("ops: move of %s to %s: %s", moves[i].Name, moves[i].ToBoard, moves[i].Error))
		}
	}
	rep.Moves = append(rep.Moves, moves...)
	slices.Sort(ops.Lost)
	return nil
}

// verifiedBeforeLoss reports whether the VM called name lost its device
// and every run it made before verified.
func (s *mobilityVMs) verifiedBeforeLoss(name string) bool {
	for i, g := range s.out {
		if s.names[i] != name {
			continue
		}
		if s.errs[i] != nil || g.Error != "" || g.Lost == "" {
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
