package aggregator

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"math"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/sched"
)

// The dispatcher, driven deterministically: a manual clock, a modelled GPU
// that runs released GPFIFO entries one at a time for a known GPU time, and
// closed-loop VMs that submit again a think time after their previous
// submission completed (the shape of the fairness harness, thesis Fig.
// 4.11). Everything runs in one goroutine, so a run's shares are the same
// every time: the tests below guard the policies' fairness as the real
// dispatcher applies them.

const fakeEntries = 1024

// fakeEntry is one released GPFIFO entry.
type fakeEntry struct {
	phys     int
	released time.Duration
}

// fakeChannel is a modelled physical channel.
type fakeChannel struct {
	user     uint64 // its shadow user area (where the dispatcher reads GP_GET)
	get, put uint32
	doneAt   time.Duration // when its last entry completed
}

// fakeGPU is a HostGPU whose engine runs the entries rung through the poll
// area in order, each for its channel's cost, on the manual clock.
type fakeGPU struct {
	clock    *sched.ManualClock
	pollBase uint64
	cost     map[int]time.Duration
	chans    map[int]*fakeChannel
	queue    []fakeEntry
	cur      *fakeEntry
	curStart time.Duration
	curEnd   time.Duration
	lastEnd  time.Duration
}

// advance completes the entries whose GPU time is over by now.
func (g *fakeGPU) advance() {
	now := g.clock.Now()
	for {
		if g.cur == nil {
			if len(g.queue) == 0 {
				return
			}
			e := g.queue[0]
			g.queue = g.queue[1:]
			g.cur = &e
			g.curStart = max(g.lastEnd, e.released)
			g.curEnd = g.curStart + g.cost[e.phys]
		}
		if g.curEnd > now {
			return
		}
		c := g.chans[g.cur.phys]
		c.get = (c.get + 1) % fakeEntries
		c.doneAt = g.curEnd
		g.lastEnd = g.curEnd
		g.cur = nil
	}
}

// nextEvent is when the entry on the engine completes (-1: idle).
func (g *fakeGPU) nextEvent() time.Duration {
	g.advance()
	if g.cur == nil {
		return -1
	}
	return g.curEnd
}

func (g *fakeGPU) Read32(bar int, off uint64) uint32 {
	g.advance()
	if bar != nvc0.BAR0 {
		return 0
	}
	switch {
	case off == uint64(nvc0.RegEngineStatus(nvc0.EngineGR)):
		if g.cur != nil && g.clock.Now() >= g.curStart {
			return nvc0.EngineStatusBusy | uint32(g.cur.phys)
		}
	case off >= nvc0.RegChanTable && off < nvc0.RegChanTable+nvc0.MaxChannels*nvc0.ChanTableStride && off%8 == 4:
		return nvc0.ChanCtlDefault
	}
	return 0
}

// Write32 takes the dispatcher's physical doorbells (GP_PUT through the
// poll area): the entries up to the new put are released to the engine.
func (g *fakeGPU) Write32(bar int, off uint64, v uint32) {
	if bar != nvc0.BAR1 || (off-g.pollBase)%nvc0.UserAreaSize != nvc0.UserGPPut {
		return
	}
	p := int((off - g.pollBase) / nvc0.UserAreaSize)
	c := g.chans[p]
	for c.put != v {
		g.queue = append(g.queue, fakeEntry{phys: p, released: g.clock.Now()})
		c.put = (c.put + 1) % fakeEntries
	}
}

func (g *fakeGPU) ReadVRAM(p []byte, addr uint64) error {
	g.advance()
	clear(p)
	for _, c := range g.chans {
		if addr == c.user+nvc0.UserGPGet && len(p) == 4 {
			binary.LittleEndian.PutUint32(p, c.get)
		}
	}
	return nil
}

