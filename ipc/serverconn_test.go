package ipc

import (
	"errors"
	"testing"
	"time"
)

// TestServerEnd: the server ends a connection on its own initiative (the
// aggregator destroying a vGPU): Serve returns an *EndedError at once, and
// the client's next call fails with a ByeError carrying the reason, even
// when the client was idle when it happened.
func TestServerEnd(t *testing.T) {
	forTransports(t, func(t *testing.T, tr Transport) {
		ts := startServer(t, nil)
		c, _, s := dialTest(t, ts, "vm", tr, nil)
		checkHonest(t, c)
		start := time.Now()
		s.sc.End("vGPU 1 destroyed by the operator")
		err := s.wait(t)
		var ee *EndedError
		if !errors.As(err, &ee) || ee.Reason != "vGPU 1 destroyed by the operator" {
			t.Fatalf("Serve = %v, want an *EndedError with the reason", err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("Serve took %v to end", d)
		}
		_, err = c.Read32(0, 0)
		var bye *ByeError
		if !errors.As(err, &bye) || bye.Reason != "vGPU 1 destroyed by the operator" {
			t.Fatalf("client call after End = %v, want a ByeError with the reason", err)
		}
		s.sc.End("again") // after Serve returned: nothing
	})
}
