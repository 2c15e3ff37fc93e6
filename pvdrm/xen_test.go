//go:build linux && (amd64 || arm64)

package pvdrm

import (
	"context"
	"encoding/binary"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestXenNoDevices: without /dev/xen the transports fail at once, saying
// so plainly, before they touch xenstore.
func TestXenNoDevices(t *testing.T) {
	ctx := testCtx(t)
	xs := newTestXenstored().connect(t, 0)
	dir := t.TempDir()
	check := func(what string, err error, dev string) {
		t.Helper()
		if !errors.Is(err, ErrNoXen) || !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), dev) {
			t.Fatalf("%s: %v", what, err)
		}
		t.Logf("%s: %v", what, err)
	}
	_, err := NewXenFront(ctx, XenFrontConfig{Xenstore: xs, Domid: 5, DevDir: dir})
	check("front", err, filepath.Join(dir, "gntalloc"))
	_, err = NewXenBack(ctx, XenBackConfig{Xenstore: xs, Device: testDevice(), DevDir: dir})
	check("back", err, filepath.Join(dir, "gntdev"))
	_, err = OpenGntalloc(dir)
	check("gntalloc", err, "gntalloc")
	_, err = OpenGntdev(dir)
	check("gntdev", err, "gntdev")
	_, err = openEvtchn(dir)
	check("evtchn", err, "evtchn")

	if _, err := os.Stat("/dev/xen/gntalloc"); err == nil {
		t.Log("this machine has /dev/xen: the default directory is not checked")
		return
	}
	_, err = NewXenFront(ctx, XenFrontConfig{Xenstore: xs, Domid: 5})
	check("front in /dev/xen", err, "/dev/xen/gntalloc")
	_, err = NewXenBack(ctx, XenBackConfig{Xenstore: xs, Device: testDevice()})
	check("back in /dev/xen", err, "/dev/xen/gntdev")
}

func TestOpenXenstoreWithoutXen(t *testing.T) {
	for _, p := range []string{XenstoredSocketPath, XenbusDevPath} {
		if _, err := os.Stat(p); err == nil {
			t.Skipf("%s exists here", p)
		}
	}
	_, err := OpenXenstore()
	if err == nil || !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), XenbusDevPath) || !strings.Contains(err.Error(), XenstoredSocketPath) {
		t.Fatalf("got %v", err)
	}
	t.Log(err)
}

func TestXenConfigChecked(t *testing.T) {
	ctx := testCtx(t)
	if _, err := NewXenFront(ctx, XenFrontConfig{}); err == nil {
		t.Fatal("no xenstore accepted")
	}
	if _, err := NewXenBack(ctx, XenBackConfig{}); err == nil {
		t.Fatal("no xenstore accepted")
	}
	xs := newTestXenstored().connect(t, 5)
	for _, pages := range []int{-1, 3, 32} {
		if _, err := NewXenFront(ctx, XenFrontConfig{Xenstore: xs, Pages: pages}); err == nil {
			t.Fatalf("%d ring pages accepted", pages)
		}
	}
	if checkGrantCount(0) == nil || checkGrantCount(MaxGrantPages+1) == nil || checkGrantCount(MaxGrantPages) != nil {
		t.Fatal("grant count bounds")
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

func frontStates(s *testXenstored, dir string) string {
	var out []string
	for _, e := range s.stateLog() {
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
	if _, err := StartXenbusBack(ctx, back, testDevice()); err != nil {
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
	f, err := StartXenbusFront(ctx, front, 5, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Publish(ctx, []uint32{8}, 9); err != nil {
		t.Fatal(err)
	}
	if err := f.WaitConnected(ctx); !errors.Is(err, ErrXenbusPeerClosed) {
		t.Fatalf("front end: %v", err)
	}
	if err := <-errc; !errors.Is(err, unix.ENOTTY) || !strings.Contains(err.Error(), "map 1 grants of domain 5") {
		t.Fatalf("back end: %v", err)
	}
	if got := frontStates(s, testDevice().BackendPath()); got != "1,2,5,6" {
		t.Fatalf("back states %s", got)
	}
}

func TestGrantHelpersCheckFirst(t *testing.T) {
	dir := fakeXenDir(t, "gntdev", "gntalloc")
	d, err := OpenGntdev(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.Map(5, []uint32{8, 1}, true); err == nil || !strings.Contains(err.Error(), "reserved") {
		t.Fatalf("reserved reference: %v", err)
	}
	if _, err := d.Map(DomidFirstReserved, []uint32{8}, true); err == nil {
		t.Fatal("reserved domain accepted")
	}
	if _, err := d.Map(5, make([]uint32, MaxGrantPages+1), true); err == nil {
		t.Fatal("too many references accepted")
	}
	a, err := OpenGntalloc(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := a.Share(0, 0, true); err == nil {
		t.Fatal("0 pages accepted")
	}
	if _, err := a.Share(0, 1, true); !errors.Is(err, unix.ENOTTY) {
		t.Fatalf("ioctl on a regular file: %v", err)
	}
	if a.Close() != nil || a.Close() != nil {
		t.Fatal("double close")
	}
}

func TestXenRingTail(t *testing.T) {
	for pages := 1; pages <= MaxRingPages; pages++ {
		mem := make([]byte, pages*pageSize)
		if err := checkXenRingTail(mem); err != nil {
			t.Fatal(err)
		}
	}
	mem := make([]byte, pageSize)
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

// TestEvtchnDrain plays the kernel's evtchn device with a socket: pending
// ports are read, and this end's port written back to unmask it.
func TestEvtchnDrain(t *testing.T) {
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(sp[1])
	e := &evtchn{fd: sp[0], port: 42}
	defer closeFd(&e.fd)
	ctx := testCtx(t)
	start := time.Now()
	if err := e.wait(ctx, 30*time.Millisecond); err != nil || time.Since(start) < 30*time.Millisecond {
		t.Fatalf("quiet wait: %v after %v", err, time.Since(start))
	}
	var ports [12]byte
	for i := range 3 {
		binary.NativeEndian.PutUint32(ports[4*i:], 42)
	}
	if _, err := unix.Write(sp[1], ports[:]); err != nil {
		t.Fatal(err)
	}
	if err := e.wait(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	var got [16]byte
	n, err := unix.Read(sp[1], got[:])
	if err != nil || n != 4 || binary.NativeEndian.Uint32(got[:]) != 42 {
		t.Fatalf("unmask: %d bytes %v, %v", n, got[:n], err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := e.wait(cctx, time.Second); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait: %v", err)
	}
	var closed *evtchn
	if closed.notify() == nil || closed.wait(ctx, time.Millisecond) == nil {
		t.Fatal("a closed channel works")
	}
	x := &XenFront{}
	if x.Ring() != nil || !x.PeerGone() || x.Notify() == nil || x.Close() != nil {
		t.Fatal("a closed front end")
	}
	if (&XenBack{}).Close() != nil || (&XenBack{}).Ring() != nil {
		t.Fatal("a closed back end")
	}
}
