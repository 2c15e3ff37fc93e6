package metrics

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/gpu/hostmem"
	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
)

func newAggregator(t *testing.T) *aggregator.Aggregator {
	t.Helper()
	part := config.PartitionConfig{VRAMPerVM: 256 << 20, ChannelsPerVM: 8, BAR1PerVM: 16 << 20, BAR3PerVM: 4 << 20, Reserved: 128 << 20}
	layout, err := aggregator.NewLayout(part, 2, 1<<30, 128)
	if err != nil {
		t.Fatal(err)
	}
	cfg := sim.DefaultConfig()
	cfg.VRAMSize, cfg.MemPartitions, cfg.VRAMSegments = 1<<30, 4, layout.Segments(1<<30)
	board, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { board.Close() })
	agg, err := aggregator.New(board, aggregator.Options{MaxVMs: 2, Partition: part, Channels: cfg.Channels,
		Weight: func(g aggregator.Guest) int { return map[string]int{"busy": 2}[g.Name] }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { agg.Close() })
	return agg
}

func startGuest(t *testing.T, agg *aggregator.Aggregator, domid uint32, name string) *nouveau.Device {
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
	v, err := agg.Attach(aggregator.Guest{DomID: domid, Name: name, Mode: "fv-optimized"}, f, ram.Size())
	if err != nil {
		t.Fatal(err)
	}
	dev, err := nouveau.Open(v.Port(), ram, nouveau.Options{BAR1Size: v.Slot.BAR1.Size, BAR3Size: v.Slot.BAR3.Size})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	return dev
}

// scrape fetches and parses the endpoint.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %s\n%s", resp.Status, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("parse: %v\n%s", err, body)
	}
	return fams
}

// value returns the value of family name's series whose labels include
// want, or -1 if there is none.
func value(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	f := fams[name]
	if f == nil {
		return -1
	}
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	return -1
}

// TestMetricsFollowWork: two VMs attached, one computes. Between scrapes
// the busy VM's GPU time, submissions, traps and queue-wait count grow; the
// idle one's stay where they were; both are labelled, and the daemon's own
// CPU time is exported.
func TestMetricsFollowWork(t *testing.T) {
	agg := newAggregator(t)
	busy := startGuest(t, agg, 5, "busy")
	startGuest(t, agg, 6, "idle")
	srv := httptest.NewServer(Handler(agg))
	defer srv.Close()
	w, err := workloads.New("madd", workloads.Params{MatrixDim: 32})
	if err != nil {
		t.Fatal(err)
	}
	run := func() {
		for range 3 {
			if _, err := w.Run(gdev.Nouveau(busy)); err != nil {
				t.Fatal(err)
			}
		}
	}
	run()
	first := scrape(t, srv.URL)
	run()
	second := scrape(t, srv.URL)

	b, i := map[string]string{"domain": "busy", "vgpu": "0"}, map[string]string{"domain": "idle", "vgpu": "1"}
	for _, name := range []string{"gpuvm_vgpu_gpu_seconds_total", "gpuvm_vgpu_submissions_total", "gpuvm_vgpu_queue_wait_seconds", "gpuvm_vgpu_doorbells_total"} {
		b1, b2 := value(first, name, b), value(second, name, b)
		i1, i2 := value(first, name, i), value(second, name, i)
		t.Logf("%s: busy %v → %v, idle %v → %v", name, b1, b2, i1, i2)
		if !(b1 > 0 && b2 > b1) {
			t.Errorf("%s of the busy VM did not grow with its work: %v → %v", name, b1, b2)
		}
		if i1 != 0 || i2 != 0 {
			t.Errorf("%s of the idle VM = %v → %v, want 0", name, i1, i2)
		}
	}
	bar3 := map[string]string{"domain": "busy", "bar": "3", "access": "write"}
	if a, z := value(first, "gpuvm_vgpu_traps_total", bar3), value(second, "gpuvm_vgpu_traps_total", bar3); !(z > a && a > 0) {
		t.Errorf("busy VM's BAR3 write traps %v → %v", a, z)
	}
	if got := value(second, "gpuvm_vgpu_weight", b); got != 2 {
		t.Errorf("busy VM's weight %v, want 2", got)
	}
	if got := value(second, "gpuvm_vgpu_gpu_share_ratio", b); got != 1 {
		t.Errorf("busy VM's share %v, want 1 (the only VM computing)", got)
	}
	if got := value(second, "gpuvm_vgpu_info", map[string]string{"domain": "idle", "domid": "6", "mode": "fv-optimized", "vgpu": "1"}); got != 1 {
		t.Errorf("idle VM's info series %v", got)
	}
	if got := value(second, "gpuvm_vgpu_vram_used_bytes", b); got <= 0 {
		t.Errorf("busy VM's VRAM in use %v", got)
	}
	if got := value(second, "gpuvm_slots", map[string]string{"state": "used"}); got != 2 {
		t.Errorf("used slots %v, want 2", got)
	}
	if got := value(second, "process_cpu_seconds_total", nil); got <= 0 {
		t.Errorf("process_cpu_seconds_total = %v", got)
	}
}
