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

// hangGuard is how long a test waits for something that must happen
// promptly before it calls it a hang. It is no performance threshold: the
// waits it guards sleep for far longer without the event.
const hangGuard = 10 * time.Second

// irqWaiter runs WaitIRQ(seen, timeout) in a goroutine.
func irqWaiter(c *Client, seen uint32, timeout time.Duration) <-chan irqResult {
	res := make(chan irqResult, 1)
	go func() {
		n, err := c.WaitIRQ(seen, timeout)
		res <- irqResult{n, err}
	}()
	return res
}

type irqResult struct {
	n   uint32
	err error
}

func recvIRQ(t *testing.T, res <-chan irqResult) irqResult {
	t.Helper()
	select {
	case r := <-res:
		return r
	case <-time.After(hangGuard):
		t.Fatal("WaitIRQ did not return")
	}
	return irqResult{}
}

// waitSleeping waits until a client thread announced it sleeps on the
// IRQ count, so that what follows tests the wake-up, not the re-check.
func waitSleeping(t *testing.T, c *Client) {
	t.Helper()
	for end := time.Now().Add(hangGuard); atomic.LoadUint32(c.ring.irqWaiters) == 0; {
		if time.Now().After(end) {
			t.Fatal("no IRQ sleeper")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestIRQ(t *testing.T) {
	ts := startServer(t, nil)
	c, _, s := dialTest(t, ts, "vm", TransportShm, nil)
	other, _, so := dialTest(t, ts, "other", TransportShm, nil)
	if !c.InterruptsOffered() || !s.sc.InterruptsOffered() {
		t.Fatal("shm connection offers no interrupts")
	}
	seen := c.IRQCount()

	// Nothing raised: the wait times out and reports the same count.
	if n, err := c.WaitIRQ(seen, time.Millisecond); n != seen || err != nil {
		t.Fatalf("WaitIRQ without an interrupt = %d, %v; want %d, nil", n, err, seen)
	}

	// A sleeper is woken by the interrupt, long before its timeout.
	res := irqWaiter(c, seen, time.Hour)
	waitSleeping(t, c)
	s.sc.Interrupt()
	if r := recvIRQ(t, res); r.err != nil || r.n != seen+1 {
		t.Fatalf("WaitIRQ = %d, %v; want %d, nil", r.n, r.err, seen+1)
	}

	// An interrupt raised before the wait is not lost.
	s.sc.Interrupt()
	if n, err := c.WaitIRQ(seen+1, time.Hour); n != seen+2 || err != nil {
		t.Fatalf("WaitIRQ after a raise = %d, %v; want %d, nil", n, err, seen+2)
	}
	if got := s.sc.Interrupts(); got != 2 {
		t.Fatalf("server raised %d interrupts, want 2", got)
	}

	// Per VM: the other connection saw none of it.
	if n := other.IRQCount(); n != 0 || so.sc.Interrupts() != 0 {
		t.Fatalf("other VM's count %d (server %d), want 0", n, so.sc.Interrupts())
	}
	checkHonest(t, c)
	checkHonest(t, other)
}

func TestIRQNotOffered(t *testing.T) {
	ts := startServer(t, nil)
	c, _, s := dialTest(t, ts, "vm", TransportSocket, nil)
	if c.InterruptsOffered() || s.sc.InterruptsOffered() {
		t.Fatal("socket connection offers interrupts")
	}
	s.sc.Interrupt() // nothing to raise: no effect, no panic
	if _, err := c.WaitIRQ(0, time.Hour); !errors.Is(err, ErrNoInterrupts) {
		t.Fatalf("WaitIRQ on the socket transport = %v, want ErrNoInterrupts", err)
	}
	checkHonest(t, c)

	// A server predating the feature leaves the header word 0: the client
	// sees no interrupts.
	l, err := newRingLayout(16, 16)
	if err != nil {
		t.Fatal(err)
	}
	r, fd, err := createRing(l)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	defer r.unmap()
	le.PutUint32(r.mem[ringHdrFeatures:], 0)
	if old := newRingMap(r.mem, l); old.irqCount != nil {
		t.Fatal("a ring without the feature bit maps an IRQ word")
	}
}

// TestIRQTeardown: a thread blocked on the interrupt returns promptly, with
// the connection's error, however the connection ends.
func TestIRQTeardown(t *testing.T) {
	cases := []struct {
		name string
		end  func(c *Client, s *served)
		want func(error) bool
	}{
		{"vGPU destroyed", func(_ *Client, s *served) { s.sc.End("vGPU 1 destroyed through the control API") },
			func(err error) bool { var be *ByeError; return errors.As(err, &be) }},
		{"server closes", func(_ *Client, s *served) { s.sc.Close() },
			func(err error) bool { return errors.Is(err, ErrPeerClosed) }},
		{"client closes", func(c *Client, _ *served) { c.Close() },
			func(err error) bool { return errors.Is(err, ErrClosed) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, nil)
			c, _, s := dialTest(t, ts, "vm", TransportShm, nil)
			seen := c.IRQCount()
			var res []<-chan irqResult
			for range 3 {
				res = append(res, irqWaiter(c, seen, time.Hour))
			}
			waitSleeping(t, c)
			tc.end(c, s)
			for _, ch := range res {
				if r := recvIRQ(t, ch); r.err == nil || !tc.want(r.err) {
					t.Fatalf("WaitIRQ = %d, %v", r.n, r.err)
				}
			}
			// And at once from then on.
			if _, err := c.WaitIRQ(seen, time.Hour); err == nil {
				t.Fatal("WaitIRQ on an ended connection succeeded")
			}
			s.sc.Interrupt() // after the end: no effect, no fault
			s.wait(t)
			s.sc.Interrupt() // after Close unmapped the ring
		})
	}
}

// TestIRQScribbler: a client rewriting its IRQ words hurts only itself.
// The server goes on raising (never blocking), another VM's count moves
// only with its own interrupts, and the honest VM's sleeper is woken.
func TestIRQScribbler(t *testing.T) {
	ts := startServer(t, nil)
	honest, _, hs := dialTest(t, ts, "honest", TransportShm, nil)
	evil, _, es := dialTest(t, ts, "evil", TransportShm, nil)
	r := evil.ring
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewSource(3))
		for !stop.Load() {
			atomic.StoreUint32(r.irqCount, rng.Uint32())
			atomic.StoreUint32(r.irqWaiters, rng.Uint32()%3)
			le.PutUint32(r.mem[ringHdrFeatures:], rng.Uint32())
		}
	}()
	const n = 20000
	for range n {
		es.sc.Interrupt()
	}
	seen := honest.IRQCount()
	res := irqWaiter(honest, seen, time.Hour)
	waitSleeping(t, honest)
	hs.sc.Interrupt()
	if got := recvIRQ(t, res); got.err != nil || got.n != seen+1 {
		t.Fatalf("honest WaitIRQ = %d, %v; want %d", got.n, got.err, seen+1)
	}
	stop.Store(true)
	wg.Wait()
	if es.sc.Interrupts() != n || hs.sc.Interrupts() != 1 || honest.IRQCount() != 1 {
		t.Fatalf("raised %d/%d, honest count %d", es.sc.Interrupts(), hs.sc.Interrupts(), honest.IRQCount())
	}
	checkHonest(t, honest)
	checkHonest(t, evil) // its requests still work: the words are only its own
}

