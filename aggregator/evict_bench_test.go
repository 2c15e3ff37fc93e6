package aggregator

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/gpu/sim"
)

// BenchmarkEvictRestore parks a vGPU holding MiB of data and brings it back
// by its next access, on one board of the fermi timing profile (each copy
// charged at the bus DMA rate), and reports per MiB in use the eviction's
// pause, the restore's, and the bound: the same bytes once at the DMA rate.
//
//	go test ./aggregator -run '^$' -bench EvictRestore -benchtime 10x
func BenchmarkEvictRestore(b *testing.B) {
	for _, mib := range []int{4, 16, 64} {
		b.Run(fmt.Sprintf("%dMiB", mib), func(b *testing.B) {
			a := fermiAggregator(b, Options{MaxVMs: 2, Overcommit: 2})
			g := startGuest(b, a, "parked", "fv-optimized")
			ctx, p, data := guestData(b, g, mib)
			var evict, restore time.Duration
			var bytes uint64
			b.ResetTimer()
			for range b.N {
				st, err := a.Evict(context.Background(), g.v, "benchmark")
				if err != nil {
					b.Fatal(err)
				}
				evict += st.Took
				bytes += st.Bytes
				t0 := time.Now()
				if _, err := g.v.Read32(nvc0.BAR0, nvc0.RegBoot0); err != nil { // brings it back
					b.Fatal(err)
				}
				restore += time.Since(t0)
			}
			b.StopTimer()
			inUse := float64(bytes) / float64(b.N) / (1 << 20)
			b.ReportMetric(inUse, "MiB-in-use")
			b.ReportMetric(float64(evict.Microseconds())/float64(b.N)/inUse, "evict-µs/MiB")
			b.ReportMetric(float64(restore.Microseconds())/float64(b.N)/inUse, "restore-µs/MiB")
			b.ReportMetric(float64(1<<20)/sim.TimingFermi().DMABytesPerSec*1e6, "dma-bound-µs/MiB")
			checkGuestData(b, ctx, p, data, "evictions")
		})
	}
}
