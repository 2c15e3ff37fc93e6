package tests

import (
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
)

// BenchmarkDoorbell measures one submission's round trip — an empty push
// buffer with its fence, the doorbell, the scheduler's release, the GPU,
// the guest's fence wait — for a guest behind a real device model in
// fv-optimized (BAR remap on), with doorbells trapped and with doorbells
// polled by the aggregator (GPUvm's sidecore idea). It reports the traps
// each submission costs. Run:
//
//	go test -run x -bench Doorbell -benchtime 2000x ./tests
func BenchmarkDoorbell(b *testing.B) {
	for _, mode := range []struct {
		name string
		poll bool
	}{{"trap", false}, {"poll", true}} {
		b.Run(mode.name, func(b *testing.B) {
			e := newEnvWith(b, envOptions{Modify: func(o *aggregator.Options) {
				o.PollDoorbells = mode.poll
				o.PollInterval = 20 * time.Microsecond
			}})
			dev := e.connect(b, "bench", 3, "fv-optimized")
			bar1, bar3 := dev.BARSizes()
			drv, err := nouveau.Open(dev, dev.RAM(), nouveau.Options{BAR1Size: bar1, BAR3Size: bar3, Timeout: 5 * time.Second})
			if err != nil {
				b.Fatal(err)
			}
			defer drv.Close()
			vm, err := drv.NewVM()
			if err != nil {
				b.Fatal(err)
			}
			ch, err := drv.NewChannel(vm)
			if err != nil {
				b.Fatal(err)
			}
			defer ch.Close()
			submit := func() {
				seq, err := ch.SubmitFenced(nil)
				if err == nil {
					err = ch.WaitFence(seq)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			for range 100 { // warm up: page tables scanned, pages remapped
				submit()
			}
			v := e.vgpu("bench")
			before := v.Counters()
			b.ResetTimer()
			for range b.N {
				submit()
			}
			b.StopTimer()
			after := v.Counters()
			traps := func(c aggregator.Counters) uint64 {
				return c.BAR0Reads + c.BAR0Writes + c.BAR1Reads + c.BAR1Writes + c.BAR3Reads + c.BAR3Writes
			}
			b.ReportMetric(float64(traps(after)-traps(before))/float64(b.N), "traps/op")
			b.ReportMetric(float64(after.PolledDoorbells-before.PolledDoorbells)/float64(b.N), "polled/op")
		})
	}
}
