package bench

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestH2AndCapacity(t *testing.T) {
	for _, c := range []struct{ p, h float64 }{
		{0, 0}, {1, 0}, {0.5, 1}, {0.25, 0.8112781244591328}, {0.11, 0.4999159581645},
	} {
		if got := H2(c.p); math.Abs(got-c.h) > 1e-9 {
			t.Errorf("H2(%v) = %v, want %v", c.p, got, c.h)
		}
		if !near(H2(c.p), H2(1-c.p)) {
			t.Errorf("H2 not symmetric at %v", c.p)
		}
	}
	if got := BSCCapacity(20, 0); got != 20 {
		t.Errorf("error-free capacity %v, want the raw rate 20", got)
	}
	if got := BSCCapacity(20, 0.5); got != 0 {
		t.Errorf("capacity at BER 0.5 is %v, want 0", got)
	}
	if got := BSCCapacity(20, 0.25); !near(got, 20*(1-0.8112781244591328)) {
		t.Errorf("capacity at BER 0.25 is %v", got)
	}
}

func TestCovertMessage(t *testing.T) {
	m := CovertMessage(16, 256, 1)
	if len(m) != 272 || !strings.HasPrefix(m, "1010101010101010") || !isBits(m) {
		t.Fatalf("message %q", m)
	}
	if m != CovertMessage(16, 256, 1) {
		t.Error("same seed, different message")
	}
	if m[16:] == CovertMessage(16, 256, 2)[16:] {
		t.Error("different seeds, same message")
	}
	if ones := strings.Count(m[16:], "1"); ones < 100 || ones > 156 {
		t.Errorf("%d ones of 256: not a fair coin", ones)
	}
}

// probes makes receiver samples for msg: per period, n probes spread over
// the period with latency hi (µs) in 1-bit periods and lo in 0-bit ones,
// plus one probe in the skipped start of every period with latency junk.
func probes(msg string, bit time.Duration, n int, lo, hi, junk float64) CovertGuest {
	g := CovertGuest{Role: CovertReceiver}
	for i, b := range msg {
		base := time.Duration(i) * bit
		g.ProbeAtNs = append(g.ProbeAtNs, int64(base+bit/50))
		g.ProbeLatencyNs = append(g.ProbeLatencyNs, int64(junk*1e3))
		for k := range n {
			at := base + bit/5 + time.Duration(k)*(bit*3/4)/time.Duration(n)
			lat := lo
			if b == '1' {
				lat = hi
			}
			if k == 0 {
				lat *= 1.5 // not all equal
			}
			g.ProbeAtNs = append(g.ProbeAtNs, int64(at))
			g.ProbeLatencyNs = append(g.ProbeLatencyNs, int64(lat*1e3))
		}
	}
	return g
}

