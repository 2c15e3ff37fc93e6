package tests

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/ipc"
)

// TestModeConflictRefused: the operator's per-VM mode ([[vm]] mode, here
// the aggregator's Mode option) is a requirement. A device model asking
// for another mode is refused with both modes in the reason — not served in
// a mode its own output does not name — and one asking for the configured
// mode, or for any mode when nothing is configured, is served in it.
func TestModeConflictRefused(t *testing.T) {
	e := newEnvWith(t, envOptions{Modify: func(o *aggregator.Options) {
		o.Mode = func(g aggregator.Guest) string {
			if g.Name == "pinned" {
				return "fv-naive"
			}
			return ""
		}
	}})
	_, err := e.tryConnect("pinned", 11, "fv-optimized")
	var rej *ipc.RejectedError
	if !errors.As(err, &rej) {
		t.Fatalf("device model asking for fv-optimized where the configuration says fv-naive: %v, want an ipc.RejectedError", err)
	}
	for _, want := range []string{`"fv-optimized"`, `"fv-naive"`, "--mode fv-naive"} {
		if !strings.Contains(rej.Reason, want) {
			t.Errorf("refusal %q does not say %s", rej.Reason, want)
		}
	}
	if v := e.vgpu("pinned"); v != nil {
		t.Fatalf("the refused VM has a vGPU in mode %s", v.Guest.Mode)
	}

	d := e.connect(t, "pinned", 11, "fv-naive")
	if v := e.vgpu("pinned"); v == nil || v.Guest.Mode != "fv-naive" {
		t.Errorf("the VM asking for its configured mode: vGPU %v", v)
	}
	d.Close()
	e.waitDetached(t, "pinned", 10*time.Second)

	e.connect(t, "free", 12, "fv-lazy")
	if v := e.vgpu("free"); v == nil || v.Guest.Mode != "fv-lazy" {
		t.Errorf("a VM without a configured mode: vGPU %v, want mode fv-lazy", v)
	}
}

// TestDestroyedVGPUNoticedPromptly: when the operator destroys a vGPU
// through the control API (gpuvm vgpu destroy), the VM's device model is
// told at once — the aggregator ends its connection with a Bye saying why —
// and the VM process, in the middle of its work, fails and exits within
// seconds, naming the reason; it used to take ~20 s (the guest driver's
// register waits on a device reading all-ones each ran to their 10 s
// timeout before it gave up). The slot is free again, and the aggregator
// logs the detach once.
func TestDestroyedVGPUNoticedPromptly(t *testing.T) {
	var (
		logs   logCounter
		logMu  sync.Mutex
		logBuf bytes.Buffer
	)
	logText := func() string {
		logMu.Lock()
		defer logMu.Unlock()
		return logBuf.String()
	}
	e := newEnvWith(t, envOptions{Logger: newCountingLogger(&logs, lockedWriter{&logMu, &logBuf})})
	srv := httptest.NewServer(e.agg.ControlHandler())
	defer srv.Close()
	p, v := e.startBusyHonest(t, 1000)
	req, err := http.NewRequest(http.MethodDelete, srv.URL+"/v1/vgpus/"+strconv.Itoa(v.ID), nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("DELETE: %s", resp.Status)
	}
	const within = 3 * time.Second
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the VM was still running 30 s after its vGPU was destroyed\nstderr:\n%s", p.stderr())
	}
	took := time.Since(start)
	t.Logf("the VM exited %v after the destroy: %v", took.Round(time.Millisecond), p.errv)
	if took > within {
		t.Errorf("the VM took %v to notice its vGPU was destroyed, want under %v\nstderr:\n%s", took.Round(time.Millisecond), within, p.stderr())
	}
	if p.errv == nil {
		t.Errorf("the VM exited 0 after losing its vGPU")
	}
	if !strings.Contains(p.stderr()+p.out.String(), "destroyed through the control API") {
		t.Errorf("the VM's output does not say its vGPU was destroyed:\nstdout:\n%s\nstderr:\n%s", p.out.String(), p.stderr())
	}
	e.waitDetached(t, "honest", 5*time.Second)
	if n := strings.Count(logText(), "vGPU detached"); n != 1 {
		t.Errorf(`"vGPU detached" logged %d times, want once:\n%s`, n, logText())
	}
}

// TestWelcomeDescribesTheVGPU: the Welcome tells the device model what it
// got — VRAM, channels (the quota, not the slot) and the board's timing
// profile — so that what the VM reports about its GPU is what it has.
func TestWelcomeDescribesTheVGPU(t *testing.T) {
	e := newEnvWith(t, envOptions{
		Quota:  func(aggregator.Guest) aggregator.Quota { return aggregator.Quota{Channels: 3, VRAM: 64 << 20} },
		Modify: func(o *aggregator.Options) { o.Timing = "fermi-xen" },
	})
	d := e.connect(t, "vm", 21, "fv-naive")
	w := d.Welcome()
	if w.VRAMSize != 64<<20 || w.Channels != 3 || w.Params[ipc.ParamTiming] != "fermi-xen" {
		t.Errorf("Welcome = VRAM %d, %d channels, params %v; want 64 MiB, 3 channels, timing fermi-xen", w.VRAMSize, w.Channels, w.Params)
	}
}
