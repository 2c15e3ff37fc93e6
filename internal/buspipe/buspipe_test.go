package buspipe

import "testing"

// The booking arithmetic: writes issued faster than the bus drains queue
// behind each other; an idle bus starts an access at once; a read waits
// for the writes before it.
func TestReserve(t *testing.T) {
	p := New()
	for _, tc := range []struct {
		now, cost, start int64
	}{
		{0, 250, 0},       // idle: at once
		{100, 250, 250},   // behind the first write
		{200, 250, 500},   // behind both
		{2000, 250, 2000}, // the bus drained meanwhile
		{2010, 800, 2250}, // a read waits for the write before it
		{2020, 250, 3050}, // and a write for the read
	} {
		if got := p.Reserve(tc.now, tc.cost); got != tc.start {
			t.Errorf("Reserve(%d, %d) = %d, want %d", tc.now, tc.cost, got, tc.start)
		}
	}
}
