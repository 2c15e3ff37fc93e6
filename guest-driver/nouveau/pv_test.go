package nouveau_test

import (
	"errors"
	"testing"

	"github.com/gpuvm/gpuvm/gpu/hostmem"
	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
)

// The PV driver refuses a GPU that offers no hypercalls (a bare board, or a
// vGPU in a full-virtualization mode, reads 0 at the hypercall ID). The PV
// modes themselves run against the real aggregator: aggregator/pv_test.go
// and tests/pv_test.go.
func TestPVNotOffered(t *testing.T) {
	cfg := sim.DefaultConfig()
	cfg.VRAMSize, cfg.MemPartitions = 256<<20, 1
	board, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer board.Close()
	ram, err := hostmem.New("pv", 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer ram.Close()
	base, err := board.RegisterSystemMemory(ram.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	ram.SetBusBase(base)
	for _, mode := range []nouveau.PVMode{nouveau.PVNaive, nouveau.PVMulticall} {
		if _, err := nouveau.Open(board, ram, nouveau.Options{PV: mode}); !errors.Is(err, nouveau.ErrNotSupported) {
			t.Errorf("%v open on a GPU without hypercalls: %v, want ErrNotSupported", mode, err)
		}
	}
}
