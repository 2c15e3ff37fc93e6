package sched

import (
	"container/heap"
	"errors"
	"fmt"
	"time"
)

// VMLoad is one simulated VM: a closed-loop submitter that keeps Depth
// submissions in flight — each time one completes it thinks and queues the
// next. Depth 1 is a loop that launches a kernel and waits for it, like the
// thesis' madd and long-madd (§4.3.3); Depth ≥ 2 keeps the VM backlogged
// (a submission is always queued when the scheduler decides).
type VMLoad struct {
	// ID is the VM's id; IDs must be distinct.
	ID VMID
	// Weight is the VM's scheduling weight; 0 means 1.
	Weight int
	// Cost is the GPU time each submission takes to execute (> 0), e.g.
	// 1 ms for madd and 15 ms for long-madd.
	Cost time.Duration
	// Think is the CPU time between a completion and the VM's next
	// submission (≥ 0).
	Think time.Duration
	// Start is when the VM queues its first submission. The VM is
	// registered with the policy at time 0 regardless, so a late Start
	// models a VM that was idle.
	Start time.Duration
	// Stop is when the VM stops submitting; 0 means never.
	Stop time.Duration
	// Depth is the number of submissions the VM keeps in flight; 0 means 1.
	Depth int
}

// SimOptions tunes Simulate.
type SimOptions struct {
	// Windows are the accounting windows for WindowStats; default
	// {500 ms} (the thesis' Fig. 4.11; Fig. 4.12 uses 100 ms).
	Windows []time.Duration
	// DecisionCost is the dispatcher CPU time of one call to Next. The GPU
	// cannot be fed while the dispatcher decides, so a Dispatch is released
	// DecisionCost after the call. It is reported through Policy.Overhead,
	// as is GPU idle time spent in Wait decisions while work was queued.
	DecisionCost time.Duration
	// SwitchCost is extra GPU time for a submission whose VM differs from
	// the previous submission's (a GPU context switch, thesis §4.3.4).
	SwitchCost time.Duration
}

// WindowStats is GPU usage per fixed-size window of simulated time.
type WindowStats struct {
	// Window is the window length.
	Window time.Duration
	// Usage[w][i] is VM i's GPU time within window w (VMs in load order).
	Usage [][]time.Duration
	// Jain[w] is Jain's index of usage/weight in window w over the VMs that
	// were submitting during the whole window (1 if fewer than two were).
	Jain []float64
	// MinJain and MeanJain summarise Jain over all windows.
	MinJain, MeanJain float64
	// MinMax[w] is the least-served VM's usage/weight over the most-served
	// one's in window w, over the same VMs as Jain (FairGV's strict
	// measure; 1 if fewer than two VMs or none used the GPU).
	MinMax []float64
	// MeanMinMax is MinMax averaged over all windows.
	MeanMinMax float64
}

// SimResult is the outcome of Simulate. Per-VM slices are in load order.
type SimResult struct {
	// Policy is the simulated policy's name.
	Policy string
	// Duration is the simulated time.
	Duration time.Duration
	// VMs are the VM ids.
	VMs []VMID
	// Usage is each VM's total GPU time (including switch costs).
	Usage []time.Duration
	// Requests is each VM's number of completed submissions.
	Requests []int
	// Throughput is Requests per second of the VM's submitting interval.
	Throughput []float64
	// Jain is Jain's index over the whole run of each VM's usage divided
	// by its weight and by the length of its submitting interval.
	Jain float64
	// MinMax is the smallest over the largest of the same per-VM values
	// Jain is computed from (1 with fewer than two VMs).
	MinMax float64
	// Windows holds the per-window statistics, one per SimOptions.Windows.
	Windows []WindowStats
	// Busy is the total time the GPU was executing.
	Busy time.Duration
	// Decisions is the number of calls to Next.
	Decisions int
	// Switches is the number of GPU context switches (consecutive
	// executions from different VMs).
	Switches int
	// Overhead is the total time reported to Policy.Overhead.
	Overhead time.Duration
}

