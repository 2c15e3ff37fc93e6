package pvdrm

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

func TestReadXsMsgHostile(t *testing.T) {
	for _, tc := range []struct {
		name  string
		in    []byte
		proto bool  // want ErrXenstoreProtocol
		is    error // else want this
	}{
		{"empty", nil, false, io.EOF},
		{"short header", []byte{2, 0, 0}, false, io.ErrUnexpectedEOF},
		{"len over max", rawXsHeader(xsRead, 1, 0, XenstorePayloadMax+1), true, nil},
		{"len 4 GiB", rawXsHeader(xsRead, 1, 0, 0xffffffff), true, nil},
		{"type count", rawXsHeader(xsTypeCount, 1, 0, 0), true, nil},
		{"removed XS_RESTRICT", rawXsHeader(xsRemovedRestrict, 1, 0, 0), true, nil},
		{"XS_INVALID", rawXsHeader(xsInvalid, 1, 0, 0), true, nil},
		{"truncated payload", append(rawXsHeader(xsRead, 1, 0, 10), "abc"...), false, io.ErrUnexpectedEOF},
		{"no payload", rawXsHeader(xsRead, 1, 0, 1), false, io.ErrUnexpectedEOF},
	} {
		_, err := readXsMsg(bytes.NewReader(tc.in))
		if tc.proto && !errors.Is(err, ErrXenstoreProtocol) || !tc.proto && !errors.Is(err, tc.is) {
			t.Errorf("%s: got %v", tc.name, err)
		}
	}
	// The length is refused before anything else is read or allocated.
	r := io.MultiReader(bytes.NewReader(rawXsHeader(xsRead, 1, 0, 1<<31)), failReader{t})
	if _, err := readXsMsg(r); !errors.Is(err, ErrXenstoreProtocol) {
		t.Fatal(err)
	}
	m, err := readXsMsg(bytes.NewReader(append(rawXsHeader(xsRead, 1, 0, XenstorePayloadMax), make([]byte, XenstorePayloadMax)...)))
	if err != nil || len(m.Payload) != XenstorePayloadMax {
		t.Fatalf("a payload of exactly the maximum: %v", err)
	}
}

type failReader struct{ t *testing.T }

func (f failReader) Read([]byte) (int, error) {
	f.t.Error("read past a refused header")
	return 0, io.EOF
}

// rawPeer is a hand-driven xenstore peer for hostile replies.
func rawPeer(t *testing.T) (*Xenstore, net.Conn) {
	cli, srv := net.Pipe()
	xs := NewXenstore(cli)
	t.Cleanup(func() { xs.Close(); srv.Close() })
	return xs, srv
}

