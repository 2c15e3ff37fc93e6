package tests

import (
	"runtime"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// floodHeapBound is how much the heap of this process (the aggregator, the
// board and the attacker's in-process device model) may grow during a
// doorbell flood. A bounded design keeps at most one pending GP_PUT per
// channel and a small per-VM cap of queued work: a few KiB for the whole
// flood. 32 MiB leaves room for the Go runtime's span rounding, goroutine
// stacks and the honest VM's in-flight buffers, and is still far below what
// an unbounded queue reaches at the rate a guest can ring (hundreds of
// thousands of doorbells per second, ~100+ bytes each).
const floodHeapBound = 32 << 20

// TestDoorbellFlood: the attacker rings GP_PUT on its enabled channel
// through its BAR1 poll area as fast as it can for a few seconds while the
// honest VM computes. The aggregator's memory (measured in this process
// after a GC, before and right after the flood) stays bounded, and the
// honest VM's fences do not time out: its work verifies.
func TestDoorbellFlood(t *testing.T) {
	e := newEnv(t)
	a := newAttacker(t, e, "attacker", 66, "fv-naive")
	a.controlCopies(t)
	g := a.inspectChannel(t)
	put := a.put(g)
	flood := 3 * time.Second
	runs := 10
	if testing.Short() {
		flood, runs = 2*time.Second, 5
	}
	honest, _ := e.startBusyHonest(t, runs)
	before := heapInUse()
	av := e.vgpu("attacker")
	bells := av.Counters().Doorbells

	// Sample the heap (without collecting) while the flood runs, to report
	// the peak.
	stop := make(chan struct{})
	peak := make(chan uint64, 1)
	go func() {
		var ms runtime.MemStats
		var hi uint64
		tk := time.NewTicker(50 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				peak <- hi
				return
			case <-tk.C:
				runtime.ReadMemStats(&ms)
				hi = max(hi, ms.HeapInuse)
			}
		}
	}()
	start := time.Now()
	n := 0
	for time.Since(start) < flood {
		for range 256 {
			a.ring(g, put)
		}
		n += 256
	}
	a.r.sync() // every doorbell above has been handled
	took := time.Since(start)
	close(stop)
	after := heapInUse()
	hi := <-peak
	rung := av.Counters().Doorbells - bells
	t.Logf("flood: %d doorbells written in %v (%.0f/s), %d counted by the aggregator; heap in use %.1f MiB before, %.1f MiB after (peak %.1f MiB uncollected)",
		n, took.Round(time.Millisecond), float64(n)/took.Seconds(), rung, inMiB(before), inMiB(after), inMiB(hi))
	if after > before && after-before > floodHeapBound {
		t.Errorf("the aggregator's heap grew by %.1f MiB during a %v doorbell flood (%d doorbells on one channel), bound %d MiB: queued work is unbounded",
			inMiB(after-before), took.Round(time.Millisecond), n, floodHeapBound>>20)
	}
	if err := a.dev.Err(); err != nil {
		t.Errorf("the flooding VM's own connection failed: %v", err)
	}
	honest.verified(t)
}

// aliasWrite writes GP_PUT into the channel's user area through an alias
// of its doorbell page (not the BAR1 poll-area doorbell).
type aliasWrite struct {
	name  string
	modes []string
	// setup prepares the alias (mappings, TLB flushes) and returns the write.
	setup func(t *testing.T, a *attacker, g guestChan) func(put uint32)
}

var gpPutAliases = []aliasWrite{
	// The control: no alias write at all. The entries past the rung GP_PUT
	// must not run (this passes on any aggregator; it shows that the harm
	// the alias cases find comes from the alias write).
	{name: "none", modes: []string{"fv-naive"}, setup: func(*testing.T, *attacker, guestChan) func(uint32) {
		return func(uint32) {}
	}},
	{name: "pramin", modes: []string{"fv-naive"}, setup: func(t *testing.T, a *attacker, g guestChan) func(uint32) {
		return func(put uint32) {
			defer a.r.restoreWindow(a.r.saveWindow())
			a.r.vramWrite32(g.user+nvc0.UserGPPut, put)
		}
	}},
	{name: "bar1", modes: []string{"fv-naive", "fv-optimized"}, setup: func(t *testing.T, a *attacker, g guestChan) func(uint32) {
		page := g.user &^ (pageSize - 1)
		off, err := a.drv.MapBAR1(page, pageSize)
		if err != nil {
			t.Fatalf("map the user page into BAR1: %v", err)
		}
		at := off + g.user%pageSize + nvc0.UserGPPut
		if at >= g.pollBase && at < g.pollBase+nvc0.MaxChannels*nvc0.UserAreaSize {
			t.Fatalf("the BAR1 alias %#x is inside the poll area", at)
		}
		return func(put uint32) { a.dev.Write32(nvc0.BAR1, at, put) }
	}},
	{name: "bar3", modes: []string{"fv-naive", "fv-optimized"}, setup: func(t *testing.T, a *attacker, g guestChan) func(uint32) {
		// A PTE of its own BAR3 page table (found through its BAR3
		// instance) maps the user page at the last BAR3 page, which the
		// driver does not use.
		defer a.r.restoreWindow(a.r.saveWindow())
		ramin := nvc0.InstDecode(a.r.rd(nvc0.RegBAR3Inst))
		pd := uint64(a.r.vramRead32(ramin+nvc0.RAMINPageDir)) | uint64(a.r.vramRead32(ramin+nvc0.RAMINPageDir+4))<<32
		pde := nvc0.DecodePDE(a.r.vramRead32(pd), a.r.vramRead32(pd+4))
		if !pde.SmallPresent || pde.SmallSys {
			t.Fatalf("the guest's BAR3 PDE 0 is %+v", pde)
		}
		_, bar3 := a.dev.BARSizes()
		idx := bar3/pageSize - 1
		if a.r.vramRead32(pde.SmallAddr+idx*nvc0.PTESize)&nvc0.PTEPresent != 0 {
			t.Fatalf("BAR3 page %d is in use by the driver", idx)
		}
		lo, hi := nvc0.PTE{Present: true, Addr: g.user &^ (pageSize - 1), Target: nvc0.TargetVRAM}.Encode()
		a.r.vramWrite32(pde.SmallAddr+idx*nvc0.PTESize, lo)
		a.r.vramWrite32(pde.SmallAddr+idx*nvc0.PTESize+4, hi)
		a.r.flushTLB(t, pd, true)
		at := idx*pageSize + g.user%pageSize + nvc0.UserGPPut
		return func(put uint32) { a.dev.Write32(nvc0.BAR3, at, put) }
	}},
}

