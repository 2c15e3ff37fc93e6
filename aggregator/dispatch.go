package aggregator

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"time"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/internal/probe"
	"github.com/gpuvm/gpuvm/internal/spin"
	"github.com/gpuvm/gpuvm/sched"
)

// submission is one guest doorbell waiting for (or being given) the GPU.
type submission struct {
	v          *VGPU
	ch         int    // guest channel
	phys       int    // physical channel
	put        uint32 // GP_PUT the guest wrote (a newer doorbell of a queued submission replaces it)
	entries    uint32 // GPFIFO ring size
	start      uint32 // GP_GET when released
	shadowUser uint64 // the GPU's user area: GP_GET read there, GP_PUT written through the poll area
	guestUser  uint64 // the guest's user area: GP_GET mirrored there
	mirrored   uint32 // last GP_GET mirrored
	queued     time.Duration
	released   time.Duration
	charged    time.Duration // GPU time the watchdog holds against it
	// void: its channel was stopped. A queued void submission is released
	// and completed without touching the GPU (so the policy's counts stay
	// right); an in-flight one completes at the next reap.
	void     bool
	stopping bool // the watchdog is stopping its channel
}

// chanKey names a guest channel across VMs.
type chanKey struct{ vm, ch int }

// Usage is one completed submission's GPU time, for fairness reports.
type Usage struct {
	VGPU       int
	Name       string        // the guest's domain name
	Start, End time.Duration // on the dispatcher's clock
	Wait       time.Duration // its queue wait, doorbell to release
}

// dispatcher is the one goroutine that releases guest submissions to the
// physical doorbells, in the order the scheduling policy decides, and
// measures each one's GPU time from release to completion by polling the
// channel's GP_GET in its shadow user area, which only the GPU writes (no
// interrupts, as GPUvm). Submissions of one channel keep their order, and a
// channel has at most one queued submission: a newer doorbell raises its
// put, so a doorbell flood costs nothing. A submission that holds the GPU
// past the watchdog limit gets its channel stopped; the stop runs in its own
// goroutine, so no lock the VMs' doorbells need is held across it.
type dispatcher struct {
	a      *Aggregator
	policy sched.Policy
	clock  sched.Clock
	// decisionCost is the scheduler's own time for a decision begun at
	// start (charged to the VMs by BAND); the wall clock, or 0 in tests
	// with a manual clock.
	decisionCost func(start time.Time) time.Duration
	watchdog     time.Duration
	poll         time.Duration
	log          *slog.Logger

	mu       sync.Mutex
	wake     chan struct{} // a submission arrived or a VM left
	queues   map[int][]*submission
	pending  map[chanKey]*submission // each channel's queued submission
	inflight []*submission
	lastTick time.Duration // when the watchdog last charged the in-flight submissions
	freeRun  bool
	freeEnd  time.Duration
	deny     map[int]bool
	usage    []Usage
	record   bool
	kills    map[int]uint64        // watchdog stops per vGPU
	lastDone map[int]time.Duration // when each vGPU's last submission completed
	lastEnd  time.Duration         // when the last submission of any VM completed
	think    map[string]*Think     // by guest name, while recording
	accounts map[int]*account      // per vGPU, while it is served (accounting.go)
	// nqueued is the number of submissions in queues, kept as they are
	// queued, released and dropped: each decision asks for it, and summing
	// the queues there cost a map walk per VM per decision (the largest
	// part of a decision at 64 VMs, gpuvm bench scale).
	nqueued int
	// stats counts the engaged decisions and their cost on the wall clock
	// (DispatchStats; gpuvm bench scale): three monotonic clock reads per
	// decision, under d.mu like the rest.
	stats DispatchStats

	// ended, per vGPU, is called when one of its submissions ends
	// (completed, faulted or stopped: reap) and when its in-flight ones
	// are dropped with it (dropVM, which then forgets it): a pvdrm back
	// end's CPU_PREP waiters sleep until then instead of polling their
	// fences (pvdrm_wait.go). It runs under d.mu, so it must not block.
	// Set by onEnded.
	ended map[*VGPU]func()

	// points are the guest channels' declared scheduling points, not yet
	// released (cooperative yield, yield.go).
	points map[chanKey]*yieldPoints

	stops sync.WaitGroup // watchdog stops in progress

	// held counts, per vGPU id, the moves that stop its work being
	// released (move.go).
	held map[int]int

	slaf slaf // SLA feedback (slo.go)
}

