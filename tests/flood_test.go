package tests

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/ipc"
)

// TestMMIOFlood: an attacker posting writes and reads as fast as it can does
// not stop the honest VM, and the aggregator keeps serving: a new VM attaches
// and gets answers while the flood runs.
func TestMMIOFlood(t *testing.T) {
	s := newSceneWith(t, "fv-naive", false)
	e, a := s.e, s.a
	s.vdev.Close() // free a slot for the probe VM
	e.waitDetached(t, "victim", 10*time.Second)
	n := 200000
	limit := 15 * time.Second
	if testing.Short() {
		n, limit = 50000, 5*time.Second
	}
	type result struct {
		sent int
		took time.Duration
	}
	done := make(chan result, 1)
	before := e.vgpu("attacker").Counters()
	go func() {
		start := time.Now()
		i := 0
		for ; (i < n || !s.honest.exited()) && time.Since(start) < limit; i++ {
			switch i % 8 {
			case 7:
				a.dev.Read32(nvc0.BAR0, nvc0.RegBoot0)
			case 3:
				a.dev.Write32(nvc0.BAR0, nvc0.PRAMINBase+uint64(i%0x1000)*4, uint32(i))
			default:
				a.dev.Write32(nvc0.BAR0, 0x001000, uint32(i)) // denied
			}
		}
		a.dev.Read32(nvc0.BAR0, nvc0.RegBoot0)
		done <- result{i, time.Since(start)}
	}()
	// The aggregator stays responsive during the flood.
	probeStart := time.Now()
	probe := e.connect(t, "probe", 9, "fv-naive")
	if v := probe.Read32(nvc0.BAR0, nvc0.RegBoot0); v != nvc0.Boot0Value {
		t.Errorf("a VM attached during the flood reads BOOT0 %#x", v)
	}
	if d := time.Since(probeStart); d > 5*time.Second {
		t.Errorf("attaching a VM during the flood took %v", d)
	}
	t.Logf("a new VM attached and answered in %v during the flood", time.Since(probeStart).Round(time.Millisecond))
	probe.Close()
	res := <-done
	after := e.vgpu("attacker").Counters()
	t.Logf("flood: %d accesses in %v (%.0f/s); attacker BAR0 writes %d, denied %d", res.sent, res.took.Round(time.Millisecond),
		float64(res.sent)/res.took.Seconds(), after.BAR0Writes-before.BAR0Writes, after.Denied-before.Denied)
	if after.BAR0Writes-before.BAR0Writes < uint64(res.sent*6/8) {
		t.Errorf("the aggregator handled %d of the flood's ~%d writes", after.BAR0Writes-before.BAR0Writes, res.sent*6/8)
	}
	if err := a.dev.Err(); err != nil {
		t.Errorf("the flooding VM's own connection failed: %v", err)
	}
	s.honest.verified(t)
}

// TestVMBeyondCapacity: with every slot taken, another VM is refused with a
// clear reason (and nothing else changes).
func TestVMBeyondCapacity(t *testing.T) {
	e := newEnv(t)
	for i := range maxVMs {
		e.connect(t, fmt.Sprintf("vm%d", i), uint32(10+i), "fv-naive")
	}
	_, err := e.tryConnect("one-too-many", 20, "fv-naive")
	var rej *ipc.RejectedError
	if !errors.As(err, &rej) {
		t.Fatalf("VM beyond capacity: %v, want an ipc.RejectedError", err)
	}
	if !strings.Contains(rej.Reason, "slot") {
		t.Errorf("refusal reason %q does not say that no slot is free", rej.Reason)
	}
	if n := len(e.agg.VGPUs()); n != maxVMs {
		t.Errorf("%d vGPUs after the refusal, want %d", n, maxVMs)
	}
	_, err = e.tryConnect("bad-mode", 21, "fv-warp")
	if !errors.As(err, &rej) || !strings.Contains(rej.Reason, "fv-warp") {
		t.Errorf("unknown mode: %v, want a refusal naming the mode", err)
	}
}
