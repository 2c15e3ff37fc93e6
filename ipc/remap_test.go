package ipc

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"
)

// remapFiles makes the two files of a remap update (any memfds will do for
// the protocol).
func remapFiles(t *testing.T) []*os.File {
	t.Helper()
	return []*os.File{testRAM(t, 1<<20), testRAM(t, 2<<20)}
}

func updateCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestRemapUpdate: a client that handles remap updates is asked to revoke,
// then to map two files; it sees them in order with the right files and
// the server gets each acknowledgement; a handler error is acknowledged as
// RemapUnmapped; MMIO goes on meanwhile.
func TestRemapUpdate(t *testing.T) {
	ts := startServer(t, nil)
	c, _, s := dialTest(t, ts, "vm", TransportShm, nil)
	if s.sc.RemapOffered() {
		t.Fatal("offered before the client asked")
	}
	if _, err := s.sc.UpdateRemap(updateCtx(t, time.Second), nil); !errors.Is(err, ErrRemapNotOffered) {
		t.Fatalf("update to a client that did not ask: %v", err)
	}
	var calls atomic.Int32
	var sizes [2]atomic.Int64 // the handshake through the socket is invisible to the race detector
	fail := atomic.Bool{}
	if !c.HandleRemap(func(files []*os.File) error {
		calls.Add(1)
		for i, f := range files {
			st, err := f.Stat()
			if err != nil {
				return err
			}
			sizes[i].Store(st.Size())
		}
		if fail.Load() {
			return errors.New("refused")
		}
		return nil
	}) {
		t.Fatal("the shm server does not offer remap updates")
	}
	if !s.sc.RemapOffered() {
		t.Fatal("not offered after HandleRemap")
	}
	st, err := s.sc.UpdateRemap(updateCtx(t, 5*time.Second), nil)
	if err != nil || st != RemapDone || calls.Load() != 1 {
		t.Fatalf("revoke: status %d, err %v, %d calls", st, err, calls.Load())
	}
	st, err = s.sc.UpdateRemap(updateCtx(t, 5*time.Second), remapFiles(t))
	if err != nil || st != RemapDone || calls.Load() != 2 || sizes[0].Load() != 1<<20 || sizes[1].Load() != 2<<20 {
		t.Fatalf("rebind: status %d, err %v, %d calls, sizes %d %d", st, err, calls.Load(), sizes[0].Load(), sizes[1].Load())
	}
	fail.Store(true)
	st, err = s.sc.UpdateRemap(updateCtx(t, 5*time.Second), remapFiles(t))
	if err != nil || st != RemapUnmapped {
		t.Fatalf("refused rebind: status %d, err %v", st, err)
	}
	checkHonest(t, c)
}

// TestRemapUpdateNoAck: a client whose handler does not return in time
// makes UpdateRemap give up at its deadline; its late acknowledgement is
// ignored (the connection lives on) and the next update is answered.
func TestRemapUpdateNoAck(t *testing.T) {
	ts := startServer(t, nil)
	c, _, s := dialTest(t, ts, "slow", TransportShm, nil)
	release := make(chan struct{})
	var n atomic.Int32
	c.HandleRemap(func([]*os.File) error {
		if n.Add(1) == 1 {
			<-release
		}
		return nil
	})
	t0 := time.Now()
	if _, err := s.sc.UpdateRemap(updateCtx(t, 200*time.Millisecond), nil); !errors.Is(err, ErrRemapNoAck) {
		t.Fatalf("unanswered update: %v", err)
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Fatalf("UpdateRemap waited %v past a 200 ms deadline", d)
	}
	close(release)
	st, err := s.sc.UpdateRemap(updateCtx(t, 5*time.Second), nil)
	if err != nil || st != RemapDone {
		t.Fatalf("update after a late ack: status %d, err %v", st, err)
	}
	checkHonest(t, c)
	// One late ack per update given up on; a second one is a flood.
	if _, err := c.conn.Write(encodeRemapAck(1, RemapDone)); err != nil {
		t.Fatal(err)
	}
	if err := s.wait(t); !errors.Is(err, ErrProtocolViolation) {
		t.Fatalf("a repeated ack: Serve returned %v, want a violation", err)
	}
}

// TestRemapAckHostile: acknowledgements the server never asked for, or
// malformed ones, are protocol violations that end only that connection.
func TestRemapAckHostile(t *testing.T) {
	for _, tc := range []struct {
		name string
		msg  []byte
		want string
	}{
		{"unsolicited", encodeRemapAck(1, RemapDone), "remap ack for update 1, last sent 0"},
		{"bad status", encodeRemapAck(1, 7), "status 7"},
		{"short", encodeRemapAck(1, 0)[:12], "12 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, nil)
			c, _, s := dialTest(t, ts, "evil", TransportShm, nil)
			if _, err := c.conn.Write(tc.msg); err != nil {
				t.Fatal(err)
			}
			err := s.wait(t)
			if !errors.Is(err, ErrProtocolViolation) {
				t.Fatalf("Serve returned %v, want a violation", err)
			}
			wantErrContains(t, err, tc.want)
		})
	}
}

// TestRemapNotOfferedOnSocket: the socket transport has no remap updates.
func TestRemapNotOfferedOnSocket(t *testing.T) {
	ts := startServer(t, nil)
	c, _, s := dialTest(t, ts, "sock", TransportSocket, nil)
	if c.HandleRemap(func([]*os.File) error { return nil }) {
		t.Fatal("HandleRemap accepted on the socket transport")
	}
	if _, err := s.sc.UpdateRemap(updateCtx(t, time.Second), nil); !errors.Is(err, ErrRemapNotOffered) {
		t.Fatalf("update on the socket transport: %v", err)
	}
}