// TestDecode: the preamble calibrates the threshold at the log-scale
// midpoint of the two classes' mean statistics, probes in a period's first tenth are
// ignored, and the message decodes without error — also when 1-bits show
// the lower latency (inverted) — and a wrong bit counts.
func TestDecode(t *testing.T) {
	const bit = 50 * time.Millisecond
	msg := CovertMessage(16, 64, 7)
	for _, c := range []struct {
		name     string
		lo, hi   float64
		inverted bool
	}{{"busy is slow", 100, 3000, false}, {"busy is fast", 3000, 100, true}} {
		t.Run(c.name, func(t *testing.T) {
			run := CovertRun{BitsPerSec: 1 / bit.Seconds()}
			if err := decodeRun(&run, msg, 16, bit, probes(msg, bit, 10, c.lo, c.hi, 1e6)); err != nil {
				t.Fatal(err)
			}
			// Each class's mean: 1.05 × its latency (one probe of ten at
			// 1.5×); the threshold is their geometric mean.
			if want := 1.05 * math.Sqrt(c.lo*c.hi); math.Abs(run.ThresholdUs-want) > 1e-6 {
				t.Errorf("threshold %v µs, want %v", run.ThresholdUs, want)
			}
			if run.Inverted != c.inverted || run.Errors != 0 || run.BER != 0 || run.Bits != 64 || run.CapacityBps != 20 || run.EmptyPeriods != 0 {
				t.Errorf("run %+v", run)
			}
			if run.Latency1.Count != 10*strings.Count(msg[16:], "1") || math.Abs(run.Latency1.MedianUs-c.hi) > 1e-6 ||
				math.Abs(run.Latency0.P95Us-1.5*c.lo) > 1e-6 {
				t.Errorf("latency stats 0 %+v, 1 %+v", run.Latency0, run.Latency1)
			}
		})
	}
	// Flip what period 20 shows, and leave period 30 without probes.
	g := probes(msg, bit, 10, 100, 3000, 0)
	var at, lat []int64
	for i, a := range g.ProbeAtNs {
		k := time.Duration(a) / bit
		switch {
		case k == 30:
			continue
		case k == 20 && msg[20] == '1':
			lat = append(lat, 100e3)
		case k == 20:
			lat = append(lat, 3000e3)
		default:
			lat = append(lat, g.ProbeLatencyNs[i])
		}
		at = append(at, a)
	}
	g.ProbeAtNs, g.ProbeLatencyNs = at, lat
	run := CovertRun{BitsPerSec: 20}
	if err := decodeRun(&run, msg, 16, bit, g); err != nil {
		t.Fatal(err)
	}
	wantErrs := 1
	if msg[30] == '1' {
		wantErrs++ // an empty period decodes as 0
	}
	if run.Errors != wantErrs || run.EmptyPeriods != 1 || run.Periods[30].Probes != 0 || run.Periods[20].Decoded == run.Periods[20].Sent {
		t.Errorf("errors %d (want %d), empty %d, periods 20 %+v 30 %+v", run.Errors, wantErrs, run.EmptyPeriods, run.Periods[20], run.Periods[30])
	}
	if p := float64(wantErrs) / 64; !near(run.BER, p) || !near(run.CapacityBps, 20*(1-H2(p))) {
		t.Errorf("BER %v capacity %v", run.BER, run.CapacityBps)
	}
	// A preamble whose 0-bit periods have no probe cannot calibrate.
	g = probes("10", bit, 3, 1, 2, 0)
	g.ProbeAtNs, g.ProbeLatencyNs = g.ProbeAtNs[:4], g.ProbeLatencyNs[:4]
	if err := decodeRun(&CovertRun{}, "101", 2, bit, g); err == nil {
		t.Error("calibrated without 0-bit samples")
	}
}

func TestQuantileAndMean(t *testing.T) {
	xs := []float64{5, 1, 4, 2, 3}
	if quantile(xs, 0.5) != 3 || quantile(xs, 0.95) != 5 || quantile(xs, 0) != 1 || mean(xs) != 3 {
		t.Errorf("quantile/mean of %v", xs)
	}
	if !math.IsNaN(quantile(nil, 0.5)) || !math.IsNaN(mean(nil)) {
		t.Error("no samples must give NaN")
	}
	if xs[0] != 5 {
		t.Error("quantile sorted its argument")
	}
}

// TestSlotOverrun: only the named VM's submissions released in the window
// that end past the end of the slot they started in count.
func TestSlotOverrun(t *testing.T) {
	const ms = time.Millisecond
	u := []aggregator.Usage{
		{Name: "sender", Start: 1 * ms, End: 45 * ms},    // released before the window
		{Name: "sender", Start: 61 * ms, End: 85 * ms},   // fits [60, 90)
		{Name: "sender", Start: 85 * ms, End: 94 * ms},   // 4 ms over
		{Name: "receiver", Start: 94 * ms, End: 99 * ms}, // another VM
		{Name: "sender", Start: 100 * ms, End: 130 * ms}, // 10 ms over
	}
	o := slotOverrun(u, "sender", 30*ms, 10*ms, time.Second)
	if o.Count != 2 || !near(o.TotalMs, 14) || !near(o.MaxMs, 10) {
		t.Errorf("overrun %+v, want 2, 14 ms, max 10 ms", o)
	}
	if b := gpuBusy(u, 40*ms, 140*ms); !near(b, (5+24+9+5+30)/100.0) {
		t.Errorf("GPU busy %v, want 0.73", b)
	}
}
