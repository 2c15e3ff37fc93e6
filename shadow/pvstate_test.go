package shadow

import (
	"errors"
	"slices"
	"testing"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// movedEnv is newEnv's layout with the slice and the RAM elsewhere (another
// slot, another RAM registration) and the slice sliceSize bytes.
func movedEnv(t *testing.T, sliceSize uint64) *env {
	t.Helper()
	base := uint64(testReserved + 8<<20)
	return newEnvLayout(t, Layout{
		SliceBase: base, SliceSize: sliceSize,
		RAMBase: 3 << 32, RAMSize: 64 << 20,
		Reserved: []Range{{0, testReserved}},
	}, base+sliceSize+nvc0.LargePageSize)
}

// TestPVExportImport: PV objects carried to a manager whose slice and RAM
// lie elsewhere keep their handles, links and bindings, and each entry
// maps the same guest page at its new place; the next handle continues
// where the old manager's would have. A state naming memory the new slice
// does not have is refused.
func TestPVExportImport(t *testing.T) {
	e := newEnv(t)
	m := newPVManager(t, e)
	must := func(h uint32, err error) uint32 {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	pd := must(m.PVAlloc(PVPageDir))
	gone := must(m.PVAlloc(PVSmallTable))
	small := must(m.PVAlloc(PVSmallTable))
	large := must(m.PVAlloc(PVLargeTable))
	pd2 := must(m.PVAlloc(PVPageDir))
	loose := must(m.PVAlloc(PVSmallTable)) // never linked
	if err := m.PVFree(gone); err != nil {
		t.Fatal(err)
	}
	if err := m.PVMapPGT(pd, 3, small, large); err != nil {
		t.Fatal(err)
	}
	vram := pteWord(nvc0.PTE{Present: true, Addr: 0x5000, Target: nvc0.TargetVRAM, Kind: 0xFE})
	sys := pteWord(nvc0.PTE{Present: true, Addr: 0x7000, Target: nvc0.TargetSysSnooped, ReadOnly: true})
	high := pteWord(nvc0.PTE{Present: true, Addr: 3 << 20, Target: nvc0.TargetVRAM})
	big := pteWord(nvc0.PTE{Present: true, Addr: 2 * nvc0.LargePageSize, Target: nvc0.TargetVRAM})
	for _, w := range []struct {
		pt, at uint32
		ptes   []uint64
	}{{small, 10, []uint64{vram, sys}}, {small, 400, []uint64{high}}, {large, 5, []uint64{big}}, {loose, 0, []uint64{sys}}} {
		if _, err := m.PVWrite(w.pt, w.at, w.ptes); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.PVBind(0x20000, pd2); err != nil {
		t.Fatal(err)
	}
	st, err := m.PVExport()
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Objects) != 5 || st.Bindings[0x20000] != pd2 {
		t.Fatalf("exported %d objects, binding %d: want 5 and %d", len(st.Objects), st.Bindings[0x20000], pd2)
	}

	e2 := movedEnv(t, testSlice)
	m2 := newPVManager(t, e2)
	if err := m2.PVImport(st); err != nil {
		t.Fatalf("import: %v", err)
	}
	for _, h := range []uint32{small, large, loose} {
		old, _ := m.PVEntries(h)
		got, err := m2.PVEntries(h)
		if err != nil {
			t.Fatalf("table %d after import: %v", h, err)
		}
		for i := range old {
			want := uint64(0)
			if old[i] != 0 {
				g := decodePTE(old[i])
				switch {
				case g.Target == nvc0.TargetVRAM:
					g.Addr += e2.l.SliceBase - e.l.SliceBase
				default:
					g.Addr += e2.l.RAMBase - e.l.RAMBase
				}
				want = pteWord(g)
			}
			if got[i] != want {
				t.Fatalf("table %d entry %d: %#x after the move, want %#x", h, i, got[i], want)
			}
		}
	}
	pdPhys, _ := m2.PVShadowPD(pd)
	walked := e2.walk(t, pdPhys)
	if got := decodePTE(walked.ptes[key{3, false, 10}]); got.Addr != e2.l.SliceBase+0x5000 || got.Kind != 0xFE {
		t.Errorf("the moved directory's VRAM entry maps %#x kind %#x", got.Addr, got.Kind)
	}
	if got := decodePTE(walked.ptes[key{3, true, 5}]); got.Addr != e2.l.SliceBase+2*nvc0.LargePageSize {
		t.Errorf("the moved directory's large entry maps %#x", got.Addr)
	}
	if len(walked.ptes) != 4 {
		t.Errorf("the moved directory walks to %d entries, want 4", len(walked.ptes))
	}
	if err := m2.PVMapPGT(pd2, 0, small, 0); !errors.Is(err, ErrPVBusy) {
		t.Errorf("the moved table is not linked where it was: %v", err)
	}
	if h := must(m2.PVAlloc(PVPageDir)); h != loose+1 {
		t.Errorf("the next handle after the import is %d, want %d", h, loose+1)
	}
	if _, err := m2.PVEntries(gone); !errors.Is(err, ErrPVHandle) {
		t.Errorf("a freed handle came back: %v", err)
	}

	// A slice too small for an entry: nothing maps outside it.
	small2 := movedEnv(t, 2<<20)
	m3 := newPVManager(t, small2)
	if err := m3.PVImport(st); !errors.Is(err, ErrPVFault) {
		t.Fatalf("import of an entry past the new slice: %v, want ErrPVFault", err)
	}
	bad := *st
	bad.Objects = slices.Clone(st.Objects)
	bad.Objects[1].Entries = bad.Objects[1].Entries[:7]
	if err := newPVManager(t, movedEnv(t, testSlice)).PVImport(&bad); !errors.Is(err, ErrPVRange) {
		t.Fatalf("import of a short table: %v, want ErrPVRange", err)
	}
}
