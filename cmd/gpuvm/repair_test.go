package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/host"
)

// vgpuNamed returns the control API's view of the vGPU of VM name.
func vgpuNamed(t *testing.T, ctl, name string) (aggregator.VGPUInfo, bool) {
	t.Helper()
	var vgpus []aggregator.VGPUInfo
	if err := controlGet(context.Background(), ctl, "/v1/vgpus", &vgpus); err != nil {
		t.Fatal(err)
	}
	for _, v := range vgpus {
		if v.Name == name {
			return v, true
		}
	}
	return aggregator.VGPUInfo{}, false
}

// TestBoardLostGuestResetsElsewhere, with real processes: a VM loops
// verified madd runs on board a of a `gpuvm serve --fault-injection`
// host when a falls off the bus. Its driver finds the GPU gone, resets it
// with a function-level reset, and the host brings the lost vGPU back on
// board b (a restart decision says so), where the VM goes on computing:
// its process, which would end at a run that failed or did not verify,
// keeps running. Then the operator puts a back on the bus and in service
// (`gpuvm board repair`, `gpuvm board reinit`): it lists active again.
func TestBoardLostGuestResetsElsewhere(t *testing.T) {
	dir := t.TempDir()
	sock, ctl := dir+"/a.sock", dir+"/ctl.sock"
	startDaemon(t, daemonConfig(t, dir, sock, ctl, `[[boards]]
name = "a"
[[boards]]
name = "b"
`), ctl, "--fault-injection")
	vm := selfCommand(context.Background(), []string{"devmodel", "--socket", sock, "--name", "victim", "--domid", "7",
		"--ram", "128MiB", "--workloads", "madd", "--runs", "1000000", "--matrix-dim", "64"})
	var vmErr lockedBuffer
	vm.Stderr = &vmErr
	if err := vm.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- vm.Wait() }()
	t.Cleanup(func() {
		vm.Process.Kill()
		<-exited
	})
	waitComputing(t, ctl, "victim")
	if v, _ := vgpuNamed(t, ctl, "victim"); v.BoardName != "a" {
		t.Fatalf("placed on %q, want a (the first of two idle boards)", v.BoardName)
	}
	if out, _, err := runApp(t, "board", "fail", "a", "--control-socket", ctl); err != nil {
		t.Fatalf("board fail a: %v\n%s", err, out)
	}
	// watch polls the victim's vGPU until done says so; the VM process
	// ending first fails the test with why (a run that failed or did not
	// verify ends it).
	deadline := time.Now().Add(2 * time.Minute) // a hang guard
	watch := func(what string, done func(aggregator.VGPUInfo) bool) aggregator.VGPUInfo {
		t.Helper()
		for {
			v, ok := vgpuNamed(t, ctl, "victim")
			if ok && done(v) {
				return v
			}
			select {
			case err := <-exited:
				exited <- err
				t.Fatalf("the VM ended before %s: %v\n%s", what, err, vmErr.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s: %+v", what, v)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	back := watch("its lost vGPU came back on b", func(v aggregator.VGPUInfo) bool {
		return v.BoardName == "b" && v.Slot >= 0 && v.Lost == ""
	})
	watch("it computed on b after its reset", func(v aggregator.VGPUInfo) bool {
		return v.Sched.Submissions > back.Sched.Submissions+20
	})
	var decisions []host.Decision
	if err := controlGet(context.Background(), ctl, "/v1/placements", &decisions); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, d := range decisions {
		found = found || d.Kind == host.KindRestart && d.Board == "b" && strings.Contains(d.Reason, "lost vGPU")
	}
	if !found {
		t.Errorf("no restart decision for the lost vGPU: %+v", decisions)
	}

	if _, _, err := runApp(t, "board", "reinit", "a", "--control-socket", ctl); err == nil || !strings.Contains(err.Error(), "0xffffffff") {
		t.Fatalf("board reinit of a board still off the bus: %v", err)
	}
	if out, _, err := runApp(t, "board", "repair", "a", "--control-socket", ctl); err != nil {
		t.Fatalf("board repair a: %v\n%s", err, out)
	}
	if out, _, err := runApp(t, "board", "reinit", "a", "--control-socket", ctl); err != nil || !strings.Contains(out, "back in service") {
		t.Fatalf("board reinit a: %v\n%s", err, out)
	}
	out, _, err := runApp(t, "board", "list", "--control-socket", ctl)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "a" && f[1] != string(host.StateActive) {
			t.Fatalf("board a after reinit:\n%s", out)
		}
	}
}
