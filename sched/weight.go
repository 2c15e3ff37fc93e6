package sched

import (
	"errors"
	"fmt"
	"time"
)

// ErrFixedWeights is returned by SetWeight of a policy whose schedule must
// not depend on anything a VM does (strict).
var ErrFixedWeights = errors.New("the policy's weights are fixed")

// SetWeight changes a registered VM's weight (≥ 1) from now on: the
// aggregator's SLA feedback raises a VM's weight for a while when it misses
// its queue-wait objective and lowers it back once it meets it (Pegasus'
// SLAF). What the new weight changes is each policy's own use of weights:
// the credit a VM gets at the next replenish (credit, band), how fast its
// virtual time grows from its next completion on (wfq, dfq), its next slice
// (timeslice). fifo accepts it and goes on ignoring weights.
func (r *roster) SetWeight(id VMID, weight int, now time.Duration) error {
	if weight < 1 {
		return fmt.Errorf("sched: %s: set vm %d weight %d: %w", r.name, id, weight, ErrBadWeight)
	}
	v, err := r.get("set weight of", id)
	if err != nil {
		return err
	}
	v.weight = weight
	return nil
}

// Weight returns a registered VM's current weight.
func (r *roster) Weight(id VMID) (int, error) {
	v, err := r.get("weight of", id)
	if err != nil {
		return 0, err
	}
	return v.weight, nil
}

// SetWeight refuses: strict's frame is its timing-channel defence, a
// function of the clock and the roster alone. A weight that followed a VM's
// queue waits — which other VMs' load sets — would make one VM's slots
// depend on what another does, the channel strict closes.
func (p *strict) SetWeight(id VMID, weight int, now time.Duration) error {
	if _, err := p.get("set weight of", id); err != nil {
		return err
	}
	return fmt.Errorf("sched: strict: set vm %d weight %d: %w", id, weight, ErrFixedWeights)
}
