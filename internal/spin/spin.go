// Package spin waits precisely for short times. time.Sleep cannot: its
// granularity is the runtime's poller timeout, which on some kernels is a
// whole millisecond (measured here: time.Sleep(20µs) takes 1.17 ms), while the
// costs of a timing model and the polling intervals of the scheduler and the
// driver are tens of microseconds. Nap sleeps the thread with nanosleep
// (~86 µs for a 20 µs request here); For and Until nap while far from the
// deadline and spin close to it.
package spin

import (
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// SleepAbove is where napping starts to pay: waits longer than this nap
// (leaving the last part to the spin).
const SleepAbove = 150 * time.Microsecond

// Nap sleeps the calling thread for about d (at least d), without the
// runtime timer's coarse granularity. Use it for polling loops.
func Nap(d time.Duration) {
	if d <= 0 {
		return
	}
	ts := unix.NsecToTimespec(int64(d))
	for {
		var rem unix.Timespec
		if err := unix.Nanosleep(&ts, &rem); err != unix.EINTR {
			return
		}
		ts = rem
	}
}

// For waits for d, busy-waiting for short waits.
func For(d time.Duration) {
	if d <= 0 {
		return
	}
	Until(time.Now().Add(d))
}

// Until waits until the deadline: napping while far away, spinning close to it.
func Until(deadline time.Time) {
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return
		}
		if left > SleepAbove {
			Nap(left - SleepAbove/2)
			continue
		}
		if left > 20*time.Microsecond {
			runtime.Gosched()
		}
	}
}
