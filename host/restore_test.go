package host

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gpuvm/gpuvm/vgpuimage"
)

// TestRestoreRouteRefusesGarbage: POST /v1/domains/{domid}/restore on a
// host of several boards answers 400 with the image decoder's reason for
// bytes that are not an image, and for a bad domain id, and registers
// nothing on any board.
func TestRestoreRouteRefusesGarbage(t *testing.T) {
	h := newTestHost(t, Options{}, 1, 1)
	srv := httptest.NewServer(h.ControlHandler())
	defer srv.Close()
	for _, c := range []struct{ path, body, want string }{
		{"/v1/domains/7/restore", "GPUVMIMG but not really", "vGPU image: "},
		{"/v1/domains/7/restore", "garbage, and more than a header of it", "not a gpuvm vGPU state image"},
		{"/v1/domains/7/restore", "garbage", "truncated"},
		{"/v1/domains/x/restore", "garbage", "domain id"},
	} {
		resp, err := http.Post(srv.URL+c.path, "application/octet-stream", bytes.NewReader([]byte(c.body)))
		if err != nil {
			t.Fatal(err)
		}
		var e struct {
			Error string `json:"error"`
		}
		derr := json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || derr != nil || !strings.Contains(e.Error, c.want) {
			t.Errorf("POST %s %q: %d %q (%v), want 400 with %q", c.path, c.body, resp.StatusCode, e.Error, derr, c.want)
		}
	}
	if b := h.restoreBoard(7); b != nil {
		t.Errorf("an image waits on board %s after refusals", b.Name)
	}
}

// TestRefusedImageKeepsTheWaitingOne: an image refused by every board's
// checks (here: of a mode the daemon does not restore) leaves the image
// already waiting for the domain where it was.
func TestRefusedImageKeepsTheWaitingOne(t *testing.T) {
	h := newTestHost(t, Options{}, 1, 1)
	s := h.boards[0].Agg.Layout().Slots[0]
	good := &vgpuimage.Image{
		Identity: vgpuimage.Identity{Mode: "fv-optimized", Name: "vm", DomID: 7, RAM: 64 << 20,
			VRAM: s.VRAM.Size, Channels: uint32(s.Chans), BAR1: s.BAR1.Size, BAR3: s.BAR3.Size},
		Chans: make([]vgpuimage.Chan, s.Chans),
	}
	encode := func(m *vgpuimage.Image) []byte {
		var b bytes.Buffer
		if err := vgpuimage.Encode(&b, m); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	if _, err := h.RegisterRestore(7, bytes.NewReader(encode(good))); err != nil {
		t.Fatalf("the good image: %v", err)
	}
	bad := *good
	bad.Identity.Mode = "pvdrm"
	if _, err := h.RegisterRestore(7, bytes.NewReader(encode(&bad))); err == nil {
		t.Fatal("an image of a pvdrm vGPU was taken")
	}
	if b := h.restoreBoard(7); b == nil {
		t.Fatal("the refused image dropped the one waiting for the domain")
	}
}
