package host

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gpuvm/gpuvm/aggregator"
)

// The control API moves a vGPU between boards (routed by the host, not the
// aggregator of its board), keeps its id, records the move with the
// placement decisions, and refuses unknown, cordoned and full boards and
// pinned guests.
func TestMoveThroughControlAPI(t *testing.T) {
	pinned := uint32(9)
	h := newTestHost(t, Options{Pin: func(g aggregator.Guest, _ string) string {
		if g.DomID == pinned {
			return "fast"
		}
		return ""
	}}, 2, 1)
	srv := httptest.NewServer(h.ControlHandler())
	defer srv.Close()
	b, v, _ := attach(t, h, 1, "mover")
	if b.Name != "fast" {
		t.Fatalf("placed on %s", b.Name)
	}
	id := itoa(v.ID)
	if code, out := post(t, srv, "/v1/vgpus/"+id+"/move?to=nowhere"); code != http.StatusConflict {
		t.Fatalf("move to no board: %d %v", code, out)
	}
	if code, out := post(t, srv, "/v1/vgpus/"+id+"/move"); code != http.StatusBadRequest {
		t.Fatalf("move without a board: %d %v", code, out)
	}
	if code, out := post(t, srv, "/v1/vgpus/77/move?to=slow"); code != http.StatusNotFound {
		t.Fatalf("move of no vGPU: %d %v", code, out)
	}
	if err := h.SetState("slow", StateCordoned); err != nil {
		t.Fatal(err)
	}
	if code, out := post(t, srv, "/v1/vgpus/"+id+"/move?to=slow"); code != http.StatusConflict || !strings.Contains(out["error"].(string), "cordoned") {
		t.Fatalf("move to a cordoned board: %d %v", code, out)
	}
	if err := h.SetState("slow", StateActive); err != nil {
		t.Fatal(err)
	}
	code, out := post(t, srv, "/v1/vgpus/"+id+"/move?to=slow")
	if code != http.StatusOK || out["to_board"] != "slow" || out["from_board"] != "fast" {
		t.Fatalf("move: %d %v", code, out)
	}
	if nb, nv := h.Lookup(v.ID); nb == nil || nb.Name != "slow" || nv != v {
		t.Fatalf("after the move the vGPU is on %v", nb)
	}
	if _, name := v.Board(); name != "slow" {
		t.Fatalf("the vGPU names board %q", name)
	}
	ds := h.Decisions()
	if last := ds[len(ds)-1]; last.Board != "slow" || !strings.Contains(last.Reason, "moved") {
		t.Fatalf("last decision %+v", last)
	}
	// slow has one slot, now taken: a second vGPU cannot move there.
	_, w, _ := attach(t, h, 2, "other")
	if code, out := post(t, srv, "/v1/vgpus/"+itoa(w.ID)+"/move?to=slow"); code != http.StatusConflict {
		t.Fatalf("move to a full board: %d %v", code, out)
	}
	// A guest pinned to fast stays there.
	_, p, _ := attach(t, h, pinned, "pinned")
	if code, out := post(t, srv, "/v1/vgpus/"+itoa(p.ID)+"/move?to=slow"); code != http.StatusConflict || !strings.Contains(out["error"].(string), "pinned") {
		t.Fatalf("move of a pinned guest: %d %v", code, out)
	}
	// Back, to the board it came from, once a slot is free there.
	if wb, _ := h.Lookup(w.ID); wb == nil || wb.Agg.Detach(w) != nil {
		t.Fatal("detach the other vGPU")
	}
	if code, out := post(t, srv, "/v1/vgpus/"+id+"/move?to=fast"); code != http.StatusOK {
		t.Fatalf("move back: %d %v", code, out)
	}
}
