package spin

import (
	"testing"
	"time"
)

// The wait is never shorter than asked (no upper bound is asserted: the
// machine is shared).
func TestNeverEarly(t *testing.T) {
	for _, d := range []time.Duration{0, time.Microsecond, 50 * time.Microsecond, 300 * time.Microsecond} {
		start := time.Now()
		For(d)
		if got := time.Since(start); got < d {
			t.Errorf("For(%v) returned after %v", d, got)
		}
	}
}

func TestNapNeverEarly(t *testing.T) {
	for _, d := range []time.Duration{0, 20 * time.Microsecond, 200 * time.Microsecond} {
		start := time.Now()
		Nap(d)
		if got := time.Since(start); got < d {
			t.Errorf("Nap(%v) returned after %v", d, got)
		}
	}
}