// onEnded has f called whenever a submission of v ends (see ended), after
// the funcs registered for v before it (a pvdrm back end's waiters, the
// VM's virtual interrupt: irq.go). The caller holds v.mu and has checked
// that v is not torn down, so dropVM is still to come and forgets f.
func (d *dispatcher) onEnded(v *VGPU, f func()) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ended == nil {
		d.ended = map[*VGPU]func(){}
	}
	if prev, next := d.ended[v], f; prev != nil {
		f = func() { prev(); next() }
	}
	d.ended[v] = f
}

// Think sums the time a VM took to submit again after its previous
// submission completed (its CPU-side "think time"), which bounds what a
// scheduler that waits for the same VM (BAND) can achieve.
type Think struct {
	Count     int
	Total     time.Duration
	Max       time.Duration
	UnderWait int // gaps shorter than the BAND wait
}

func newDispatcher(a *Aggregator, p sched.Policy, watchdog time.Duration) *dispatcher {
	return &dispatcher{a: a, policy: p, clock: sched.NewRealClock(), decisionCost: time.Since, watchdog: watchdog, poll: 20 * time.Microsecond,
		log: a.log, wake: make(chan struct{}, 1), queues: map[int][]*submission{}, pending: map[chanKey]*submission{}, kills: map[int]uint64{},
		lastDone: map[int]time.Duration{}, think: map[string]*Think{}, accounts: map[int]*account{}}
}

func (d *dispatcher) signal() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// addVM and removeVM register a vGPU with the policy. A vGPU that comes
// from another board's dispatcher (a move, a restore) keeps its totals
// (account.carry). Called with v.mu held.
func (d *dispatcher) addVM(v *VGPU, weight int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.policy.AddVM(sched.VMID(v.ID), weight, d.clock.Now()); err != nil {
		return err
	}
	c := &account{v: v, weight: weight, slo: d.newSLO(v)}
	if old := v.leftAccount; old != nil && old.v == v {
		c.carry(old)
	}
	v.leftAccount = nil
	d.accounts[v.ID] = c
	return nil
}

func (d *dispatcher) removeVM(v *VGPU) {
	d.mu.Lock()
	for _, s := range d.queues[v.ID] {
		delete(d.pending, chanKey{v.ID, s.ch})
	}
	d.nqueued -= len(d.queues[v.ID])
	delete(d.queues, v.ID)
	d.dropVMPoints(v)
	delete(d.accounts, v.ID)
	_ = d.policy.RemoveVM(sched.VMID(v.ID), d.clock.Now())
	d.mu.Unlock()
	d.signal()
}

// dropVM forgets a departing VM's in-flight submissions (its channels are
// stopped): the dispatcher touches nothing of the VM afterwards.
func (d *dispatcher) dropVM(v *VGPU) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.inflight) > 0 {
		d.a.faults.collect() // errors end submissions (completed)
	}
	keep := d.inflight[:0]
	for _, s := range d.inflight {
		if s.v != v {
			keep = append(keep, s)
		}
	}
	clear(d.inflight[len(keep):])
	d.inflight = keep
	if f := d.ended[v]; f != nil {
		f() // what a waiter waited for will not complete now
		delete(d.ended, v)
	}
}

// channelStopped voids a stopped channel's queued and in-flight
// submissions (called with the VM's lock held, after the physical stop).
func (d *dispatcher) channelStopped(v *VGPU, ch int) {
	d.mu.Lock()
	if s := d.pending[chanKey{v.ID, ch}]; s != nil {
		s.void = true
	}
	d.dropPoints(v, ch)
	for _, s := range d.inflight {
		if s.v == v && s.ch == ch {
			s.void = true
		}
	}
	d.mu.Unlock()
	d.signal()
}

