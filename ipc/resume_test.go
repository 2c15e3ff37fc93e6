package ipc

import (
	"fmt"
	"strings"
	"testing"
)

// TestHelloResumeFlag: the resume flag travels in byte 28 and comes back
// decoded; any other bit there, or a byte of 29..31 not zero, is refused.
func TestHelloResumeFlag(t *testing.T) {
	h := Hello{Version: ProtocolVersion, DomID: 7, Name: "g", Mode: "fv-optimized", RAMSize: 1 << 20, Transport: TransportShm, Resume: true}
	b := encodeHello(&h, 0)
	if b[28] != HelloResume {
		t.Fatalf("flags byte %#x, want %#x", b[28], HelloResume)
	}
	got, _, err := decodeHello(b)
	if err != nil || !got.Resume {
		t.Fatalf("decode: %+v, %v", got, err)
	}
	h.Resume = false
	if got, _, err := decodeHello(encodeHello(&h, 0)); err != nil || got.Resume {
		t.Fatalf("decode without the flag: %+v, %v", got, err)
	}
	h.ResumesHandoff = true
	if b := encodeHello(&h, 0); b[28] != HelloResumesHandoff {
		t.Fatalf("flags byte %#x, want %#x", b[28], HelloResumesHandoff)
	}
	if got, _, err := decodeHello(encodeHello(&h, 0)); err != nil || got.Resume || !got.ResumesHandoff {
		t.Fatalf("decode with resumes-handoff: %+v, %v", got, err)
	}
	for _, c := range []struct {
		off  int
		val  byte
		want string
	}{{28, 4, "unknown flags 0x4"}, {28, 0x81, "unknown flags 0x80"}, {29, 1, "reserved bytes 29..31"}, {31, 1, "reserved bytes 29..31"}} {
		bad := encodeHello(&h, 0)
		bad[c.off] = c.val
		if _, _, err := decodeHello(bad); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("byte %d = %#x: %v, want %q", c.off, c.val, err, c.want)
		}
	}
}

// TestSavedByeAndNoImage: the markers are recognised through wrapping, and
// only as prefixes of their own message kinds.
func TestSavedByeAndNoImage(t *testing.T) {
	saved := fmt.Errorf("read: %w", &ByeError{Reason: ByeSaved + "vGPU saved"})
	if !IsSavedBye(saved) || IsNoImage(saved) {
		t.Errorf("saved Bye: IsSavedBye %v IsNoImage %v", IsSavedBye(saved), IsNoImage(saved))
	}
	for _, err := range []error{&ByeError{Reason: "vGPU 3 destroyed through the control API"}, &RejectedError{Reason: ByeSaved + "x"}, nil} {
		if IsSavedBye(err) {
			t.Errorf("IsSavedBye(%v)", err)
		}
	}
	noImg := fmt.Errorf("ipc: dial s: %w", &RejectedError{Reason: RejectNoImage + "none waits for domain 7"})
	if !IsNoImage(noImg) || IsNoImage(&ByeError{Reason: RejectNoImage}) || IsNoImage(&RejectedError{Reason: "mode"}) {
		t.Error("IsNoImage misjudges")
	}
}
