package aggregator

import (
	"testing"

	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
)

// Every workload runs on both PV modes against the real aggregator: page
// tables built by hypercalls only (nothing scanned, no BAR instance), no
// refusal for an honest guest, and multicall cutting the hypercalls.
func TestPVWorkloads(t *testing.T) {
	calls := map[string]uint64{}
	for _, mode := range []string{"pv-naive", "pv-multicall"} {
		t.Run(mode, func(t *testing.T) {
			agg, _ := newTestAggregator(t, 1)
			g := startGuest(t, agg, "pv", mode)
			before := g.v.Counters()
			for _, name := range workloads.Names() {
				w, err := workloads.New(name, smallParams)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := w.Run(g.dev); err != nil {
					t.Fatalf("%s on %s: %v", name, mode, err)
				}
			}
			c := g.v.Counters()
			t.Logf("%s counters: %+v", mode, c)
			if c.Hypercalls == before.Hypercalls || c.PTEsMapped == 0 || c.HypercallOps < c.Hypercalls {
				t.Errorf("no hypercall work counted: %+v", c)
			}
			if c.Scans != 0 || c.PTEsScanned != 0 {
				t.Errorf("a PV vGPU scanned page tables: %+v", c)
			}
			if c.Denied != 0 || c.PVRejected != 0 {
				t.Errorf("an honest PV guest was refused: denied %d, pv_rejected %d", c.Denied, c.PVRejected)
			}
			calls[mode] = c.Hypercalls - before.Hypercalls
		})
	}
	if n, m := calls["pv-naive"], calls["pv-multicall"]; m == 0 || n < 10*m {
		t.Errorf("hypercalls: %d without multicall, %d with: want at least 10× fewer", n, m)
	}
}

// A PV guest that opens and closes contexts holds no more page-table
// memory or handles after the hundredth than after the first.
func TestPVMemoryReturnedBetweenContexts(t *testing.T) {
	agg, _ := newTestAggregator(t, 1)
	g := startGuest(t, agg, "churn", "pv-multicall")
	var first uint64
	var firstObjs int
	for i := range 100 {
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
			t.Fatalf("after %d contexts: %d bytes, %d retired, %d handles; after the first %d bytes, %d handles", i+1, held, retired, objs, first, firstObjs)
		}
	}
}