// submit queues a guest doorbell, or raises the put of the channel's
// queued submission. It never blocks on the GPU.
func (d *dispatcher) submit(s *submission) {
	d.mu.Lock()
	k := chanKey{s.v.ID, s.ch}
	if q := d.pending[k]; q != nil && !q.void {
		q.put, q.entries = s.put, s.entries
		d.mu.Unlock()
		return
	}
	now := d.clock.Now()
	s.queued = now
	if last, ok := d.lastDone[s.v.ID]; ok && d.record && len(d.queues[s.v.ID]) == 0 {
		t := d.think[s.v.Guest.Name]
		if t == nil {
			t = &Think{}
			d.think[s.v.Guest.Name] = t
		}
		gap := now - last
		t.Count++
		t.Total += gap
		t.Max = max(t.Max, gap)
		if gap < 500*time.Microsecond {
			t.UnderWait++
		}
		delete(d.lastDone, s.v.ID)
	}
	d.queues[s.v.ID] = append(d.queues[s.v.ID], s)
	d.nqueued++
	d.pending[k] = s
	err := d.policy.Submitted(sched.VMID(s.v.ID), now)
	d.mu.Unlock()
	if err != nil {
		d.log.Error("scheduler", "err", err)
	}
	d.signal()
}

// run is the dispatcher loop; it returns when ctx is done.
func (d *dispatcher) run(ctx context.Context) {
	for ctx.Err() == nil {
		busy, until := d.step()
		d.sleep(ctx, busy, until)
	}
}

// step does what is due now: it reaps completed submissions and releases
// what the policy (or a free run) allows. It reports whether a submission
// is in flight and until when a Wait or FreeRun holds (-1: none).
func (d *dispatcher) step() (busy bool, until time.Duration) {
	start := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.reap()
	now := d.clock.Now()
	d.sloTick(now)
	until = -1
	switch {
	case d.freeRun && now < d.freeEnd:
		d.releaseAllowed(now)
		until = d.freeEnd
	case len(d.inflight) > 0:
		// Engaged: one submission at a time on the non-preemptive GPU.
	default:
		d.freeRun = false
		t0 := time.Now()
		dec := d.policy.Next(now)
		t1 := time.Now()
		switch dec.Action {
		case sched.Dispatch:
			d.release(int(dec.VM), now)
		case sched.Wait:
			until = dec.Until
		case sched.FreeRun:
			d.freeRun, d.freeEnd = true, dec.Until
			d.deny = map[int]bool{}
			for _, id := range dec.Deny {
				d.deny[int(id)] = true
			}
			d.releaseAllowed(now)
			until = dec.Until
		}
		if q := d.queued(); q > 0 && len(d.inflight) == 0 {
			d.policy.Overhead(d.decisionCost(start), d.clock.Now())
		}
		d.stats.Decisions++
		d.stats.NextTime += t1.Sub(t0)
		d.stats.DecisionTime += time.Since(t0)
	}
	return len(d.inflight) > 0, until
}

// DispatchStats are the dispatcher's engaged scheduling decisions since the
// aggregator started, and what they cost on the wall clock. A decision is
// one call of the policy's Next (after a completion, on an arrival while the
// GPU idles, and at each step of a Wait); free-run releases are not
// decisions.
type DispatchStats struct {
	// Decisions counts the calls of the policy's Next.
	Decisions uint64
	// NextTime is the time spent in the policy's Next.
	NextTime time.Duration
	// DecisionTime is the time of whole decisions: Next, then releasing
	// the chosen submission (queue bookkeeping and the physical doorbell
	// write) or applying the Wait or FreeRun, then charging the scheduler's
	// overhead to the policy when work stays queued.
	DecisionTime time.Duration
	// Completed counts the submissions the dispatcher saw end (completed,
	// faulted or stopped).
	Completed uint64
	// Splits counts the submissions cut at a guest's scheduling point
	// (cooperative yield): each cut releases one part and queues the rest
	// as a new submission.
	Splits uint64
}

// DispatchStats returns the dispatcher's decision counts and costs so far.
func (a *Aggregator) DispatchStats() DispatchStats {
	d := a.disp
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stats
}

// queued is the number of queued submissions, of every VM.
func (d *dispatcher) queued() int { return d.nqueued }

// sleep waits for the next thing to do: a completion to poll, a deadline,
// or a new submission. Short waits nap (time.Sleep and timers may take a
// whole millisecond); the loop re-reads the queues after each nap.
func (d *dispatcher) sleep(ctx context.Context, busy bool, until time.Duration) {
	var timeout time.Duration
	switch {
	case busy:
		if d.sinceRelease() < spinFor {
			runtime.Gosched() // most submissions are short: poll hard at first
			return
		}
		timeout = d.poll
	case until >= 0:
		timeout = until - d.clock.Now()
		if timeout <= 0 {
			return
		}
	default:
		timeout = time.Hour
	}
	if timeout <= napUpTo {
		spin.Nap(min(timeout, d.poll))
		return
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-d.wake:
	case <-t.C:
	}
}

