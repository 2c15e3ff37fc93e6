package tests

import (
	"bytes"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestPVDRMFrontEndKilled: a pvdrm front end killed (SIGKILL) while its
// kernel runs and a CPU_PREP waits, beside an honest FV VM: its vGPU is torn
// down, every byte of its slot reads zero afterwards, and a new pvdrm tenant
// of the same slot runs and verifies its workloads.
func TestPVDRMFrontEndKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("processes only; -short keeps the in-process variant (aggregator.TestPVDRMFrontEndVanishesMidRequest) under -race")
	}
	e := newEnv(t)
	honest, _ := e.startHonestMode(t, "fv-optimized")
	// madd leaves matrices in VRAM; the loop that follows never ends.
	victim := e.startVM(t, "victim", 21, "pvdrm", []string{"--workloads", "madd,loop", "--runs", "1", "--matrix-dim", "64",
		"--loop-iterations", "1099511627776"})
	v := e.waitAttached(t, "victim", victim)
	slot := v.Slot.VRAM
	deadline := time.Now().Add(2 * time.Minute)
	for !strings.Contains(victim.stderr(), "loop") || v.Counters().Doorbells < 10 {
		if victim.exited() || time.Now().After(deadline) {
			t.Fatalf("the victim never reached its loop (exited %v)\nstderr:\n%s", victim.exited(), victim.stderr())
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // the loop kernel holds the GPU; a CPU_PREP waits for it
	if bytes.Count(e.readVRAM(t, slot.Base, slot.Size), []byte{0}) == int(slot.Size) {
		t.Fatal("the victim's slot is all zeros before the kill: the test would prove nothing")
	}
	victim.cmd.Process.Signal(syscall.SIGKILL)
	<-victim.done
	e.waitDetached(t, "victim", 30*time.Second)
	if got := e.readVRAM(t, slot.Base, slot.Size); bytes.Count(got, []byte{0}) != len(got) {
		t.Fatalf("the killed front end's slot is not scrubbed: first non-zero byte at +%#x", bytes.IndexFunc(got, func(r rune) bool { return r != 0 }))
	}
	next := e.startVM(t, "next", 22, "pvdrm", honestArgs())
	if w := e.waitAttached(t, "next", next); w.Slot.VRAM.Base != slot.Base {
		t.Logf("the next tenant got slot at %#x (the victim's was %#x)", w.Slot.VRAM.Base, slot.Base)
	}
	next.verified(t)
	honest.verified(t)
}
