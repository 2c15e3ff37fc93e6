package host

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// TestLostBoardRestartsParkedVGPUElsewhere: board fast (one slot, 2×
// overcommit) holds a resident vGPU and a parked one when it fails. The
// host hands the parked one to slow (a restart decision, with its reason)
// and its next access restores it there; the resident one is a lost
// device, parked on fast.
func TestLostBoardRestartsParkedVGPUElsewhere(t *testing.T) {
	h := newTestHostWith(t, Options{Placement: PlacePack, FaultInjection: true}, func(i int, o *aggregator.Options) {
		if i == 0 {
			o.Overcommit, o.EvictIdle = 2, time.Millisecond
		}
	}, 1, 1)
	fast, slow := h.Board("fast"), h.Board("slow")
	b1, parked, _ := attach(t, h, 1, "parked")
	if b1 != fast {
		t.Fatalf("placed on %s", b1.Name)
	}
	if _, err := fast.Agg.Evict(context.Background(), parked, "test"); err != nil {
		t.Fatal(err)
	}
	b2, resident, d := attach(t, h, 2, "resident")
	if b2 != fast {
		t.Fatalf("the overcommitted board's room was not used: placed on %v (%s)", b2, d.Reason)
	}
	fast.FailBus()
	deadline := time.Now().Add(time.Minute) // a hang guard
	for lost, _ := resident.Lost(); !lost || len(fast.Agg.VGPUs()) != 1; lost, _ = resident.Lost() {
		if time.Now().After(deadline) {
			t.Fatal("the lost board's vGPUs were never taken off it")
		}
		time.Sleep(time.Millisecond)
	}
	if b, v := h.Lookup(parked.ID); b != slow || v != parked || !parked.Evicted() {
		t.Fatalf("the parked vGPU is on %v (evicted %v), want parked on slow", b, parked.Evicted())
	}
	if b, _ := h.Lookup(resident.ID); b != fast || !resident.Evicted() {
		t.Fatalf("the resident vGPU of the lost board is on %v (parked %v), want a lost device parked on fast", b, resident.Evicted())
	}
	var restart *Decision
	for _, d := range h.Decisions() {
		if d.Kind == KindRestart {
			restart = &d
		}
	}
	if restart == nil || restart.Board != "slow" || !strings.Contains(restart.Reason, "eviction image") {
		t.Fatalf("no restart decision for slow: %+v", h.Decisions())
	}
	if got, err := parked.Read32(nvc0.BAR0, nvc0.RegBoot0); err != nil || got == nvc0.ReadAllOnes {
		t.Fatalf("its first access after the restart: %#x, %v", got, err)
	}
	if parked.Evicted() || parked.Info().Slot < 0 || parked.Info().BoardName != "slow" {
		t.Fatalf("not restored on slow: %+v", parked.Info())
	}
}
