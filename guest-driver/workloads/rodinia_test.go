package workloads_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/gpuvm/gpuvm/bench"
	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
)

// openNative opens a simulated board without timing delays and the native
// driver on it.
func openNative(t *testing.T) *bench.Native {
	t.Helper()
	cfg := sim.DefaultConfig()
	cfg.VRAMSize, cfg.MemPartitions = 512<<20, 4
	n, err := bench.OpenNative(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return n
}

var rodinia = []string{"bp", "hs", "lud", "nn", "srad", "srad2"}

func TestNamesInThesisOrder(t *testing.T) {
	want := append([]string{"nop", "loop", "madd", "mmul", "fmadd", "fmmul", "cpy", "pincpy"}, rodinia...)
	if got := workloads.Names(); !slices.Equal(got, want) {
		t.Errorf("Names() = %v, want %v", got, want)
	}
	all, err := workloads.Parse("all")
	if err != nil || !slices.Equal(all, want) {
		t.Errorf("Parse(all) = %v, %v", all, err)
	}
	for _, name := range want {
		if workloads.Describe(name) == "" {
			t.Errorf("%s: no description", name)
		}
	}
}

// launches is how many kernels each Rodinia-like workload launches per run
// at scale (the package documentation's counts).
func launches(name string, scale int) uint64 {
	switch name {
	case "bp":
		return 2
	case "hs":
		return 12
	case "lud":
		n := max(512/scale, 4)
		return uint64(3*((n-1)/16) + 1)
	case "nn":
		return 1
	case "srad":
		return 1 + 3*20 + 1
	case "srad2":
		return 2 * 2
	}
	return 0
}

// TestRodiniaWorkloadsVerify runs each Rodinia-like workload natively at
// several scales, twice each (the second run reuses the buffers of the
// first): each run must verify and launch the documented number of kernels.
func TestRodiniaWorkloadsVerify(t *testing.T) {
	n := openNative(t)
	drv := gdev.Nouveau(n.Device)
	scales := []int{64, 13}
	if !testing.Short() {
		scales = append(scales, 4)
	}
	for _, scale := range scales {
		for _, name := range rodinia {
			t.Run(fmt.Sprintf("%s/scale=%d", name, scale), func(t *testing.T) {
				w, err := workloads.New(name, workloads.Params{RodiniaScale: scale})
				if err != nil {
					t.Fatal(err)
				}
				if w.Name() != name || w.Description() != workloads.Describe(name) {
					t.Errorf("name %q, description %q", w.Name(), w.Description())
				}
				for run := range 2 {
					before := n.Counters()["kernels"]
					ph, err := w.Run(drv)
					if err != nil {
						t.Fatalf("run %d: %v", run, err)
					}
					if got, want := n.Counters()["kernels"]-before, launches(name, scale); got != want {
						t.Errorf("run %d: %d kernels, want %d", run, got, want)
					}
					if ph.Launch <= 0 || ph.HtoD <= 0 || ph.DtoH <= 0 || ph.Total() < ph.Launch {
						t.Errorf("run %d: phases %+v", run, ph)
					}
				}
			})
		}
	}
}

func TestRodiniaScaleValidated(t *testing.T) {
	for _, scale := range []int{-1, workloads.MaxRodiniaScale + 1} {
		if _, err := workloads.New("bp", workloads.Params{RodiniaScale: scale}); err == nil {
			t.Errorf("scale %d accepted", scale)
		}
	}
	for _, scale := range []int{0, 1, workloads.MaxRodiniaScale} {
		if _, err := workloads.New("srad2", workloads.Params{RodiniaScale: scale}); err != nil {
			t.Errorf("scale %d: %v", scale, err)
		}
	}
}
