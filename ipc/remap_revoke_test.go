package ipc

import (
	"errors"
	"os"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestRemapRevoke: a client that maps remapped pages is sent the entries
// in batches of at most MaxRevokeEntries, in order, sharing the epochs of
// RemapUpdate; RemapAcked reaches the last epoch once it handled them.
// Without the bit nothing is sent.
func TestRemapRevoke(t *testing.T) {
	ts := startServer(t, nil)
	c, _, s := dialTest(t, ts, "vm", TransportShm, nil)
	if _, err := s.sc.RevokeRemap([]uint32{1}); !errors.Is(err, ErrRemapNotOffered) {
		t.Fatalf("revoke to a client that did not ask: %v", err)
	}
	if c.HandleRemapRevoke(func([]uint32) error { return nil }) {
		t.Fatal("HandleRemapRevoke accepted before HandleRemap")
	}
	if !c.HandleRemap(func([]*os.File) error { return nil }) {
		t.Fatal("no remap updates offered")
	}
	if s.sc.RemapMapped() {
		t.Fatal("mapped before the client asked")
	}
	if _, err := s.sc.RevokeRemap([]uint32{1}); !errors.Is(err, ErrRemapNotOffered) {
		t.Fatalf("revoke to a client that does not map pages: %v", err)
	}
	var mu sync.Mutex
	var got [][]uint32
	if !c.HandleRemapRevoke(func(idx []uint32) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, slices.Clone(idx))
		return nil
	}) {
		t.Fatal("the shm server does not offer per-page revocation")
	}
	if !s.sc.RemapMapped() {
		t.Fatal("not mapped after HandleRemapRevoke")
	}
	if st, err := s.sc.UpdateRemap(updateCtx(t, 5*time.Second), nil); err != nil || st != RemapDone {
		t.Fatalf("update: %d %v", st, err)
	}
	idx := make([]uint32, MaxRevokeEntries+3)
	for i := range idx {
		idx[i] = uint32(i * 2)
	}
	last, err := s.sc.RevokeRemap(idx)
	if err != nil || last != 3 {
		t.Fatalf("revoke: last epoch %d, err %v; want 3 (after update 1)", last, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for s.sc.RemapAcked() < last {
		if time.Now().After(deadline) {
			t.Fatalf("acknowledged %d, want %d", s.sc.RemapAcked(), last)
		}
		time.Sleep(time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 || !slices.Equal(slices.Concat(got...), idx) || len(got[0]) != MaxRevokeEntries {
		t.Fatalf("client saw %d batches (%v), want 2 holding every entry in order", len(got), got)
	}
	checkHonest(t, c)
}

// TestRemapRevokeAckHostile: an acknowledgement out of order, or saying a
// revoke could not be done, is a violation that ends only that connection.
func TestRemapRevokeAckHostile(t *testing.T) {
	for _, tc := range []struct {
		name string
		acks [][]byte
		want string
	}{
		{"out of order", [][]byte{encodeRemapAck(2, RemapDone)}, "remap ack for update 2"},
		{"twice", [][]byte{encodeRemapAck(1, RemapDone), encodeRemapAck(1, RemapDone)}, "last acknowledged 1"},
		{"status 1", [][]byte{encodeRemapAck(1, RemapUnmapped)}, "revoke 1 with status 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, nil)
			c, _, s := dialTest(t, ts, "evil", TransportShm, nil)
			block := make(chan struct{})
			t.Cleanup(func() { close(block) })
			c.HandleRemap(func([]*os.File) error { return nil })
			c.HandleRemapRevoke(func([]uint32) error { <-block; return nil }) // the test answers
			if _, err := s.sc.RevokeRemap([]uint32{1, 2}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.sc.RevokeRemap([]uint32{3}); err != nil {
				t.Fatal(err)
			}
			for _, m := range tc.acks {
				if _, err := c.conn.Write(m); err != nil {
					t.Fatal(err)
				}
			}
			err := s.wait(t)
			if !errors.Is(err, ErrProtocolViolation) {
				t.Fatalf("Serve returned %v, want a violation", err)
			}
			wantErrContains(t, err, tc.want)
		})
	}
}

// TestRemapRevokeDecode: malformed RemapRevokes are refused.
func TestRemapRevokeDecode(t *testing.T) {
	good := encodeRemapRevoke(4, []uint32{7, 9})
	if e, idx, err := decodeRemapRevoke(good); err != nil || e != 4 || !slices.Equal(idx, []uint32{7, 9}) {
		t.Fatalf("decode: %d %v %v", e, idx, err)
	}
	bad := map[string][]byte{
		"short":    good[:18],
		"long":     append(slices.Clone(good), 0, 0, 0, 0),
		"count 0":  encodeRemapRevoke(4, nil),
		"reserved": func() []byte { b := slices.Clone(good); b[15] = 1; return b }(),
		"too many": encodeRemapRevoke(4, make([]uint32, MaxRevokeEntries+1)),
	}
	for name, b := range bad {
		if _, _, err := decodeRemapRevoke(b); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}