// ErrSim is wrapped by Simulate's errors about invalid input or a policy
// that broke the protocol.
var ErrSim = errors.New("simulation error")

const (
	evSubmit = iota
	evRelease
	evComplete
	evWake
)

type simEvent struct {
	t    time.Duration
	seq  uint64
	kind int
	vm   int
}

type eventHeap []simEvent

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if h[i].t != h[j].t {
		return h[i].t < h[j].t
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(simEvent)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

type simVM struct {
	load     VMLoad
	queued   int             // trapped, not released
	ready    int             // released, waiting for the GPU
	released []time.Duration // release times of released, uncompleted submissions, oldest first
	denied   bool
}

// simulator is the state of one Simulate run: a non-preemptive GPU that
// executes one submission at a time, round-robin among VMs with released
// submissions, and an engaged dispatcher that releases one submission at a
// time (or, during a FreeRun, everything not denied).
type simulator struct {
	p    Policy
	opt  SimOptions
	dur  time.Duration
	vms  []*simVM
	idx  map[VMID]int
	ev   eventHeap
	seq  uint64
	res  SimResult
	errs error

	gpuBusy bool
	gpuRR   int
	lastVM  int

	outstanding int
	deciding    bool
	wakeAt      time.Duration
	free        bool
	freeUntil   time.Duration
	waiting     bool
	waitSince   time.Duration
}

// Simulate runs policy p against the closed-loop loads for duration of
// simulated time and reports per-VM GPU usage, throughput and fairness. It
// is deterministic. p must be fresh (no VMs added); Simulate adds the VMs
// at time 0.
func Simulate(p Policy, loads []VMLoad, duration time.Duration, opt SimOptions) (SimResult, error) {
	if duration <= 0 {
		return SimResult{}, fmt.Errorf("sched: simulate: duration %v: %w", duration, ErrSim)
	}
	if len(opt.Windows) == 0 {
		opt.Windows = []time.Duration{500 * time.Millisecond}
	}
	s := &simulator{p: p, opt: opt, dur: duration, idx: make(map[VMID]int), lastVM: -1, wakeAt: -1}
	s.res = SimResult{Policy: p.Name(), Duration: duration}
	for i, l := range loads {
		if l.Weight == 0 {
			l.Weight = 1
		}
		if l.Depth == 0 {
			l.Depth = 1
		}
		if l.Depth < 0 || l.Cost <= 0 || l.Think < 0 || l.Start < 0 || (l.Stop != 0 && l.Stop < l.Start) {
			return SimResult{}, fmt.Errorf("sched: simulate: vm %d load %+v: %w", l.ID, l, ErrSim)
		}
		if _, dup := s.idx[l.ID]; dup {
			return SimResult{}, fmt.Errorf("sched: simulate: vm %d listed twice: %w", l.ID, ErrSim)
		}
		if err := p.AddVM(l.ID, l.Weight, 0); err != nil {
			return SimResult{}, fmt.Errorf("sched: simulate: %w", err)
		}
		s.idx[l.ID] = i
		s.vms = append(s.vms, &simVM{load: l})
		s.res.VMs = append(s.res.VMs, l.ID)
		for k := 0; k < l.Depth && l.Start < duration; k++ {
			s.push(l.Start, evSubmit, i)
		}
	}
	n := len(loads)
	s.res.Usage = make([]time.Duration, n)
	s.res.Requests = make([]int, n)
	for _, w := range opt.Windows {
		if w <= 0 {
			return SimResult{}, fmt.Errorf("sched: simulate: window %v: %w", w, ErrSim)
		}
		nw := int((duration + w - 1) / w)
		ws := WindowStats{Window: w, Usage: make([][]time.Duration, nw)}
		for k := range ws.Usage {
			ws.Usage[k] = make([]time.Duration, n)
		}
		s.res.Windows = append(s.res.Windows, ws)
	}

	for s.ev.Len() > 0 && s.errs == nil {
		e := heap.Pop(&s.ev).(simEvent)
		if e.t >= duration {
			break
		}
		s.handle(e)
	}
	if s.errs != nil {
		return SimResult{}, s.errs
	}
	s.summarise()
	return s.res, nil
}

func (s *simulator) push(t time.Duration, kind, vm int) {
	s.seq++
	heap.Push(&s.ev, simEvent{t: t, seq: s.seq, kind: kind, vm: vm})
}

func (s *simulator) fail(err error) {
	if s.errs == nil {
		s.errs = fmt.Errorf("sched: simulate %s: %w", s.p.Name(), err)
	}
}

func (s *simulator) handle(e simEvent) {
	switch e.kind {
	case evSubmit:
		v := s.vms[e.vm]
		v.queued++
		if err := s.p.Submitted(v.load.ID, e.t); err != nil {
			s.fail(err)
			return
		}
	case evRelease:
		s.deciding = false
		s.release(e.vm, e.t)
	case evComplete:
		s.complete(e.vm, e.t)
	case evWake:
		if e.t != s.wakeAt {
			return // superseded
		}
		s.wakeAt = -1
	}
	s.dispatch(e.t)
}

func (s *simulator) release(i int, t time.Duration) {
	v := s.vms[i]
	if v.queued == 0 {
		s.fail(fmt.Errorf("release of vm %d with nothing queued: %w", v.load.ID, ErrSim))
		return
	}
	v.queued--
	if err := s.p.Started(v.load.ID, t); err != nil {
		s.fail(err)
		return
	}
	v.ready++
	v.released = append(v.released, t)
	s.outstanding++
	s.kick(t)
}

// kick starts the GPU on the next released submission, round-robin among
// VMs (a GPU cycles among channels with pending work).
func (s *simulator) kick(t time.Duration) {
	if s.gpuBusy {
		return
	}
	n := len(s.vms)
	for k := 0; k < n; k++ {
		i := (s.gpuRR + k) % n
		v := s.vms[i]
		if v.ready == 0 {
			continue
		}
		s.gpuRR = (i + 1) % n
		exec := v.load.Cost
		if s.lastVM >= 0 && s.lastVM != i {
			exec += s.opt.SwitchCost
			s.res.Switches++
		}
		s.lastVM = i
		s.gpuBusy = true
		s.account(i, t, t+exec)
		s.push(t+exec, evComplete, i)
		v.ready--
		return
	}
}

func (s *simulator) complete(i int, t time.Duration) {
	v := s.vms[i]
	s.gpuBusy = false
	rel := v.released[0]
	v.released = v.released[1:]
	s.outstanding--
	s.res.Requests[i]++
	if err := s.p.Completed(v.load.ID, t-rel, t); err != nil {
		s.fail(err)
		return
	}
	next := t + v.load.Think
	if (v.load.Stop == 0 || next < v.load.Stop) && next < s.dur {
		s.push(next, evSubmit, i)
	}
	s.kick(t)
}

func (s *simulator) account(i int, from, to time.Duration) {
	to = min(to, s.dur)
	if to <= from {
		return
	}
	s.res.Usage[i] += to - from
	s.res.Busy += to - from
	for k := range s.res.Windows {
		ws := &s.res.Windows[k]
		for a := from; a < to; {
			w := int(a / ws.Window)
			end := min(to, time.Duration(w+1)*ws.Window)
			ws.Usage[w][i] += end - a
			a = end
		}
	}
}

func (s *simulator) overhead(d, now time.Duration) {
	if d > 0 {
		s.p.Overhead(d, now)
		s.res.Overhead += d
	}
}

func (s *simulator) endWait(now time.Duration) {
	if s.waiting {
		s.waiting = false
		s.overhead(now-s.waitSince, now)
	}
}

func (s *simulator) anyQueued() bool {
	for _, v := range s.vms {
		if v.queued > 0 {
			return true
		}
	}
	return false
}

// dispatch is the dispatcher: called after every event.
func (s *simulator) dispatch(now time.Duration) {
	if s.errs != nil || s.deciding {
		return
	}
	if s.free {
		if now < s.freeUntil {
			s.releaseFree(now)
			return
		}
		s.free = false
	}
	if s.outstanding > 0 {
		return
	}
	d := s.p.Next(now)
	s.res.Decisions++
	s.overhead(s.opt.DecisionCost, now)
	switch d.Action {
	case Idle:
	case Dispatch:
		s.endWait(now)
		i, ok := s.idx[d.VM]
		if !ok || s.vms[i].queued == 0 {
			s.fail(fmt.Errorf("dispatch of vm %d with nothing queued: %w", d.VM, ErrSim))
			return
		}
		s.wakeAt = -1
		if s.opt.DecisionCost > 0 {
			s.deciding = true
			s.push(now+s.opt.DecisionCost, evRelease, i)
		} else {
			s.release(i, now)
		}
	case Wait:
		if d.Until <= now {
			s.fail(fmt.Errorf("wait until %v at %v: %w", d.Until, now, ErrSim))
			return
		}
		if !s.waiting && s.anyQueued() {
			s.waiting, s.waitSince = true, now
		}
		s.wakeAt = d.Until
		s.push(d.Until, evWake, -1)
	case FreeRun:
		if d.Until <= now {
			s.fail(fmt.Errorf("free run until %v at %v: %w", d.Until, now, ErrSim))
			return
		}
		s.endWait(now)
		for _, v := range s.vms {
			v.denied = false
		}
		for _, id := range d.Deny {
			if i, ok := s.idx[id]; ok {
				s.vms[i].denied = true
			}
		}
		s.free, s.freeUntil = true, d.Until
		s.wakeAt = d.Until
		s.push(d.Until, evWake, -1)
		s.releaseFree(now)
	default:
		s.fail(fmt.Errorf("unknown action %v: %w", d.Action, ErrSim))
	}
}

func (s *simulator) releaseFree(now time.Duration) {
	for i, v := range s.vms {
		for !v.denied && v.queued > 0 && s.errs == nil {
			s.release(i, now)
		}
	}
}

func (s *simulator) summarise() {
	r := &s.res
	n := len(s.vms)
	r.Throughput = make([]float64, n)
	var x []float64
	for i, v := range s.vms {
		l := v.load
		end := s.dur
		if l.Stop != 0 {
			end = min(end, l.Stop)
		}
		if span := end - l.Start; span > 0 {
			r.Throughput[i] = float64(r.Requests[i]) / span.Seconds()
			x = append(x, float64(r.Usage[i])/float64(l.Weight)/float64(span))
		}
	}
	r.Jain = Jain(x)
	r.MinMax = minMax(x)
	for k := range r.Windows {
		ws := &r.Windows[k]
		ws.Jain = make([]float64, len(ws.Usage))
		ws.MinMax = make([]float64, len(ws.Usage))
		ws.MinJain = 1
		sum, mmSum := 0.0, 0.0
		for w, u := range ws.Usage {
			from, to := time.Duration(w)*ws.Window, time.Duration(w+1)*ws.Window
			var xs []float64
			for i, v := range s.vms {
				l := v.load
				if l.Start <= from && (l.Stop == 0 || l.Stop >= to) {
					xs = append(xs, float64(u[i])/float64(l.Weight))
				}
			}
			j := 1.0
			if len(xs) >= 2 {
				j = Jain(xs)
			}
			ws.Jain[w] = j
			ws.MinJain = min(ws.MinJain, j)
			sum += j
			ws.MinMax[w] = minMax(xs)
			mmSum += ws.MinMax[w]
		}
		if len(ws.Jain) > 0 {
			ws.MeanJain = sum / float64(len(ws.Jain))
			ws.MeanMinMax = mmSum / float64(len(ws.Jain))
		}
	}
}

// minMax returns min(x)/max(x): 1 for fewer than two values or when the
// largest is not positive.
func minMax(x []float64) float64 {
	if len(x) < 2 {
		return 1
	}
	lo, hi := x[0], x[0]
	for _, v := range x[1:] {
		lo, hi = min(lo, v), max(hi, v)
	}
	if hi <= 0 {
		return 1
	}
	return lo / hi
}
