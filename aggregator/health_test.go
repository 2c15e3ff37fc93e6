package aggregator

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A board that falls off the bus is found by the next identity read; its
// vGPU becomes a lost device without waiting on the dead board (no channel
// stop runs into its timeout) — its connection stays, its guest reads an
// absent device —, its slot goes out of service, and a VM on another board
// of the host goes on computing. (lost_test.go brings it back.)
func TestBoardLostFoundAndVGPUsTakenOff(t *testing.T) {
	reg := NewRegistry()
	var lostCalls atomic.Int32
	var lostWhy atomic.Value
	a, boardA := newTestAggregatorWith(t, Options{MaxVMs: 2, Registry: reg, BoardName: "a", HealthInterval: 5 * time.Millisecond,
		Timeout: time.Hour, // a stop that waited on the dead board would hang the test
		OnLost:  func(why string) { lostCalls.Add(1); lostWhy.Store(why) }})
	b, _ := newTestAggregatorWith(t, Options{MaxVMs: 2, Registry: reg, Board: 1, BoardName: "b"})

	victim := startGuest(t, a, "victim", "fv-optimized")
	honest := startGuest(t, b, "honest", "fv-optimized")
	runAllWorkloads(t, victim, "fv-optimized")
	hung := make(chan string, 1)
	victim.v.onHangup(func(reason string) { hung <- reason })

	before := a.HealthChecks()
	boardA.FailBus()
	deadline := time.Now().Add(time.Minute) // a hang guard, not a measurement
	for lost, _ := victim.v.Lost(); !lost; lost, _ = victim.v.Lost() {
		if time.Now().After(deadline) {
			t.Fatal("the lost board's vGPU never became a lost device")
		}
		time.Sleep(time.Millisecond)
	}
	if n := a.HealthChecks() - before; n > 1 {
		t.Errorf("%d identity reads after the failure before it was found; the next one must find it", n)
	}
	if lost, why := a.Lost(); !lost || !strings.Contains(why, "fell off the bus") {
		t.Fatalf("Lost() = %v %q", lost, why)
	}
	if lostCalls.Load() != 1 || !strings.Contains(lostWhy.Load().(string), "all ones") {
		t.Errorf("OnLost called %d times (%v)", lostCalls.Load(), lostWhy.Load())
	}
	if _, why := victim.v.Lost(); !strings.Contains(why, "the vGPU is lost") || !strings.Contains(why, "board a") {
		t.Errorf("the lost device's reason: %q", why)
	}
	select {
	case reason := <-hung:
		t.Errorf("the lost device's connection was ended (%q): it stays for a reset", reason)
	default:
	}
	expectLost(t, victim)
	if oos := a.OutOfService(); len(oos) != 1 {
		t.Errorf("out of service after the loss: %v; the victim's slot must not go to a new tenant", oos)
	}
	if _, err := attachOn(t, a, 9, "late"); !errors.Is(err, ErrBoardLost) {
		t.Errorf("attach to the lost board: %v, want ErrBoardLost", err)
	}
	if reg.Len() != 2 {
		t.Errorf("registry holds %d ids; the lost device keeps its own", reg.Len())
	}
	// The other board is untouched.
	runAllWorkloads(t, honest, "fv-optimized")
	if lost, _ := b.Lost(); lost {
		t.Fatal("the healthy board counts as lost")
	}
}