// napUpTo: waits up to this long are naps of d.poll (so a new submission is
// noticed within a nap); longer ones block until woken.
const napUpTo = 5 * time.Millisecond

// spinFor is how long after a release the dispatcher polls without sleeping.
const spinFor = 200 * time.Microsecond

// sinceRelease is the time since the newest in-flight release.
func (d *dispatcher) sinceRelease() time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	var last time.Duration
	for _, s := range d.inflight {
		last = max(last, s.released)
	}
	return d.clock.Now() - last
}

// release gives the GPU to the oldest queued submission of vGPU id.
func (d *dispatcher) release(id int, now time.Duration) {
	q := d.queues[id]
	if len(q) == 0 || d.held[id] > 0 {
		return // nothing queued, or the VM is being moved (move.go)
	}
	s := q[0]
	q[0] = nil
	d.queues[id] = q[1:]
	d.nqueued--
	if d.pending[chanKey{id, s.ch}] == s {
		delete(d.pending, chanKey{id, s.ch})
	}
	if err := d.policy.Started(sched.VMID(id), now); err != nil {
		d.log.Error("scheduler", "err", err)
	}
	s.released = now
	probe.Release(id, int64(now-s.queued)) // gpuvm trace: doorbell-to-release wait
	if c := d.accounts[id]; c != nil && c.v == s.v {
		c.wait(now - s.queued)
	}
	d.inflight = append(d.inflight, s)
	if s.void {
		return // completes at the next reap, without touching the GPU
	}
	var err error
	s.start, err = d.gpGet(s)
	s.mirrored = s.start
	if err == nil && d.points != nil {
		if rest := d.cut(s); rest != nil {
			d.requeue(rest, now)
		}
	}
	d.a.phys.doorbell(s.phys, s.put)
}

// releaseAllowed releases every queued submission of VMs not denied (free run).
func (d *dispatcher) releaseAllowed(now time.Duration) {
	for id, q := range d.queues {
		if d.deny[id] {
			continue
		}
		for range q {
			d.release(id, now)
		}
	}
}

// reap collects completed in-flight submissions: GP_GET reached their put,
// the channel faulted or was stopped, or the VM left. It charges the time
// since the last reap to each submission that holds the GPU — not to one
// that waits for the compute engine while another channel's work runs on
// it (the engine's status register names the channel it runs) — and has
// the watchdog stop the channel of one charged past the limit.
func (d *dispatcher) reap() {
	now := d.clock.Now()
	dt := now - d.lastTick
	d.lastTick = now
	onGR := -1
	if len(d.inflight) > 1 {
		if st := d.a.gpu.Read32(nvc0.BAR0, uint64(nvc0.RegEngineStatus(nvc0.EngineGR))); st&nvc0.EngineStatusBusy != 0 {
			onGR = int(st & nvc0.EngineStatusChanMask)
		}
	}
	if len(d.inflight) > 0 {
		d.a.faults.collect() // errors end submissions (completed)
	}
	keep := d.inflight[:0]
	for _, s := range d.inflight {
		done, err := d.completed(s)
		if !done && d.watchdog > 0 && !s.stopping {
			if onGR < 0 || onGR == s.phys {
				s.charged += dt
			}
			if s.charged > d.watchdog {
				s.stopping = true
				d.kills[s.v.ID]++
				d.log.Warn("watchdog: stopping channel", "vgpu", s.v.ID, "name", s.v.Guest.Name, "channel", s.ch, "charged", s.charged)
				d.stops.Add(1)
				go func(v *VGPU, ch, p int) {
					defer d.stops.Done()
					v.watchdogStop(d.a, ch, p)
				}(s.v, s.ch, s.phys)
			}
		}
		if !done {
			keep = append(keep, s)
			continue
		}
		if err != nil {
			d.log.Debug("submission ended without completing", "vgpu", s.v.ID, "err", err)
		}
		d.stats.Completed++
		if f := d.ended[s.v]; f != nil {
			f() // wakes the VM's waiters for this completion (onEnded)
		}
		// The GPU runs one submission at a time: with several in flight (a
		// free run), one's GPU time starts when the previous one ended.
		begin := max(s.released, d.lastEnd)
		d.lastEnd = now
		if cerr := d.policy.Completed(sched.VMID(s.v.ID), now-begin, now); cerr != nil && !errors.Is(cerr, sched.ErrUnknownVM) {
			d.log.Error("scheduler", "err", cerr)
		}
		d.lastDone[s.v.ID] = now
		if c := d.accounts[s.v.ID]; c != nil && c.v == s.v {
			c.ran(now-begin, now)
		}
		if d.record {
			d.usage = append(d.usage, Usage{VGPU: s.v.ID, Name: s.v.Guest.Name, Start: begin, End: now, Wait: s.released - s.queued})
		}
	}
	clear(d.inflight[len(keep):])
	d.inflight = keep
}

