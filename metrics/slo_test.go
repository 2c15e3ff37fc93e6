package metrics

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
)

// TestSLOMetrics: a vGPU with a queue-wait objective exports it, its
// violations and its effective weight; one without exports no objective
// and its weight as the effective one.
func TestSLOMetrics(t *testing.T) {
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
	// An objective of 1 ns: every submission, released a few µs after its
	// doorbell at best, violates it.
	agg, err := aggregator.New(board, aggregator.Options{MaxVMs: 2, Partition: part, Channels: cfg.Channels,
		Weight: func(g aggregator.Guest) int { return map[string]int{"busy": 2}[g.Name] },
		SLO: aggregator.SLOOptions{Target: func(g aggregator.Guest) time.Duration {
			return map[string]time.Duration{"busy": time.Nanosecond}[g.Name]
		}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { agg.Close() })
	busy := startGuest(t, agg, 5, "busy")
	startGuest(t, agg, 6, "idle")
	srv := httptest.NewServer(Handler(agg))
	defer srv.Close()
	w, err := workloads.New("madd", workloads.Params{MatrixDim: 32})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Run(gdev.Nouveau(busy)); err != nil {
		t.Fatal(err)
	}
	fams := scrape(t, srv.URL)
	b, i := map[string]string{"domain": "busy"}, map[string]string{"domain": "idle"}
	if got := value(fams, "gpuvm_vgpu_slo_seconds", b); got != 1e-9 {
		t.Errorf("busy VM's SLO %v s, want 1e-9", got)
	}
	subs := value(fams, "gpuvm_vgpu_queue_wait_seconds", b)
	if got := value(fams, "gpuvm_vgpu_slo_violations_total", b); got <= 0 || got != subs {
		t.Errorf("busy VM's violations %v, want every one of its %v released submissions", got, subs)
	}
	if got := value(fams, "gpuvm_vgpu_effective_weight", b); got != 2 {
		t.Errorf("busy VM's effective weight %v, want its weight 2 (no feedback)", got)
	}
	if got := value(fams, "gpuvm_vgpu_slo_seconds", i); got != -1 {
		t.Errorf("idle VM without an SLO exports one: %v", got)
	}
	if got := value(fams, "gpuvm_vgpu_effective_weight", i); got != 1 {
		t.Errorf("idle VM's effective weight %v, want 1", got)
	}
}
