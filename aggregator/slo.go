package aggregator

import (
	"time"

	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/sched"
)

// Queue-wait objectives (SLOs) and SLA feedback (Pegasus' SLAF, config/
// slo.go). A vGPU may have a target queue wait; every submission released
// after waiting longer from its doorbell is a violation, counted in its
// SchedStats. With feedback on, the dispatcher looks at every vGPU with an
// SLO at the end of each window of its clock: one that missed (a violation
// in the window, or a submission queued longer than its SLO now) has its
// boost multiplied by Boost, up to MaxBoost; one that met it has the boost
// divided by Boost, down to 1. The policy schedules it at its configured
// weight × boost (sched.Policy.SetWeight), never above config.MaxWeight.
//
// The bound. A guest controls only its own submissions, so the most it can
// get from feedback — an SLO it can never meet — is MaxBoost × its weight:
// a VM beside it keeps its weight over the sum of the weights, the boosted
// ones counted at the cap, and no VM is starved.

// SLOOptions configure queue-wait objectives and SLA feedback.
type SLOOptions struct {
	// Target returns a guest's queue-wait objective (0: none; nil: no
	// guest has one).
	Target func(Guest) time.Duration
	// Feedback tunes SLA feedback; a zero Window turns it off.
	Feedback SLAFeedback
}

// SLAFeedback tunes SLA feedback ([scheduler] sla_window, sla_boost,
// sla_max_boost; defaults and their reasons in package config).
type SLAFeedback struct {
	// Window is how often each VM's waits are judged (0: feedback off).
	Window time.Duration
	// Boost multiplies a missing VM's boost, and divides a meeting VM's,
	// each window (< 2: config.DefaultSLABoost).
	Boost int
	// MaxBoost caps the boost (< 2: config.DefaultSLAMaxBoost).
	MaxBoost int
}

// FeedbackFromConfig returns the SLA feedback settings of a [scheduler]
// table (off unless sla_feedback is set).
func FeedbackFromConfig(s config.SchedulerConfig) SLAFeedback {
	if !s.SLAFeedback {
		return SLAFeedback{}
	}
	return SLAFeedback{Window: s.SLAWindow.Duration, Boost: s.SLABoost, MaxBoost: s.SLAMaxBoost}
}

// sloAccount is a vGPU's SLO bookkeeping, part of its account (under d.mu).
type sloAccount struct {
	target     time.Duration // 0: none
	violations uint64
	missed     bool // a violation in the current window
	boost      int  // ≥ 1: the policy schedules it at weight × boost
	boosted    uint64
	fixed      bool // the policy refused a new weight: feedback leaves it alone
}

// waited counts a released submission's queue wait against the target.
func (s *sloAccount) waited(w time.Duration) {
	if s.target > 0 && w > s.target {
		s.violations++
		s.missed = true
	}
}

// weight is the weight the policy schedules a VM of configured weight w at.
func (s *sloAccount) weight(w int) int { return min(w*max(s.boost, 1), config.MaxWeight) }

// fill copies the SLO figures into a SchedStats of configured weight w.
func (s *sloAccount) fill(st *SchedStats, w int) {
	st.SLO, st.SLOViolations, st.EffectiveWeight, st.SLABoostedWindows = s.target, s.violations, s.weight(w), s.boosted
}

// slaf is the dispatcher's SLA feedback state.
type slaf struct {
	SLAFeedback
	started bool
	window  int64 // index of the current window (clock / Window)
}

// newSLO returns the SLO account of a vGPU being added.
func (d *dispatcher) newSLO(v *VGPU) sloAccount {
	s := sloAccount{boost: 1}
	if t := d.a.opts.SLO.Target; t != nil {
		s.target = max(t(v.Guest), 0)
	}
	return s
}

// sloTick ends the feedback windows that are over by now, adjusting the
// weights of the vGPUs with an SLO. Called by each dispatcher step.
func (d *dispatcher) sloTick(now time.Duration) {
	f := &d.slaf
	if !f.started {
		f.SLAFeedback = d.a.opts.SLO.Feedback
		if f.Boost < 2 {
			f.Boost = config.DefaultSLABoost
		}
		if f.MaxBoost < 2 {
			f.MaxBoost = config.DefaultSLAMaxBoost
		}
		f.started = true
		if f.Window > 0 {
			f.window = int64(now / f.Window)
		}
	}
	if f.Window <= 0 {
		return
	}
	idx := int64(now / f.Window)
	if idx == f.window {
		return
	}
	// Windows after the first that ended with no step in between saw no
	// release and nothing queued (a queued submission keeps the
	// dispatcher stepping): each is met.
	idle := min(idx-f.window-1, 64)
	f.window = idx
	for id, c := range d.accounts {
		s := &c.slo
		if s.target <= 0 || s.fixed {
			continue
		}
		boost := s.boost
		if s.missed || d.overdue(id, s.target, now) {
			boost = min(boost*f.Boost, f.MaxBoost)
		} else {
			boost = max(boost/f.Boost, 1)
		}
		for i := int64(0); i < idle && boost > 1; i++ {
			boost = max(boost/f.Boost, 1)
		}
		s.missed = false
		if boost > 1 {
			s.boosted++
		}
		d.setBoost(id, c, boost, now)
	}
}

// overdue reports whether a queued submission of vGPU id has waited longer
// than target by now.
func (d *dispatcher) overdue(id int, target, now time.Duration) bool {
	for _, s := range d.queues[id] {
		if now-s.queued > target {
			return true
		}
	}
	return false
}

// setBoost has the policy schedule c's vGPU at its weight × boost.
func (d *dispatcher) setBoost(id int, c *account, boost int, now time.Duration) {
	s := &c.slo
	if boost == s.boost {
		return
	}
	old := s.weight(c.weight)
	prev := s.boost
	s.boost = boost
	if err := d.policy.SetWeight(sched.VMID(id), s.weight(c.weight), now); err != nil {
		s.boost, s.fixed = prev, true
		d.log.Warn("SLA feedback: the policy would not change the weight; leaving this vGPU at its own",
			"vgpu", id, "name", c.v.Guest.Name, "err", err)
		return
	}
	d.log.Debug("SLA feedback", "vgpu", id, "name", c.v.Guest.Name, "boost", boost, "weight", s.weight(c.weight), "was", old)
}
