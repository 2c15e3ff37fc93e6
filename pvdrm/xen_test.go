//go:build linux && (amd64 || arm64)

package pvdrm

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/xen"
	"github.com/gpuvm/gpuvm/xen/xenbus"
	"github.com/gpuvm/gpuvm/xen/xenstore"
	"github.com/gpuvm/gpuvm/xen/xenstore/xenstoretest"
	"golang.org/x/sys/unix"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// testDevice is front domain 5's pvdrm device 0, backed by dom0.
func testDevice() xenbus.Device {
	return xenbus.Device{Type: XenDeviceType, FrontDomid: 5, BackDomid: 0, DevID: 0}
}

// newTestDevice starts a test xenstored, creates the device as the
// toolstack does, and returns the store and a connection per end.
func newTestDevice(t *testing.T) (s *xenstoretest.Server, front, back *xenstore.Client) {
	t.Helper()
	s = xenstoretest.NewServer()
	if err := xenbus.CreateDevice(testCtx(t), s.Connect(t, 0), testDevice()); err != nil {
		t.Fatal(err)
	}
	return s, s.Connect(t, testDevice().FrontDomid), s.Connect(t, testDevice().BackDomid)
}

// TestXenNoDevices: without /dev/xen the transports fail at once, saying
// so plainly, before they touch xenstore.
func TestXenNoDevices(t *testing.T) {
	ctx := testCtx(t)
	xs := xenstoretest.NewServer().Connect(t, 0)
	dir := t.TempDir()
	check := func(what string, err error, dev string) {
		t.Helper()
		if !errors.Is(err, xen.ErrNoXen) || !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), dev) {
			t.Fatalf("%s: %v", what, err)
		}
		t.Logf("%s: %v", what, err)
	}
	_, err := NewXenFront(ctx, XenFrontConfig{Xenstore: xs, Domid: 5, DevDir: dir})
	check("front", err, filepath.Join(dir, "gntalloc"))
	_, err = NewXenBack(ctx, XenBackConfig{Xenstore: xs, Device: testDevice(), DevDir: dir})
	check("back", err, filepath.Join(dir, "gntdev"))

	if _, err := os.Stat("/dev/xen/gntalloc"); err == nil {
		t.Log("this machine has /dev/xen: the default directory is not checked")
		return
	}
	_, err = NewXenFront(ctx, XenFrontConfig{Xenstore: xs, Domid: 5})
	check("front in /dev/xen", err, "/dev/xen/gntalloc")
	_, err = NewXenBack(ctx, XenBackConfig{Xenstore: xs, Device: testDevice()})
	check("back in /dev/xen", err, "/dev/xen/gntdev")
}

func TestXenConfigChecked(t *testing.T) {
	ctx := testCtx(t)
	if _, err := NewXenFront(ctx, XenFrontConfig{}); err == nil {
		t.Fatal("no xenstore accepted")
	}
	if _, err := NewXenBack(ctx, XenBackConfig{}); err == nil {
		t.Fatal("no xenstore accepted")
	}
	xs := xenstoretest.NewServer().Connect(t, 5)
	for _, pages := range []int{-1, 3, 32} {
		if _, err := NewXenFront(ctx, XenFrontConfig{Xenstore: xs, Pages: pages}); err == nil {
			t.Fatalf("%d ring pages accepted", pages)
		}
	}
	for _, typ := range []string{"", "vbd"} {
		d := testDevice()
		d.Type = typ
		if _, err := NewXenBack(ctx, XenBackConfig{Xenstore: xs, Device: d}); err == nil || errors.Is(err, xen.ErrNoXen) {
			t.Fatalf("device type %q: %v", typ, err)
		}
	}
}

