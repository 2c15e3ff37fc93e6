package workloads_test

import (
	"slices"
	"testing"

	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
)

// TestObserveTellsEachPhase: a run on an observed driver reports every
// phase as it ends, in order (srad2 re-enters launch, htod and dtoh), and
// still verifies; the board's counters between two reports belong to the
// phase that ended.
func TestObserveTellsEachPhase(t *testing.T) {
	n := openNative(t)
	for name, want := range map[string][]string{
		"madd":  {"init", "htod", "launch", "dtoh", "close"},
		"srad2": nil, // checked below: starts with init, ends with close, re-enters phases
	} {
		w, err := workloads.New(name, workloads.Params{MatrixDim: 32, RodiniaScale: 16})
		if err != nil {
			t.Fatal(err)
		}
		var seen []string
		kernels := map[string]uint64{}
		last := n.Counters()["kernels"]
		drv := workloads.Observe(gdev.Nouveau(n.Device), func(phase string) {
			seen = append(seen, phase)
			now := n.Counters()["kernels"]
			kernels[phase] += now - last
			last = now
		})
		if _, err := w.Run(drv); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if want != nil && !slices.Equal(seen, want) {
			t.Errorf("%s: phases %v, want %v", name, seen, want)
		}
		if len(seen) < 5 || seen[0] != "init" || seen[len(seen)-1] != "close" {
			t.Errorf("%s: phases %v", name, seen)
		}
		if kernels["launch"] == 0 || kernels["init"] != 0 || kernels["close"] != 0 {
			t.Errorf("%s: kernels by phase %v: want them all in launch", name, kernels)
		}
	}
}
