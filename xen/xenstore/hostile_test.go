package xenstore

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

func TestReadMsgHostile(t *testing.T) {
	for _, tc := range []struct {
		name  string
		in    []byte
		proto bool  // want ErrProtocol
		is    error // else want this
	}{
		{"empty", nil, false, io.EOF},
		{"short header", []byte{2, 0, 0}, false, io.ErrUnexpectedEOF},
		{"len over max", rawHeader(MsgRead, 1, 0, PayloadMax+1), true, nil},
		{"len 4 GiB", rawHeader(MsgRead, 1, 0, 0xffffffff), true, nil},
		{"type count", rawHeader(msgTypeCount, 1, 0, 0), true, nil},
		{"removed XS_RESTRICT", rawHeader(msgRemovedRestrict, 1, 0, 0), true, nil},
		{"XS_INVALID", rawHeader(msgInvalid, 1, 0, 0), true, nil},
		{"truncated payload", append(rawHeader(MsgRead, 1, 0, 10), "abc"...), false, io.ErrUnexpectedEOF},
		{"no payload", rawHeader(MsgRead, 1, 0, 1), false, io.ErrUnexpectedEOF},
	} {
		_, err := ReadMsg(bytes.NewReader(tc.in))
		if tc.proto && !errors.Is(err, ErrProtocol) || !tc.proto && !errors.Is(err, tc.is) {
			t.Errorf("%s: got %v", tc.name, err)
		}
	}
	// The length is refused before anything else is read or allocated.
	r := io.MultiReader(bytes.NewReader(rawHeader(MsgRead, 1, 0, 1<<31)), failReader{t})
	if _, err := ReadMsg(r); !errors.Is(err, ErrProtocol) {
		t.Fatal(err)
	}
	m, err := ReadMsg(bytes.NewReader(append(rawHeader(MsgRead, 1, 0, PayloadMax), make([]byte, PayloadMax)...)))
	if err != nil || len(m.Payload) != PayloadMax {
		t.Fatalf("a payload of exactly the maximum: %v", err)
	}
}

type failReader struct{ t *testing.T }

func (f failReader) Read([]byte) (int, error) {
	f.t.Error("read past a refused header")
	return 0, io.EOF
}

// rawPeer is a hand-driven xenstore peer for hostile replies.
func rawPeer(t *testing.T) (*Client, net.Conn) {
	cli, srv := net.Pipe()
	xs := NewClient(cli)
	t.Cleanup(func() { xs.Close(); srv.Close() })
	return xs, srv
}

