package aggregator

import (
	"hash/fnv"
	"testing"

	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/gpu/hostmem"
	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
)

func testPartition() config.PartitionConfig {
	return config.PartitionConfig{VRAMPerVM: 256 << 20, ChannelsPerVM: 8, BAR1PerVM: 16 << 20, BAR3PerVM: 4 << 20, Reserved: 128 << 20}
}

func newTestAggregator(t *testing.T, maxVMs int) (*Aggregator, *sim.Board) {
	return newTestAggregatorWith(t, Options{MaxVMs: maxVMs})
}

// newTestAggregatorWith builds an aggregator over a 1 GiB board with the
// test partition; opts supplies everything else.
func newTestAggregatorWith(t testing.TB, opts Options) (*Aggregator, *sim.Board) {
	t.Helper()
	cfg := sim.DefaultConfig()
	cfg.VRAMSize, cfg.MemPartitions = 1<<30, 4
	board, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { board.Close() })
	opts.Partition, opts.Channels = testPartition(), cfg.Channels
	agg, err := New(board, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := agg.Close(); err != nil {
			t.Errorf("aggregator close: %v", err)
		}
	})
	return agg, board
}

// guestVM is a VM in the test process: its RAM, its vGPU, its driver.
type guestVM struct {
	ram *hostmem.RAM
	v   *VGPU
	dev *nouveau.Device
}

func startGuest(t testing.TB, agg *Aggregator, name, mode string) *guestVM {
	t.Helper()
	h := fnv.New32a()
	h.Write([]byte(name))
	return startGuestAs(t, agg, h.Sum32(), name, mode)
}

// startGuestAs is startGuest for domain domid.
func startGuestAs(t testing.TB, agg *Aggregator, domid uint32, name, mode string) *guestVM {
	t.Helper()
	ram, err := hostmem.New(name, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ram.Close() })
	f, err := ram.File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	v, err := agg.Attach(Guest{DomID: domid, Name: name, Mode: mode}, f, ram.Size())
	if err != nil {
		t.Fatal(err)
	}
	dev, err := nouveau.Open(vgpuPort{v}, ram, nouveau.Options{BAR1Size: v.Slot.BAR1.Size, BAR3Size: v.Slot.BAR3.Size, PV: driverPV(mode)})
	if err != nil {
		t.Fatalf("guest driver on %s: %v", mode, err)
	}
	t.Cleanup(func() { dev.Close() })
	return &guestVM{ram: ram, v: v, dev: dev}
}

// driverPV is the guest driver's PV mode for a mode.
func driverPV(mode string) nouveau.PVMode {
	switch config.Mode(mode) {
	case config.ModePVNaive:
		return nouveau.PVNaive
	case config.ModePVMulticall:
		return nouveau.PVMulticall
	}
	return nouveau.PVOff
}

// runAllWorkloads runs every workload once on the guest; each must verify.
func runAllWorkloads(t *testing.T, g *guestVM, mode string) {
	t.Helper()
	for _, name := range workloads.Names() {
		w, err := workloads.New(name, smallParams)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Run(gdev.Nouveau(g.dev)); err != nil {
			t.Fatalf("%s on %s: %v", name, mode, err)
		}
	}
}

var smallParams = workloads.Params{MatrixDim: 32, LoopIterations: 1000, CopyBytes: 5<<20 + 123, RodiniaScale: 16}

func TestGuestWorkloadsRunVirtualized(t *testing.T) {
	for _, mode := range []string{"fv-naive", "fv-lazy"} {
		t.Run(mode, func(t *testing.T) {
			agg, _ := newTestAggregator(t, 2)
			g := startGuest(t, agg, "vm1", mode)
			if got := g.dev.VRAMSize(); got != 256<<20 {
				t.Errorf("guest sees %d MiB of VRAM, want its 256 MiB slice", got>>20)
			}
			runAllWorkloads(t, g, mode)
			c := g.v.Counters()
			t.Logf("%s counters: %+v", mode, c)
			if c.Scans == 0 || c.TLBFlushes == 0 || c.BAR3Writes == 0 || c.Doorbells == 0 {
				t.Errorf("counters look idle: %+v", c)
			}
			if c.Denied != 0 {
				t.Errorf("an honest guest had %d accesses denied", c.Denied)
			}
		})
	}
}

// TestShadowMemoryReturnedBetweenContexts: a guest that opens and closes
// contexts (an address space and channels each) over and over holds no more
// shadow memory (or, in PV, page-table handles) after the hundredth than
// after the first: what a closed channel and its space retired is reclaimed
// as the guest goes on, not only when the VM leaves (a long benchmark once
// ran out of its shadow budget).
func TestShadowMemoryReturnedBetweenContexts(t *testing.T) {
	for _, mode := range []string{"fv-optimized", "pv-multicall"} {
		t.Run(mode, func(t *testing.T) {
			agg, _ := newTestAggregator(t, 1)
			g := startGuest(t, agg, "churn", mode)
			var first uint64
			var firstObjs int
			contexts := 100
			if testing.Short() {
				contexts = 30 // a leak shows from the second; -race's run is the short one
			}
			for i := range contexts {
				ctx, err := gdev.NewContext(g.dev)
				if err != nil {
					t.Fatalf("context %d: %v", i, err)
				}
				if err := maddOnce(ctx, 8); err != nil {
					t.Fatalf("context %d: %v", i, err)
				}
				if err := ctx.Close(); err != nil {
					t.Fatalf("close context %d: %v", i, err)
				}
				g.v.mu.Lock()
				held, retired, objs := g.v.shadows.ShadowBytes(), g.v.shadows.Retired(), g.v.shadows.PVObjects()
				g.v.mu.Unlock()
				if i == 0 {
					first, firstObjs = held, objs
					continue
				}
				if held > first || retired > 0 || objs > firstObjs {
					t.Fatalf("after %d contexts: %d shadow bytes, %d retired allocations, %d PV handles; after the first %d bytes, %d handles",
						i+1, held, retired, objs, first, firstObjs)
				}
			}
		})
	}
}
