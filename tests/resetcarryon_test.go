package tests

import (
	"encoding/json"
	"testing"
	"time"
)

// TestResetGuestCarriesOn: a VM process (gpuvm devmodel) loops verified
// madd and cpy while the operator resets its vGPU again and again. Each
// reset ends the run it interrupted; the guest driver notices, brings the
// GPU up again and makes the run again, so the VM finishes with every
// workload verified — the reset cost it time, never a wrong result — and
// says how many runs it made again. The honest VM beside it verifies.
func TestResetGuestCarriesOn(t *testing.T) {
	e := newEnv(t)
	honest, _ := e.startHonest(t)
	// Enough runs to outlast three resets (each waits for 20 doorbells, a
	// few runs' worth); the VM makes them all, so fewer under -short.
	runs := "200"
	if testing.Short() {
		runs = "80"
	}
	p := e.startVM(t, "resettee", 12, "fv-optimized", []string{"--workloads", "madd,cpy", "--runs", runs, "--matrix-dim", "32", "--copy-size", "256KiB"})
	v := e.waitAttached(t, "resettee", p)
	resets := 0
	for resets < 3 && !p.exited() {
		// Reset only once the guest has work in flight since the last one.
		before := v.Counters().Doorbells
		deadline := time.Now().Add(time.Minute) // a hang guard
		for v.Counters().Doorbells < before+20 && !p.exited() && time.Now().Before(deadline) {
			time.Sleep(2 * time.Millisecond)
		}
		if p.exited() {
			break
		}
		if err := e.agg.Reset(v, "test: reset under a looping guest"); err != nil {
			t.Fatalf("reset %d: %v", resets+1, err)
		}
		resets++
	}
	if resets < 3 {
		p.mu.Lock()
		out := p.out.String()
		p.mu.Unlock()
		t.Fatalf("the VM ended (%v) after %d resets (its loop must outlast 3 resets under work)\nstdout:\n%s\nstderr:\n%s", p.errv, resets, out, p.stderr())
	}
	p.wait(t, 3*time.Minute) // a hang guard
	p.mu.Lock()
	out := p.out.Bytes()
	p.mu.Unlock()
	var results []struct {
		Workload  string `json:"workload"`
		Verified  bool   `json:"verified"`
		Error     string `json:"error"`
		Recovered int    `json:"recovered"`
	}
	if err := json.Unmarshal(out, &results); err != nil {
		t.Fatalf("exit %v, output is not a result list: %v\n%s\nstderr:\n%s", p.errv, err, out, p.stderr())
	}
	recovered := 0
	for _, r := range results {
		if !r.Verified || r.Error != "" {
			t.Errorf("%s not verified after the resets: %q", r.Workload, r.Error)
		}
		recovered += r.Recovered
	}
	if recovered < 1 {
		t.Errorf("the VM made no run again after %d resets under its work: %+v", resets, results)
	}
	if p.errv != nil {
		t.Fatalf("the reset VM exited with %v\nstderr:\n%s", p.errv, p.stderr())
	}
	t.Logf("%d resets; %d runs made again; %+v", resets, recovered, results)
	honest.verified(t)
}