func TestHostilePeer(t *testing.T) {
	ctx := testCtx(t)
	reply := func(srv net.Conn, b []byte) Msg {
		req, err := ReadMsg(srv)
		if err != nil {
			t.Error(err)
		}
		if b != nil {
			_, _ = srv.Write(b)
		}
		return req
	}
	msg := func(m Msg) []byte { b, _ := m.Marshal(); return b }

	t.Run("oversized length ends the connection", func(t *testing.T) {
		xs, srv := rawPeer(t)
		go reply(srv, rawHeader(MsgRead, 1, 0, PayloadMax+1))
		if _, err := xs.Read(ctx, "/x"); !errors.Is(err, ErrProtocol) {
			t.Fatalf("got %v", err)
		}
		if _, err := xs.Read(ctx, "/x"); !errors.Is(err, ErrProtocol) {
			t.Fatalf("after: %v", err)
		}
	})
	t.Run("unknown type ends the connection", func(t *testing.T) {
		xs, srv := rawPeer(t)
		go reply(srv, rawHeader(99, 1, 0, 0))
		if _, err := xs.Read(ctx, "/x"); !errors.Is(err, ErrProtocol) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("truncated payload", func(t *testing.T) {
		xs, srv := rawPeer(t)
		go func() { reply(srv, append(rawHeader(MsgRead, 1, 0, 100), "short"...)); srv.Close() }()
		if _, err := xs.Read(ctx, "/x"); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("wrong reply type", func(t *testing.T) {
		xs, srv := rawPeer(t)
		go reply(srv, msg(Msg{Type: MsgWrite, ReqID: 1, Payload: []byte("OK\x00")}))
		if _, err := xs.Read(ctx, "/x"); !errors.Is(err, ErrProtocol) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("malformed error reply", func(t *testing.T) {
		xs, srv := rawPeer(t)
		go reply(srv, msg(Msg{Type: MsgError, ReqID: 1, Payload: []byte("no such thing, really\x00")}))
		if _, err := xs.Read(ctx, "/x"); !errors.Is(err, ErrProtocol) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("not OK", func(t *testing.T) {
		xs, srv := rawPeer(t)
		go reply(srv, msg(Msg{Type: MsgWrite, ReqID: 1, Payload: []byte("KO\x00")}))
		if err := xs.Write(ctx, "/x", "1"); !errors.Is(err, ErrProtocol) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("events and replies interleaved, out of order", func(t *testing.T) {
		xs, srv := rawPeer(t)
		go func() {
			w := reply(srv, nil) // the WATCH: its event comes before its reply
			tok := strings.Split(string(w.Payload), "\x00")[1]
			_, _ = srv.Write(msg(Msg{Type: MsgWatchEvent, Payload: []byte("/w\x00" + tok + "\x00")}))
			_, _ = srv.Write(msg(Msg{Type: MsgWatchEvent, Payload: []byte("/w\x00unknown-token\x00")}))
			_, _ = srv.Write(msg(Msg{Type: MsgWatchEvent, Payload: []byte("garbage")}))
			_, _ = srv.Write(msg(Msg{Type: MsgWatch, ReqID: w.ReqID, Payload: []byte("OK\x00")}))
			a, b := reply(srv, nil), reply(srv, nil) // two reads, answered in reverse
			_, _ = srv.Write(msg(Msg{Type: MsgRead, ReqID: b.ReqID, Payload: b.Payload[:2]}))
			_, _ = srv.Write(msg(Msg{Type: MsgRead, ReqID: 12345, Payload: []byte("stale")}))
			_, _ = srv.Write(msg(Msg{Type: MsgRead, ReqID: a.ReqID, Payload: a.Payload[:2]}))
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

// FuzzDecode feeds arbitrary bytes to the message reader and the
// payload parsers: nothing may panic, every length is bounded, and what
// decodes re-encodes to the same bytes.
func FuzzDecode(f *testing.F) {
	m := func(typ MsgType, p string) []byte {
		b, _ := (Msg{Type: typ, ReqID: 1, Payload: []byte(p)}).Marshal()
		return b
	}
	f.Add(m(MsgRead, "value"))
	f.Add(m(MsgError, "ENOENT\x00"))
	f.Add(m(MsgWatchEvent, "/local/domain/0/backend\x00gpuvm-1\x00"))
	f.Add(m(MsgDirectory, "a\x00b\x00"))
	f.Add(rawHeader(MsgRead, 1, 0, PayloadMax+1))
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		for {
			start := len(in) - r.Len()
			msg, err := ReadMsg(r)
			if err != nil {
				return
			}
			if len(msg.Payload) > PayloadMax || !msg.Type.valid() {
				t.Fatalf("decoded %v with %d bytes", msg.Type, len(msg.Payload))
			}
			b, err := msg.Marshal()
			if err != nil || !bytes.Equal(b, in[start:len(in)-r.Len()]) {
				t.Fatalf("re-encoding differs: %v", err)
			}
			_, _ = splitStrings(msg.Payload)
			_, _, _ = parseWatchEvent(msg.Payload)
			_, _ = oneString(msg.Payload)
			if name, err := parseError(msg.Payload); err == nil {
				_ = (&Error{Errno: name}).Error()
			}
			if s, err := oneString(msg.Payload); err == nil {
				_, _ = ParseUint(s, 1<<32-1)
				_ = checkPath(s)
			}
		}
	})
}
