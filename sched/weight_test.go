package sched

import (
	"errors"
	"math"
	"testing"
	"time"
)

// reweigh wraps a Policy and sets VM to weight right after it is added.
type reweigh struct {
	Policy
	vm     VMID
	weight int
}

func (r *reweigh) AddVM(id VMID, weight int, now time.Duration) error {
	if err := r.Policy.AddVM(id, weight, now); err != nil {
		return err
	}
	if id != r.vm {
		return nil
	}
	return r.Policy.SetWeight(id, r.weight, now)
}

// TestSetWeight: every weighted policy shares the GPU by the weight
// SetWeight gave, not the one AddVM did.
func TestSetWeight(t *testing.T) {
	for _, name := range []string{"credit", "band", "wfq", "timeslice", "dfq"} {
		t.Run(name, func(t *testing.T) {
			loads := []VMLoad{
				{ID: 1, Weight: 1, Cost: ms, Think: 100 * time.Microsecond, Depth: 2},
				{ID: 2, Weight: 1, Cost: ms, Think: 100 * time.Microsecond, Depth: 2},
			}
			p := &reweigh{Policy: mustNew(t, name, Params{}), vm: 2, weight: 3}
			r := mustSim(t, p, loads, 10*time.Second, SimOptions{})
			ratio := float64(r.Usage[1]) / float64(r.Usage[0])
			if math.Abs(ratio-3)/3 > 0.05 {
				t.Errorf("usage ratio %.3f after SetWeight(2, 3), want 3 ± 5%%", ratio)
			}
			if w, err := p.Weight(2); err != nil || w != 3 {
				t.Errorf("Weight(2) = %d, %v; want 3", w, err)
			}
		})
	}
}

func TestSetWeightErrors(t *testing.T) {
	for _, name := range Names() {
		p := mustNew(t, name, Params{})
		check(t, p.AddVM(1, 2, 0))
		if err := p.SetWeight(9, 2, 0); !errors.Is(err, ErrUnknownVM) {
			t.Errorf("%s: SetWeight(unknown) = %v, want ErrUnknownVM", name, err)
		}
		if _, err := p.Weight(9); !errors.Is(err, ErrUnknownVM) {
			t.Errorf("%s: Weight(unknown) = %v, want ErrUnknownVM", name, err)
		}
		err := p.SetWeight(1, 4, 0)
		switch {
		case name == "strict" && !errors.Is(err, ErrFixedWeights):
			t.Errorf("strict: SetWeight = %v, want ErrFixedWeights", err)
		case name != "strict" && err != nil:
			t.Errorf("%s: SetWeight = %v", name, err)
		}
		if name != "strict" {
			if err := p.SetWeight(1, 0, 0); !errors.Is(err, ErrBadWeight) {
				t.Errorf("%s: SetWeight(0) = %v, want ErrBadWeight", name, err)
			}
		}
		want := 4
		if name == "strict" {
			want = 2
		}
		if w, err := p.Weight(1); err != nil || w != want {
			t.Errorf("%s: Weight = %d, %v; want %d", name, w, err, want)
		}
	}
}
