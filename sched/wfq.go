package sched

import (
	"math"
	"time"
)

// wfq is weighted fair queueing with per-VM virtual time, as in GLoop's
// proportional scheduler (thesis §5.2.4, after [29]): a VM's virtual time
// advances by gpuTime / weight when its submission completes, and the VM
// with queued work and the smallest virtual time is released next (ties
// round-robin). A VM that becomes active (gets a submission while it had
// nothing queued or running) has its virtual time moved up to the system
// virtual time — the smallest virtual time among the active VMs, never
// decreasing — so it cannot bank the time it was idle, and the policy stays
// work-conserving. (GLoop resets the virtual time to that minimum; moving it
// only forward keeps a VM from shedding debt by briefly going idle.)
//
// Anticipation. A VM that loops "launch a kernel, wait for it, launch the
// next" has nothing queued at the moment its submission completes: its
// next one arrives a think time later. Plain WFQ then releases another VM
// (the only one queued) and, worse, counts the looping VM as having gone
// idle, moving its virtual time up to the others' — so the 2-VM madd vs
// long-madd case degenerates to FIFO (thesis §4.3.3, Jain 0.57 in
// simulation). WFQ therefore anticipates as BAND does (thesis §4.1.5, and
// the anticipatory disk scheduler of Iyer and Druschel, SOSP'01):
//
//   - When a VM's submission completes and the next candidate is another
//     VM with a larger virtual time, while the completed VM has nothing
//     queued or running, WFQ waits — polling every BandPoll, for at most
//     BandWait after the completion — for the completed VM's next
//     submission. The wait is only for a VM behind in virtual time, i.e.
//     below its fair share, so a VM ahead never holds the GPU idle.
//   - A VM that submits again within BandWait of its last completion has
//     not gone idle: it keeps its virtual time (and counts as active for
//     the system virtual time meanwhile).
//
// Both use band_wait and band_poll: the window covers the same thing, a
// guest's think time between a completion and its next doorbell.
type wfq struct {
	roster
	sysvt      float64
	wait, poll time.Duration

	last   *vm           // VM whose submission completed last, until a dispatch
	doneAt time.Duration // when last's submission completed
}

func newWFQ(p Params) *wfq {
	return &wfq{roster: newRoster("wfq"), wait: p.BandWait, poll: p.BandPoll}
}

func (p *wfq) AddVM(id VMID, weight int, now time.Duration) error {
	v, err := p.add(id, weight, now)
	if err != nil {
		return err
	}
	v.vt = p.sysvt
	return nil
}

func (p *wfq) RemoveVM(id VMID, now time.Duration) error {
	v, err := p.remove(id)
	if err != nil {
		return err
	}
	if p.last == v {
		p.last = nil
	}
	return nil
}

// active reports whether v competes for the GPU at now: it has work queued
// or running, or it was last active (a completion, or for a VM that never
// submitted, its registration) within the anticipation window.
func (p *wfq) active(v *vm, now time.Duration) bool {
	return v.busy() || now-v.lastActive <= p.wait
}

// advance moves the system virtual time up to the smallest virtual time of
// the active VMs other than except.
func (p *wfq) advance(except *vm, now time.Duration) {
	m := math.Inf(1)
	for _, v := range p.vms {
		if v != except && p.active(v, now) && v.vt < m {
			m = v.vt
		}
	}
	if !math.IsInf(m, 1) && m > p.sysvt {
		p.sysvt = m
	}
}

func (p *wfq) Submitted(id VMID, now time.Duration) error {
	v, err := p.get("submitted", id)
	if err != nil {
		return err
	}
	if !p.active(v, now) {
		p.advance(v, now)
		v.vt = max(v.vt, p.sysvt)
	}
	_, err = p.submitted(id, now)
	return err
}

func (p *wfq) Next(now time.Duration) Decision {
	var best *vm
	first, second := p.rotation()
	for _, part := range [2][]*vm{first, second} {
		for _, v := range part {
			if v.pending > 0 && (best == nil || v.vt < best.vt) {
				best = v
			}
		}
	}
	if best == nil {
		return Decision{Action: Idle}
	}
	if l := p.last; l != nil && l != best && l.vt < best.vt && !l.busy() {
		if deadline := p.doneAt + p.wait; now < deadline {
			return Decision{Action: Wait, Until: min(now+p.poll, deadline)}
		}
	}
	return Decision{Action: Dispatch, VM: best.id}
}

func (p *wfq) Started(id VMID, now time.Duration) error {
	if _, err := p.started(id, now); err != nil {
		return err
	}
	p.last = nil
	return nil
}

func (p *wfq) Completed(id VMID, gpuTime, now time.Duration) error {
	v, err := p.completed(id, now)
	if err != nil {
		return err
	}
	v.vt += float64(gpuTime) / float64(v.weight)
	p.last, p.doneAt = v, now
	return nil
}

func (p *wfq) Overhead(d, now time.Duration) {}
