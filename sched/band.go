package sched

import "time"

// band is GPUvm's BAND scheduler (thesis §4.1.5, after Gdev's
// bandwidth-aware non-preemptive device scheduler [44], common/
// gdev_vsched_band.c). It is CREDIT plus two changes:
//
//  1. Reserved bandwidth and a short wait. A VM has used more than its
//     reserved bandwidth (its share, weight / sum of competing weights) when
//     its credit for the current period is exhausted. When a VM's command
//     completes and the next candidate is a different VM that has used more
//     than its share while the completed VM has not, BAND does not dispatch
//     the candidate at once: it waits — polling every BandPoll, for at most
//     BandWait after the completion — for the completed VM's next
//     submission, and dispatches that instead if it arrives. Without the
//     wait, a VM that issues short commands with a little CPU time in
//     between always finds only the other VM's commands queued when its own
//     command completes, and credit scheduling degenerates to FIFO (the
//     2-VM madd vs long-madd case of §4.3.3). The wait also makes BAND run
//     one context in batches (§4.3.4).
//  2. Scheduler time is charged. The CPU time the scheduler consumes (and
//     its waits) leaves the GPU idle, so replenished credit would remain
//     unused and stop influencing decisions; BAND charges that time, split
//     among the VMs competing for the GPU (in proportion to their weights;
//     equally when the weights are equal), as if it were GPU time
//     (§4.1.5: "GPUvm charges CPU time equally to each VM to avoid an
//     unbalanced charge to a VM that issues short requests frequently").
//     The dispatcher reports it through Overhead.
//
// Gdev measures "used more than its share" as utilization over a 1 s
// window; this implementation uses the period credit, which measures the
// same thing (usage against share) over the current period.
type band struct {
	credits
	wait, poll time.Duration

	last   *vm           // VM whose command completed last, until a dispatch
	doneAt time.Duration // when last's command completed
}

func newBand(p Params) *band {
	return &band{credits: newCredits("band", p.Period), wait: p.BandWait, poll: p.BandPoll}
}

func (p *band) AddVM(id VMID, weight int, now time.Duration) error {
	v, err := p.add(id, weight, now)
	if err != nil {
		return err
	}
	p.added(v, now)
	return nil
}

func (p *band) RemoveVM(id VMID, now time.Duration) error {
	v, err := p.remove(id)
	if err != nil {
		return err
	}
	if p.last == v {
		p.last = nil
	}
	return nil
}

func (p *band) Submitted(id VMID, now time.Duration) error {
	p.tick(now)
	_, err := p.submitted(id, now)
	return err
}

func (p *band) Next(now time.Duration) Decision {
	p.tick(now)
	v := p.pick()
	if v == nil {
		return Decision{Action: Idle}
	}
	// pick prefers VMs with credit, so a candidate without credit means
	// every queued VM is over its share. Wait for the previous VM if it is
	// not, it has nothing queued yet, and the wait has not expired.
	if l := p.last; l != nil && v != l && v.credit <= 0 && l.credit > 0 &&
		l.pending == 0 && l.running == 0 {
		if deadline := p.doneAt + p.wait; now < deadline {
			return Decision{Action: Wait, Until: min(now+p.poll, deadline)}
		}
	}
	return Decision{Action: Dispatch, VM: v.id}
}

func (p *band) Started(id VMID, now time.Duration) error {
	if _, err := p.started(id, now); err != nil {
		return err
	}
	p.last = nil
	return nil
}

func (p *band) Completed(id VMID, gpuTime, now time.Duration) error {
	p.tick(now)
	v, err := p.completed(id, now)
	if err != nil {
		return err
	}
	v.credit -= gpuTime
	p.last, p.doneAt = v, now
	return nil
}

// Overhead charges d to the VMs competing for the GPU now (those with work
// queued or running, or else those active during the last period), in
// proportion to their weights.
func (p *band) Overhead(d, now time.Duration) {
	if d <= 0 {
		return
	}
	p.tick(now)
	n := 0
	for _, v := range p.vms {
		if v.busy() {
			n++
		}
	}
	active := func(v *vm) bool { return v.busy() }
	if n == 0 {
		active = func(v *vm) bool { return p.competing(v, now) }
		for _, v := range p.vms {
			if active(v) {
				n++
			}
		}
	}
	if n == 0 {
		return
	}
	// In proportion to weight: an equal split with equal weights (the
	// thesis' rule), and with weights 1:2:4 it keeps the charge from
	// eating a larger part of the small VM's share (simulated usage/weight
	// min/max 0.924 with an equal split, 0.985 so).
	w := 0
	for _, v := range p.vms {
		if active(v) {
			w += v.weight
		}
	}
	for _, v := range p.vms {
		if active(v) {
			v.credit -= d * time.Duration(v.weight) / time.Duration(w)
		}
	}
}
