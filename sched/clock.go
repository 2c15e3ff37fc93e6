package sched

import (
	"sync"
	"time"
)

// Clock is a monotonic time source. Times are durations since the clock's
// own epoch, which is the time base every Policy method's now argument uses.
// A dispatcher reads its Clock and passes the value to the policy; policies
// never read a clock themselves, so they are deterministic under test.
type Clock interface {
	// Now returns the time elapsed since the clock's epoch. It never
	// decreases.
	Now() time.Duration
}

// RealClock is the wall clock, measured with Go's monotonic clock from the
// moment NewRealClock was called. It is safe for concurrent use.
type RealClock struct {
	start time.Time
}

// NewRealClock returns a RealClock whose epoch is now.
func NewRealClock() *RealClock { return &RealClock{start: time.Now()} }

// Now returns the time since the clock was created.
func (c *RealClock) Now() time.Duration { return time.Since(c.start) }

// ManualClock is a clock that moves only when told to, for tests and
// simulations. The zero value reads 0 and is ready to use. It is safe for
// concurrent use.
type ManualClock struct {
	mu  sync.Mutex
	now time.Duration
}

// Now returns the clock's current reading.
func (c *ManualClock) Now() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d (negative d is ignored, so the clock
// stays monotonic) and returns the new reading.
func (c *ManualClock) Advance(d time.Duration) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d > 0 {
		c.now += d
	}
	return c.now
}

// Set moves the clock to t if t is later than the current reading and
// returns the new reading.
func (c *ManualClock) Set(t time.Duration) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t > c.now {
		c.now = t
	}
	return c.now
}