func TestXenstoreHostilePeer(t *testing.T) {
	ctx := testCtx(t)
	reply := func(srv net.Conn, b []byte) xsMsg {
		req, err := readXsMsg(srv)
		if err != nil {
			t.Error(err)
		}
		if b != nil {
			_, _ = srv.Write(b)
		}
		return req
	}
	msg := func(m xsMsg) []byte { b, _ := m.marshal(); return b }

	t.Run("oversized length ends the connection", func(t *testing.T) {
		xs, srv := rawPeer(t)
		go reply(srv, rawXsHeader(xsRead, 1, 0, XenstorePayloadMax+1))
		if _, err := xs.Read(ctx, "/x"); !errors.Is(err, ErrXenstoreProtocol) {
			t.Fatalf("got %v", err)
		}
		if _, err := xs.Read(ctx, "/x"); !errors.Is(err, ErrXenstoreProtocol) {
			t.Fatalf("after: %v", err)
		}
	})
	t.Run("unknown type ends the connection", func(t *testing.T) {
		xs, srv := rawPeer(t)
		go reply(srv, rawXsHeader(99, 1, 0, 0))
		if _, err := xs.Read(ctx, "/x"); !errors.Is(err, ErrXenstoreProtocol) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("truncated payload", func(t *testing.T) {
		xs, srv := rawPeer(t)
		go func() { reply(srv, append(rawXsHeader(xsRead, 1, 0, 100), "short"...)); srv.Close() }()
		if _, err := xs.Read(ctx, "/x"); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("wrong reply type", func(t *testing.T) {
		xs, srv := rawPeer(t)
		go reply(srv, msg(xsMsg{Type: xsWrite, ReqID: 1, Payload: []byte("OK\x00")}))
		if _, err := xs.Read(ctx, "/x"); !errors.Is(err, ErrXenstoreProtocol) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("malformed error reply", func(t *testing.T) {
		xs, srv := rawPeer(t)
		go reply(srv, msg(xsMsg{Type: xsError, ReqID: 1, Payload: []byte("no such thing, really\x00")}))
		if _, err := xs.Read(ctx, "/x"); !errors.Is(err, ErrXenstoreProtocol) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("not OK", func(t *testing.T) {
		xs, srv := rawPeer(t)
		go reply(srv, msg(xsMsg{Type: xsWrite, ReqID: 1, Payload: []byte("KO\x00")}))
		if err := xs.Write(ctx, "/x", "1"); !errors.Is(err, ErrXenstoreProtocol) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("events and replies interleaved, out of order", func(t *testing.T) {
		xs, srv := rawPeer(t)
		go func() {
			w := reply(srv, nil) // the WATCH: its event comes before its reply
			tok := strings.Split(string(w.Payload), "\x00")[1]
			_, _ = srv.Write(msg(xsMsg{Type: xsWatchEvent, Payload: []byte("/w\x00" + tok + "\x00")}))
			_, _ = srv.Write(msg(xsMsg{Type: xsWatchEvent, Payload: []byte("/w\x00unknown-token\x00")}))
			_, _ = srv.Write(msg(xsMsg{Type: xsWatchEvent, Payload: []byte("garbage")}))
			_, _ = srv.Write(msg(xsMsg{Type: xsWatch, ReqID: w.ReqID, Payload: []byte("OK\x00")}))
			a, b := reply(srv, nil), reply(srv, nil) // two reads, answered in reverse
			_, _ = srv.Write(msg(xsMsg{Type: xsRead, ReqID: b.ReqID, Payload: b.Payload[:2]}))
			_, _ = srv.Write(msg(xsMsg{Type: xsRead, ReqID: 12345, Payload: []byte("stale")}))
			_, _ = srv.Write(msg(xsMsg{Type: xsRead, ReqID: a.ReqID, Payload: a.Payload[:2]}))
		}()
		w, err := xs.Watch(ctx, "/w")
		if err != nil {
			t.Fatal(err)
		}
		if p := <-w.Events(); p != "/w" {
			t.Fatalf("event %q", p)
		}
		// The requests are sent in turn (net.Pipe has no buffer) and
		// answered in reverse.
		da, db := make(chan string, 1), make(chan string, 1)
		go func() { v, _ := xs.Read(ctx, "/a"); da <- v }()
		time.Sleep(10 * time.Millisecond)
		go func() { v, _ := xs.Read(ctx, "/b"); db <- v }()
		if a, b := <-da, <-db; a != "/a" || b != "/b" {
			t.Fatalf("replies %q and %q crossed", a, b)
		}
	})
	t.Run("context ends a request nobody answers", func(t *testing.T) {
		xs, srv := rawPeer(t)
		go reply(srv, nil)
		short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		if _, err := xs.Read(short, "/x"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("got %v", err)
		}
	})
}

// FuzzXenstoreDecode feeds arbitrary bytes to the message reader and the
// payload parsers: nothing may panic, every length is bounded, and what
// decodes re-encodes to the same bytes.
func FuzzXenstoreDecode(f *testing.F) {
	m := func(typ xsType, p string) []byte {
		b, _ := (xsMsg{Type: typ, ReqID: 1, Payload: []byte(p)}).marshal()
		return b
	}
	f.Add(m(xsRead, "value"))
	f.Add(m(xsError, "ENOENT\x00"))
	f.Add(m(xsWatchEvent, "/local/domain/0/backend\x00pvdrm-1\x00"))
	f.Add(m(xsDirectory, "a\x00b\x00"))
	f.Add(rawXsHeader(xsRead, 1, 0, XenstorePayloadMax+1))
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		for {
			start := len(in) - r.Len()
			msg, err := readXsMsg(r)
			if err != nil {
				return
			}
			if len(msg.Payload) > XenstorePayloadMax || !msg.Type.valid() {
				t.Fatalf("decoded %v with %d bytes", msg.Type, len(msg.Payload))
			}
			b, err := msg.marshal()
			if err != nil || !bytes.Equal(b, in[start:len(in)-r.Len()]) {
				t.Fatalf("re-encoding differs: %v", err)
			}
			_, _ = xsStrings(msg.Payload)
			_, _, _ = parseWatchEvent(msg.Payload)
			_, _ = xsOneString(msg.Payload)
			if name, err := parseXsError(msg.Payload); err == nil {
				_ = (&XenstoreError{Errno: name}).Error()
			}
			if s, err := xsOneString(msg.Payload); err == nil {
				_, _ = parseXsUint(s, 1<<32-1)
				_ = checkXsPath(s)
			}
		}
	})
}
