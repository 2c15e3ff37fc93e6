package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuvm/gpuvm/aggregator"
)

// sloDescs are the per-vGPU series of queue-wait objectives and SLA
// feedback (aggregator/slo.go), labelled as the other per-vGPU series.
type sloDescs struct {
	target, violations, effective, boosted *prometheus.Desc
}

func newSLODescs(d func(name, help string, labels ...string) *prometheus.Desc) sloDescs {
	return sloDescs{
		target:     d("vgpu_slo_seconds", "The vGPU's queue-wait objective (doorbell to release); absent without one."),
		violations: d("vgpu_slo_violations_total", "Submissions of the vGPU released after waiting longer than its objective."),
		effective:  d("vgpu_effective_weight", "The weight the scheduler uses for the vGPU now: its weight, or more while SLA feedback boosts it."),
		boosted:    d("vgpu_sla_boosted_windows_total", "SLA feedback windows that ended with the vGPU's weight boosted."),
	}
}

func (s sloDescs) describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{s.target, s.violations, s.effective, s.boosted} {
		ch <- d
	}
}

// collect sends st's SLO series, with label values lv.
func (s sloDescs) collect(ch chan<- prometheus.Metric, st aggregator.SchedStats, lv []string) {
	if st.SLO > 0 {
		ch <- prometheus.MustNewConstMetric(s.target, prometheus.GaugeValue, st.SLO.Seconds(), lv...)
		ch <- prometheus.MustNewConstMetric(s.violations, prometheus.CounterValue, float64(st.SLOViolations), lv...)
		ch <- prometheus.MustNewConstMetric(s.boosted, prometheus.CounterValue, float64(st.SLABoostedWindows), lv...)
	}
	ch <- prometheus.MustNewConstMetric(s.effective, prometheus.GaugeValue, float64(st.EffectiveWeight), lv...)
}
