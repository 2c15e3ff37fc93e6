package aggregator

import (
	"testing"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/hypercall"
)

// BenchmarkHypercall measures what the aggregator spends on one hypercall
// from the trap to the result (in-process: no IPC, no hypervisor share;
// the board's timing profile is none): a single MAP, and a multicall of
// as many one-entry MAP_SG_BATCH calls as fit in the page plus a VM_FLUSH.
// Run:
//
//	go test -run x -bench Hypercall ./aggregator
func BenchmarkHypercall(b *testing.B) {
	agg, _ := newTestAggregatorWith(b, Options{MaxVMs: 1})
	g := startGuest(b, agg, "bench", "pv-multicall")
	v := g.v
	buf, err := g.ram.Alloc(hypercall.PageSize)
	if err != nil {
		b.Fatal(err)
	}
	mmio := vgpuPort{v}
	mmio.Write32(hypercall.BAR, hypercall.RegSlot, 1)
	mmio.Write32(hypercall.BAR, hypercall.RegSlotLo, uint32(buf.Bus)|hypercall.SlotEnable)
	mmio.Write32(hypercall.BAR, hypercall.RegSlotHi, uint32(buf.Bus>>32))
	call := func(enc *hypercall.Encoder) {
		copy(buf.Bytes, enc.Page())
		mmio.Write32(hypercall.BAR, hypercall.RegCall, 1)
		if code := hypercall.Code(mmio.Read32(hypercall.BAR, hypercall.RegResult)); code != hypercall.OK {
			b.Fatalf("hypercall: %v", code)
		}
	}
	one := func(c hypercall.Call) uint32 {
		enc := hypercall.NewEncoder(false)
		if err := enc.Add(c); err != nil {
			b.Fatal(err)
		}
		call(enc)
		_, val := hypercall.Result(buf.Bytes, 0)
		return val
	}
	pd := one(hypercall.Call{Op: hypercall.OpMemAlloc, Kind: hypercall.KindPageDir})
	pt := one(hypercall.Call{Op: hypercall.OpMemAlloc, Kind: hypercall.KindSmallTable})
	one(hypercall.Call{Op: hypercall.OpMapPGT, PD: pd, PDE: 2, Small: pt})
	lo, hi := nvc0.PTE{Present: true, Addr: 1 << 20, Target: nvc0.TargetVRAM}.Encode()
	pte := uint64(lo) | uint64(hi)<<32
	single := hypercall.NewEncoder(false)
	_ = single.Add(hypercall.Call{Op: hypercall.OpMap, PT: pt, Index: 7, PTE: pte})
	// As many one-entry scatter-gather maps as fit beside the flush.
	multi := hypercall.NewEncoder(true)
	for i := 0; ; i++ {
		if err := multi.Add(hypercall.Call{Op: hypercall.OpMapSGBatch, PT: pt, Index: uint32(i), Count: 1, PTEs: []uint64{pte}}); err != nil {
			break
		}
	}
	flush := hypercall.Call{Op: hypercall.OpVMFlush, PD: pd}
	for multi.Add(flush) != nil { // make room for the flush
		n := multi.Len()
		multi.Reset()
		for i := range n - 1 {
			_ = multi.Add(hypercall.Call{Op: hypercall.OpMapSGBatch, PT: pt, Index: uint32(i), Count: 1, PTEs: []uint64{pte}})
		}
	}
	b.Run("map", func(b *testing.B) {
		for b.Loop() {
			call(single)
		}
	})
	b.Run("multicall", func(b *testing.B) {
		for b.Loop() {
			call(multi)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(multi.Len()), "ns/op-in-call")
	})
}
