package config

import (
	"fmt"
	"time"
)

// Queue-wait objectives and SLA feedback.
//
// A VM's SLO ([[vm]] slo, or its profile's) is a target queue wait: the time
// from a submission's doorbell to its release to the GPU. Every submission
// that waits longer is one violation, counted per VM and exported (control
// API and Prometheus). With [scheduler] sla_feedback on, the aggregator also
// acts on them as Pegasus' SLAF does ("SLA feedback": a monitor tracks the
// wait times of each domain's accelerator requests to detect SLO violations
// and feeds them back into its credits; Gupta et al., ATC'11 §3.2, §4):
// every sla_window it looks at each VM with an SLO, multiplies the boost of
// one that missed (a violation in the window, or a submission queued longer
// than its SLO now) by sla_boost, up to sla_max_boost, and divides the boost
// of one that met it by sla_boost, down to 1; the policy schedules the VM at
// its configured weight × its boost.

// SLA feedback defaults ([scheduler] sla_window, sla_boost, sla_max_boost).
const (
	// DefaultSLAWindow is 100 ms: the default credit period (scheduler.
	// period), so that under credit and band one boost lasts exactly one
	// replenish, and the length of the accounting's share buckets.
	// Pegasus' accelerator schedulers ran on 30 ms periods and its
	// monitor once a second (ATC'11 §6.3, Table 2); 100 ms lies between,
	// long enough to hold several submissions of a latency-bound VM.
	DefaultSLAWindow = 100 * time.Millisecond
	// DefaultSLABoost is 2: multiplicative increase and decrease by
	// halves (as TCP's window halving), so a missing VM reaches the
	// default cap in three windows and is back at its weight three
	// windows after it meets its SLO again.
	DefaultSLABoost = 2
	// DefaultSLAMaxBoost is 8: the smallest built-in profile (weight 1)
	// can then reach twice the largest (weight 4) while it misses, and a
	// VM beside it keeps at least its weight over the sum of the others'
	// and 8× the boosted ones' — the bound that keeps SLAF from starving
	// anyone.
	DefaultSLAMaxBoost = 8
	// MaxSLABoost bounds sla_boost.
	MaxSLABoost = 16
)

// profileSLO is the SLO of the i-th [[vm]] entry, whose own value is slo,
// when it names profile p: its own if it wrote one (for a Config built in
// code: if it is not 0), else the profile's.
func (c Config) profileSLO(i int, slo Duration, p ProfileConfig) Duration {
	if c.src != nil && c.src.written(joinKey(indexKey("vm", i), "slo")) || c.src == nil && slo.Duration != 0 {
		return slo
	}
	return p.SLO
}

// validateSLO checks the [[vm]] and [[profile]] slo keys and the SLA
// feedback keys of [scheduler].
func (c Config) validateSLO(v *validator) {
	for _, e := range []struct {
		table string
		slo   func(i int) Duration
		n     int
	}{
		{"vm", func(i int) Duration { return c.VMs[i].SLO }, len(c.VMs)},
		{"profile", func(i int) Duration { return c.Profiles[i].SLO }, len(c.Profiles)},
	} {
		for i := range e.n {
			key := joinKey(indexKey(e.table, i), "slo")
			if d := e.slo(i); v.ok(indexKey(e.table, i), key) && d.Duration < 0 {
				v.errorf([]string{key}, "%s is negative (leave it out, or write \"0s\", for no objective)", d)
			}
		}
	}
	s := c.Scheduler
	if v.ok("scheduler.sla_window") && s.SLAWindow.Duration <= 0 {
		v.errorf([]string{"scheduler.sla_window"}, "%s: must be longer than 0", s.SLAWindow)
	}
	if v.ok("scheduler.sla_boost") && (s.SLABoost < 2 || s.SLABoost > MaxSLABoost) {
		v.errorf([]string{"scheduler.sla_boost"}, "%d is outside 2..%d", s.SLABoost, MaxSLABoost)
	}
	if v.ok("scheduler.sla_max_boost") && (s.SLAMaxBoost < 2 || s.SLAMaxBoost > MaxWeight) {
		v.errorf([]string{"scheduler.sla_max_boost"}, "%d is outside 2..%d", s.SLAMaxBoost, MaxWeight)
	}
	if !s.SLAFeedback || !v.ok("scheduler.sla_feedback", "scheduler.policy") {
		return
	}
	if why, ok := unweighted()[s.Policy]; ok {
		v.errorf([]string{"scheduler.sla_feedback", "scheduler.policy"}, "SLA feedback acts through weights, and policy %q %s", s.Policy, why)
	}
}

// unweighted lists the policies SLA feedback cannot act on, with why.
func unweighted() map[Policy]string {
	return map[Policy]string{
		PolicyFIFO:   "ignores them",
		PolicyStrict: "keeps them fixed (a weight that followed queue waits would reopen the timing channel it closes)",
	}
}

// setBool stores a TOML boolean.
func setBool(p *bool) func(any) error {
	return func(v any) error {
		b, ok := v.(bool)
		if !ok {
			return typeError("a boolean (true or false)", v)
		}
		*p = b
		return nil
	}
}

// SLAString describes the SLA feedback settings, for logs.
func (s SchedulerConfig) SLAString() string {
	if !s.SLAFeedback {
		return "off"
	}
	return fmt.Sprintf("window %s, boost ×%d up to ×%d", s.SLAWindow, s.SLABoost, s.SLAMaxBoost)
}
