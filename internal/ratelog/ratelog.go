// Package ratelog bounds how many log lines a guest can make the daemon
// write: a token bucket per source, with a count of what it held back so
// the next line that does go out can say so.
package ratelog

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Limiter lets a burst of lines through, then at most a steady rate, and
// counts the lines it suppresses. It is safe for concurrent use.
type Limiter struct {
	mu         sync.Mutex
	rate       float64 // tokens per second
	burst      float64
	tokens     float64
	last       time.Time
	suppressed uint64
	total      uint64
	now        func() time.Time
}

// New returns a limiter allowing burst lines at once and rate lines per
// second after that.
func New(rate float64, burst int) *Limiter {
	return &Limiter{rate: rate, burst: float64(burst), tokens: float64(burst), now: time.Now}
}

// Allow reports whether a line may be written now and, if so, how many
// lines were suppressed since the last one allowed.
func (l *Limiter) Allow() (ok bool, suppressed uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if !l.last.IsZero() {
		l.tokens = min(l.burst, l.tokens+now.Sub(l.last).Seconds()*l.rate)
	}
	l.last = now
	if l.tokens < 1 {
		l.suppressed++
		l.total++
		return false, 0
	}
	l.tokens--
	suppressed, l.suppressed = l.suppressed, 0
	return true, suppressed
}

// Suppressed returns how many lines the limiter has held back in all.
func (l *Limiter) Suppressed() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}

// Brief shortens an error for a log line: an errors.Join of many errors (a
// scan that failed on a thousand entries) becomes its first error and a
// count, and the text is cut to max bytes.
func Brief(err error, max int) string {
	if err == nil {
		return ""
	}
	leaves := flatten(err)
	s := err.Error()
	if len(leaves) > 1 {
		s = fmt.Sprintf("%s (and %d more)", leaves[0].Error(), len(leaves)-1)
	}
	s = strings.ReplaceAll(s, "\n", "; ")
	if len(s) > max {
		s = s[:max] + "…"
	}
	return s
}

// flatten returns the leaves of a tree of joined errors (an error that
// wraps a join counts as one leaf per joined error, keeping its context).
func flatten(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flatten(e)...)
		}
		return out
	}
	if u := errors.Unwrap(err); u != nil {
		if inner := flatten(u); len(inner) > 1 {
			return inner
		}
	}
	return []error{err}
}
