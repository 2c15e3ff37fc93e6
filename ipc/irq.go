// Virtual interrupts on the shared-memory transport: the server counts a
// connection's interrupts in a word of the ring memory and wakes the
// client's threads sleeping on it (docs/protocol.md §6.6).

package ipc

import (
	"errors"
	"sync/atomic"
	"time"
)

// RingFeatureIRQ is the ring header's feature bit for virtual interrupts:
// the server counts the connection's interrupts in the ring's IRQ count
// word and wakes the sleepers the IRQ waiters word announces.
const RingFeatureIRQ = 1

// serverRingFeatures are the features this package's server offers on
// every shm ring (RingFeatureRemap: remap.go; RingFeatureRemapMapped:
// remap_revoke.go; RingFeatureReqDone: replay.go).
const serverRingFeatures = RingFeatureIRQ | RingFeatureRemap | RingFeatureRemapMapped | RingFeatureReqDone

// ErrNoInterrupts is returned by Client.WaitIRQ on a connection whose
// server raises no virtual interrupts: the socket transport, or a server
// that predates them. The driver then polls.
var ErrNoInterrupts = errors.New("ipc: the connection has no virtual interrupts")

// Interrupt raises the connection's virtual interrupt: it increments the
// IRQ count in the ring memory and, if a client thread announced it
// sleeps on it, wakes it. It never blocks (it may run under the
// dispatcher's lock), allocates nothing, and does nothing on the socket
// transport or after Close.
//
// The count is the client's to read: the server never reads it back for
// anything (it only adds to it), so a client that rewrites it fools only
// itself. The waiters word it does read decides only whether this
// connection's word gets a FUTEX_WAKE: a client that lies there gets
// spurious wake-ups or sleeps until its own timeout.
func (s *ServerConn) Interrupt() {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.ring
	if r == nil || s.unmapped || r.irqCount == nil {
		return
	}
	s.irqs++
	atomic.AddUint32(r.irqCount, 1)
	if atomic.LoadUint32(r.irqWaiters) != 0 {
		futexWakeWord(r.irqCount)
	}
}

// InterruptsOffered reports whether Interrupt reaches the client: the shm
// transport, whose ring offers RingFeatureIRQ.
func (s *ServerConn) InterruptsOffered() bool { return s.ring != nil && s.ring.irqCount != nil }

// Interrupts returns how many interrupts the server raised on the
// connection (for tests and counters; the client's count may differ if it
// rewrote it).
func (s *ServerConn) Interrupts() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.irqs
}

// InterruptsOffered reports whether the server raises virtual interrupts
// on this connection (the shm transport with a server that offers them).
// Without them WaitIRQ fails with ErrNoInterrupts and the driver polls.
func (c *Client) InterruptsOffered() bool {
	c.irqMu.RLock()
	defer c.irqMu.RUnlock()
	return c.ring != nil && c.ring.irqCount != nil
}

// IRQCount returns the number of virtual interrupts raised so far (a
// wrapping counter; compare for equality only), 0 without interrupts. Take
// it before checking what an interrupt announces, then WaitIRQ with it, so
// that an interrupt in between is not lost.
func (c *Client) IRQCount() uint32 {
	c.irqMu.RLock()
	defer c.irqMu.RUnlock()
	if r := c.ring; r != nil && r.irqCount != nil {
		return atomic.LoadUint32(r.irqCount)
	}
	return 0
}

// WaitIRQ sleeps until the IRQ count differs from seen or timeout passed,
// and returns the count (seen itself after a timeout). It returns at once
// with the connection's error once the connection ended (the server's Bye
// or death, Close: a sleeper is woken), and with ErrNoInterrupts when the
// connection has none. Any number of goroutines may wait at once; none
// holds up requests. It allocates nothing.
func (c *Client) WaitIRQ(seen uint32, timeout time.Duration) (uint32, error) {
	c.irqMu.RLock()
	defer c.irqMu.RUnlock()
	if c.dead.Load() {
		return seen, c.Err()
	}
	r := c.ring
	if r == nil || r.irqCount == nil {
		return seen, ErrNoInterrupts
	}
	deadline := time.Now().Add(timeout)
	for {
		if c.dead.Load() {
			return seen, c.Err()
		}
		if n := atomic.LoadUint32(r.irqCount); n != seen {
			return n, nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return seen, nil
		}
		// Announce, re-check, sleep (§6.6): the server's increment is
		// ordered before its load of the waiters word, ours after our
		// store to it, so either it sees us or we see its increment.
		atomic.AddUint32(r.irqWaiters, 1)
		if atomic.LoadUint32(r.irqCount) == seen && !c.dead.Load() {
			futexWaitWordFor(r.irqCount, seen, left)
		}
		atomic.AddUint32(r.irqWaiters, ^uint32(0))
	}
}

// interruptIRQ wakes the client's IRQ sleepers after c.dead was set: it
// changes the count (so a sleeper about to enter FUTEX_WAIT fails it with
// EAGAIN) and wakes those already asleep. The count means nothing once the
// connection is dead.
func (r *ringMap) interruptIRQ() {
	if r.irqCount != nil {
		atomic.AddUint32(r.irqCount, 1)
		futexWakeWord(r.irqCount)
	}
}
