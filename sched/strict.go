package sched

import "time"

// strict is time-division multiplexing with fixed, non-work-conserving
// slots: the opt-in policy that closes the GPU timing channel between VMs
// as far as a non-preemptive GPU allows (docs/performance.md, "Timing
// channel between VMs").
//
// Time on the dispatcher clock is cut into frames of one slot per
// registered VM, in registration order, each Timeslice × the VM's weight
// long, anchored at the clock's epoch (time 0): the owner of the GPU at time
// t depends only on t and the roster, never on what any VM queued or ran.
// In its slot a VM's submissions are released one at a time; outside it
// nothing of it is, and a slot whose owner has nothing queued leaves the GPU
// idle until the next slot boundary. What a VM can see of the GPU — when its
// own submissions are released — is then a function of the clock alone.
//
// The guard. The GPU cannot be preempted, so a submission released shortly
// before its slot ends runs into the next VM's slot, and the next VM sees
// its slot shortened by the overrun: a residual channel. To keep honest VMs
// from overrunning, a submission is released only while at least the VM's
// guard remains of its slot: the longest GPU time any of its own
// submissions has used so far. The guard only ever grows (a VM that could
// lower it again could train it down and overrun at will), and it uses only
// the VM's own history, so a VM's releases still depend on nothing another
// VM does. The price: one unusually long submission shrinks the usable
// part of its VM's slots for good. A VM whose guard is at least its whole
// slot (its submissions never fit) still runs one submission per frame:
// the first release of a slot, of a submission queued before the slot
// began, so that it starts as the slot does (or as the previous slot's
// overrun ends) and overruns by its length less the rest of the slot.
//
// What remains: a submission longer than every earlier one of its VM, or
// one of a VM whose submissions do not fit its slot, overruns, and delays
// the next slot's owner by up to the dispatcher's watchdog
// (scheduler.watchdog), which stops a submission that holds the GPU longer.
// Overruns are not repaid: the schedule never shifts, since moving the next
// slot would itself reveal the overrun.
type strict struct {
	roster
	slice time.Duration
	// guard is each VM's longest GPU time so far (never shrinks).
	guard map[*vm]time.Duration
	// released is the start of the slot in which each VM last had a
	// submission released (-1: none yet), for the one release per slot of
	// a VM whose guard exceeds its slot.
	released map[*vm]time.Duration
	// queued holds when each VM's queued submissions were submitted,
	// oldest first.
	queued map[*vm][]time.Duration
}

func newStrict(p Params) *strict {
	return &strict{roster: newRoster("strict"), slice: p.Timeslice,
		guard: map[*vm]time.Duration{}, released: map[*vm]time.Duration{}, queued: map[*vm][]time.Duration{}}
}

func (p *strict) AddVM(id VMID, weight int, now time.Duration) error {
	v, err := p.add(id, weight, now)
	if err != nil {
		return err
	}
	p.released[v] = -1
	return nil
}

func (p *strict) RemoveVM(id VMID, now time.Duration) error {
	v, err := p.remove(id)
	if err != nil {
		return err
	}
	delete(p.guard, v)
	delete(p.released, v)
	delete(p.queued, v)
	return nil
}

func (p *strict) Submitted(id VMID, now time.Duration) error {
	v, err := p.submitted(id, now)
	if err != nil {
		return err
	}
	p.queued[v] = append(p.queued[v], now)
	return nil
}

// slotAt returns the slot that contains t: its owner and its bounds. The
// owner is nil when no VM is registered.
func (p *strict) slotAt(t time.Duration) (owner *vm, start, end time.Duration) {
	var frame time.Duration
	for _, v := range p.vms {
		frame += p.slice * time.Duration(v.weight)
	}
	if frame == 0 {
		return nil, 0, 0
	}
	off := t % frame
	start = t - off
	for i, v := range p.vms {
		l := p.slice * time.Duration(v.weight)
		if off < l || i == len(p.vms)-1 {
			return v, start, start + l
		}
		off -= l
		start += l
	}
	return nil, 0, 0 // unreachable: the loop returns at the last VM
}

func (p *strict) Next(now time.Duration) Decision {
	for _, v := range p.vms {
		if v.running > 0 {
			return Decision{Action: Idle} // one submission at a time
		}
	}
	o, start, end := p.slotAt(now)
	if o == nil {
		return Decision{Action: Idle}
	}
	g := p.guard[o]
	if o.pending > 0 && (end-now >= g || g >= end-start && p.released[o] != start && p.queued[o][0] <= start) {
		return Decision{Action: Dispatch, VM: o.id}
	}
	if !p.anyPending() {
		// Nothing queued anywhere: a Submitted report comes first.
		return Decision{Action: Idle}
	}
	return Decision{Action: Wait, Until: end}
}

func (p *strict) Started(id VMID, now time.Duration) error {
	v, err := p.started(id, now)
	if err != nil {
		return err
	}
	_, start, _ := p.slotAt(now)
	p.released[v] = start
	p.queued[v] = p.queued[v][1:]
	return nil
}

// Completed raises the VM's guard to the GPU time the submission used.
func (p *strict) Completed(id VMID, gpuTime, now time.Duration) error {
	v, err := p.completed(id, now)
	if err != nil {
		return err
	}
	p.guard[v] = max(p.guard[v], gpuTime)
	return nil
}

func (p *strict) Overhead(d, now time.Duration) {}
