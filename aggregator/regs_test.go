package aggregator

import (
	"fmt"
	"testing"
)

// TestRegisterVisibility: every register a guest can read states what its
// value may depend on (issue 20's rule), and a shared one says why.
func TestRegisterVisibility(t *testing.T) {
	regs := newRegTable()
	check := func(what string, h regHandler) {
		if h.read == nil {
			return
		}
		switch {
		case h.vis == visUnstated:
			t.Errorf("%s: readable, but its visibility is not stated", what)
		case h.vis == visShared && h.why == "":
			t.Errorf("%s: shared between VMs without a reason", what)
		case h.vis != visShared && h.why != "":
			t.Errorf("%s: a reason for sharing on a register that is not shared", what)
		}
	}
	counts := map[visibility]int{}
	for off, h := range regs.exact {
		check(fmt.Sprintf("BAR0 %#07x", off), h)
		if h.read != nil {
			counts[h.vis]++
		}
	}
	for _, r := range regs.ranges {
		check(fmt.Sprintf("BAR0 %#07x–%#07x", r.lo, r.hi), r.h)
	}
	if counts[visOwn] == 0 || counts[visConstant] == 0 {
		t.Fatalf("visibility counts %v: the table is not what this test expects", counts)
	}
	t.Logf("readable registers by visibility: own %d, constant %d, shared %d", counts[visOwn], counts[visConstant], counts[visShared])
}
