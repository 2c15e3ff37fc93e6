// Package spin waits precisely for short times: sub-microsecond costs of a
// timing model cannot be expressed with time.Sleep, whose granularity is tens
// of microseconds.
package spin

import (
	"runtime"
	"time"
)

// SleepAbove is where sleeping starts to pay: waits longer than this sleep
// (leaving the last part to the spin).
const SleepAbove = 200 * time.Microsecond

// For waits for d, busy-waiting for short waits.
func For(d time.Duration) {
	if d <= 0 {
		return
	}
	Until(time.Now().Add(d))
}

// Until waits until the deadline: sleeping while far away, spinning close to it.
func Until(deadline time.Time) {
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return
		}
		if left > SleepAbove {
			time.Sleep(left - SleepAbove/2)
			continue
		}
		if left > 20*time.Microsecond {
			runtime.Gosched()
		}
	}
}
