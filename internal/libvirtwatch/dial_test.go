package libvirtwatch

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
)

// hungLibvirtd is a libvirtd that accepts connections and answers the
// first `answer` calls of each (the handshake is two: the authentication
// list and the opening of the URI) and then never again. accepted gets
// each connection's side; the connection's end closes it.
type hungLibvirtd struct {
	socket   string
	accepted chan net.Conn
	closed   chan struct{} // one value per connection the client closed
}

func startHungLibvirtd(t *testing.T, answer int) *hungLibvirtd {
	t.Helper()
	h := &hungLibvirtd{socket: t.TempDir() + "/libvirt-sock", accepted: make(chan net.Conn, 16), closed: make(chan struct{}, 16)}
	ln, err := net.Listen("unix", h.socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
			h.accepted <- c
			go h.serve(c, answer)
		}
	}()
	return h
}

// serve answers the first n calls on c with an empty success (an empty
// list for the authentication list), reads the rest and never answers.
func (h *hungLibvirtd) serve(c net.Conn, n int) {
	defer func() { h.closed <- struct{}{} }()
	for {
		var length uint32
		if err := binary.Read(c, binary.BigEndian, &length); err != nil {
			return
		}
		pkt := make([]byte, length-4)
		if _, err := io.ReadFull(c, pkt); err != nil {
			return
		}
		if n == 0 {
			continue
		}
		n--
		// The call's header (program, version, procedure, type, serial,
		// status) as a reply (type 1, status 0), with a zero word: an
		// empty XDR list.
		reply := make([]byte, 4+24+4)
		binary.BigEndian.PutUint32(reply, uint32(len(reply)))
		copy(reply[4:], pkt[:24])
		binary.BigEndian.PutUint32(reply[4+12:], 1)
		binary.BigEndian.PutUint32(reply[4+20:], 0)
		if _, err := c.Write(reply); err != nil {
			return
		}
	}
}

// waitClosed waits for the client to close a connection of h.
func (h *hungLibvirtd) waitClosed(t *testing.T, what string) {
	t.Helper()
	select {
	case <-h.closed:
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: the connection to libvirtd is still open", what)
	}
}

// TestDialerHung: a libvirtd that accepts but never completes the
// handshake is given up after the handshake timeout, or when ctx ends,
// and its connection closed.
func TestDialerHung(t *testing.T) {
	h := startHungLibvirtd(t, 0)
	start := time.Now()
	_, err := dialer(h.socket, "test:///default", 200*time.Millisecond)(context.Background())
	if err == nil || !strings.Contains(err.Error(), "did not complete the handshake") || time.Since(start) > 5*time.Second {
		t.Errorf("dial of a libvirtd that does not answer: %v after %v; want the handshake timeout", err, time.Since(start))
	}
	h.waitClosed(t, "after the handshake timeout")

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start = time.Now()
	if _, err := Dialer(h.socket, "test:///default")(ctx); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Errorf("dial ended by its context: %v after %v", err, time.Since(start))
	}
	h.waitClosed(t, "after the dial's context ended")
}

// TestDisconnectHung: a libvirtd that stops answering after the handshake
// does not hold Disconnect, and Disconnect fails the call waiting for it.
func TestDisconnectHung(t *testing.T) {
	h := startHungLibvirtd(t, 2)
	c, err := Dialer(h.socket, "test:///default")(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	call := make(chan error, 1)
	go func() { _, err := c.DomainLookupByUUID(libvirt.UUID{}); call <- err }()
	select {
	case err := <-call:
		t.Fatalf("a call answered by a libvirtd that does not answer: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	start := time.Now()
	if err := c.Disconnect(); err == nil {
		t.Error("Disconnect of a libvirtd that does not answer: no error")
	}
	if d := time.Since(start); d > closeGrace+2*time.Second {
		t.Errorf("Disconnect took %v", d)
	}
	select {
	case err := <-call:
		if err == nil {
			t.Error("the waiting call succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the call waiting for libvirtd still waits after Disconnect")
	}
	h.waitClosed(t, "after Disconnect")
	if err2 := c.Disconnect(); err2 == nil {
		t.Error("a second Disconnect forgot the first's error")
	}
}

// TestWatcherHungLibvirtd: stopped while libvirtd does not answer, Run
// returns promptly (the connection's calls fail) and stops the device
// models; here the subscription to events never gets its answer.
func TestWatcherHungLibvirtd(t *testing.T) {
	h := startHungLibvirtd(t, 2)
	rec := &record{models: map[string]*fakeModel{}}
	w, err := New(Config{Dial: Dialer(h.socket, "test:///default"), Registry: rec, Launcher: rec})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	<-h.accepted
	time.Sleep(100 * time.Millisecond) // the subscription sent
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(closeGrace + 5*time.Second):
		t.Fatal("Run still runs after its context ended, with libvirtd not answering")
	}
	h.waitClosed(t, "after Run")
}
