package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/host"
)

// TestServeSeveralBoards: one `gpuvm serve` owns two boards of different
// sizes; VMs (real device-model processes) are placed on both, each
// computes on its own board, a pinned VM goes where its [[vm]] entry says,
// and `gpuvm board` lists, cordons and explains.
func TestServeSeveralBoards(t *testing.T) {
	dir := t.TempDir()
	sock, ctl := dir+"/a.sock", dir+"/ctl.sock"
	startDaemon(t, daemonConfig(t, dir, sock, ctl, `[[boards]]
name = "big"
[[boards]]
name = "small"
vram = "768MiB"
mem_partitions = 4
max_vms = 2
[[vm]]
name = "pinned"
board = "small"
`), ctl)

	out, _, err := runApp(t, "board", "list", "--control-socket", ctl)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "big") || !strings.Contains(out, "small") || !strings.Contains(out, "active") {
		t.Fatalf("board list:\n%s", out)
	}

	startComputingVM(t, sock, ctl, "pinned", 3)
	startComputingVM(t, sock, ctl, "free", 4)
	var vgpus []aggregator.VGPUInfo
	if err := controlGet(context.Background(), ctl, "/v1/vgpus", &vgpus); err != nil {
		t.Fatal(err)
	}
	on := map[string]string{}
	ids := map[int]bool{}
	for _, v := range vgpus {
		on[v.Name] = v.BoardName
		if ids[v.ID] {
			t.Fatalf("vGPU id %d twice: %+v", v.ID, vgpus)
		}
		ids[v.ID] = true
	}
	if on["pinned"] != "small" || on["free"] != "big" {
		t.Fatalf("placed %v; want pinned on small (its pin) and free on big (small carries pinned's weight)", on)
	}

	// Drain big: free moves to small while it computes and goes on
	// computing there; big is cordoned, so a third VM has nowhere to go
	// and is told why.
	out, _, err = runApp(t, "board", "drain", "big", "--control-socket", ctl)
	if err != nil || !strings.Contains(out, "moved vGPU") || !strings.Contains(out, "-> board small") || !strings.Contains(out, "1 moved, 0 left") {
		t.Fatalf("board drain big: %v\n%s", err, out)
	}
	var after []aggregator.VGPUInfo
	if err := controlGet(context.Background(), ctl, "/v1/vgpus", &after); err != nil {
		t.Fatal(err)
	}
	var subs uint64
	for _, v := range after {
		if v.Name == "free" {
			if v.BoardName != "small" {
				t.Fatalf("free on %s after the drain", v.BoardName)
			}
			subs = v.Sched.Submissions
		}
	}
	deadline := time.Now().Add(time.Minute) // a hang guard
	for {
		var now []aggregator.VGPUInfo
		_ = controlGet(context.Background(), ctl, "/v1/vgpus", &now)
		done := false
		for _, v := range now {
			done = done || v.Name == "free" && v.Sched.Submissions > subs+5
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("free stopped computing after its move: %+v", now)
		}
		time.Sleep(20 * time.Millisecond)
	}
	_, stderr, err := runApp(t, "devmodel", "--socket", sock, "--name", "third", "--domid", "5", "--ram", "64MiB", "--workloads", "nop", "--runs", "1")
	if err == nil || !strings.Contains(stderr+err.Error(), "big: board is cordoned") {
		t.Fatalf("a VM with every board cordoned or full: err %v\n%s", err, stderr)
	}
	body, _, err := runApp(t, "board", "placements", "--control-socket", ctl)
	if err != nil {
		t.Fatal(err)
	}
	var decisions []host.Decision
	if err := json.Unmarshal([]byte(body), &decisions); err != nil {
		t.Fatalf("placements: %v\n%s", err, body)
	}
	if len(decisions) != 4 || decisions[0].Board != "small" || decisions[2].Board != "small" || decisions[3].Board != "" ||
		decisions[0].Kind != host.KindPlace || decisions[2].Kind != host.KindMove || !strings.Contains(decisions[2].Reason, "a drain of board big") {
		t.Fatalf("placements: %+v", decisions)
	}
	if out, _, err := runApp(t, "board", "balance", "--control-socket", ctl); err != nil || !strings.Contains(out, `"policy": "off"`) {
		t.Fatalf("board balance (off by default): %v\n%s", err, out)
	}
	if _, _, err := runApp(t, "board", "cordon", "nope", "--control-socket", ctl); err == nil {
		t.Fatal("cordoned a board that does not exist")
	}
	if _, _, err := runApp(t, "vgpu", "layout", "--control-socket", ctl); err == nil {
		t.Fatal("vgpu layout on a host of two boards answered without naming one")
	}
	if out, _, err := runApp(t, "board", "layout", "small", "--control-socket", ctl); err != nil || !strings.Contains(out, `"slots"`) {
		t.Fatalf("board layout small: %v\n%s", err, out)
	}
	// Fault injection is off unless the daemon was started with it.
	if _, _, err := runApp(t, "board", "fail", "small", "--control-socket", ctl); err == nil || !strings.Contains(err.Error(), "fault injection is off") {
		t.Fatalf("board fail without --fault-injection: %v", err)
	}
	if _, _, err := runApp(t, "board", "repair", "small", "--control-socket", ctl); err == nil || !strings.Contains(err.Error(), "fault injection is off") {
		t.Fatalf("board repair without --fault-injection: %v", err)
	}
	if _, _, err := runApp(t, "board", "reinit", "small", "--control-socket", ctl); err == nil || !strings.Contains(err.Error(), "not lost") {
		t.Fatalf("board reinit of a board that answers: %v", err)
	}
}