// completed reports whether a released submission is over: GP_GET (which
// the GPU advances after each entry's work) reached its put, or the channel
// will never get there (stopped by the aggregator, or stopped on an error
// the board reported). Everything it reads only the GPU or the aggregator
// writes.
func (d *dispatcher) completed(s *submission) (bool, error) {
	if s.void {
		return true, errors.New("channel stopped")
	}
	get, err := d.gpGet(s)
	if err != nil {
		return true, err
	}
	d.mirror(s, get)
	// Done once GP_GET has travelled from where it was at release to put
	// (in ring order: a later release on the channel may already have
	// taken it further).
	dist := func(a, b uint32) uint32 { return (b - a + s.entries) % s.entries }
	if dist(s.start, get) >= dist(s.start, s.put) {
		return true, nil
	}
	if d.a.faults.errored(s.phys) {
		return true, fmt.Errorf("channel %d stopped on an error", s.phys)
	}
	return false, nil
}

// mirror copies what the GPU wrote in the shadow user area — GP_GET, and
// with it DMA_GET, the reference and DMA_GET_HI — into the guest's user
// area, for guest reads that do not trap (a passed-through poll page,
// PRAMIN). The others change only with GP_GET, so they are copied then.
func (d *dispatcher) mirror(s *submission, get uint32) {
	if get == s.mirrored || s.guestUser == 0 {
		return
	}
	for _, r := range [...]struct{ off, n uint64 }{{nvc0.UserDMAGet, 8}, {nvc0.UserDMAGetHi, 4}} { // DMA_GET and reference; DMA_GET_HI
		var w [8]byte
		if err := d.a.gpu.ReadVRAM(w[:r.n], s.shadowUser+r.off); err == nil {
			_ = d.a.gpu.WriteVRAM(w[:r.n], s.guestUser+r.off)
		}
	}
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], get)
	if err := d.a.gpu.WriteVRAM(b[:], s.guestUser+nvc0.UserGPGet); err == nil {
		s.mirrored = get
	}
}

// gpGet reads the channel's GP_GET from its shadow user area.
func (d *dispatcher) gpGet(s *submission) (uint32, error) {
	var b [4]byte
	if err := d.a.gpu.ReadVRAM(b[:], s.shadowUser+nvc0.UserGPGet); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b[:]) % s.entries, nil
}

// watchdogStop stops guest channel ch for running past the watchdog limit
// (in its own goroutine: the stop waits for the GPU). The guest sees its
// channel faulted with FaultReasonKilled.
func (v *VGPU) watchdogStop(a *Aggregator, ch, p int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.dead || !v.chans[ch].running || v.agg != a || v.phys(ch) != p {
		// Stopped already, or moved since (move.go): not the run it judged.
		return
	}
	_ = v.stopChannel(ch)
	v.reportKilled(ch)
	v.ctr.watchdogStops.Add(1)
	v.reclaim()
}

// StartRecording clears and starts the per-submission usage record.
func (a *Aggregator) StartRecording() {
	d := a.disp
	d.mu.Lock()
	d.usage, d.record = nil, true
	d.think = map[string]*Think{}
	d.mu.Unlock()
}

// ThinkTimes returns, per guest name, how long VMs took to resubmit after
// a completion, since StartRecording.
func (a *Aggregator) ThinkTimes() map[string]Think {
	d := a.disp
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[string]Think{}
	for k, v := range d.think {
		out[k] = *v
	}
	return out
}

// Recorded returns the usage recorded since StartRecording and the
// dispatcher clock's current time.
func (a *Aggregator) Recorded() ([]Usage, time.Duration) {
	d := a.disp
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]Usage(nil), d.usage...), d.clock.Now()
}

// WatchdogKills returns how many channels of a vGPU the watchdog stopped.
func (a *Aggregator) WatchdogKills(id int) uint64 {
	d := a.disp
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.kills[id]
}
