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
	"github.com/gpuvm/gpuvm/internal/spin"
	"github.com/gpuvm/gpuvm/sched"
)

// submission is one trapped guest doorbell waiting for (or being given) the GPU.
type submission struct {
	v        *VGPU
	ch       int    // guest channel
	phys     int    // physical channel
	put      uint32 // GP_PUT the guest wrote
	entries  uint32 // GPFIFO ring size
	start    uint32 // GP_GET when released
	user     uint64 // physical VRAM address of the channel's user area
	queued   time.Duration
	released time.Duration
}

// Usage is one completed submission's GPU time, for fairness reports.
type Usage struct {
	VGPU       int
	Name       string        // the guest's domain name
	Start, End time.Duration // on the dispatcher's clock
}

// dispatcher is the one goroutine that releases guest submissions to the
// physical doorbells, in the order the scheduling policy decides, and
// measures each one's GPU time from release to completion by polling the
// channel's GP_GET (no interrupts, as GPUvm). Submissions of one channel keep
// their order. A submission that runs past the watchdog limit gets its
// channel killed.
type dispatcher struct {
	a        *Aggregator
	policy   sched.Policy
	clock    sched.Clock
	watchdog time.Duration
	poll     time.Duration
	log      *slog.Logger

	mu       sync.Mutex
	wake     chan struct{} // a submission arrived or a VM left
	queues   map[int][]*submission
	inflight []*submission
	freeRun  bool
	freeEnd  time.Duration
	deny     map[int]bool
	usage    []Usage
	record   bool
	kills    map[int]uint64        // watchdog kills per vGPU
	lastDone map[int]time.Duration // when each vGPU's last submission completed
	lastEnd  time.Duration         // when the last submission of any VM completed
	think    map[string]*Think     // by guest name, while recording
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
	return &dispatcher{a: a, policy: p, clock: sched.NewRealClock(), watchdog: watchdog, poll: 20 * time.Microsecond,
		log: a.log, wake: make(chan struct{}, 1), queues: map[int][]*submission{}, kills: map[int]uint64{},
		lastDone: map[int]time.Duration{}, think: map[string]*Think{}}
}

func (d *dispatcher) signal() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// addVM and removeVM register a vGPU with the policy.
func (d *dispatcher) addVM(v *VGPU, weight int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.policy.AddVM(sched.VMID(v.ID), weight, d.clock.Now())
}

func (d *dispatcher) removeVM(v *VGPU) {
	d.mu.Lock()
	delete(d.queues, v.ID)
	_ = d.policy.RemoveVM(sched.VMID(v.ID), d.clock.Now())
	d.mu.Unlock()
	d.signal()
}

// submit queues a guest doorbell. It never blocks on the GPU.
func (d *dispatcher) submit(s *submission) {
	d.mu.Lock()
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
		start := time.Now()
		d.mu.Lock()
		d.reap()
		now := d.clock.Now()
		var until time.Duration = -1
		switch {
		case d.freeRun && now < d.freeEnd:
			d.releaseAllowed(now)
			until = d.freeEnd
		case len(d.inflight) > 0:
			// Engaged: one submission at a time on the non-preemptive GPU.
		default:
			d.freeRun = false
			dec := d.policy.Next(now)
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
				d.policy.Overhead(time.Since(start), d.clock.Now())
			}
		}
		busy := len(d.inflight) > 0
		d.mu.Unlock()
		d.sleep(ctx, busy, until)
	}
}

func (d *dispatcher) queued() int {
	n := 0
	for _, q := range d.queues {
		n += len(q)
	}
	return n
}

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
	if len(q) == 0 {
		return
	}
	s := q[0]
	d.queues[id] = q[1:]
	if err := d.policy.Started(sched.VMID(id), now); err != nil {
		d.log.Error("scheduler", "err", err)
	}
	s.released = now
	s.start, _ = d.gpGet(s)
	d.inflight = append(d.inflight, s)
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
// the channel stopped, the VM left, or the watchdog fired.
func (d *dispatcher) reap() {
	keep := d.inflight[:0]
	for _, s := range d.inflight {
		now := d.clock.Now()
		done, err := d.completed(s)
		if !done && d.watchdog > 0 && now-s.released > d.watchdog {
			d.kills[s.v.ID]++
			d.log.Warn("watchdog: killing channel", "vgpu", s.v.ID, "channel", s.ch, "ran", now-s.released)
			if kerr := d.a.phys.kill(s.phys); kerr != nil {
				d.log.Error("watchdog kill", "err", kerr)
			}
			done = true
		}
		if !done {
			keep = append(keep, s)
			continue
		}
		if err != nil {
			d.log.Debug("submission ended without completing", "vgpu", s.v.ID, "err", err)
		}
		// The GPU runs one submission at a time: with several in flight (a
		// free run), one's GPU time starts when the previous one ended.
		begin := max(s.released, d.lastEnd)
		d.lastEnd = now
		if cerr := d.policy.Completed(sched.VMID(s.v.ID), now-begin, now); cerr != nil && !errors.Is(cerr, sched.ErrUnknownVM) {
			d.log.Error("scheduler", "err", cerr)
		}
		d.lastDone[s.v.ID] = now
		if d.record {
			d.usage = append(d.usage, Usage{VGPU: s.v.ID, Name: s.v.Guest.Name, Start: begin, End: now})
		}
	}
	d.inflight = keep
}

// completed reports whether a released submission is over: GP_GET (which
// the GPU advances after each entry's work) reached its put, or the channel
// will never get there.
func (d *dispatcher) completed(s *submission) (bool, error) {
	get, err := d.gpGet(s)
	if err != nil {
		return true, err
	}
	// Done once GP_GET has travelled from where it was at release to put
	// (in ring order: a later release on the channel may already have
	// taken it further).
	dist := func(a, b uint32) uint32 { return (b - a + s.entries) % s.entries }
	if dist(s.start, get) >= dist(s.start, s.put) {
		return true, nil
	}
	ctl := d.a.gpu.Read32(nvc0.BAR0, uint64(nvc0.ChanCtl(s.phys)))
	if ctl&nvc0.ChanCtlFaulted != 0 || ctl&nvc0.ChanCtlEnable == 0 {
		return true, fmt.Errorf("channel %d stopped", s.phys)
	}
	return false, nil
}

// gpGet reads the channel's GP_GET from its user page.
func (d *dispatcher) gpGet(s *submission) (uint32, error) {
	var b [4]byte
	if err := d.a.gpu.ReadVRAM(b[:], s.user+nvc0.UserGPGet); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b[:]) % s.entries, nil
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

// WatchdogKills returns how many channels of a vGPU the watchdog killed.
func (a *Aggregator) WatchdogKills(id int) uint64 {
	d := a.disp
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.kills[id]
}
