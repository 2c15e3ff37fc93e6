package shadow

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// Guest layout used by several tests (guest VRAM addresses).
const (
	gPD     = 0x10000  // page directory
	gSmall0 = 0x20000  // small table of PDE 0 (256 KiB)
	gLarge1 = 0x60000  // large table of PDE 1 (8 KiB)
	gSmall2 = 0x70000  // small table of PDE 2 with size 2 (64 KiB)
	gSmallX = 0x80000  // a spare small table
	gData   = 0x100000 // data pages
)

// buildGuest writes a guest address space with valid and invalid mappings
// and returns how many present PTEs must be dropped.
func buildGuest(e *env) (dropped, priv int) {
	sl := e.l.SliceSize
	e.setPDE(gPD, 0, nvc0.PDE{SmallPresent: true, SmallAddr: gSmall0})
	e.setPDE(gPD, 1, nvc0.PDE{LargePresent: true, LargeAddr: gLarge1})
	e.setPDE(gPD, 2, nvc0.PDE{SmallPresent: true, SmallAddr: gSmall2, Size: 2})
	// PDE 3: small table outside the slice, large table straddling its end.
	e.setPDE(gPD, 3, nvc0.PDE{SmallPresent: true, SmallAddr: sl + 0x10000, LargePresent: true, LargeAddr: sl - nvc0.PageSize})
	// PDE 4: table in system memory (unsupported: dropped).
	e.setPDE(gPD, 4, nvc0.PDE{SmallPresent: true, SmallSys: true, SmallAddr: 0x1000})
	// PDE 5: small table would reach past the slice when size 0 but fits at size 3.
	e.setPDE(gPD, 5, nvc0.PDE{SmallPresent: true, SmallAddr: sl - nvc0.SmallPTSize/8, Size: 3})

	for i := range 64 { // 64 valid VRAM pages
		e.setPTE(gSmall0, i, nvc0.PTE{Present: true, Addr: gData + uint64(i)*nvc0.PageSize, Kind: uint32(i)})
	}
	e.setPTE(gSmall0, 100, nvc0.PTE{Present: true, Addr: sl})                       // just outside
	e.setPTE(gSmall0, 101, nvc0.PTE{Present: true, Addr: sl - nvc0.PageSize})       // last page: valid
	e.setPTE(gSmall0, 102, nvc0.PTE{Present: true, Addr: 0x40000000})               // far outside
	e.setPTE(gSmall0, 103, nvc0.PTE{Present: true, Addr: 0x1000, Target: 1})        // bad target
	e.setPTE(gSmall0, 104, nvc0.PTE{Present: true, Addr: 0x1000, Privileged: true}) // cleared
	e.setPTE(gSmall0, 200, nvc0.PTE{Present: true, Addr: 0x3000, Target: nvc0.TargetSysSnooped, Volatile: true})
	e.setPTE(gSmall0, 201, nvc0.PTE{Present: true, Addr: e.l.RAMSize, Target: nvc0.TargetSysNoSnoop}) // outside RAM
	e.setPTE(gSmall0, nvc0.SmallPTECount-1, nvc0.PTE{Present: true, Addr: 0x2000, ReadOnly: true})
	e.setPTE(gLarge1, 0, nvc0.PTE{Present: true, Addr: 0})
	e.setPTE(gLarge1, 1, nvc0.PTE{Present: true, Addr: sl - nvc0.LargePageSize})
	e.setPTE(gLarge1, 2, nvc0.PTE{Present: true, Addr: sl - nvc0.PageSize})          // straddles
	e.setPTE(gLarge1, 3, nvc0.PTE{Present: true, Addr: nvc0.LargePageSize + 0x1000}) // misaligned
	e.setPTE(gSmall2, 0, nvc0.PTE{Present: true, Addr: 0x5000})
	e.setPTE(gSmall2, nvc0.SmallPTECount/4-1, nvc0.PTE{Present: true, Addr: 0x6000})
	return 6, 1
}

