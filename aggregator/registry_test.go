package aggregator

import (
	"errors"
	"testing"

	"github.com/gpuvm/gpuvm/gpu/hostmem"
)

// attachOn attaches a guest with a small RAM to agg, returning the error.
func attachOn(t *testing.T, agg *Aggregator, domid uint32, name string) (*VGPU, error) {
	t.Helper()
	ram, err := hostmem.New(name, 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ram.Close() })
	f, err := ram.File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return agg.Attach(Guest{DomID: domid, Name: name, Mode: "fv-optimized"}, f, ram.Size())
}

// Two boards of one daemon share a registry: a domain holds one vGPU on
// the whole host, and ids are unique across boards and are not slots.
func TestRegistrySharedAcrossBoards(t *testing.T) {
	reg := NewRegistry()
	a, _ := newTestAggregatorWith(t, Options{MaxVMs: 2, Registry: reg, Board: 0, BoardName: "a"})
	b, _ := newTestAggregatorWith(t, Options{MaxVMs: 2, Registry: reg, Board: 1, BoardName: "b"})

	va, err := attachOn(t, a, 7, "seven")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := attachOn(t, b, 7, "other-name"); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("same domid on the second board: err %v, want ErrDuplicate", err)
	}
	if _, err := attachOn(t, b, 8, "seven"); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("same name on the second board: err %v, want ErrDuplicate", err)
	}
	vb, err := attachOn(t, b, 8, "eight")
	if err != nil {
		t.Fatal(err)
	}
	if va.ID == vb.ID {
		t.Fatalf("two boards gave out vGPU id %d twice", va.ID)
	}
	if vb.Slot.Index != 0 || vb.ID != 1 {
		t.Fatalf("second board's first vGPU: id %d slot %d, want id 1 in slot 0", vb.ID, vb.Slot.Index)
	}
	if info := vb.Info(); info.Board != 1 || info.BoardName != "b" || info.Slot != 0 || info.ID != 1 {
		t.Fatalf("info board %d %q slot %d id %d", info.Board, info.BoardName, info.Slot, info.ID)
	}

	// A refused attach holds nothing; a detach gives the id and the
	// identity back.
	if err := a.Detach(va); err != nil {
		t.Fatal(err)
	}
	if reg.Len() != 1 {
		t.Fatalf("registry holds %d ids after one detach, want 1", reg.Len())
	}
	vc, err := attachOn(t, b, 7, "seven")
	if err != nil {
		t.Fatalf("the domain again, on the other board, after its detach: %v", err)
	}
	if vc.ID != va.ID {
		t.Fatalf("reattach got id %d, want the lowest free id %d", vc.ID, va.ID)
	}
}

// A board with no free slot gives back the id it claimed.
func TestRegistryReleasedWhenNoSlot(t *testing.T) {
	reg := NewRegistry()
	a, _ := newTestAggregatorWith(t, Options{MaxVMs: 1, Registry: reg})
	if _, err := attachOn(t, a, 1, "one"); err != nil {
		t.Fatal(err)
	}
	if _, err := attachOn(t, a, 2, "two"); !errors.Is(err, ErrNoSlot) {
		t.Fatalf("err %v, want ErrNoSlot", err)
	}
	if reg.Len() != 1 {
		t.Fatalf("registry holds %d ids, want 1", reg.Len())
	}
}
