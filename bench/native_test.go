package bench

import (
	"context"
	"testing"

	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
)

// smallParams keeps every workload quick enough for -race.
var smallParams = workloads.Params{MatrixDim: 64, LoopIterations: 1 << 12, CopyBytes: 9<<20 + 4096 + 100, RodiniaScale: 16}

func TestNativeAllWorkloadsVerify(t *testing.T) {
	cfg := sim.DefaultConfig()
	cfg.VRAMSize, cfg.MemPartitions = 1<<30, 4
	n, err := OpenNative(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	for _, name := range workloads.Names() {
		w, err := workloads.New(name, smallParams)
		if err != nil {
			t.Fatal(err)
		}
		res := RunWorkload(context.Background(), "native", gdev.Nouveau(n.Device), w, 2, n.Counters, nil)
		if !res.Verified || res.Error != "" {
			t.Fatalf("%s: verified=%v error=%s", name, res.Verified, res.Error)
		}
		if res.TotalNs <= 0 {
			t.Errorf("%s: total %d", name, res.TotalNs)
		}
	}
}
