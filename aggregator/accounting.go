package aggregator

import (
	"time"
)

// ShareWindow is the window over which SchedStats.Share and
// SchedStats.Busy are measured: the last second, in ten buckets.
const ShareWindow = shareBuckets * shareBucket

const (
	shareBuckets = 10
	shareBucket  = 100 * time.Millisecond
)

// waitBuckets is how many bounds WaitBounds has.
const waitBuckets = 6

// WaitBounds returns the upper bounds of SchedStats.WaitBuckets: how long
// submissions waited from their doorbell to their release to the GPU, in
// decades from 10µs to 1s. The last bucket, beyond the last bound, holds
// the rest and is not listed.
func WaitBounds() [waitBuckets]time.Duration {
	return [waitBuckets]time.Duration{
		10 * time.Microsecond, 100 * time.Microsecond, time.Millisecond,
		10 * time.Millisecond, 100 * time.Millisecond, time.Second,
	}
}

// SchedStats is one vGPU's account with the GPU scheduler: what the
// dispatcher gave it, measured on the dispatcher's clock the way the
// policies see it (GPU time from release, or the previous completion if
// later, to completion).
type SchedStats struct {
	Weight      int           `json:"weight"`
	Submissions uint64        `json:"submissions"`   // completed (a stopped channel's count too)
	GPUTime     time.Duration `json:"gpu_time_ns"`   // total GPU time of its completed submissions
	QueueWait   time.Duration `json:"queue_wait_ns"` // total time from doorbell to release
	// WaitBuckets counts released submissions by queue wait: bucket i
	// holds waits ≤ WaitBounds()[i] (and above the previous bound), the
	// last one the rest. Not cumulative.
	WaitBuckets []uint64 `json:"wait_buckets"`
	Released    uint64   `json:"released"` // submissions released (WaitBuckets' total)
	Queued      int      `json:"queued"`   // submissions waiting now
	// Share is its part of all VMs' GPU time over the last ShareWindow
	// (0 when the GPU was idle); Busy its GPU time over that window's
	// length (0.9–1 s: nine whole 100 ms buckets and the current one so
	// far). GPU time counts when its submission completes, so a long
	// submission lands in one bucket and Busy is capped at 1.
	Share float64 `json:"share"`
	Busy  float64 `json:"busy"`
	// SLO is its queue-wait objective (0: none) and SLOViolations the
	// released submissions that waited longer (slo.go).
	SLO           time.Duration `json:"slo_ns,omitempty"`
	SLOViolations uint64        `json:"slo_violations"`
	// EffectiveWeight is the weight the policy schedules it at: Weight,
	// or more while SLA feedback boosts it; SLABoostedWindows counts the
	// feedback windows that ended with it boosted.
	EffectiveWeight   int    `json:"effective_weight"`
	SLABoostedWindows uint64 `json:"sla_boosted_windows,omitempty"`
}

// account is the dispatcher's running form of SchedStats (under d.mu).
type account struct {
	v           *VGPU // whose: a slot's next tenant gets a new account
	weight      int
	submissions uint64
	gpuTime     time.Duration
	queueWait   time.Duration
	waits       [waitBuckets + 1]uint64
	released    uint64
	window      [shareBuckets]bucket
	slo         sloAccount
}

// carry takes the totals of old, the vGPU's account on the dispatcher it
// left (a move or an eviction), so that the figures operators and metrics
// read of it never go back: submissions, GPU time, queue wait and its
// buckets, releases, SLO violations and boosted windows. Its share window
// starts empty (the share is of this board's time), and the policy's own
// state for it (BAND's budget, credits) starts afresh on this board, as
// any VM's that joins.
func (c *account) carry(old *account) {
	c.submissions, c.gpuTime, c.queueWait = old.submissions, old.gpuTime, old.queueWait
	c.waits, c.released = old.waits, old.released
	c.slo.violations, c.slo.boosted = old.slo.violations, old.slo.boosted
}

// bucket is one shareBucket of GPU time; idx names which (time/shareBucket).
type bucket struct {
	idx int64
	t   time.Duration
}

func (c *account) wait(w time.Duration) {
	c.queueWait += w
	c.released++
	bounds := WaitBounds()
	i := 0
	for i < len(bounds) && w > bounds[i] {
		i++
	}
	c.waits[i]++
	c.slo.waited(w)
}

// ran charges GPU time t, completed at now.
func (c *account) ran(t, now time.Duration) {
	c.submissions++
	c.gpuTime += t
	idx := int64(now / shareBucket)
	b := &c.window[idx%shareBuckets]
	if b.idx != idx {
		*b = bucket{idx: idx}
	}
	b.t += t
}

// window is how much of the ShareWindow ending at now the buckets cover:
// nine whole buckets and the current one so far.
func window(now time.Duration) time.Duration {
	return (shareBuckets-1)*shareBucket + now%shareBucket
}

// recent is its GPU time in the ShareWindow ending at now.
func (c *account) recent(now time.Duration) time.Duration {
	idx := int64(now / shareBucket)
	var sum time.Duration
	for _, b := range c.window {
		if idx-b.idx < shareBuckets && b.idx <= idx {
			sum += b.t
		}
	}
	return sum
}

// schedStats returns the account of every vGPU the dispatcher serves. It
// is keyed by the vGPU itself, not its slot: a caller that lists the vGPUs
// before or after cannot pair one tenant's figures with the next one's.
func (d *dispatcher) schedStats() map[*VGPU]SchedStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.clock.Now()
	var total time.Duration
	recent := map[int]time.Duration{}
	for id, c := range d.accounts {
		recent[id] = c.recent(now)
		total += recent[id]
	}
	out := make(map[*VGPU]SchedStats, len(d.accounts))
	for id, c := range d.accounts {
		s := SchedStats{Weight: c.weight, Submissions: c.submissions, GPUTime: c.gpuTime, QueueWait: c.queueWait,
			WaitBuckets: append([]uint64(nil), c.waits[:]...), Released: c.released, Queued: len(d.queues[id]),
			Busy: min(float64(recent[id])/float64(window(now)), 1)}
		if total > 0 {
			s.Share = float64(recent[id]) / float64(total)
		}
		c.slo.fill(&s, c.weight)
		out[c.v] = s
	}
	return out
}

// SchedStats returns v's account with the scheduler (zero once v has left
// the dispatcher).
func (v *VGPU) SchedStats() SchedStats {
	a, _ := v.where()
	return a.disp.schedStats()[v]
}

// SchedStats returns every attached vGPU's account with the scheduler,
// measured at one instant (so the shares add up).
func (a *Aggregator) SchedStats() map[*VGPU]SchedStats { return a.disp.schedStats() }
