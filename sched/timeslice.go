package sched

import "time"

// timeslice is NEON's timeslice with overuse control (Menychtas et al.,
// ASPLOS'14, §3.1). A token passes round-robin among the VMs with queued
// work; only the holder's submissions are released, for a slice of
// Timeslice × its weight. Because the GPU is non-preemptive, a submission
// released before the slice ends may run past it; the holder keeps the
// token until it completes and the overrun is recorded as debt. The debt is
// deducted from the VM's next slice(s): a slice shorter than its debt is
// skipped entirely and the debt reduced by a slice (NEON: "deduct their
// excess execution time from future timeslices ... When a task's accrued
// overuse exceeds a full timeslice, we skip the task's next turn").
//
// The policy is not work-conserving, as in NEON: a holder with nothing
// queued keeps the token (the GPU idles) — but only for Poll (NEON's 1 ms
// polling period) after its last activity, after which the token moves on
// if another VM is waiting.
type timeslice struct {
	roster
	slice, poll time.Duration

	holder   *vm
	sliceEnd time.Duration
}

func newTimeslice(p Params) *timeslice {
	return &timeslice{roster: newRoster("timeslice"), slice: p.Timeslice, poll: p.Poll}
}

func (p *timeslice) AddVM(id VMID, weight int, now time.Duration) error {
	_, err := p.add(id, weight, now)
	return err
}

func (p *timeslice) RemoveVM(id VMID, now time.Duration) error {
	v, err := p.remove(id)
	if err != nil {
		return err
	}
	if p.holder == v {
		p.holder = nil
	}
	return nil
}

func (p *timeslice) Submitted(id VMID, now time.Duration) error {
	_, err := p.submitted(id, now)
	return err
}

func (p *timeslice) Next(now time.Duration) Decision {
	if h := p.holder; h != nil {
		switch {
		case h.running > 0:
			// One submission at a time; at the slice end, wait for the
			// overrunning one to complete before passing the token.
			return Decision{Action: Idle}
		case now >= p.sliceEnd:
			// Slice over.
		case h.pending > 0:
			return Decision{Action: Dispatch, VM: h.id}
		case !p.othersPending(h):
			return Decision{Action: Idle}
		case now < h.lastActive+p.poll:
			return Decision{Action: Wait, Until: min(h.lastActive+p.poll, p.sliceEnd)}
		}
		p.holder = nil
		p.rr = h.pos + 1
	}
	if !p.anyPending() {
		return Decision{Action: Idle}
	}
	n := len(p.vms)
	for k := 0; ; k++ {
		v := p.vms[(p.rr+k)%n]
		if v.pending == 0 {
			continue
		}
		full := p.slice * time.Duration(v.weight)
		if v.debt >= full {
			v.debt -= full // skip this turn
			continue
		}
		p.holder, p.sliceEnd = v, now+full-v.debt
		v.debt = 0
		p.rr = (p.rr + k) % n
		return Decision{Action: Dispatch, VM: v.id}
	}
}

func (p *timeslice) othersPending(h *vm) bool {
	for _, v := range p.vms {
		if v != h && v.pending > 0 {
			return true
		}
	}
	return false
}

func (p *timeslice) Started(id VMID, now time.Duration) error {
	rr := p.rr
	_, err := p.started(id, now)
	p.rr = rr // the token, not each release, moves the cursor
	return err
}

// Completed charges an overrun of the holder's slice as debt.
func (p *timeslice) Completed(id VMID, gpuTime, now time.Duration) error {
	v, err := p.completed(id, now)
	if err != nil {
		return err
	}
	if v == p.holder && now > p.sliceEnd {
		v.debt += now - max(p.sliceEnd, now-gpuTime)
	}
	return nil
}

func (p *timeslice) Overhead(d, now time.Duration) {}
