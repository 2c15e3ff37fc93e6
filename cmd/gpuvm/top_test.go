package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
)

func TestRenderTop(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	vm := func(id int, name string, weight int, gpu time.Duration, released uint64, wait time.Duration, traps float64) aggregator.VGPUInfo {
		return aggregator.VGPUInfo{ID: id, DomID: uint32(10 + id), Name: name, Mode: "fv-optimized", VRAMBytes: 256 << 20, VRAMInUse: 3 << 20,
			Counters: map[string]any{"bar3_traps": map[string]any{"read": 0.0, "write": traps}, "denied": 0.0},
			Sched:    aggregator.SchedStats{Weight: weight, GPUTime: gpu, Released: released, QueueWait: wait, Share: map[bool]float64{true: 1}[gpu > 0]}}
	}
	prev := topSample{at: t0, slots: 4, vgpus: []aggregator.VGPUInfo{vm(0, "busy", 3, 100*time.Millisecond, 10, time.Millisecond, 1000), vm(1, "idle", 1, 0, 0, 0, 5)}}
	cur := topSample{at: t0.Add(2 * time.Second), slots: 4, vgpus: []aggregator.VGPUInfo{vm(1, "idle", 1, 0, 0, 0, 5), vm(0, "busy", 3, 600*time.Millisecond, 20, 3*time.Millisecond, 3000)}}
	var out bytes.Buffer
	if err := renderTop(&out, prev, cur); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", out.String())
	lines := strings.Split(out.String(), "\n")
	if !strings.Contains(lines[0], "vGPUs 2/4") {
		t.Errorf("header %q", lines[0])
	}
	busy, idle := strings.Fields(lines[3]), strings.Fields(lines[4])
	// VGPU DOMAIN DOMID MODE PROFILE WEIGHT SHARE ENTITLED GPU GPU-TIME QWAIT QUEUED TRAPS/s VRAM STATE
	want := []string{"0", "busy", "10", "fv-optimized", "-", "3", "100.0%", "75.0%", "25.0%", "600ms", "200µs", "0", "1000", "3MiB/256MiB", "computing"}
	if strings.Join(busy, " ") != strings.Join(want, " ") {
		t.Errorf("busy row\n%q\nwant\n%q", busy, want)
	}
	if idle[1] != "idle" || idle[7] != "25.0%" || idle[12] != "0" || idle[14] != "idle" {
		t.Errorf("idle row %q", idle)
	}
	// The same domain attached afresh (its counters start again) shows no
	// rates, not wrapped ones.
	again := topSample{at: t0.Add(4 * time.Second), slots: 4, vgpus: []aggregator.VGPUInfo{vm(0, "busy", 3, 10*time.Millisecond, 1, 0, 50)}}
	out.Reset()
	if err := renderTop(&out, cur, again); err != nil {
		t.Fatal(err)
	}
	if row := strings.Fields(strings.Split(out.String(), "\n")[3]); row[8] != "0.0%" || row[12] != "0" {
		t.Errorf("re-attached VM's row %q: want no rates", row)
	}
}

// TestTopAgainstDaemon: gpuvm top, its output not a terminal, prints
// plain refreshes in which a computing VM shows as computing.
func TestTopAgainstDaemon(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a daemon and a VM process")
	}
	dir := t.TempDir()
	sock, ctl := dir+"/agg.sock", dir+"/ctl.sock"
	d := startDaemon(t, daemonConfig(t, dir, sock, ctl, ""), ctl)
	defer d.stop(t)
	startComputingVM(t, sock, ctl, "busy", 5)
	out, _, err := runApp(t, "top", "-n", "2", "--interval", "300ms", "--control-socket", ctl)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", out)
	if n := strings.Count(out, "gpuvm top - "); n != 2 {
		t.Errorf("%d refreshes, want 2", n)
	}
	if strings.Contains(out, "\x1b[") {
		t.Error("escape sequences in output that is not a terminal")
	}
	if !strings.Contains(out, "computing") {
		t.Error("the computing VM is not shown computing")
	}
}

// TestRenderTopSeveralBoards: with vGPUs on two boards, each row names its
// board, entitlement is against the weights of its own board (each has its
// own scheduler), and the header gives each board's busy time.
func TestRenderTopSeveralBoards(t *testing.T) {
	t0 := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	vm := func(id, board int, name string, weight int, busy float64) aggregator.VGPUInfo {
		return aggregator.VGPUInfo{ID: id, Board: board, BoardName: []string{"fast", "slow"}[board], DomID: uint32(10 + id), Name: name,
			Mode: "fv-optimized", VRAMInUse: -1, Counters: map[string]any{}, Sched: aggregator.SchedStats{Weight: weight, Busy: busy}}
	}
	s := topSample{at: t0, slots: 4, vgpus: []aggregator.VGPUInfo{vm(0, 0, "a", 3, 0.5), vm(1, 0, "b", 1, 0.25), vm(2, 1, "c", 1, 0.1)}}
	var out bytes.Buffer
	if err := renderTop(&out, s, s); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", out.String())
	lines := strings.Split(out.String(), "\n")
	if !strings.Contains(lines[0], "GPU busy fast 75%, slow 10%") {
		t.Errorf("header %q", lines[0])
	}
	if h := strings.Fields(lines[2]); h[1] != "BOARD" {
		t.Errorf("columns %q", h)
	}
	// VGPU BOARD DOMAIN DOMID MODE PROFILE WEIGHT SHARE ENTITLED ...
	for i, want := range []struct{ board, entitled string }{{"fast", "75.0%"}, {"fast", "25.0%"}, {"slow", "100.0%"}} {
		row := strings.Fields(lines[3+i])
		if row[1] != want.board || row[8] != want.entitled {
			t.Errorf("row %d %q: want board %s entitled %s", i, row, want.board, want.entitled)
		}
	}
}