// TestIRQFlood: interrupts raised as fast as possible while a waiter keeps
// waiting: it never misses the last one, and the server never blocks.
func TestIRQFlood(t *testing.T) {
	ts := startServer(t, nil)
	c, _, s := dialTest(t, ts, "vm", TransportShm, nil)
	const n = 50000
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range n {
			s.sc.Interrupt()
		}
	}()
	seen := uint32(0)
	for seen != n {
		got, err := c.WaitIRQ(seen, hangGuard)
		if err != nil {
			t.Fatal(err)
		}
		if got == seen {
			t.Fatalf("WaitIRQ timed out at %d of %d interrupts", seen, n)
		}
		seen = got
	}
	<-done
}

func TestIRQAllocs(t *testing.T) {
	ts := startServer(t, nil)
	c, _, s := dialTest(t, ts, "vm", TransportShm, nil)
	if a := testing.AllocsPerRun(1000, s.sc.Interrupt); a != 0 {
		t.Fatalf("Interrupt allocates %v times", a)
	}
	atomic.StoreUint32(c.ring.irqWaiters, 1) // take the wake path too
	if a := testing.AllocsPerRun(1000, s.sc.Interrupt); a != 0 {
		t.Fatalf("Interrupt with a sleeper allocates %v times", a)
	}
	atomic.StoreUint32(c.ring.irqWaiters, 0)
	if a := testing.AllocsPerRun(1000, func() {
		s.sc.Interrupt()
		c.WaitIRQ(c.IRQCount()-1, time.Hour)
		c.WaitIRQ(c.IRQCount(), 0)
	}); a != 0 {
		t.Fatalf("WaitIRQ allocates %v times", a)
	}
}
