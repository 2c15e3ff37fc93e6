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
type wfq struct {
	roster
	sysvt float64
}

func newWFQ() *wfq { return &wfq{roster: newRoster("wfq")} }

func (p *wfq) AddVM(id VMID, weight int, now time.Duration) error {
	v, err := p.add(id, weight, now)
	if err != nil {
		return err
	}
	v.vt = p.sysvt
	return nil
}

func (p *wfq) RemoveVM(id VMID, now time.Duration) error {
	_, err := p.remove(id)
	return err
}

// advance moves the system virtual time up to the smallest virtual time of
// the active VMs other than except.
func (p *wfq) advance(except *vm) {
	m := math.Inf(1)
	for _, v := range p.vms {
		if v != except && v.busy() && v.vt < m {
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
	if !v.busy() {
		p.advance(v)
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
	return Decision{Action: Dispatch, VM: best.id}
}

func (p *wfq) Started(id VMID, now time.Duration) error {
	_, err := p.started(id, now)
	return err
}

func (p *wfq) Completed(id VMID, gpuTime, now time.Duration) error {
	v, err := p.completed(id, now)
	if err != nil {
		return err
	}
	v.vt += float64(gpuTime) / float64(v.weight)
	return nil
}

func (p *wfq) Overhead(d, now time.Duration) {}
