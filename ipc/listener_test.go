package ipc

import (
	"net"
	"os"
	"strings"
	"testing"
)

func wantDialable(t *testing.T, network, path string) {
	t.Helper()
	c, err := net.Dial(network, path)
	if err != nil {
		t.Fatalf("%s socket %s: %v", network, path, err)
	}
	c.Close()
}

// TestListenStream: the control socket is created and owned as the device
// socket is. A second server at the same path is refused and leaves the
// first one's socket in place (a second `gpuvm serve` with another device
// socket but the same control socket used to delete the first daemon's);
// a socket of the other kind is not taken for a stale one; a stale socket
// is replaced; a server removes only its own socket when it closes.
func TestListenStream(t *testing.T) {
	dir := t.TempDir()
	ctl := dir + "/ctl.sock"
	l1, err := ListenStream(ctl)
	if err != nil {
		t.Fatal(err)
	}
	accept := func(l net.Listener) {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}
	go accept(l1)
	if fi, err := os.Stat(ctl); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("control socket mode %v, %v; want 0600", fi.Mode(), err)
	}
	wantDialable(t, "unix", ctl)

	_, err = ListenStream(ctl)
	if err == nil || !strings.Contains(err.Error(), "another server is listening there") {
		t.Fatalf("second ListenStream on a live socket: %v", err)
	}
	if _, err := Listen(ctl, nil); err == nil {
		t.Fatal("a device-socket Listen took over a live control socket")
	}
	wantDialable(t, "unix", ctl)

	// A device socket given as a control socket is neither live for a
	// stream dial nor stale: it is left alone.
	dev := dir + "/dev.sock"
	dl, err := Listen(dev, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dl.Close()
	if _, err := ListenStream(dev); err == nil || !strings.Contains(err.Error(), "cannot be told stale") {
		t.Fatalf("ListenStream over a live device socket: %v", err)
	}
	wantDialable(t, "unixpacket", dev)

	// If the first server's socket file is removed and a second server
	// listens at the path, the first, closing, leaves the second's alone.
	if err := os.Remove(ctl); err != nil {
		t.Fatal(err)
	}
	l2, err := ListenStream(ctl)
	if err != nil {
		t.Fatalf("ListenStream after the first socket was removed: %v", err)
	}
	if err := l1.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(ctl); err != nil {
		t.Fatalf("closing the first listener removed the second's socket: %v", err)
	}
	if err := l2.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(ctl); !os.IsNotExist(err) {
		t.Fatalf("socket not removed on close: %v", err)
	}

	// A stale control socket (listener gone without unlinking) is replaced.
	l3, err := ListenStream(ctl)
	if err != nil {
		t.Fatal(err)
	}
	l3.(*streamListener).UnixListener.Close()
	l4, err := ListenStream(ctl)
	if err != nil {
		t.Fatalf("ListenStream over a stale socket: %v", err)
	}
	wantDialable(t, "unix", ctl)
	l4.Close()

	reg := dir + "/file"
	os.WriteFile(reg, nil, 0o600)
	if _, err := ListenStream(reg); err == nil {
		t.Fatal("ListenStream replaced a regular file")
	}
}
