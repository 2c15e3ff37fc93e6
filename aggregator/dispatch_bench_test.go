package aggregator

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/sched"
)

// instantGPU is a HostGPU for measuring the dispatcher alone: each physical
// channel's GP_GET (in its shadow user area) is what the benchmark says has
// completed, and every access costs the same whatever the channel count.
type instantGPU struct {
	pollBase uint64
	byUser   map[uint64]*instantChannel // by GP_GET address
	byPhys   []*instantChannel
}

type instantChannel struct{ get, put uint32 }

func (g *instantGPU) Read32(int, uint64) uint32 { return 0 }

func (g *instantGPU) Write32(bar int, off uint64, v uint32) {
	if bar == nvc0.BAR1 && off >= g.pollBase && (off-g.pollBase)%nvc0.UserAreaSize == nvc0.UserGPPut {
		g.byPhys[(off-g.pollBase)/nvc0.UserAreaSize].put = v
	}
}

func (g *instantGPU) ReadVRAM(p []byte, addr uint64) error {
	clear(p)
	if c := g.byUser[addr]; c != nil && len(p) == 4 {
		binary.LittleEndian.PutUint32(p, c.get)
	}
	return nil
}

func (g *instantGPU) WriteVRAM([]byte, uint64) error { return nil }
func (g *instantGPU) VRAMSize() uint64               { return 1 << 30 }
func (g *instantGPU) ScrubVRAM(uint64, uint64) error { return nil }
func (g *instantGPU) RegisterSystemMemory([]byte) (uint64, error) {
	return 0, fmt.Errorf("not modelled")
}
func (g *instantGPU) UnregisterSystemMemory(uint64) error { return nil }

// BenchmarkDispatchDecision measures the dispatcher's cycle with n
// backlogged VMs, one channel each: a completion is reaped, the completed
// VM submits again, the policy decides and the chosen submission is
// released. ns/op is the whole cycle on a GPU model whose accesses cost the
// same at any n; decision-ns and next-ns are what DispatchStats measures
// (the decision with its release, and the policy's Next alone). A flat
// per-VM cost means these stay flat as n grows.
func BenchmarkDispatchDecision(b *testing.B) {
	for _, policy := range []string{"band", "credit", "fifo"} {
		for _, n := range []int{1, 8, 32, 64} {
			b.Run(fmt.Sprintf("%s/vms=%d", policy, n), func(b *testing.B) {
				benchDispatch(b, policy, n)
			})
		}
	}
}

func benchDispatch(b *testing.B, policy string, n int) {
	p, err := sched.New(policy, sched.Defaults())
	if err != nil {
		b.Fatal(err)
	}
	const cost = 100 * time.Microsecond
	clock := &sched.ManualClock{}
	g := &instantGPU{byUser: map[uint64]*instantChannel{}}
	log := slog.New(slog.DiscardHandler)
	a := &Aggregator{gpu: g, log: log, faults: newPhysFaults(g, log),
		phys: &physical{gpu: g, layout: Layout{PollArea: Region{0, nvc0.MaxChannels * nvc0.UserAreaSize}}}}
	d := newDispatcher(a, p, 0)
	d.clock = clock
	d.decisionCost = func(time.Time) time.Duration { return 0 }
	a.disp = d
	vms := make([]*VGPU, n)
	subs := make([]submission, n) // each VM's next submission
	for i := range vms {
		vms[i] = &VGPU{ID: i, Guest: Guest{DomID: uint32(i + 1), Name: fmt.Sprintf("vm%d", i+1)}}
		c := &instantChannel{}
		user := 0x100000 + uint64(i)*nvc0.PageSize
		g.byPhys = append(g.byPhys, c)
		g.byUser[user+nvc0.UserGPGet] = c
		if err := d.addVM(vms[i], 1+i%4); err != nil {
			b.Fatal(err)
		}
		subs[i] = submission{v: vms[i], phys: i, put: 1, entries: fakeEntries, shadowUser: user}
		s := subs[i]
		d.submit(&s)
	}
	cur := -1 // the physical channel in flight
	start := a.DispatchStats()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if cur >= 0 {
			// Its submission completed; the VM (backlogged) submits again.
			c := g.byPhys[cur]
			c.get = c.put
			subs[cur].put = (subs[cur].put + 1) % fakeEntries
			s := subs[cur]
			d.submit(&s)
		}
		clock.Advance(cost)
		d.step()
		cur = -1
		if len(d.inflight) > 0 {
			cur = d.inflight[0].phys
		}
	}
	b.StopTimer()
	s := a.DispatchStats()
	if dec := s.Decisions - start.Decisions; dec > 0 {
		b.ReportMetric(float64((s.DecisionTime-start.DecisionTime).Nanoseconds())/float64(dec), "decision-ns")
		b.ReportMetric(float64((s.NextTime-start.NextTime).Nanoseconds())/float64(dec), "next-ns")
	}
}