func newSpace(t testing.TB, e *env, pd uint64) *Space {
	t.Helper()
	s, err := NewSpace(e.mem, e.alloc, e.tr, pd)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSpaceFullScan(t *testing.T) {
	e := newEnv(t)
	dropped, priv := buildGuest(e)
	s := newSpace(t, e, gPD)
	st, err := s.Sync()
	if err != nil {
		t.Fatal(err)
	}
	diffViews(t, e.walk(t, s.ShadowPD()), e.expected(gPD))
	if st.Kind != ScanFull || st.PDEs != nvc0.PDECount {
		t.Errorf("kind %v PDEs %d", st.Kind, st.PDEs)
	}
	wantScanned := nvc0.SmallPTECount + nvc0.LargePTECount + nvc0.SmallPTECount/4 + nvc0.SmallPTECount/8
	if st.PTEsScanned != wantScanned {
		t.Errorf("PTEs scanned %d, want %d", st.PTEsScanned, wantScanned)
	}
	if st.PTEsDropped != dropped || st.PrivCleared != priv {
		t.Errorf("dropped %d priv %d, want %d %d", st.PTEsDropped, st.PrivCleared, dropped, priv)
	}
	if st.PDEsDropped != 3 {
		t.Errorf("PDEs dropped %d, want 3", st.PDEsDropped)
	}
	if st.TablesBuilt != 4 {
		t.Errorf("tables built %d, want 4", st.TablesBuilt)
	}
	// Spot checks of the translation.
	v := e.walk(t, s.ShadowPD())
	if w, want := v.ptes[key{0, false, 5}], pteWord(nvc0.PTE{Present: true, Addr: e.l.SliceBase + gData + 5*nvc0.PageSize, Kind: 5}); w != want {
		t.Errorf("PTE 0/5 = %#x, want %#x", w, want)
	}
	if w, want := v.ptes[key{0, false, 200}], pteWord(nvc0.PTE{Present: true, Addr: e.l.RAMBase + 0x3000, Target: nvc0.TargetSysSnooped, Volatile: true}); w != want {
		t.Errorf("PTE 0/200 = %#x, want %#x", w, want)
	}
	for _, k := range []key{{0, false, 100}, {0, false, 102}, {0, false, 201}, {1, true, 2}, {1, true, 3}} {
		if _, ok := v.ptes[k]; ok {
			t.Errorf("PTE %+v should be dropped", k)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if len(e.alloc.live) != 0 {
		t.Errorf("after Close %d allocations live", len(e.alloc.live))
	}
}

func TestSpaceRescanWritesOnlyChanges(t *testing.T) {
	e := newEnv(t)
	buildGuest(e)
	s := newSpace(t, e, gPD)
	if _, err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	st, err := s.Sync()
	if err != nil {
		t.Fatal(err)
	}
	if st.EntriesWritten != 0 || st.BytesWritten != 0 || st.Changed() {
		t.Fatalf("unchanged rescan wrote %d entries", st.EntriesWritten)
	}
	// Change one PTE.
	e.setPTE(gSmall0, 7, nvc0.PTE{Present: true, Addr: 0x9000})
	w0 := e.mem.writes
	if st, err = s.Sync(); err != nil {
		t.Fatal(err)
	}
	if st.EntriesWritten != 1 || st.BytesWritten != nvc0.PTESize || e.mem.writes-w0 != 1 {
		t.Fatalf("one changed PTE: %d entries, %d bytes, %d writes", st.EntriesWritten, st.BytesWritten, e.mem.writes-w0)
	}
	// Change three adjacent PTEs: one coalesced write.
	for i := 10; i < 13; i++ {
		e.setPTE(gSmall0, i, nvc0.PTE{Present: true, Addr: 0xa000})
	}
	w0 = e.mem.writes
	if st, err = s.Sync(); err != nil {
		t.Fatal(err)
	}
	if st.EntriesWritten != 3 || e.mem.writes-w0 != 1 {
		t.Fatalf("three adjacent PTEs: %d entries in %d writes", st.EntriesWritten, e.mem.writes-w0)
	}
	// Point PDE 0 at another guest table with the same size: the shadow
	// table is reused, only differing entries written, PD untouched.
	e.setPTE(gSmallX, 0, nvc0.PTE{Present: true, Addr: 0x4000})
	e.setPDE(gPD, 0, nvc0.PDE{SmallPresent: true, SmallAddr: gSmallX})
	if st, err = s.Sync(); err != nil {
		t.Fatal(err)
	}
	diffViews(t, e.walk(t, s.ShadowPD()), e.expected(gPD))
	if st.TablesBuilt != 0 {
		t.Errorf("relinked table rebuilt")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestSpaceIncrementalOnePage(t *testing.T) {
	e := newEnv(t)
	buildGuest(e)
	s := newSpace(t, e, gPD)
	if st, err := s.SyncIncremental(); err != nil || st.Kind != ScanFull {
		t.Fatalf("first incremental scan: %v %v, want a full scan", st.Kind, err)
	}
	if s.NoteWrite(gData, nvc0.PageSize) {
		t.Error("write to a data page reported as watched")
	}
	st, err := s.SyncIncremental()
	if err != nil || st.Kind != ScanIncremental || st.PTEsScanned != 0 || st.PDEs != 0 {
		t.Fatalf("clean incremental scan: %+v %v", st, err)
	}
	// One PTE in the second page of the small table of PDE 0.
	a := e.setPTE(gSmall0, 600, nvc0.PTE{Present: true, Addr: 0x7000})
	if !s.NoteWrite(a, nvc0.PTESize) {
		t.Fatal("write to a page-table page not watched")
	}
	if st, err = s.SyncIncremental(); err != nil {
		t.Fatal(err)
	}
	if st.Kind != ScanIncremental || st.PTEsScanned != nvc0.PageSize/nvc0.PTESize || st.EntriesWritten != 1 {
		t.Fatalf("incremental: %+v", st)
	}
	diffViews(t, e.walk(t, s.ShadowPD()), e.expected(gPD))

	// A PD write that links a new table: one PD page re-read, the new table built.
	e.setPTE(gSmallX, 3, nvc0.PTE{Present: true, Addr: 0x8000})
	a = e.setPDE(gPD, 9, nvc0.PDE{SmallPresent: true, SmallAddr: gSmallX})
	s.NoteWrite(a, nvc0.PDESize)
	if st, err = s.SyncIncremental(); err != nil {
		t.Fatal(err)
	}
	if st.PDEs != 1 || st.TablesBuilt != 1 || st.PTEsScanned != nvc0.SmallPTECount {
		t.Fatalf("PD page incremental: %+v", st)
	}
	diffViews(t, e.walk(t, s.ShadowPD()), e.expected(gPD))

	// Unlink it again: the shadow table is freed.
	live := len(e.alloc.live)
	a = e.setPDE(gPD, 9, nvc0.PDE{})
	s.NoteWrite(a, nvc0.PDESize)
	if _, err = s.SyncIncremental(); err != nil {
		t.Fatal(err)
	}
	if len(e.alloc.live) != live-1 {
		t.Errorf("unlinked table not freed: %d live, want %d", len(e.alloc.live), live-1)
	}
	diffViews(t, e.walk(t, s.ShadowPD()), e.expected(gPD))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if len(e.alloc.live) != 0 {
		t.Errorf("after Close %d allocations live", len(e.alloc.live))
	}
}

func TestSpaceMarkAllDirty(t *testing.T) {
	e := newEnv(t)
	buildGuest(e)
	s := newSpace(t, e, gPD)
	if _, err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	// An unobserved write (e.g. by the GPU): incremental scans cannot see it.
	e.setPTE(gSmall0, 1000, nvc0.PTE{Present: true, Addr: 0xb000})
	if st, _ := s.SyncIncremental(); st.PTEsScanned != 0 {
		t.Fatalf("incremental scan without noted writes scanned %d PTEs", st.PTEsScanned)
	}
	s.MarkAllDirty()
	if !s.Dirty() {
		t.Fatal("not dirty after MarkAllDirty")
	}
	st, err := s.SyncIncremental()
	if err != nil || st.Kind != ScanFull || st.EntriesWritten != 1 {
		t.Fatalf("after MarkAllDirty: %+v %v", st, err)
	}
	diffViews(t, e.walk(t, s.ShadowPD()), e.expected(gPD))
	_ = s.Close()
}

func TestNewSpaceOutsideSlice(t *testing.T) {
	e := newEnv(t)
	for _, pd := range []uint64{e.l.SliceSize, e.l.SliceSize - nvc0.PageDirSize + 8, 1 << 40} {
		if _, err := NewSpace(e.mem, e.alloc, e.tr, pd); !errors.Is(err, ErrOutsideSlice) {
			t.Errorf("PD at %#x: err %v", pd, err)
		}
	}
	if len(e.alloc.live) != 0 {
		t.Error("failed NewSpace leaked memory")
	}
}

// randomEdit changes the guest at random and returns the written ranges.
func randomEdit(e *env, r *rand.Rand, pd uint64, tables []uint64) (addr, n uint64) {
	pick := func() uint64 { return tables[r.IntN(len(tables))] }
	randPTE := func() nvc0.PTE {
		p := nvc0.PTE{Present: r.IntN(4) != 0, ReadOnly: r.IntN(2) == 0, Privileged: r.IntN(8) == 0, Kind: uint32(r.IntN(256))}
		switch r.IntN(5) {
		case 0:
			p.Target, p.Addr = nvc0.TargetSysSnooped, uint64(r.IntN(int(e.l.RAMSize/nvc0.PageSize)+64))*nvc0.PageSize
		case 1:
			p.Target = uint32(r.IntN(4))
			p.Addr = uint64(r.Uint32()) << 8 &^ (nvc0.PageSize - 1)
		default:
			p.Addr = uint64(r.IntN(int(e.l.SliceSize/nvc0.PageSize)+64)) * nvc0.PageSize
			if r.IntN(2) == 0 {
				p.Addr &^= nvc0.LargePageSize - 1
			}
		}
		return p
	}
	switch r.IntN(10) {
	case 0, 1: // a PDE
		i := r.IntN(12)
		if r.IntN(3) == 0 { // entries next to a PD page boundary
			i = 510 + r.IntN(3)
		}
		p := nvc0.PDE{}
		if r.IntN(4) != 0 {
			p.SmallPresent, p.SmallAddr, p.Size = true, pick(), uint32(r.IntN(4))
			p.SmallSys = r.IntN(16) == 0
		}
		if r.IntN(3) == 0 {
			p.LargePresent, p.LargeAddr = true, pick()
		}
		if r.IntN(16) == 0 {
			p.SmallAddr = e.l.SliceSize - nvc0.PageSize // straddles the end
		}
		return e.setPDE(pd, i, p), nvc0.PDESize
	case 2: // a run of PTEs (a bulk write across a page boundary)
		t := pick()
		j := r.IntN(nvc0.SmallPTECount - 600)
		for k := range 600 {
			e.setPTE(t, j+k, randPTE())
		}
		return t + uint64(j)*nvc0.PTESize, 600 * nvc0.PTESize
	default:
		t := pick()
		j := r.IntN(nvc0.SmallPTECount)
		if r.IntN(2) == 0 {
			j = r.IntN(nvc0.LargePTECount)
		}
		return e.setPTE(t, j, randPTE()), nvc0.PTESize
	}
}

// TestSpaceIncrementalProperty applies random guest edits, noting each
// write, and checks after every incremental scan that the shadow equals the
// translation of the guest (what a full scan of a fresh space produces).
func TestSpaceIncrementalProperty(t *testing.T) {
	for seed := range uint64(8) {
		r := rand.New(rand.NewPCG(seed, 77))
		e := newEnv(t)
		pd := uint64(gPD) + uint64(r.IntN(64))*4 // not necessarily page (or even entry) aligned
		tables := []uint64{0x40000, 0x80000, 0xc0000, 0x100000, 0x140000}
		for i := range 3 {
			e.setPDE(pd, i, nvc0.PDE{SmallPresent: true, SmallAddr: tables[i]})
		}
		s := newSpace(t, e, pd)
		if _, err := s.Sync(); err != nil {
			t.Fatal(err)
		}
		// Half the rounds note whole edits; the other half note only the
		// 32-bit words that changed, as trapped MMIO writes would show them.
		words := false
		e.onWrite = func(ga, old, new uint64) {
			if !words {
				return
			}
			if uint32(old) != uint32(new) {
				s.NoteWrite(ga, 4)
			}
			if old>>32 != new>>32 {
				s.NoteWrite(ga+4, 4)
			}
		}
		for round := range 40 {
			words = round%2 == 1
			for range 1 + r.IntN(6) {
				a, n := randomEdit(e, r, pd, tables)
				if !words {
					s.NoteWrite(a, n)
				}
			}
			st, err := s.SyncIncremental()
			if err != nil {
				t.Fatal(err)
			}
			if st.Kind != ScanIncremental {
				t.Fatalf("seed %d round %d: %v scan", seed, round, st.Kind)
			}
			diffViews(t, e.walk(t, s.ShadowPD()), e.expected(pd))
		}
		// A fresh full scan agrees, and rescanning the incremental shadow
		// fully changes nothing.
		if st, err := s.Sync(); err != nil || st.EntriesWritten != 0 {
			t.Fatalf("seed %d: full rescan after incremental scans wrote %d entries (%v)", seed, st.EntriesWritten, err)
		}
		fresh := newSpace(t, e, pd)
		if _, err := fresh.Sync(); err != nil {
			t.Fatal(err)
		}
		diffViews(t, e.walk(t, s.ShadowPD()), e.walk(t, fresh.ShadowPD()))
		if err := errors.Join(s.Close(), fresh.Close()); err != nil {
			t.Fatal(err)
		}
		if len(e.alloc.live) != 0 {
			t.Fatalf("seed %d: %d allocations live after Close", seed, len(e.alloc.live))
		}
	}
}

// TestSpaceUnalignedPD: a page directory that is not entry aligned has PDEs
// straddling guest pages; a 32-bit write to the half of such a PDE in the
// first page must still re-read the whole PDE.
func TestSpaceUnalignedPD(t *testing.T) {
	e := newEnv(t)
	const pd = gPD + 4
	s := newSpace(t, e, pd)
	if _, err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	const i = nvc0.PageSize/nvc0.PDESize - 1 // straddles the first page boundary
	e.setPTE(gSmallX, 0, nvc0.PTE{Present: true, Addr: 0x4000})
	a := e.setPDE(pd, i, nvc0.PDE{SmallPresent: true, SmallAddr: gSmallX})
	if (a+4)>>nvc0.PageShift == a>>nvc0.PageShift {
		t.Fatalf("PDE %d at %#x does not straddle a page", i, a)
	}
	s.NoteWrite(a, 4) // only the low word changed
	st, err := s.SyncIncremental()
	if err != nil || st.PDEs != 1 {
		t.Fatalf("%+v %v", st, err)
	}
	diffViews(t, e.walk(t, s.ShadowPD()), e.expected(pd))
	_ = s.Close()
}
