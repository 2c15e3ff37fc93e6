package tests

import (
	"errors"
	"strings"
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
