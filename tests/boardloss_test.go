package tests

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
)

// TestBoardFallsOffTheBus: a host with two boards (two aggregators sharing
// one registry, as `gpuvm serve` builds them). A VM computes on board B when
// B falls off the bus. B's aggregator finds it at its next identity read
// and the vGPU becomes a lost device: the VM's driver finds its GPU gone
// (reads of all ones) instead of hanging on fences the dead board will
// never signal, tries a function-level reset — refused: board B is still
// lost and this host has no way to another board — and its process ends
// with the error; nothing of B's goes to a new tenant. The honest VM on board A verifies throughout, and a canary
// in board A's free slot is never read or changed.
func TestBoardFallsOffTheBus(t *testing.T) {
	reg := aggregator.NewRegistry()
	a := newEnvWith(t, envOptions{Modify: func(o *aggregator.Options) { o.Registry, o.BoardName = reg, "a" }})
	b := newEnvWith(t, envOptions{Modify: func(o *aggregator.Options) {
		o.Registry, o.Board, o.BoardName = reg, 1, "b"
		o.HealthInterval = 10 * time.Millisecond
	}})
	honest, hv := a.startHonest(t)
	canary := a.plant(t, "board a, free slot", a.layout.Slots[maxVMs-1].VRAM.Base+vramPerVM/2, 0x3C)

	victim := b.startVM(t, "victim", 12, "fv-optimized", []string{"--workloads", "madd,cpy", "--runs", "100000", "--matrix-dim", "64", "--copy-size", "1MiB"})
	v := b.waitAttached(t, "victim", victim)
	deadline := time.Now().Add(time.Minute)
	for v.Counters().Doorbells < 10 && time.Now().Before(deadline) && !victim.exited() {
		time.Sleep(5 * time.Millisecond)
	}
	if victim.exited() || v.Counters().Doorbells < 10 {
		t.Fatalf("the victim never got going (exited %v)\nstderr:\n%s", victim.exited(), victim.stderr())
	}
	if hv.ID == v.ID {
		t.Fatalf("two boards of one registry gave out vGPU id %d twice", v.ID)
	}

	b.board.FailBus()
	// A hang guard: the victim must end on its own, told why.
	victim.wait(t, 2*time.Minute)
	victim.mu.Lock()
	out := victim.out.String()
	victim.mu.Unlock()
	said := out + victim.stderr()
	if !strings.Contains(said, "gone") {
		t.Errorf("the victim did not find its GPU gone:\nstdout:\n%s\nstderr:\n%s", out, victim.stderr())
	}
	var results []struct {
		Verified bool   `json:"verified"`
		Error    string `json:"error"`
	}
	if json.Unmarshal([]byte(out), &results) == nil {
		for _, r := range results {
			if r.Verified && r.Error == "" && victim.errv == nil {
				t.Errorf("the victim reports verified work after its board died: %+v", results)
			}
		}
	}
	if lost, why := b.agg.Lost(); !lost || !strings.Contains(why, "fell off the bus") {
		t.Fatalf("board b: Lost() = %v %q", lost, why)
	}
	// The victim's process has ended; its connection's end reaches the
	// aggregator a moment later (under -race, a long one), and the lost
	// vGPU goes with it. The registry then holds board A's ids only: the
	// honest VM's while it runs, none once it has finished (under a loaded
	// CI it can finish before the victim's end is seen: CI found 0 ids).
	onlyBoardA := func() bool { return reg.Len() == len(a.agg.VGPUs()) }
	for wait := time.Now().Add(30 * time.Second); (len(b.agg.VGPUs()) != 0 || !onlyBoardA()) && time.Now().Before(wait); {
		time.Sleep(10 * time.Millisecond)
	}
	if n := len(b.agg.VGPUs()); n != 0 {
		t.Errorf("board b still has %d vGPUs", n)
	}
	if oos := b.agg.OutOfService(); len(oos) != 1 {
		t.Errorf("board b's slots out of service: %v; the victim's slot must never go to a new tenant", oos)
	}
	if _, err := b.tryConnect("late", 13, "fv-optimized"); err == nil || !strings.Contains(err.Error(), "stopped answering") {
		t.Errorf("a VM connecting to the lost board: %v", err)
	}
	if !onlyBoardA() {
		t.Errorf("the registry holds %d ids, board a has %d vGPUs; only the honest VM's may remain", reg.Len(), len(a.agg.VGPUs()))
	}

	honest.verified(t)
	a.checkCanary(t, canary)
	if lost, _ := a.agg.Lost(); lost {
		t.Fatal("board a counts as lost")
	}
}
