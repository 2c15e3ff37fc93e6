package sched

import "time"

// credits is the credit bookkeeping shared by CREDIT and BAND: every period
// each competing VM's credit grows by period × weight / (sum of competing
// weights) and is clamped to ± that amount, so an idle VM cannot bank more
// than one period's worth and a VM cannot sink more than one period into
// debt. A VM competes in a period if it had work queued or on the GPU at
// any time during the previous period; bandwidth of idle VMs is thereby
// redistributed to the busy ones (Xen's credit scheduler does the same; Gdev
// instead zeroes credits beyond ± one period).
type credits struct {
	roster
	period     time.Duration
	nextRefill time.Duration
	ticking    bool
}

func newCredits(name string, period time.Duration) credits {
	return credits{roster: newRoster(name), period: period}
}

// tick replenishes the credits of every period boundary up to now.
func (c *credits) tick(now time.Duration) {
	if !c.ticking {
		c.ticking = true
		c.nextRefill = now
	}
	if now < c.nextRefill {
		return
	}
	// After an idle stretch only the last two boundaries matter: the
	// clamp makes further refills no-ops.
	if skip := (now-c.nextRefill)/c.period - 1; skip > 0 {
		c.nextRefill += skip * c.period
	}
	for now >= c.nextRefill {
		c.refill(c.nextRefill)
		c.nextRefill += c.period
	}
}

func (c *credits) competing(v *vm, at time.Duration) bool {
	return v.busy() || v.lastActive > at-c.period
}

func (c *credits) refill(at time.Duration) {
	total := 0
	for _, v := range c.vms {
		if c.competing(v, at) {
			total += v.weight
		}
	}
	if total == 0 {
		return
	}
	for _, v := range c.vms {
		if !c.competing(v, at) {
			continue
		}
		share := c.period * time.Duration(v.weight) / time.Duration(total)
		v.credit = min(max(v.credit+share, -share), share)
	}
}

// added gives a newly registered VM one period's worth of credit at its
// share among the VMs registered now.
func (c *credits) added(v *vm, now time.Duration) {
	c.tick(now)
	total := 0
	for _, x := range c.vms {
		total += x.weight
	}
	v.credit = c.period * time.Duration(v.weight) / time.Duration(total)
}

// pick returns the VM to release next: round-robin from the cursor among
// VMs with queued work and positive credit, else (work-conserving) the
// queued VM least in debt (the first in round-robin order among equals); nil
// if nothing is queued. Taking the least-indebted rather than the next in
// round-robin order matters when every VM is over its share — with 8 VMs a
// 15 ms long-madd submission exceeds a 12.5 ms share, so that is common —
// because a round-robin of submissions hands each VM one submission, i.e.
// GPU time in proportion to its submission size.
func (c *credits) pick() *vm {
	var fallback *vm
	first, second := c.rotation()
	for _, part := range [2][]*vm{first, second} {
		for _, v := range part {
			if v.pending == 0 {
				continue
			}
			if v.credit > 0 {
				return v
			}
			if fallback == nil || v.credit > fallback.credit {
				fallback = v
			}
		}
	}
	return fallback
}

// credit is CREDIT, the Xen-credit-like baseline of thesis §4.3.3: usage is
// charged to a VM's credit on completion, credits are replenished every
// period in proportion to weight, a VM with positive credit is preferred
// (round-robin among them), and when none has credit any queued VM runs
// (work-conserving). It does not account the scheduler's own time.
type credit struct {
	credits
}

func newCredit(p Params) *credit {
	return &credit{credits: newCredits("credit", p.Period)}
}

func (p *credit) AddVM(id VMID, weight int, now time.Duration) error {
	v, err := p.add(id, weight, now)
	if err != nil {
		return err
	}
	p.added(v, now)
	return nil
}

func (p *credit) RemoveVM(id VMID, now time.Duration) error {
	_, err := p.remove(id)
	return err
}

func (p *credit) Submitted(id VMID, now time.Duration) error {
	p.tick(now)
	_, err := p.submitted(id, now)
	return err
}

func (p *credit) Next(now time.Duration) Decision {
	p.tick(now)
	if v := p.pick(); v != nil {
		return Decision{Action: Dispatch, VM: v.id}
	}
	return Decision{Action: Idle}
}

func (p *credit) Started(id VMID, now time.Duration) error {
	_, err := p.started(id, now)
	return err
}

func (p *credit) Completed(id VMID, gpuTime, now time.Duration) error {
	p.tick(now)
	v, err := p.completed(id, now)
	if err != nil {
		return err
	}
	v.credit -= gpuTime
	return nil
}

func (p *credit) Overhead(d, now time.Duration) {}
