package workloads

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gpuvm/gpuvm/gpu/hostmem"
	"github.com/gpuvm/gpuvm/gpu/kernels"
	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
)

// openBoard opens the native driver on a fresh simulated board without
// timing delays.
func openBoard(t *testing.T) gdev.Driver {
	t.Helper()
	cfg := sim.DefaultConfig()
	cfg.VRAMSize, cfg.MemPartitions = 256<<20, 4
	board, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { board.Close() })
	ram, err := hostmem.New("workloads-test", 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ram.Close() })
	base, err := board.RegisterSystemMemory(ram.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	ram.SetBusBase(base)
	dev, err := nouveau.Open(board, ram, nouveau.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	return gdev.Nouveau(dev)
}

// TestRodiniaVerificationBites corrupts one bit of each workload's expected
// result after a good run: the next run must fail with ErrVerify, so the
// comparison is not vacuous.
func TestRodiniaVerificationBites(t *testing.T) {
	drv := openBoard(t)
	s := rodiniaSizes(64)
	for _, w := range []Workload{newBP(s), newHotspot(s), newLUD(s), newNN(s), newSrad(s), newSrad2(s)} {
		if _, err := w.Run(drv); err != nil {
			t.Fatalf("%s: %v", w.Name(), err)
		}
		var expect []byte
		switch w := w.(type) {
		case *bpWorkload:
			expect = w.expOld
		case *hotspotWorkload:
			expect = w.expect
		case *ludWorkload:
			expect = w.expect
		case *nnWorkload:
			expect = w.expDist
		case *sradWorkload:
			expect = w.expect
		case *srad2Workload:
			expect = w.expect
		}
		expect[len(expect)/2] ^= 1
		if _, err := w.Run(drv); !errors.Is(err, ErrVerify) {
			t.Errorf("%s with a corrupted reference: err = %v, want ErrVerify", w.Name(), err)
		}
		expect[len(expect)/2] ^= 1
	}
	nn := newNN(s)
	if _, err := nn.Run(drv); err != nil {
		t.Fatal(err)
	}
	nn.expNear[0], nn.expNear[1] = nn.expNear[1], nn.expNear[0]
	if _, err := nn.Run(drv); !errors.Is(err, ErrVerify) {
		t.Errorf("nn with swapped nearest records: err = %v, want ErrVerify", err)
	}
}

// TestKNearest compares the host's selection with the reference's sort,
// with many ties.
func TestKNearest(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 2, 5, 6, 100, 1000} {
		for _, k := range []int{1, 3, 5, 8} {
			dist := make([]float32, n)
			for i := range dist {
				dist[i] = float32(r.IntN(7)) // ties everywhere
			}
			locs := make([]float32, 2*n)
			for i, d := range dist {
				locs[2*i] = d // distance d from (0, 0)
			}
			_, want := kernels.NNF32(locs, 0, 0, k)
			if got := kNearest(dist, k); !slices.Equal(got, want) {
				t.Errorf("n=%d k=%d: %v, want %v", n, k, got, want)
			}
		}
	}
}
