package aggregator

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/ipc"
	"github.com/gpuvm/gpuvm/pvdrm"
)

// serveOnSocket serves agg's device-model protocol on a socket of its own
// for the test's length and returns its path.
func serveOnSocket(t *testing.T, agg *Aggregator) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "gpuvm-agg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "agg.sock")
	ln, err := ipc.Listen(sock, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- agg.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-served; ln.Close() })
	return sock
}

// A pvdrm front end over the real handshake: it is served, listed by the
// control API in its mode, and destroyed through it — after which its
// requests fail and its vGPU is gone.
func TestPVDRMServedAndDestroyed(t *testing.T) {
	agg, _ := newTestAggregator(t, 2)
	sock := serveOnSocket(t, agg)

	fe, err := pvdrm.DialLocal(context.Background(), pvdrm.DialConfig{Socket: sock, DomID: 9, Name: "drm", Mode: "pvdrm-pooling", GARTSize: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer fe.Close()
	if fe.Client.Features&pvdrm.FeaturePooling == 0 {
		t.Error("pooling not granted in pvdrm-pooling")
	}
	gctx, err := gdev.NewContextOn(gdev.PVDRM(fe.Client, fe.Shares))
	if err != nil {
		t.Fatal(err)
	}
	if err := maddOnce(gctx, 16); err != nil {
		t.Fatal(err)
	}
	if err := gctx.Close(); err != nil {
		t.Fatal(err)
	}
	c, err := fe.Counters(CounterNames())
	if err != nil || c["pvdrm_requests"] == 0 {
		t.Errorf("counters over the device-model socket: %v, %v", c, err)
	}

	api := httptest.NewServer(agg.ControlHandler())
	defer api.Close()
	var infos []VGPUInfo
	resp, err := http.Get(api.URL + "/v1/vgpus")
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(resp.Body).Decode(&infos)
	resp.Body.Close()
	if len(infos) != 1 || infos[0].Mode != "pvdrm-pooling" || infos[0].Name != "drm" {
		t.Fatalf("control API lists %+v", infos)
	}
	req, _ := http.NewRequest(http.MethodDelete, api.URL+"/v1/vgpus/"+strconv.Itoa(infos[0].ID), nil)
	if resp, err = http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("destroy: %v %v", resp, err)
	}
	resp.Body.Close()
	deadline := time.Now().Add(30 * time.Second)
	for len(agg.VGPUs()) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the destroyed pvdrm vGPU is still attached")
		}
		time.Sleep(5 * time.Millisecond)
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer rcancel()
	if _, err := fe.Client.Do(rctx, pvdrm.Request{Op: pvdrm.OpOpen}); !errors.Is(err, pvdrm.ErrDisconnected) {
		t.Errorf("a request after the destroy: %v", err)
	}
}

// The device-model connection of a pvdrm guest carries no register
// access: each is refused (the connection then ends) and counted.
func TestPVDRMConnectionHasNoRegisters(t *testing.T) {
	agg, _ := newTestAggregator(t, 1)
	g := startPVDRM(t, agg, "vm", "pvdrm")
	c := pvdrmConn{g.b.VGPU()}
	if _, err := c.Read32(0, 0); !errors.Is(err, ErrNoRegisters) {
		t.Errorf("read: %v", err)
	}
	if err := c.Write32(1, 0x100, 1); !errors.Is(err, ErrNoRegisters) {
		t.Errorf("write: %v", err)
	}
	if d := g.b.VGPU().Counters().Denied; d != 2 {
		t.Errorf("denied %d, want 2", d)
	}
}
