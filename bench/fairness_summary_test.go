package bench

import (
	"math"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
)

// TestSummarizeFairnessMinMax checks the strict fairness measures on a
// recorded schedule whose shares are known: vm1 gets 60 % and vm2 30 % of
// every 100 ms window after the first, so min/max is 0.5 per window and over
// the run, while Jain's index is a forgiving 0.9.
func TestSummarizeFairnessMinMax(t *testing.T) {
	var usage []aggregator.Usage
	const w = 100 * time.Millisecond
	for k := range 20 {
		start := time.Duration(k) * w
		usage = append(usage,
			aggregator.Usage{Name: "vm1", Start: start, End: start + 60*time.Millisecond},
			aggregator.Usage{Name: "vm2", Start: start + 60*time.Millisecond, End: start + 90*time.Millisecond})
	}
	run := FairnessRun{VMs: 2, Usage: map[string]map[string][]float64{}, Throughput: map[string]float64{}, MeanIterationNs: map[string]float64{}}
	got, err := summarizeFairness(run, usage, 20*w, FairnessOptions{Windows: []time.Duration{500 * time.Millisecond, w}}, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	if !near(got.MinMax100, 0.5) || !near(got.MinMax500, 0.5) || !near(got.MinMaxRun, 0.5) {
		t.Errorf("min/max: 100 ms %v, 500 ms %v, run %v; want 0.5 each", got.MinMax100, got.MinMax500, got.MinMaxRun)
	}
	if !near(got.Jain100, 0.9) {
		t.Errorf("Jain over 100 ms windows %v, want 0.9", got.Jain100)
	}
}

// TestSummarizeFairnessWeighted: with weights 1 and 2, a 1:2 split of
// every window is perfectly fair by every measure, and the run's shares
// match their weighted targets.
func TestSummarizeFairnessWeighted(t *testing.T) {
	var usage []aggregator.Usage
	const w = 100 * time.Millisecond
	for k := range 20 {
		start := time.Duration(k) * w
		usage = append(usage,
			aggregator.Usage{Name: "vm1", Start: start, End: start + 30*time.Millisecond},
			aggregator.Usage{Name: "vm2", Start: start + 30*time.Millisecond, End: start + 90*time.Millisecond})
	}
	run := FairnessRun{VMs: 2, Weights: []int{1, 2}, Usage: map[string]map[string][]float64{}, Throughput: map[string]float64{}, MeanIterationNs: map[string]float64{}}
	got, err := summarizeFairness(run, usage, 20*w, FairnessOptions{Windows: []time.Duration{500 * time.Millisecond, w}}, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	if !near(got.MinMax100, 1) || !near(got.MinMax500, 1) || !near(got.MinMaxRun, 1) || !near(got.Jain100, 1) || !near(got.Jain500, 1) {
		t.Errorf("weighted 1:2 split: min/max %v %v %v, Jain %v %v; want 1", got.MinMax100, got.MinMax500, got.MinMaxRun, got.Jain100, got.Jain500)
	}
	if !near(got.Share["vm2"], 2.0/3) || !near(got.Target["vm2"], 2.0/3) || !near(got.Target["vm1"], 1.0/3) {
		t.Errorf("shares %v, targets %v; want vm2 2/3 of both", got.Share, got.Target)
	}
}

func TestMinOverMax(t *testing.T) {
	if _, ok := minOverMax(nil); ok {
		t.Error("empty: ok")
	}
	if _, ok := minOverMax([]float64{0, 0}); ok {
		t.Error("all zero: ok")
	}
	if v, ok := minOverMax([]float64{0.2, 0.8, 0.4}); !ok || v != 0.25 {
		t.Errorf("got %v %v, want 0.25", v, ok)
	}
}
