package host

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// post POSTs path on srv and returns the status and the decoded body.
func post(t *testing.T, srv *httptest.Server, path string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Post(srv.URL+path, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body
}

// TestFailedBoardBackInService, through the control API: board fast
// fails under a vGPU, which becomes a lost device (listed, with why). Its
// reset is refused while fast is lost and slow is full; reinit is refused
// while fast does not answer; the fault injection puts fast back on the
// bus, reinit puts it back in service (active, no slot out of service; a
// second reinit is a conflict) and the vGPU's reset brings it back on
// fast, where its registers read their power-on values.
func TestFailedBoardBackInService(t *testing.T) {
	h := newTestHost(t, Options{FaultInjection: true, Placement: PlacePack}, 1, 1)
	_, v, _ := attach(t, h, 1, "victim")
	_, _, _ = attach(t, h, 2, "fills-slow")
	srv := httptest.NewServer(h.ControlHandler())
	defer srv.Close()
	if code, body := post(t, srv, "/v1/boards/fast/reinit"); code != http.StatusConflict {
		t.Fatalf("reinit of a board that answers: %d %v", code, body)
	}
	if code, body := post(t, srv, "/v1/boards/fast/fail"); code != http.StatusOK {
		t.Fatalf("fail: %d %v", code, body)
	}
	deadline := time.Now().Add(time.Minute) // a hang guard
	for lost, _ := v.Lost(); !lost; lost, _ = v.Lost() {
		if time.Now().After(deadline) {
			t.Fatal("the vGPU never became a lost device")
		}
		time.Sleep(time.Millisecond)
	}
	resp, err := http.Get(srv.URL + "/v1/vgpus")
	if err != nil {
		t.Fatal(err)
	}
	var infos []aggregator.VGPUInfo
	err = json.NewDecoder(resp.Body).Decode(&infos)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	listed := false
	for _, i := range infos {
		listed = listed || (i.ID == v.ID && strings.Contains(i.Lost, "board fast") && i.Slot == -1)
	}
	if !listed {
		t.Fatalf("the lost device is not listed as lost: %+v", infos)
	}
	reset := "/v1/vgpus/" + itoa(v.ID) + "/reset"
	if code, body := post(t, srv, reset); code != http.StatusInternalServerError || !strings.Contains(fmt.Sprint(body["error"]), "still lost") {
		t.Fatalf("reset with fast lost and slow full: %d %v", code, body)
	}
	if code, body := post(t, srv, "/v1/boards/fast/reinit"); code != http.StatusServiceUnavailable || !strings.Contains(fmt.Sprint(body["error"]), "0xffffffff") {
		t.Fatalf("reinit of a board still off the bus: %d %v", code, body)
	}
	if code, body := post(t, srv, "/v1/boards/fast/repair"); code != http.StatusOK {
		t.Fatalf("repair: %d %v", code, body)
	}
	if code, body := post(t, srv, "/v1/boards/fast/reinit"); code != http.StatusOK {
		t.Fatalf("reinit: %d %v", code, body)
	}
	if code, _ := post(t, srv, "/v1/boards/fast/reinit"); code != http.StatusConflict {
		t.Fatalf("a second reinit: %d", code)
	}
	bi := h.BoardInfos()[0]
	if bi.State != StateActive || bi.Lost != "" || bi.OutOfService != 0 {
		t.Fatalf("fast after reinit: %+v", bi)
	}
	if got, err := v.Read32(nvc0.BAR0, nvc0.RegBoot0); err != nil || got != nvc0.ReadAllOnes {
		t.Fatalf("the lost device before its reset reads %#x, %v; it waits for its reset", got, err)
	}
	if code, body := post(t, srv, reset); code != http.StatusOK {
		t.Fatalf("reset after reinit: %d %v", code, body)
	}
	if info := v.Info(); info.BoardName != "fast" || info.Slot != 0 || info.Lost != "" {
		t.Fatalf("after its reset: %+v", info)
	}
	if got, err := v.Read32(nvc0.BAR0, nvc0.RegBoot0); err != nil || got != nvc0.Boot0Value {
		t.Fatalf("PMC_BOOT_0 after the reset: %#x, %v", got, err)
	}
	if got, err := v.Read32(nvc0.BAR0, nvc0.RegPMCEnable); err != nil || got != 0 {
		t.Fatalf("PMC_ENABLE after the reset: %#x, %v; want its power-on 0", got, err)
	}
}
