package ipc

import (
	"errors"
	"math/rand"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// waitClientErr waits until the client noticed the connection's end.
func waitClientErr(t *testing.T, c *Client) error {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if err := c.Err(); err != nil {
			return err
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("client did not notice the end of its connection")
	return nil
}

// TestHostileRing writes garbage straight into the shared ring memory: each
// case must end only that connection, with a descriptive error on both
// sides, while an honest connection keeps working.
func TestHostileRing(t *testing.T) {
	ts := startServer(t, &ListenOptions{Spin: 100})
	honest, _, _ := dialTest(t, ts, "honest", TransportShm, nil)

	publish := func(c *Client, entries ...[]byte) {
		r := c.ring
		for _, e := range entries {
			copy(r.reqSlot(c.reqProd), e)
			c.reqProd++
		}
		atomic.StoreUint32(r.reqProd, c.reqProd)
		wakeOn(r.serverWait, waitReq)
	}
	entry := func(req request) []byte {
		b := make([]byte, EntrySize)
		encodeRequest(b, &req)
		return b
	}
	cases := []struct {
		name string
		evil func(c *Client)
		want string
	}{
		{"producer far ahead", func(c *Client) {
			atomic.StoreUint32(c.ring.reqProd, c.ring.l.reqN+1)
			wakeOn(c.ring.serverWait, waitReq)
		}, "producer index 257 is 257 entries past consumer index 0"},
		{"producer behind consumer", func(c *Client) {
			publish(c, entry(request{kind: kindWrite32, off: 0}))
			time.Sleep(20 * time.Millisecond)
			atomic.StoreUint32(c.ring.reqProd, 0)
			wakeOn(c.ring.serverWait, waitReq)
		}, "entries past consumer index 1"},
		{"garbage entry", func(c *Client) {
			b := make([]byte, EntrySize)
			rand.New(rand.NewSource(1)).Read(b)
			publish(c, b)
		}, "unknown request kind"},
		{"bad BAR", func(c *Client) { publish(c, entry(request{kind: kindRead32, bar: 2})) }, "bad BAR 2"},
		{"beyond BAR", func(c *Client) { publish(c, entry(request{kind: kindWrite32, bar: 3, off: 64 << 20})) }, "beyond BAR size"},
		{"unaligned", func(c *Client) { publish(c, entry(request{kind: kindWrite32, bar: 1, off: 6})) }, "not 4-byte aligned"},
		{"bad entry after good ones", func(c *Client) {
			publish(c, entry(request{kind: kindWrite32, off: 4, value: 1}), entry(request{kind: kindCall, op: 1, nargs: 1}),
				entry(request{kind: 0x7777}))
		}, "request 2: unknown request kind"},
		{"bogus response consumer", func(c *Client) {
			atomic.StoreUint32(c.ring.rspCons, 1000)
			publish(c, entry(request{kind: kindRead32}))
		}, "response ring: consumer index 1000"},
		{"data on the socket", func(c *Client) { c.conn.Write([]byte("hello?")) }, "unexpected 6-byte message on the socket"},
		{"fd on the socket", func(c *Client) {
			c.conn.WriteMsgUnix([]byte{1}, unix.UnixRights(int(testRAM(t, 4096).Fd())), nil)
		}, "unexpected 1-byte message"},
	}
	for _, cs := range cases {
		t.Run(cs.name, func(t *testing.T) {
			c, _, s := dialTest(t, ts, "evil", TransportShm, &DialOptions{Spin: 10})
			c.mu.Lock() // the test owns the ring now
			cs.evil(c)
			c.mu.Unlock()
			err := s.wait(t)
			if !errors.Is(err, ErrProtocolViolation) {
				t.Fatalf("Serve = %v, want a protocol violation", err)
			}
			wantErrContains(t, err, cs.want)
			cerr := waitClientErr(t, c)
			var be *ByeError
			if !errors.As(cerr, &be) {
				t.Fatalf("client error %v, want a Bye", cerr)
			}
			wantErrContains(t, cerr, cs.want)
			if _, err := c.Read32(0, 0); err == nil {
				t.Fatal("read on a closed connection succeeded")
			}
			checkHonest(t, honest)
		})
	}
}

// TestHostileScribbler rewrites request entries and the server's wait word
// while the server works on them (time-of-check/time-of-use): the server must
// never act on an entry it did not validate, never panic, and stop cleanly.
func TestHostileScribbler(t *testing.T) {
	ts := startServer(t, &ListenOptions{Spin: 10})
	honest, _, _ := dialTest(t, ts, "honest", TransportShm, nil)
	c, _, s := dialTest(t, ts, "evil", TransportShm, nil)
	r := c.ring
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewSource(2))
		for !stop.Load() {
			// Flip valid entries between a good write and a bad BAR.
			i := uint32(rng.Intn(int(r.l.reqN)))
			slot := r.reqSlot(i)
			if rng.Intn(2) == 0 {
				le.PutUint16(slot[2:], 2)
			} else {
				le.PutUint16(slot[2:], 0)
			}
			atomic.StoreUint32(r.serverWait, uint32(rng.Intn(4)))
		}
	}()
	// Publish valid writes; the scribbler corrupts some after publication.
	for i := 0; i < 100000; i++ {
		if c.Write32(0, 0x10, uint32(i)) != nil {
			break
		}
	}
	checkHonest(t, honest)
	stop.Store(true)
	wg.Wait()
	c.Close() // in case the server has not noticed anything yet
	err := s.wait(t)
	if err == nil {
		t.Fatal("Serve returned nil")
	}
	if errors.Is(err, ErrProtocolViolation) {
		wantErrContains(t, err, "bad BAR 2")
	} else if !errors.Is(err, ErrPeerClosed) {
		t.Fatalf("Serve = %v", err)
	}
	// Every write the handler executed was a validated one.
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	for k := range s.h.m {
		if k != [2]uint64{0, 0x10} {
			t.Fatalf("handler saw an access to BAR%d+%#x", k[0], k[1])
		}
	}
	checkHonest(t, honest)
}

// TestHostileFlood: a client that posts requests as fast as it can and never
// consumes responses stalls only its own connection; Serve still ends when
// it goes away.
func TestHostileFlood(t *testing.T) {
	ts := startServer(t, &ListenOptions{Spin: 10, RequestEntries: 16, ResponseEntries: 2})
	honest, _, _ := dialTest(t, ts, "honest", TransportShm, nil)
	c, _, s := dialTest(t, ts, "flood", TransportShm, nil)
	r := c.ring
	req := make([]byte, EntrySize)
	encodeRequest(req, &request{kind: kindRead32})
	prod := uint32(0)
	deadline := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(deadline) {
		cons := atomic.LoadUint32(r.reqCons)
		for prod-cons < r.l.reqN {
			copy(r.reqSlot(prod), req)
			prod++
		}
		atomic.StoreUint32(r.reqProd, prod)
		wakeOn(r.serverWait, waitReq)
	}
	if atomic.LoadUint32(r.rspProd) != 2 {
		t.Fatalf("server produced %d responses into a 2-entry ring", atomic.LoadUint32(r.rspProd))
	}
	checkHonest(t, honest)
	start := time.Now()
	c.Close()
	if err := s.wait(t); !errors.Is(err, ErrPeerClosed) {
		t.Fatalf("Serve = %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Serve took %v to notice the hang-up", d)
	}
	checkHonest(t, honest)
}
