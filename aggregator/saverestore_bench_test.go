package aggregator

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"
)

// BenchmarkSaveRestore saves a vGPU holding MiB of its own data to an
// image in memory and restores it on a second daemon (another board,
// another registry: what `gpuvm vgpu save` and `restore` do without the
// file and the control socket), back and forth, on boards of the fermi
// timing profile. It reports, per round: the save (park, capture, encode)
// with the eviction's pause within it, the restore (decode and check the
// image, then the device model's attach restoring it into a slot), and the
// guest's whole pause from park to resident. The data is compared after
// the last round.
//
//	go test ./aggregator -run '^$' -bench SaveRestore -benchtime 10x
func BenchmarkSaveRestore(b *testing.B) {
	for _, mib := range []int{4, 16, 64} {
		b.Run(fmt.Sprintf("%dMiB", mib), func(b *testing.B) {
			aggs := [2]*Aggregator{fermiAggregator(b, Options{MaxVMs: 2}), fermiAggregator(b, Options{MaxVMs: 2})}
			s := startSavable(b, aggs[0], 5, "saved", "fv-optimized")
			ctx, p, data := guestData(b, s.guestVM, mib)
			var save, pause, restore time.Duration
			var inUse, image uint64
			var buf bytes.Buffer
			b.ResetTimer()
			for i := range b.N {
				from, to := aggs[i%2], aggs[(i+1)%2]
				buf.Reset()
				st, err := from.Save(context.Background(), s.v, &buf, false)
				if err != nil {
					b.Fatal(err)
				}
				image += uint64(buf.Len())
				start := time.Now()
				if _, err := to.RegisterRestore(5, &buf); err != nil {
					b.Fatal(err)
				}
				nv, err := attachRAMErr(to, s.g, s.ram)
				if err != nil {
					b.Fatal(err)
				}
				restore += time.Since(start)
				s.port.v.Store(nv)
				s.v = nv
				save += st.Took
				pause += st.Pause
				inUse += st.Bytes
			}
			b.StopTimer()
			n := float64(b.N)
			ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / n }
			b.ReportMetric(float64(inUse)/n/(1<<20), "MiB-in-use")
			b.ReportMetric(float64(image)/n/(1<<20), "MiB-image")
			b.ReportMetric(ms(save), "save-ms")
			b.ReportMetric(ms(pause), "evict-ms")
			b.ReportMetric(ms(restore), "restore-ms")
			b.ReportMetric(ms(save+restore), "guest-pause-ms")
			checkGuestData(b, ctx, p, data, "saves and restores")
		})
	}
}
