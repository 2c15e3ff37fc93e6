package aggregator

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
)

// BenchmarkMove moves a vGPU holding MiB of data back and forth between two
// boards of the fermi timing profile (the copy charged at the bus DMA rate,
// twice: out of one board, into the other) and reports the guest's pause and
// the VRAM copy per MiB in use. The data is the guest's own: allocated and
// written through its driver, so exactly those pages are resident.
//
//	go test ./aggregator -run '^$' -bench Move -benchtime 10x
func BenchmarkMove(b *testing.B) {
	for _, mib := range []int{4, 16, 64} {
		b.Run(fmt.Sprintf("%dMiB", mib), func(b *testing.B) {
			reg := NewRegistry()
			var aggs [2]*Aggregator
			for i := range aggs {
				aggs[i] = fermiAggregator(b, Options{MaxVMs: 2, Registry: reg, Board: i, BoardName: fmt.Sprint("b", i)})
			}
			g := startGuest(b, aggs[0], "mover", "fv-optimized")
			ctx, p, data := guestData(b, g, mib)
			var down, cp time.Duration
			var bytes uint64
			b.ResetTimer()
			for i := range b.N {
				st, err := Move(context.Background(), g.v, aggs[(i+1)%2])
				if err != nil {
					b.Fatal(err)
				}
				down += st.Downtime
				cp += st.Copy
				bytes += st.Bytes
			}
			b.StopTimer()
			inUse := float64(bytes) / float64(b.N) / (1 << 20)
			b.ReportMetric(inUse, "MiB-in-use")
			b.ReportMetric(float64(down.Microseconds())/float64(b.N)/inUse, "pause-µs/MiB")
			b.ReportMetric(float64(cp.Microseconds())/float64(b.N)/inUse, "copy-µs/MiB")
			checkGuestData(b, ctx, p, data, "moves")
		})
	}
}

// guestData gives g a context holding mib MiB of its own data, written
// through its driver (so exactly those pages are resident), closed at the
// benchmark's end.
func guestData(b *testing.B, g *guestVM, mib int) (*gdev.Context, gdev.DevPtr, []byte) {
	b.Helper()
	ctx, err := gdev.NewContext(g.dev)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ctx.Close() })
	p, err := ctx.MemAlloc(uint64(mib) << 20)
	if err != nil {
		b.Fatal(err)
	}
	data := make([]byte, mib<<20)
	for i := range data {
		data[i] = byte(i*7 + 1)
	}
	if err := ctx.MemcpyHtoD(p, data); err != nil {
		b.Fatal(err)
	}
	return ctx, p, data
}

// checkGuestData fails b unless the guest's data at p still reads data
// after what (moves, evictions).
func checkGuestData(b *testing.B, ctx *gdev.Context, p gdev.DevPtr, data []byte, what string) {
	b.Helper()
	out := make([]byte, len(data))
	if err := ctx.MemcpyDtoH(out, p); err != nil {
		b.Fatal(err)
	}
	for i := range out {
		if out[i] != data[i] {
			b.Fatalf("byte %d of the guest's data changed across the %s", i, what)
		}
	}
}

// fermiAggregator is an aggregator over a 1 GiB board of the fermi timing
// profile with the test partition, opts supplying the rest; both are
// closed when b ends.
func fermiAggregator(b *testing.B, opts Options) *Aggregator {
	b.Helper()
	cfg := sim.DefaultConfig()
	cfg.VRAMSize, cfg.MemPartitions, cfg.Timing = 1<<30, 4, sim.TimingFermi()
	board, err := sim.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { board.Close() })
	opts.Partition, opts.Channels = testPartition(), cfg.Channels
	a, err := New(board, opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { a.Close() })
	return a
}
