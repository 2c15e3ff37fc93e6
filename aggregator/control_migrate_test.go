package aggregator

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/gpuvm/gpuvm/vgpuimage"
)

// TestControlMigrateRoutes: a live migration over the control API, as the
// CLI carries it. No such vGPU is 404. The source streams (200, a token);
// the destination takes the stream (migrate-in, 200, the image waits); a
// verdict with another token is 404; a refusal is 409 and the vGPU stays
// on the source, computing; DELETE migrate-in drops the stale image on
// the destination. A second migration with an ok verdict completes: 200
// with its statistics, the vGPU gone from the source.
func TestControlMigrateRoutes(t *testing.T) {
	src, _ := newTestAggregator(t, 2)
	dst, _ := newTestAggregator(t, 2)
	g := startSavable(t, src, 5, "vm1", "fv-optimized")
	verifiedWork(t, g.guestVM)
	srcSrv := httptest.NewServer(src.ControlHandler())
	defer srcSrv.Close()
	dstSrv := httptest.NewServer(dst.ControlHandler())
	defer dstSrv.Close()
	id := strconv.Itoa(g.v.ID)

	if code, body, _ := postControl(t, srcSrv, "/v1/vgpus/99/migrate", nil); code != http.StatusNotFound {
		t.Errorf("migrate of no such vGPU: %d %s", code, body)
	}
	migrate := func(verdict string) (int, string) {
		t.Helper()
		resp, err := http.Post(srcSrv.URL+"/v1/vgpus/"+id+"/migrate?rounds=2", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		tok := resp.Header.Get(MigrationTokenHeader)
		if resp.StatusCode != http.StatusOK || tok == "" {
			t.Fatalf("migrate: %s, token %q", resp.Status, tok)
		}
		var stream bytes.Buffer
		if _, err := vgpuimage.CopyStream(&stream, resp.Body); err != nil {
			t.Fatal(err)
		}
		if code, body, _ := postControl(t, dstSrv, "/v1/domains/5/migrate-in", stream.Bytes()); code != http.StatusOK || len(dst.Restores()) != 1 {
			t.Fatalf("migrate-in: %d %s", code, body)
		}
		if code, _, _ := postControl(t, srcSrv, "/v1/vgpus/"+id+"/migrate-verdict?token=x"+tok, []byte(`{"ok":true}`)); code != http.StatusNotFound {
			t.Fatalf("a verdict with another token: %d", code)
		}
		code, body, _ := postControl(t, srcSrv, "/v1/vgpus/"+id+"/migrate-verdict?token="+tok, []byte(verdict))
		return code, body
	}
	code, body := migrate(`{"ok":false,"error":"the operator changed their mind"}`)
	if code != http.StatusConflict || !strings.Contains(jsonError(t, body), "changed their mind") {
		t.Fatalf("refused verdict: %d %s", code, body)
	}
	if v := src.VGPUs(); len(v) != 1 || v[0] != g.v {
		t.Fatal("the source let the vGPU go after a refusal")
	}
	verifiedWork(t, g.guestVM)
	req, _ := http.NewRequest(http.MethodDelete, dstSrv.URL+"/v1/domains/5/migrate-in", nil)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusOK || len(dst.Restores()) != 0 {
		t.Fatalf("dropping the stale image: %v %v, %d waiting", resp, err, len(dst.Restores()))
	}

	code, body = migrate(`{"ok":true}`)
	if code != http.StatusOK || !strings.Contains(body, `"in_use"`) {
		t.Fatalf("ok verdict: %d %s", code, body)
	}
	if len(src.VGPUs()) != 0 || len(dst.Restores()) != 1 {
		t.Fatalf("after the migration: %d vGPUs on the source, %d images on the destination", len(src.VGPUs()), len(dst.Restores()))
	}
}
