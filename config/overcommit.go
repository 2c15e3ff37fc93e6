package config

import "time"

// VRAM overcommit by eviction ([board] / [[boards]] overcommit, [daemon]
// evict_idle, restore_wait, min_residency; package aggregator's evict.go).
// A board with overcommit above 1 admits vGPUs whose VRAM sums to that many
// times its slots' VRAM; the vGPUs beyond its slots take turns: a vGPU with
// no work for evict_idle may be parked (its VRAM copied to the daemon's
// memory) to free a slot;
// a vGPU waiting for a slot takes the one of the vGPU resident longest once
// that one has held it for min_residency, and a parked guest waits at most
// restore_wait for a slot.

// Eviction defaults and bounds. The defaults are the aggregator's
// (aggregator.DefaultEvictIdle, DefaultRestoreWait, DefaultMinResidency),
// repeated here because config does not import the aggregator.
const (
	// DefaultEvictIdle is how long a vGPU has no work before it may be
	// evicted: long against a guest's gap between two submissions of one
	// job (GPUvm's "think time", well under a millisecond), short against
	// a user's pause.
	DefaultEvictIdle = 200 * time.Millisecond
	// DefaultRestoreWait bounds a parked guest's (or an attach's) wait
	// for a slot: it then gets an error, not a hang.
	DefaultRestoreWait = 30 * time.Second
	// DefaultMinResidency is how long a busy vGPU keeps its slot before a
	// waiting one takes it: restoring a few MiB takes milliseconds, so
	// the board runs work, not copies.
	DefaultMinResidency = 500 * time.Millisecond
	// MaxOvercommit bounds overcommit: each parked vGPU's image is held
	// in the daemon's memory, up to its VRAM.
	MaxOvercommit = 8
)

// validateOvercommit checks every board's overcommit and the eviction keys
// of [daemon].
func (c Config) validateOvercommit(v *validator) {
	for _, b := range c.AllBoards() {
		k := b.keys("overcommit")
		if !v.ok(k...) {
			continue
		}
		switch {
		case !(b.Overcommit >= 1 && b.Overcommit <= MaxOvercommit):
			v.errorf(k, "%v is outside 1..%d: the board's VRAM may be committed this many times (1: no overcommit)", b.Overcommit, MaxOvercommit)
		case b.Overcommit > 1 && b.Kind != BoardSim && v.ok(b.keys("kind")...):
			v.errorf(append(k, b.keys("kind")...), "board %q: overcommit needs a board whose VRAM in use can be listed and copied (kind = \"sim\")", b.Name)
		}
	}
	d := c.Daemon
	for _, r := range []struct {
		key      string
		val      Duration
		min, max time.Duration
	}{
		{"daemon.evict_idle", d.EvictIdle, time.Millisecond, time.Hour},
		{"daemon.restore_wait", d.RestoreWait, 100 * time.Millisecond, 10 * time.Minute},
		{"daemon.min_residency", d.MinResidency, time.Millisecond, time.Hour},
	} {
		if v.ok(r.key) && (r.val.Duration < r.min || r.val.Duration > r.max) {
			v.errorf([]string{r.key}, "%s is outside %s..%s", r.val, Duration{r.min}, Duration{r.max})
		}
	}
}
