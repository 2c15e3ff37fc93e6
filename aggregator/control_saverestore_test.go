package aggregator

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/vgpuimage"
)

// postControl posts body to path on srv and returns the status and body.
func postControl(t *testing.T, srv *httptest.Server, path string, body []byte) (int, string, http.Header) {
	t.Helper()
	resp, err := http.Post(srv.URL+path, "application/octet-stream", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b), resp.Header
}

// jsonError is the error field of a control API answer.
func jsonError(t *testing.T, body string) string {
	t.Helper()
	var e struct {
		Error string `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error == "" {
		t.Fatalf("not a JSON error: %q (%v)", body, err)
	}
	return e.Error
}

// TestControlSaveRestoreRoutes: the save and restore routes' answers — a
// save of no such vGPU is 404; garbage, a truncated image, a bad domain id
// are 400 with the reason (the decoder's for an image) and register
// nothing; a save streams the image (200, octet-stream) and takes the
// vGPU away; that image restores (200, what waits).
func TestControlSaveRestoreRoutes(t *testing.T) {
	agg, _ := newTestAggregator(t, 2)
	g := startGuest(t, agg, "vm1", "fv-optimized")
	srv := httptest.NewServer(agg.ControlHandler())
	defer srv.Close()

	if code, body, _ := postControl(t, srv, "/v1/vgpus/99/save", nil); code != http.StatusNotFound || jsonError(t, body) != "no such vGPU" {
		t.Errorf("save of no such vGPU: %d %s", code, body)
	}
	for _, c := range []struct {
		path string
		body []byte
		want string
	}{
		{"/v1/domains/7/restore", []byte("this is not an image, it is garbage"), "vGPU image: " + vgpuimage.ErrNotImage.Error()},
		{"/v1/domains/7/restore", nil, "vGPU image: header"},
		{"/v1/domains/seven/restore", []byte("x"), "domain id"},
	} {
		code, body, _ := postControl(t, srv, c.path, c.body)
		if code != http.StatusBadRequest || !strings.Contains(jsonError(t, body), c.want) {
			t.Errorf("POST %s (%d bytes): %d %s, want 400 with %q", c.path, len(c.body), code, body, c.want)
		}
	}
	if n := len(agg.Restores()); n != 0 {
		t.Fatalf("%d images registered after refusals", n)
	}

	id := strconv.Itoa(g.v.ID)
	code, img, hdr := postControl(t, srv, "/v1/vgpus/"+id+"/save", nil)
	token := hdr.Get(SaveTokenHeader)
	if code != http.StatusOK || hdr.Get("Content-Type") != "application/octet-stream" || token == "" {
		t.Fatalf("save: %d %s, token %q", code, hdr.Get("Content-Type"), token)
	}
	// Held for the commit: there, parked, with no restore possible.
	if n := len(agg.VGPUs()); n != 1 || !g.v.Evicted() {
		t.Fatalf("%d vGPUs before the commit (parked: %v), want the one, parked", n, g.v.Evicted())
	}
	for _, bad := range []string{"", "?token=", "?token=" + token + "x"} {
		if code, body, _ := postControl(t, srv, "/v1/vgpus/"+id+"/save/commit"+bad, nil); code != http.StatusConflict {
			t.Errorf("commit with token %q: %d %s, want 409", bad, code, body)
		}
	}
	if n := len(agg.VGPUs()); n != 1 {
		t.Fatalf("%d vGPUs after refused commits, want 1", n)
	}
	if code, body, _ := postControl(t, srv, "/v1/vgpus/"+id+"/save/commit?token="+token, nil); code != http.StatusOK || !strings.Contains(body, `"destroyed": true`) {
		t.Fatalf("commit: %d %s", code, body)
	}
	if n := len(agg.VGPUs()); n != 0 {
		t.Fatalf("%d vGPUs after the commit", n)
	}
	if code, body, _ := postControl(t, srv, "/v1/vgpus/"+strconv.Itoa(g.v.ID)+"/save", nil); code != http.StatusNotFound {
		t.Errorf("second save of the saved vGPU: %d %s", code, body)
	}
	trunc := []byte(img[:len(img)-1])
	if code, body, _ := postControl(t, srv, "/v1/domains/7/restore", trunc); code != http.StatusBadRequest || !strings.Contains(jsonError(t, body), "truncated") {
		t.Errorf("restore of a truncated image: %d %s", code, body)
	}
	if code, body, _ := postControl(t, srv, "/v1/domains/0/restore", []byte(img)); code != http.StatusBadRequest || !strings.Contains(jsonError(t, body), "domain id 0") {
		t.Errorf("restore for domain 0: %d %s", code, body)
	}
	if n := len(agg.Restores()); n != 0 {
		t.Fatalf("%d images registered after refusals", n)
	}
	code, body, _ := postControl(t, srv, "/v1/domains/7/restore", []byte(img))
	var info RestoreInfo
	if code != http.StatusOK || json.Unmarshal([]byte(body), &info) != nil || info.DomID != 7 || info.Mode != "fv-optimized" || info.Name != "vm1" {
		t.Fatalf("restore: %d %s", code, body)
	}
	if !agg.HasRestore(7) {
		t.Fatal("the image does not wait for domain 7")
	}
}

// TestSaveNotCommittedResumes: a save whose client never commits — it
// aborts, or says nothing until the hold times out — leaves the vGPU
// attached and parked, and its guest's next workload brings it back here
// and verifies; a commit after that is refused and destroys nothing. Two
// saves under way at once take the daemon's transfers; a third is 503.
func TestSaveNotCommittedResumes(t *testing.T) {
	agg, _ := newTestAggregator(t, 2)
	g := startGuest(t, agg, "vm1", "fv-optimized")
	verifiedWork(t, g)
	srv := httptest.NewServer(agg.ControlHandler())
	defer srv.Close()
	id := strconv.Itoa(g.v.ID)

	for _, how := range []string{"abort", "timeout"} {
		code, _, hdr := postControl(t, srv, "/v1/vgpus/"+id+"/save", nil)
		token := hdr.Get(SaveTokenHeader)
		if code != http.StatusOK || token == "" {
			t.Fatalf("%s: save: %d", how, code)
		}
		switch how {
		case "abort":
			if code, body, _ := postControl(t, srv, "/v1/vgpus/"+id+"/save/abort?token="+token, nil); code != http.StatusOK {
				t.Fatalf("abort: %d %s", code, body)
			}
		case "timeout":
			h := g.v.saveHold.Load()
			if h == nil {
				t.Fatal("no hold after the save")
			}
			h.timer.Reset(time.Millisecond)
			for g.v.saveHold.Load() != nil {
				time.Sleep(time.Millisecond)
			}
		}
		if code, body, _ := postControl(t, srv, "/v1/vgpus/"+id+"/save/commit?token="+token, nil); code != http.StatusConflict {
			t.Fatalf("%s: a late commit: %d %s, want 409", how, code, body)
		}
		if n := len(agg.VGPUs()); n != 1 || !g.v.Evicted() {
			t.Fatalf("%s: %d vGPUs (parked %v), want the one still parked", how, n, g.v.Evicted())
		}
		verifiedWork(t, g)
		if g.v.Evicted() {
			t.Fatalf("%s: the guest's work ran but the vGPU is still parked", how)
		}
	}

	var dones []func()
	for range MaxImageTransfers {
		done, ok := agg.reg.TryImageTransfer()
		if !ok {
			t.Fatal("fewer image transfers than MaxImageTransfers")
		}
		dones = append(dones, done)
	}
	if code, body, _ := postControl(t, srv, "/v1/vgpus/"+id+"/save", nil); code != http.StatusServiceUnavailable {
		t.Fatalf("a save past the transfer bound: %d %s, want 503", code, body)
	}
	if code, body, _ := postControl(t, srv, "/v1/domains/9/restore", []byte("x")); code != http.StatusServiceUnavailable {
		t.Fatalf("a restore past the transfer bound: %d %s, want 503", code, body)
	}
	if g.v.Evicted() || len(agg.VGPUs()) != 1 {
		t.Fatal("a refused save touched the vGPU")
	}
	for _, d := range dones {
		d()
		d() // twice is once
	}
	if _, ok := agg.reg.TryImageTransfer(); !ok {
		t.Fatal("transfers not given back")
	}
}