func (g *fakeGPU) WriteVRAM([]byte, uint64) error              { return nil }
func (g *fakeGPU) VRAMSize() uint64                            { return 1 << 30 }
func (g *fakeGPU) ScrubVRAM(uint64, uint64) error              { return nil }
func (g *fakeGPU) RegisterSystemMemory([]byte) (uint64, error) { return 0, fmt.Errorf("not modelled") }
func (g *fakeGPU) UnregisterSystemMemory(uint64) error         { return nil }
func (g *fakeGPU) channel(p int, user uint64) *fakeChannel {
	c := &fakeChannel{user: user}
	g.chans[p] = c
	return c
}
func (g *fakeGPU) submissionOf(v *VGPU, p int, put uint32) *submission {
	return &submission{v: v, ch: 0, phys: p, put: put, entries: fakeEntries, shadowUser: g.chans[p].user}
}

// loadVM is a closed-loop VM: one channel, one entry of cost GPU time per
// submission, resubmitting think after each completion.
type loadVM struct {
	name    string
	weight  int
	cost    time.Duration
	think   time.Duration
	v       *VGPU
	phys    int
	put     uint32
	waiting bool
	next    time.Duration
}

// runDispatcher runs vms against policy for horizon of manual-clock time
// and returns each VM's GPU time.
func runDispatcher(t *testing.T, policy string, vms []*loadVM, horizon time.Duration) map[string]time.Duration {
	t.Helper()
	p, err := sched.New(policy, sched.Defaults())
	if err != nil {
		t.Fatal(err)
	}
	clock := &sched.ManualClock{}
	g := &fakeGPU{clock: clock, cost: map[int]time.Duration{}, chans: map[int]*fakeChannel{}}
	a := &Aggregator{gpu: g, log: slog.New(slog.DiscardHandler), faults: newPhysFaults(g, slog.New(slog.DiscardHandler)),
		phys: &physical{gpu: g, layout: Layout{PollArea: Region{0, nvc0.MaxChannels * nvc0.UserAreaSize}}}}
	d := newDispatcher(a, p, 0)
	d.clock = clock
	d.decisionCost = func(time.Time) time.Duration { return 0 }
	for i, vm := range vms {
		vm.v, vm.phys = &VGPU{ID: i, Guest: Guest{DomID: uint32(i + 1), Name: vm.name}}, i
		g.cost[i] = vm.cost
		g.channel(i, 0x100000+uint64(i)*nvc0.PageSize)
		if err := d.addVM(vm.v, vm.weight); err != nil {
			t.Fatal(err)
		}
	}
	a.disp = d
	a.StartRecording()
	for clock.Now() < horizon {
		now := clock.Now()
		for _, vm := range vms {
			c := g.chans[vm.phys]
			if vm.waiting && c.get == vm.put {
				vm.waiting, vm.next = false, c.doneAt+vm.think
			}
			if !vm.waiting && vm.next <= now {
				vm.put = (vm.put + 1) % fakeEntries
				vm.waiting = true
				d.submit(g.submissionOf(vm.v, vm.phys, vm.put))
			}
		}
		busy, until := d.step()
		// A completion the step just reaped starts the VM's think time now,
		// not when the loop next comes round (which may be a policy's far
		// Wait away).
		for _, vm := range vms {
			if c := g.chans[vm.phys]; vm.waiting && c.get == vm.put {
				vm.waiting, vm.next = false, c.doneAt+vm.think
			}
		}
		next := horizon
		if e := g.nextEvent(); e >= 0 {
			next = min(next, e)
		}
		for _, vm := range vms {
			if !vm.waiting {
				next = min(next, vm.next)
			}
		}
		if until >= 0 {
			next = min(next, until)
		}
		if busy {
			next = min(next, now+d.poll)
		}
		if next <= now { // something is due now: let the loop take it
			next = now + time.Microsecond
		}
		clock.Advance(next - now)
	}
	used := map[string]time.Duration{}
	for _, u := range d.usage {
		used[u.Name] += u.End - u.Start
	}
	return used
}

