package metrics

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/host"
)

// TestBoardMetrics: a host of two boards exports each board's state, load
// and slots, and each vGPU names its board; a board that fell off the bus
// shows as failed.
func TestBoardMetrics(t *testing.T) {
	part := config.PartitionConfig{VRAMPerVM: 128 << 20, ChannelsPerVM: 8, BAR1PerVM: 16 << 20, BAR3PerVM: 4 << 20, Reserved: 64 << 20}
	reg := aggregator.NewRegistry()
	var boards []*host.Board
	for i, name := range []string{"fast", "slow"} {
		cfg := sim.DefaultConfig()
		cfg.VRAMSize, cfg.MemPartitions = 512<<20, 4
		board, err := sim.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		agg, err := aggregator.New(board, aggregator.Options{MaxVMs: 2, Partition: part, Channels: cfg.Channels, Registry: reg,
			Board: i, BoardName: name, HealthInterval: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		boards = append(boards, &host.Board{Index: i, Name: name, Timing: "none", Agg: agg, Release: board.Close, FailBus: board.FailBus})
	}
	h, err := host.New(reg, boards, host.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	startGuest(t, boards[1].Agg, 5, "on-slow")
	srv := httptest.NewServer(Handler(h))
	defer srv.Close()
	fams := scrape(t, srv.URL)
	if got := value(fams, "gpuvm_vgpu_info", map[string]string{"domain": "on-slow", "board": "slow"}); got != 1 {
		t.Errorf("vgpu_info of the VM on slow: %v", got)
	}
	if got := value(fams, "gpuvm_board_slots", map[string]string{"board": "slow", "state": "used"}); got != 1 {
		t.Errorf("slow's used slots: %v", got)
	}
	if got := value(fams, "gpuvm_board_slots", map[string]string{"board": "fast", "state": "free"}); got != 2 {
		t.Errorf("fast's free slots: %v", got)
	}
	if got := value(fams, "gpuvm_board_info", map[string]string{"board": "fast", "state": "active"}); got != 1 {
		t.Errorf("fast's info: %v", got)
	}
	if got := value(fams, "gpuvm_balance_moves_total", nil); got != 0 {
		t.Errorf("balance moves with the balancer off: %v", got)
	}
	boards[0].FailBus()
	deadline := time.Now().Add(time.Minute) // a hang guard
	for lost, _ := boards[0].Agg.Lost(); !lost; lost, _ = boards[0].Agg.Lost() {
		if time.Now().After(deadline) {
			t.Fatal("the failed board was never found lost")
		}
		time.Sleep(time.Millisecond)
	}
	fams = scrape(t, srv.URL)
	if got := value(fams, "gpuvm_board_info", map[string]string{"board": "fast", "state": "failed"}); got != 1 {
		t.Errorf("the failed board's info: %v", got)
	}
}