// fakeXenDir makes regular files where the Xen devices belong: they open,
// and every ioctl on them fails (ENOTTY), as on a broken Xen.
func fakeXenDir(t *testing.T, names ...string) string {
	dir := t.TempDir()
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func frontStates(s *xenstoretest.Server, dir string) string {
	var out []string
	for _, e := range s.StateLog() {
		if d, st, _ := strings.Cut(e, "="); d == dir {
			out = append(out, st)
		}
	}
	return strings.Join(out, ",")
}

// TestXenFrontFailureCloses: a front end that fails after the handshake
// began tells the back end (Closing, then Closed) and releases everything.
func TestXenFrontFailureCloses(t *testing.T) {
	s, front, back := newTestDevice(t)
	ctx := testCtx(t)
	if _, err := xenbus.StartBack(ctx, back, testDevice(), Version); err != nil {
		t.Fatal(err)
	}
	_, err := NewXenFront(ctx, XenFrontConfig{Xenstore: front, Domid: 5, DevDir: fakeXenDir(t, "gntalloc", "evtchn")})
	if !errors.Is(err, unix.ENOTTY) || !strings.Contains(err.Error(), "grant 1 pages to domain 0") {
		t.Fatalf("got %v", err)
	}
	if got := frontStates(s, testDevice().FrontendPath()); got != "1,1,5,6" {
		t.Fatalf("front states %s", got)
	}
}

// TestXenBackFailureCloses: a back end that cannot map the ring says so
// through xenbus, and the waiting front end learns it.
func TestXenBackFailureCloses(t *testing.T) {
	s, front, back := newTestDevice(t)
	ctx := testCtx(t)
	errc := make(chan error, 1)
	go func() {
		_, err := NewXenBack(ctx, XenBackConfig{Xenstore: back, Device: testDevice(), DevDir: fakeXenDir(t, "gntdev", "evtchn")})
		errc <- err
	}()
	f, err := xenbus.StartFront(ctx, front, testDevice(), Version)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Publish(ctx, []uint32{8}, 9); err != nil {
		t.Fatal(err)
	}
	if err := f.WaitConnected(ctx); !errors.Is(err, xenbus.ErrPeerClosed) {
		t.Fatalf("front end: %v", err)
	}
	if err := <-errc; !errors.Is(err, unix.ENOTTY) || !strings.Contains(err.Error(), "map 1 grants of domain 5") {
		t.Fatalf("back end: %v", err)
	}
	if got := frontStates(s, testDevice().BackendPath()); got != "1,2,5,6" {
		t.Fatalf("back states %s", got)
	}
}

func TestXenRingTail(t *testing.T) {
	for pages := 1; pages <= MaxRingPages; pages++ {
		mem := make([]byte, pages*xen.PageSize)
		if err := checkXenRingTail(mem); err != nil {
			t.Fatal(err)
		}
	}
	mem := make([]byte, xen.PageSize)
	mem[len(mem)-xenFrontAliveOff] = 1
	if !peerAlive(mem, xenFrontAliveOff) || peerAlive(mem, xenBackAliveOff) {
		t.Fatal("front liveness byte")
	}
	mem[len(mem)-xenBackAliveOff] = 1
	mem[len(mem)-xenFrontAliveOff] = 0
	if peerAlive(mem, xenFrontAliveOff) || !peerAlive(mem, xenBackAliveOff) {
		t.Fatal("back liveness byte")
	}
	// The ring never writes there.
	fr, err := NewFront(mem)
	if err != nil {
		t.Fatal(err)
	}
	req := make([]byte, SlotSize)
	for i := range req {
		req[i] = 0xAA
	}
	for fr.Free() > 0 {
		if _, err := fr.Push(req); err != nil {
			t.Fatal(err)
		}
	}
	if !peerAlive(mem, xenBackAliveOff) || mem[len(mem)-xenFrontAliveOff] != 0 {
		t.Fatal("the ring wrote into its tail")
	}
}

// TestXenClosedEnds: a closed (or never opened) end refuses to work and
// closes again quietly.
func TestXenClosedEnds(t *testing.T) {
	x := &XenFront{}
	if x.Ring() != nil || !x.PeerGone() || x.Notify() == nil || x.Wait(testCtx(t), time.Millisecond) == nil || x.Close() != nil {
		t.Fatal("a closed front end")
	}
	b := &XenBack{}
	if b.Ring() != nil || !b.PeerGone() || b.Notify() == nil || b.Close() != nil {
		t.Fatal("a closed back end")
	}
}
