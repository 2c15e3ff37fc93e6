package nouveau

import (
	"testing"
	"time"
)

// TestNextSpin: the fence wait's spin follows the channel's waits — short
// waits make the next one spin through (up to the limit), long ones halve
// the spin until the wait sleeps at once.
func TestNextSpin(t *testing.T) {
	const most = 200 * time.Microsecond
	us := time.Microsecond
	cases := []struct {
		budget, w, want time.Duration
	}{
		{0, 30 * us, 60 * us},                   // a new channel's short wait: spin next time
		{60 * us, 30 * us, 60 * us},             // steady short waits
		{60 * us, 150 * us, most},               // capped
		{most, most, most},                      // at the limit still counts as short
		{most, 60 * time.Millisecond, 100 * us}, // a long wait halves it
		{100 * us, 60 * time.Millisecond, 50 * us},
		{1, 60 * time.Millisecond, 0}, // and reaches 0: sleep at once
		{0, 60 * time.Millisecond, 0},
	}
	for _, c := range cases {
		if got := nextSpin(c.budget, c.w, most); got != c.want {
			t.Errorf("nextSpin(%v, %v, %v) = %v, want %v", c.budget, c.w, most, got, c.want)
		}
	}
	// Sustained long waits decay any budget to 0 in a few waits.
	b := most
	for i := 0; b > 0; i++ {
		if i > 64 {
			t.Fatalf("spin budget still %v after %d long waits", b, i)
		}
		b = nextSpin(b, time.Second, most)
	}
}