// TestDispatcherFairness runs every policy through the real dispatcher on
// the deterministic model and checks each VM's share of the GPU time the
// VMs used against what the policy is meant to give, within a stated
// tolerance: a guard for the fairness figures in docs/performance.md.
func TestDispatcherFairness(t *testing.T) {
	type scenario struct {
		name string
		vms  func() []*loadVM
	}
	const think = 50 * time.Microsecond
	scenarios := []scenario{
		{"equal", func() []*loadVM {
			return []*loadVM{{name: "a", weight: 1, cost: 2 * time.Millisecond, think: think},
				{name: "b", weight: 1, cost: 2 * time.Millisecond, think: think}}
		}},
		{"madd-vs-long-madd", func() []*loadVM { // thesis Fig. 4.11: 15× the work per submission
			return []*loadVM{{name: "madd", weight: 1, cost: time.Millisecond, think: think},
				{name: "long-madd", weight: 1, cost: 15 * time.Millisecond, think: think}}
		}},
		{"weights-1-2-4", func() []*loadVM {
			return []*loadVM{{name: "w1", weight: 1, cost: 2 * time.Millisecond, think: think},
				{name: "w2", weight: 2, cost: 2 * time.Millisecond, think: think},
				{name: "w4", weight: 4, cost: 2 * time.Millisecond, think: think}}
		}},
	}
	for _, policy := range sched.Names() {
		for _, sc := range scenarios {
			t.Run(policy+"/"+sc.name, func(t *testing.T) {
				vms := sc.vms()
				used := runDispatcher(t, policy, vms, 5*time.Second)
				var total time.Duration
				for _, d := range used {
					total += d
				}
				if total == 0 {
					t.Fatal("no GPU time used")
				}
				for _, vm := range vms {
					share := float64(used[vm.name]) / float64(total)
					want, tol := expectedShare(policy, sc.name, vm, vms)
					t.Logf("%s: share %.3f (want %.3f ± %.3f)", vm.name, share, want, tol)
					if math.Abs(share-want) > tol {
						t.Errorf("%s under %s: GPU share %.3f, want %.3f ± %.3f", vm.name, policy, share, want, tol)
					}
				}
			})
		}
	}
}

// known are the shares the policies deliver today where they do not give
// the weighted share, by policy, scenario and VM: a regression guard for
// the fairness figures (docs/performance.md), with the reason. Issue 19's
// scheduler work is to move these to the weighted share.
//
//   - fifo releases in arrival order: the closed-loop VMs alternate, so the
//     shares follow the work per submission, and weights are ignored.
//   - credit is work-conserving without anticipation: when a VM's
//     submission completes it is in its think time when the next decision
//     is taken, so another VM runs (the thesis' Fig. 4.11 failure of
//     CREDIT); with one submission in flight each, the madd VM gets its
//     1/16 and weights are only partly honoured. (wfq was here too until
//     it gained BAND's anticipation window, issue 19.)
//   - strict: fixed 30 ms slots with a guard of the VM's longest
//     submission; a 15 ms submission fits once per slot (a second would
//     overrun), so long-madd uses 15 ms of each of its slots while madd
//     fills about 28 of its own.
var known = map[string]map[string]map[string]float64{
	"fifo": {
		"madd-vs-long-madd": {"madd": 1.0 / 16, "long-madd": 15.0 / 16},
		"weights-1-2-4":     {"w1": 1.0 / 3, "w2": 1.0 / 3, "w4": 1.0 / 3},
	},
	"credit": {
		"madd-vs-long-madd": {"madd": 1.0 / 16, "long-madd": 15.0 / 16},
		"weights-1-2-4":     {"w1": 0.219, "w2": 0.287, "w4": 0.495},
	},
	"strict": {
		"madd-vs-long-madd": {"madd": 0.653, "long-madd": 0.347},
	},
}

// expectedShare is what a policy gives a VM in a scenario, and the
// tolerance: the weighted share within 0.05, or the known share within 0.03.
func expectedShare(policy, scenario string, vm *loadVM, vms []*loadVM) (want, tol float64) {
	if k, ok := known[policy][scenario][vm.name]; ok {
		return k, 0.03
	}
	weights := 0
	for _, v := range vms {
		weights += v.weight
	}
	return float64(vm.weight) / float64(weights), 0.05
}
