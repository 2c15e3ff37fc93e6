package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuvm/gpuvm/host"
)

// BoardSource is a Source that owns several boards (package host): the
// collector then also exports each board's state, load and slots.
type BoardSource interface {
	BoardInfos() []host.BoardInfo
}

// BalanceSource is a BoardSource with a load balancer (package host): the
// collector then also counts its moves.
type BalanceSource interface {
	BalanceMoves() uint64
}

// boardDescs are the per-board metrics, and the balancer's.
type boardDescs struct {
	info, load, queued, slots *prometheus.Desc
	balanceMoves              *prometheus.Desc
}

func newBoardDescs() boardDescs {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("gpuvm_board_"+name, help, append([]string{"board"}, labels...), nil)
	}
	return boardDescs{
		info:   d("info", "A board of the host (always 1), with its state (active, cordoned, failed) and timing profile.", "state", "timing"),
		load:   d("load_ratio", "The share of the board's time its vGPUs' submissions used over the last 2 s."),
		queued: d("queued_submissions", "Submissions waiting for the board now."),
		slots:  d("slots", "vGPU slots of the board, by state.", "state"),
		balanceMoves: prometheus.NewDesc("gpuvm_balance_moves_total",
			"vGPUs the load balancer ([daemon] balance) moved between boards.", nil, nil),
	}
}

func (b boardDescs) describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{b.info, b.load, b.queued, b.slots, b.balanceMoves} {
		ch <- d
	}
}

func (b boardDescs) collect(ch chan<- prometheus.Metric, src Source) {
	bs, ok := src.(BoardSource)
	if !ok {
		return
	}
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for _, i := range bs.BoardInfos() {
		g(b.info, 1, i.Name, string(i.State), i.Timing)
		g(b.load, i.Load, i.Name)
		g(b.queued, float64(i.Queued), i.Name)
		g(b.slots, float64(i.Used), i.Name, "used")
		g(b.slots, float64(i.Free), i.Name, "free")
		g(b.slots, float64(i.OutOfService), i.Name, "out_of_service")
	}
	if bal, ok := src.(BalanceSource); ok {
		ch <- prometheus.MustNewConstMetric(b.balanceMoves, prometheus.CounterValue, float64(bal.BalanceMoves()))
	}
}
