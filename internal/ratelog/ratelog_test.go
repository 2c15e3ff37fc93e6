package ratelog

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestLimiterBurstThenRate(t *testing.T) {
	l := New(2, 3)
	now := time.Unix(0, 0)
	l.now = func() time.Time { return now }
	allowed := 0
	for range 100 {
		if ok, _ := l.Allow(); ok {
			allowed++
		}
	}
	if allowed != 3 {
		t.Fatalf("burst: %d allowed, want 3", allowed)
	}
	now = now.Add(time.Second) // two more tokens
	ok, sup := l.Allow()
	if !ok || sup != 97 {
		t.Fatalf("after a second: ok %v suppressed %d, want true 97", ok, sup)
	}
	if ok, _ := l.Allow(); !ok {
		t.Fatal("second token of the second refused")
	}
	if ok, _ := l.Allow(); ok {
		t.Fatal("a third line in the same second allowed")
	}
	if l.Suppressed() != 98 {
		t.Fatalf("total suppressed %d, want 98", l.Suppressed())
	}
	now = now.Add(time.Hour) // tokens cap at the burst
	n := 0
	for range 10 {
		if ok, _ := l.Allow(); ok {
			n++
		}
	}
	if n != 3 {
		t.Fatalf("after an hour: %d allowed, want the burst of 3", n)
	}
}

func TestBrief(t *testing.T) {
	var errs []error
	for i := range 1000 {
		errs = append(errs, fmt.Errorf("PDE %d: allocate: quota exceeded", i))
	}
	err := fmt.Errorf("shadow space: full scan: %w", errors.Join(errs...))
	b := Brief(err, 200)
	if !strings.Contains(b, "PDE 0") || !strings.Contains(b, "and 999 more") || len(b) > 204 {
		t.Fatalf("Brief = %q", b)
	}
	if got := Brief(errors.New("one\nline"), 100); got != "one; line" {
		t.Fatalf("Brief(single) = %q", got)
	}
	if Brief(nil, 10) != "" {
		t.Fatal("Brief(nil) not empty")
	}
}