// TestGPPutAliases: the attacker writes GP_PUT into its channel's user area
// (the doorbell page its RAMIN +0x08 names) through an alias — the PRAMIN
// window, another BAR1 address mapping the page, a BAR3 mapping of it —
// instead of the poll-area doorbell. The GPU must not run GPFIFO entries
// the scheduler never released.
//
// The attack: entry 1 blocks on a semaphore in the attacker's RAM; entry 2
// launches a 2^40-iteration loop kernel. The attacker rings the legitimate
// doorbell for entry 1 only, waits until its channel is busy on it, writes
// GP_PUT = entry 2 through the alias, then releases the semaphore. If the
// board follows the alias, the scheduler sees entry 1 complete and hands the
// GPU to the honest VM while the unscheduled kernel holds the compute
// engine: the watchdog then kills the honest VM's submissions.
//
// Both fixed behaviours pass: the alias write is ignored by the GPU (entry
// 2 never runs), or it is treated as a doorbell that goes through the
// scheduler (entry 2 runs as the attacker's submission and the watchdog
// kills the attacker). Either way no honest submission is killed, the
// honest VM verifies, and the compute engine is free again soon after.
func TestGPPutAliases(t *testing.T) {
	for _, al := range gpPutAliases {
		modes := al.modes
		if testing.Short() {
			modes = modes[len(modes)-1:]
		}
		for _, mode := range modes {
			t.Run(al.name+"/"+mode, func(t *testing.T) {
				e := newEnvWith(t, envOptions{Watchdog: watchdogLimit})
				a := newAttacker(t, e, "attacker", 66, mode)
				k := newKernelPage(t, a)
				k.controlKernel(t, a)
				g := a.inspectChannel(t)
				write := al.setup(t, a, g)
				if err := a.ch.Finish(); err != nil {
					t.Fatal(err)
				}
				if ctl := a.chanCtl(g); ctl&nvc0.ChanCtlPending != 0 || a.r.errorReported(g.id) {
					t.Fatalf("the attacker's channel is not idle before the attack (control word %#x)", ctl)
				}
				p := a.put(g)
				// Entry p blocks on semaphore 0; entry p+1 is the long kernel.
				k.setSem(0, 0)
				w0, w1 := k.push(0, k.acquire(0, 1))
				a.writeGPFIFO(t, g, p, w0, w1)
				w0, w1 = k.push(1, k.loopLaunch(1, nvc0.MaxKernelLoopIterations, 0))
				a.writeGPFIFO(t, g, p+1, w0, w1)
				next := func(x uint32) uint32 { return (x + 1) % g.entries }

				runs := 12
				if testing.Short() {
					runs = 6
				}
				honest, hv := e.startBusyHonest(t, runs)
				av := e.vgpu("attacker")
				a.ring(g, next(p)) // the scheduler releases entry p only
				if !pollUntil(10*time.Second, func() bool { return a.chanCtl(g)&nvc0.ChanCtlPending != 0 }) {
					t.Fatalf("the blocking entry never ran (control word %#x): the attack harness is broken", a.chanCtl(g))
				}
				write(next(next(p))) // GP_PUT past the kernel entry, through the alias
				a.r.sync()
				k.setSem(0, 1)
				released := time.Now()

				// A kernel that got onto the engine holds it from ~1 ms after
				// the release; give it that chance before looking.
				time.Sleep(100 * time.Millisecond)
				if !pollUntil(10*time.Second, func() bool { return !e.pgraphBusy() }) {
					t.Errorf("the compute engine is still busy %v after the semaphore release: the kernel entry that GP_PUT written through the %s alias exposed runs unstopped (attacker watchdog kills %d)",
						time.Since(released).Round(time.Millisecond), al.name, e.agg.WatchdogKills(av.ID))
				}
				honest.wait(t, 3*time.Minute)
				if n := e.agg.WatchdogKills(hv.ID); n != 0 {
					t.Errorf("the watchdog killed %d submission(s) of the honest VM: it was given the GPU while the attacker's unscheduled kernel (GP_PUT through the %s alias) held the engine", n, al.name)
				}
				t.Logf("attacker: watchdog kills %d, control word %#x", e.agg.WatchdogKills(av.ID), a.chanCtl(g))
				honest.verified(t)
			})
		}
	}
}
