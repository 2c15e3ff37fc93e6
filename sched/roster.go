package sched

import (
	"fmt"
	"time"
)

// vm is the per-VM state of every policy; each policy uses its own subset
// of the policy-specific fields.
type vm struct {
	id      VMID
	pos     int // index in roster.vms
	weight  int
	pending int // queued, not yet released
	running int // released, not yet completed
	// lastActive is the last time the VM had work queued, released or
	// completing.
	lastActive time.Duration

	// credit, band: remaining credit in this period (ns of GPU time).
	credit time.Duration
	// wfq, dfq: virtual time (GPU time / weight).
	vt float64
	// timeslice: overuse not yet deducted from a slice.
	debt time.Duration
	// dfq: sampling and free-run statistics.
	sampleN    int
	sampleSum  time.Duration
	avgCost    time.Duration
	freeDone   int  // completions outside sampling since the last engagement
	freeActive bool // submitted since the last engagement
	denied     bool
}

// busy reports whether the VM has work queued or on the GPU.
func (v *vm) busy() bool { return v.pending > 0 || v.running > 0 }

// roster is the ordered set of registered VMs shared by all policies. The
// order is registration order; rr is the round-robin cursor (an index into
// vms) that policies which rotate use.
type roster struct {
	name string
	vms  []*vm
	byID map[VMID]*vm
	rr   int
}

func newRoster(name string) roster {
	return roster{name: name, byID: make(map[VMID]*vm)}
}

// Name returns the policy's name.
func (r *roster) Name() string { return r.name }

func (r *roster) add(id VMID, weight int, now time.Duration) (*vm, error) {
	if weight < 1 {
		return nil, fmt.Errorf("sched: %s: add vm %d weight %d: %w", r.name, id, weight, ErrBadWeight)
	}
	if _, ok := r.byID[id]; ok {
		return nil, fmt.Errorf("sched: %s: add vm %d: %w", r.name, id, ErrDuplicateVM)
	}
	v := &vm{id: id, pos: len(r.vms), weight: weight, lastActive: now}
	r.vms = append(r.vms, v)
	r.byID[id] = v
	return v, nil
}

func (r *roster) remove(id VMID) (*vm, error) {
	v, ok := r.byID[id]
	if !ok {
		return nil, fmt.Errorf("sched: %s: remove vm %d: %w", r.name, id, ErrUnknownVM)
	}
	delete(r.byID, id)
	i := v.pos
	r.vms = append(r.vms[:i], r.vms[i+1:]...)
	for j := i; j < len(r.vms); j++ {
		r.vms[j].pos = j
	}
	if r.rr > i {
		r.rr--
	}
	if r.rr >= len(r.vms) {
		r.rr = 0
	}
	return v, nil
}

func (r *roster) get(op string, id VMID) (*vm, error) {
	v, ok := r.byID[id]
	if !ok {
		return nil, fmt.Errorf("sched: %s: %s vm %d: %w", r.name, op, id, ErrUnknownVM)
	}
	return v, nil
}

// submitted does the common bookkeeping of Policy.Submitted.
func (r *roster) submitted(id VMID, now time.Duration) (*vm, error) {
	v, err := r.get("submitted", id)
	if err != nil {
		return nil, err
	}
	v.pending++
	v.lastActive = now
	return v, nil
}

// started does the common bookkeeping of Policy.Started and moves the
// round-robin cursor past the VM.
func (r *roster) started(id VMID, now time.Duration) (*vm, error) {
	v, err := r.get("started", id)
	if err != nil {
		return nil, err
	}
	if v.pending == 0 {
		return nil, fmt.Errorf("sched: %s: started vm %d: %w", r.name, id, ErrNotQueued)
	}
	v.pending--
	v.running++
	v.lastActive = now
	r.rr = v.pos + 1
	if r.rr == len(r.vms) {
		r.rr = 0
	}
	return v, nil
}

// completed does the common bookkeeping of Policy.Completed.
func (r *roster) completed(id VMID, now time.Duration) (*vm, error) {
	v, err := r.get("completed", id)
	if err != nil {
		return nil, err
	}
	if v.running == 0 {
		return nil, fmt.Errorf("sched: %s: completed vm %d: %w", r.name, id, ErrNotQueued)
	}
	v.running--
	v.lastActive = now
	return v, nil
}

// anyPending reports whether some VM has a queued submission.
func (r *roster) anyPending() bool {
	for _, v := range r.vms {
		if v.pending > 0 {
			return true
		}
	}
	return false
}

// rotation returns the VMs in round-robin order starting at the cursor, as
// two slices to scan one after the other.
func (r *roster) rotation() (first, second []*vm) {
	return r.vms[r.rr:], r.vms[:r.rr]
}
