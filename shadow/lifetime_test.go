package shadow

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// logAlloc is a recAlloc that also logs its frees, so tests can check that
// a TLB flush came first.
type logAlloc struct {
	*recAlloc
	log *[]string
}

func (l logAlloc) Free(addr uint64) error {
	*l.log = append(*l.log, fmt.Sprintf("free %#x", addr))
	return l.recAlloc.Free(addr)
}

// TestReclaimFlushesBeforeFree: memory a released space held (its page
// directory and tables) stays allocated until Reclaim, which flushes the TLB
// of that page directory before any of it is freed; a failing flush frees
// nothing.
func TestReclaimFlushesBeforeFree(t *testing.T) {
	e := newEnv(t)
	buildGuest(e)
	var log []string
	m, err := NewManager(Config{Memory: e.mem, Allocator: logAlloc{e.alloc, &log}, Translator: e.tr})
	if err != nil {
		t.Fatal(err)
	}
	s, err := m.Acquire(gPD)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	pd, live := s.ShadowPD(), len(e.alloc.live)
	if err := m.Release(s); err != nil {
		t.Fatal(err)
	}
	if len(log) != 0 || len(e.alloc.live) != live || m.Retired() != live {
		t.Fatalf("release freed memory at once (%v) or retired %d of %d", log, m.Retired(), live)
	}
	boom := errors.New("flush timed out")
	if err := m.Reclaim(func(uint64) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("Reclaim with a failing flush: %v", err)
	}
	if len(log) != 0 || m.Retired() != live {
		t.Fatalf("a failed flush still freed memory: %v", log)
	}
	if err := m.Reclaim(func(p uint64) error { log = append(log, fmt.Sprintf("flush %#x", p)); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(log) != live+1 || log[0] != fmt.Sprintf("flush %#x", pd) {
		t.Fatalf("reclaim log %v: want one flush of %#x, then %d frees", log, pd, live)
	}
	if len(e.alloc.live) != 0 || m.Retired() != 0 {
		t.Fatalf("%d allocations live, %d retired after Reclaim", len(e.alloc.live), m.Retired())
	}
}

// TestScanRetiresUnlinkedTables: a table a rescan unlinks (the guest PDE
// changed) is not freed during the scan — a page walk that read the old PDE
// may still be in it — but retired, to be freed after a flush of the
// space's page directory.
func TestScanRetiresUnlinkedTables(t *testing.T) {
	e := newEnv(t)
	buildGuest(e)
	m := newManager(t, e, 0)
	s, err := m.Acquire(gPD)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	old := decodePDE(e.mem.read64(s.ShadowPD())).SmallAddr
	e.setPDE(gPD, 0, nvc0.PDE{}) // the guest unmaps PDE 0's table
	m.NoteWrite(gPD, nvc0.PDESize)
	if _, err := s.SyncIncremental(); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.alloc.live[old]; !ok || m.Retired() != 1 {
		t.Fatalf("the unlinked table at %#x was freed during the scan (retired %d)", old, m.Retired())
	}
	var flushed []uint64
	if err := m.Reclaim(func(pd uint64) error { flushed = append(flushed, pd); return nil }); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(flushed, []uint64{s.ShadowPD()}) {
		t.Fatalf("flushed %#x, want the space's page directory %#x", flushed, s.ShadowPD())
	}
	if _, ok := e.alloc.live[old]; ok {
		t.Fatal("the unlinked table is still allocated after Reclaim")
	}
}

// TestTrackerOneWatchPerPage: however many PDEs name the same guest page
// table (16 here), the tracker holds one watch for its pages, so a write costs one
// notification; the pages are trapped and their kinds reported.
func TestTrackerOneWatchPerPage(t *testing.T) {
	e := newEnv(t)
	for i := range 16 {
		e.setPDE(gPD, i, nvc0.PDE{SmallPresent: true, SmallAddr: gSmall0})
	}
	m := newManager(t, e, 0)
	s, err := m.Acquire(gPD)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	tr := m.Tracker()
	if n := len(tr.pages[gSmall0>>nvc0.PageShift]); n != 1 {
		t.Fatalf("%d watches on a page table page named by 16 PDEs, want 1", n)
	}
	if !tr.Trapped(gSmall0) || !tr.Trapped(gPD) || tr.Trapped(gData) {
		t.Fatal("tracked pages not trapped, or a data page trapped")
	}
	if k := tr.Kinds(gSmall0); !slices.Equal(k, []Kind{KindPageTable}) {
		t.Fatalf("kinds %v", k)
	}
	before := m.Counters().WritesNoted
	if !m.NoteWrite(gSmall0+8, 4) || m.NoteWrite(gData, 4) || m.Counters().WritesNoted != before+1 {
		t.Fatal("write to a watched page not noted once, or a data page noted")
	}
	if err := errors.Join(m.Release(s), m.Reclaim(nil)); err != nil {
		t.Fatal(err)
	}
	if tr.Pages() != 0 {
		t.Fatalf("%d pages still tracked after the space went", tr.Pages())
	}
}

// TestUserAreaDoorbell: a trapped write to the GP_PUT word of a channel's
// user area is reported (a doorbell), whatever else the page holds; other
// words are not. User areas trap only when configured to.
func TestUserAreaDoorbell(t *testing.T) {
	for _, trap := range []bool{true, false} {
		t.Run(fmt.Sprintf("trap=%v", trap), func(t *testing.T) {
			e := newEnv(t)
			buildGuest(e)
			var rung []*Channel
			m, err := NewManager(Config{Memory: e.mem, Allocator: e.alloc, Translator: e.tr, TrapUserAreas: trap,
				UserAreaWrite: func(c *Channel) { rung = append(rung, c) }})
			if err != nil {
				t.Fatal(err)
			}
			e.writeRAMIN(gRAMIN, gPD, gUser, 0x1000000, 10, nvc0.VASize-1)
			c, err := m.OpenChannel(gRAMIN)
			if err != nil || !c.Valid() {
				t.Fatalf("open: %v %v", err, c.Err())
			}
			m.NoteWrite(gUser+nvc0.UserGPGet, 4)
			m.NoteWrite(gUser+nvc0.UserGPPut, 4)
			m.NoteWrite(gUser+nvc0.UserGPPut-4, 8) // a wider write covering it
			if len(rung) != 2 || rung[0] != c {
				t.Fatalf("%d doorbells, want 2", len(rung))
			}
			if got := m.IsSensitive(gUser); got != trap {
				t.Errorf("user area page trapped: %v, want %v", got, trap)
			}
			if !m.IsSensitive(gRAMIN) {
				t.Error("RAMIN page not trapped")
			}
			// The guest moves its user area: the old page is no longer watched.
			binary.LittleEndian.PutUint32(e.mem.vram[e.l.SliceBase+gRAMIN+nvc0.RAMINUserLo:], gUser+nvc0.PageSize)
			m.NoteWrite(gRAMIN+nvc0.RAMINUserLo, 4)
			if err := c.Refresh(); err != nil {
				t.Fatal(err)
			}
			m.NoteWrite(gUser+nvc0.UserGPPut, 4)
			m.NoteWrite(gUser+nvc0.PageSize+nvc0.UserGPPut, 4)
			if len(rung) != 3 {
				t.Fatalf("%d doorbells after the move, want 3", len(rung))
			}
			if err := errors.Join(c.Close(), m.Close(), m.Reclaim(nil)); err != nil {
				t.Fatal(err)
			}
			if m.Tracker().Pages() != 0 || len(e.alloc.live) != 0 {
				t.Fatalf("%d pages tracked, %d allocations live after close", m.Tracker().Pages(), len(e.alloc.live))
			}
		})
	}
}

// TestBARSpace: a guest BAR address space is mirrored into a fixed run of
// physical PTE slots by the same translation as channel tables: entries
// outside the slice map nothing, the guest's structures are watched, the
// aperture pages report the guest pages they map, and Clear unmaps all.
func TestBARSpace(t *testing.T) {
	e := newEnv(t)
	m := newManager(t, e, 0)
	const pages = 64
	dst := uint64(0x40000) // physical PTE slots, in the reserve
	b := m.NewBARSpace(dst, pages)
	const ramin, pd, pt = 0x300000, 0x310000, 0x320000
	e.writeRAMIN(ramin, pd, 0, 0, 0, pages*nvc0.PageSize-1)
	e.setPDE(pd, 0, nvc0.PDE{SmallPresent: true, SmallAddr: pt})
	e.setPTE(pt, 0, nvc0.PTE{Present: true, Addr: gData, Target: nvc0.TargetVRAM})
	e.setPTE(pt, 1, nvc0.PTE{Present: true, Addr: e.l.SliceSize, Target: nvc0.TargetVRAM}) // outside: dropped
	e.setPTE(pt, 2, nvc0.PTE{Present: true, Addr: 0x1000, Target: nvc0.TargetSysSnooped})
	e.setPTE(pt, pages, nvc0.PTE{Present: true, Addr: gData, Target: nvc0.TargetVRAM}) // beyond the limit
	b.SetInstance(true, ramin)
	st, err := b.Sync()
	if err != nil || !st.Changed() {
		t.Fatalf("Sync: %+v %v", st, err)
	}
	phys := func(i int) nvc0.PTE { return decodePTE(e.mem.read64(dst + uint64(i)*nvc0.PTESize)) }
	if p := phys(0); !p.Present || p.Addr != e.l.SliceBase+gData || b.GuestPage(0) != gData {
		t.Errorf("page 0: %+v, guest page %#x", p, b.GuestPage(0))
	}
	if p := phys(1); p.Present || b.GuestPage(1) != NoGuestPage {
		t.Errorf("page 1 (outside the slice) maps %+v", p)
	}
	if p := phys(2); !p.Present || !p.IsSystem() || p.Addr != e.l.RAMBase+0x1000 || b.GuestPage(2) != NoGuestPage {
		t.Errorf("page 2 (system memory): %+v", p)
	}
	if e.mem.read64(dst+pages*nvc0.PTESize) != 0 {
		t.Error("an entry past the slice was written")
	}
	tr := m.Tracker()
	for _, g := range []uint64{ramin, pd, pt} {
		if !tr.Trapped(g) {
			t.Errorf("guest page %#x of the BAR space not trapped", g)
		}
	}
	if b.GuestPD() != pd {
		t.Errorf("GuestPD %#x", b.GuestPD())
	}
	// A guest write to its table is seen; a rescan applies it.
	e.setPTE(pt, 0, nvc0.PTE{})
	m.NoteWrite(pt, 8)
	if !b.Dirty() {
		t.Fatal("a write to the guest BAR page table went unseen")
	}
	if _, err := b.Sync(); err != nil || phys(0).Present {
		t.Fatalf("unmapped page still present after Sync (%v)", err)
	}
	// The instance moves outside the slice: nothing maps.
	e.setPTE(pt, 0, nvc0.PTE{Present: true, Addr: gData, Target: nvc0.TargetVRAM})
	b.SetInstance(true, e.l.SliceSize)
	if _, err := b.Sync(); err != nil {
		t.Fatal(err)
	}
	for i := range pages {
		if phys(i).Present {
			t.Fatalf("page %d maps with the instance outside the slice", i)
		}
	}
	if tr.Pages() != 0 {
		t.Errorf("%d pages still tracked", tr.Pages())
	}
	b.SetInstance(true, ramin)
	if _, err := b.Sync(); err != nil || !phys(0).Present {
		t.Fatalf("remap after a valid instance again: %v", err)
	}
	if st, err := b.Clear(); err != nil || !st.Changed() {
		t.Fatalf("Clear: %+v %v", st, err)
	}
	for i := range pages {
		if phys(i).Present {
			t.Fatalf("page %d maps after Clear", i)
		}
	}
}
