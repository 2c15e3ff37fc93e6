package ipc

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestHandOffKeepsConnectionsWaiting: a device model that connects while
// the listener is handed off is neither refused nor lost: it waits in the
// socket's backlog and is accepted by the listener made from the handed
// socket (ListenFile), as a new daemon process would; the path is never
// unlinked. Resume on the old listener accepts again too.
func TestHandOffKeepsConnectionsWaiting(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agg.sock")
	l, err := Listen(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	f, err := l.HandOff()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the socket's path went with the handoff: %v", err)
	}
	dialed := make(chan error, 1)
	go func() {
		c, _, _, err := Dial(context.Background(), path, testHello("waits", TransportShm), testRAM(t, 1<<20), nil, nil)
		if err == nil {
			c.Close()
		}
		dialed <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	if p, err := l.Accept(ctx); err == nil {
		t.Fatalf("a handed-off listener accepted %q", p.Hello().Name)
	}
	cancel()
	select {
	case err := <-dialed:
		t.Fatalf("the device model did not wait for the new listener: %v", err)
	default:
	}

	l2, err := ListenFile(path, f, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := l2.Accept(ctx)
	if err != nil {
		t.Fatalf("the new listener: %v", err)
	}
	if p.Hello().Name != "waits" {
		t.Fatalf("accepted %q", p.Hello().Name)
	}
	sc, err := p.Accept(Welcome{VGPU: 1, VRAMSize: 1 << 30, Channels: 32}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	if err := <-dialed; err != nil {
		t.Fatalf("dial: %v", err)
	}
	l.Close() // the old listener's Close must not remove the new one's socket
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("closing the handed-off listener removed the socket: %v", err)
	}

	// A handoff that does not happen: Resume accepts again on the socket.
	f2, err := l2.HandOff()
	if err != nil {
		t.Fatal(err)
	}
	if err := l2.Resume(f2); err != nil {
		t.Fatal(err)
	}
	go func() {
		c, _, _, err := Dial(context.Background(), path, testHello("again", TransportShm), testRAM(t, 1<<20), nil, nil)
		if err == nil {
			c.Close()
		}
		dialed <- err
	}()
	p, err = l2.Accept(ctx)
	if err != nil || p.Hello().Name != "again" {
		t.Fatalf("after Resume: %v", err)
	}
	p.Reject("done")
	<-dialed
}
