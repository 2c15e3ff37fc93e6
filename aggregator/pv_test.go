package aggregator

import "testing"

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
			runAllWorkloads(t, g, mode)
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
