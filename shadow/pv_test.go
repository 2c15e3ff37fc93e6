package shadow

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

func newPVManager(t testing.TB, e *env) *Manager {
	t.Helper()
	m, err := NewManager(Config{Memory: e.mem, Allocator: e.alloc, Translator: e.tr, MaxShadowBytes: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	m.EnablePV(PVLimits{Objects: 16, Bindings: 4})
	return m
}

func TestPVMapAndRefuse(t *testing.T) {
	e := newEnv(t)
	m := newPVManager(t, e)
	pd, err := m.PVAlloc(PVPageDir)
	if err != nil {
		t.Fatal(err)
	}
	pt, err := m.PVAlloc(PVSmallTable)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.PVMapPGT(pd, 3, pt, 0); err != nil {
		t.Fatal(err)
	}
	good := pteWord(nvc0.PTE{Present: true, Addr: 0x5000, Target: nvc0.TargetVRAM})
	sys := pteWord(nvc0.PTE{Present: true, Addr: 0x7000, Target: nvc0.TargetSysSnooped})
	if _, err := m.PVWrite(pt, 10, []uint64{good, sys}); err != nil {
		t.Fatal(err)
	}
	shadowPD, _ := m.PVShadowPD(pd)
	v := e.walk(t, shadowPD)
	if len(v.ptes) != 2 {
		t.Fatalf("walk found %d entries, want 2", len(v.ptes))
	}
	if got := decodePTE(v.ptes[key{3, false, 10}]); got.Addr != e.l.SliceBase+0x5000 {
		t.Errorf("VRAM entry maps %#x", got.Addr)
	}
	if got := decodePTE(v.ptes[key{3, false, 11}]); got.Addr != e.l.RAMBase+0x7000 {
		t.Errorf("RAM entry maps %#x", got.Addr)
	}
	for _, tc := range []struct {
		name string
		pte  uint64
	}{
		{"outside the slice", pteWord(nvc0.PTE{Present: true, Addr: testSlice, Target: nvc0.TargetVRAM})},
		{"outside RAM", pteWord(nvc0.PTE{Present: true, Addr: 64 << 20, Target: nvc0.TargetSysSnooped})},
		{"unknown target", pteWord(nvc0.PTE{Present: true, Addr: 0x1000, Target: 1})},
	} {
		// The refused entry comes after a good one: nothing of the call lands.
		if _, err := m.PVWrite(pt, 20, []uint64{good, tc.pte}); !errors.Is(err, ErrPVFault) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	if v := e.walk(t, shadowPD); len(v.ptes) != 2 {
		t.Errorf("after refused writes %d entries, want 2", len(v.ptes))
	}
	if _, err := m.PVWrite(pt, nvc0.SmallPTECount-1, []uint64{good, good}); !errors.Is(err, ErrPVRange) {
		t.Errorf("write past the table: %v", err)
	}
	if _, err := m.PVWrite(pd, 0, []uint64{good}); !errors.Is(err, ErrPVHandle) {
		t.Errorf("write to a page directory handle: %v", err)
	}
	if _, err := m.PVWrite(999, 0, []uint64{good}); !errors.Is(err, ErrPVHandle) {
		t.Errorf("write to no handle: %v", err)
	}
	pd2, _ := m.PVAlloc(PVPageDir)
	if err := m.PVMapPGT(pd2, 0, pt, 0); !errors.Is(err, ErrPVBusy) {
		t.Errorf("table linked twice: %v", err)
	}
	if err := m.PVMapPGT(pd, nvc0.PDECount, 0, 0); !errors.Is(err, ErrPVRange) {
		t.Errorf("entry beyond the directory: %v", err)
	}
}

// Freed tables are unlinked at once and their memory reused only after a
// flush of the page directory they were in.
func TestPVFreeRetires(t *testing.T) {
	e := newEnv(t)
	m := newPVManager(t, e)
	pd, _ := m.PVAlloc(PVPageDir)
	pt, _ := m.PVAlloc(PVSmallTable)
	if err := m.PVMapPGT(pd, 0, pt, 0); err != nil {
		t.Fatal(err)
	}
	shadowPD, _ := m.PVShadowPD(pd)
	if err := m.PVFree(pt); err != nil {
		t.Fatal(err)
	}
	if v := e.walk(t, shadowPD); len(v.tables) != 0 {
		t.Fatalf("freed table still linked: %v", v.tables)
	}
	var flushed []uint64
	if err := m.Reclaim(func(pd uint64) error { flushed = append(flushed, pd); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(flushed) != 1 || flushed[0] != shadowPD {
		t.Errorf("flushed %#x, want the directory %#x", flushed, shadowPD)
	}
	if err := m.PVFree(pt); !errors.Is(err, ErrPVHandle) {
		t.Errorf("double free: %v", err)
	}
	if err := m.PVFree(pd); err != nil {
		t.Fatal(err)
	}
	_ = m.Reclaim(nil)
	if len(e.alloc.live) != 0 {
		t.Errorf("%d allocations live after freeing everything", len(e.alloc.live))
	}
}

// A channel keeps its bound page directory after the guest frees the handle,
// until the channel refreshes.
func TestPVChannelKeepsDirectory(t *testing.T) {
	e := newEnv(t)
	m := newPVManager(t, e)
	pd, _ := m.PVAlloc(PVPageDir)
	const ramin = 0x10000
	if err := m.PVBind(ramin, pd); err != nil {
		t.Fatal(err)
	}
	c, err := m.OpenChannel(ramin)
	if err != nil {
		t.Fatal(err)
	}
	// The user area must be valid for the channel to be valid.
	e.setG64(ramin+nvc0.RAMINUserLo, pdeWordAddr(0x20000))
	_ = c.Refresh()
	shadowPD, _ := m.PVShadowPD(pd)
	if c.Space() == nil || c.Space().ShadowPD() != shadowPD {
		t.Fatalf("channel space %v, err %v", c.Space(), c.Err())
	}
	if err := m.PVFree(pd); err != nil {
		t.Fatal(err)
	}
	if m.Retired() != 0 {
		t.Fatal("the directory was retired while a channel uses it")
	}
	if !c.Dirty() {
		t.Fatal("channel not due for a refresh after its directory was freed")
	}
	if err := c.Refresh(); !errors.Is(err, ErrInvalidChannel) {
		t.Fatalf("refresh without a bound directory: %v", err)
	}
	if m.Retired() == 0 {
		t.Fatal("the directory was not retired once the channel let go")
	}
	if err := m.PVBind(ramin+8, 0); !errors.Is(err, ErrPVInval) {
		t.Errorf("unaligned instance block: %v", err)
	}
	if err := m.PVBind(testSlice, 0); !errors.Is(err, ErrPVFault) {
		t.Errorf("instance block outside the slice: %v", err)
	}
}

// pdeWordAddr is a RAMIN address field (VRAM target) for addr.
func pdeWordAddr(addr uint64) uint64 {
	lo, hi := nvc0.RAMINAddrEncode(addr)
	return uint64(lo) | uint64(hi)<<32
}

func TestPVLimits(t *testing.T) {
	e := newEnv(t)
	m := newPVManager(t, e)
	var err error
	n := 0
	for ; n < 100 && err == nil; n++ {
		_, err = m.PVAlloc(PVLargeTable)
	}
	if !errors.Is(err, ErrPVLimit) || n != 17 {
		t.Errorf("after %d allocations: %v", n, err)
	}
	m2 := newPVManager(t, newEnv(t))
	m2.pv.limits.Objects = 1000
	for err = nil; err == nil; {
		_, err = m2.PVAlloc(PVSmallTable)
	}
	if !errors.Is(err, ErrQuota) {
		t.Errorf("over the byte budget: %v", err)
	}
}

// FuzzPVBuilder drives a PV manager with random operations (allocate,
// free, link, write entries with random words, bind, reclaim) and checks,
// after each, that every live page directory walks to live tables whose
// present entries lie in the VM's slice or RAM, and that every accepted
// write installed the translation of what was given.
func FuzzPVBuilder(f *testing.F) {
	f.Add([]byte{0, 0, 1, 1, 3, 0, 1, 2, 4, 1, 0, 5, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0})
	f.Add([]byte{0, 0, 1, 0, 3, 0, 1, 9, 2, 0, 6, 4, 1, 3, 0x05, 0x10, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		e := newEnv(t)
		m := newPVManager(t, e)
		var handles []uint32
		pick := func(b byte) uint32 {
			if len(handles) == 0 || b == 0xff {
				return uint32(b)
			}
			return handles[int(b)%len(handles)]
		}
		for len(data) >= 2 {
			op, arg := data[0]%7, data[1]
			data = data[2:]
			switch op {
			case 0:
				if h, err := m.PVAlloc(PVKind(arg%3 + 1)); err == nil {
					handles = append(handles, h)
				}
			case 1:
				_ = m.PVFree(pick(arg))
			case 2:
				if len(data) < 2 {
					return
				}
				_ = m.PVMapPGT(pick(arg), uint32(data[0])%8, pick(data[1]), 0)
				data = data[2:]
			case 3:
				if len(data) < 9 {
					return
				}
				pt := pick(arg)
				idx := uint32(data[0])
				w := binary.LittleEndian.Uint64(data[1:9])
				data = data[9:]
				before, _ := m.PVEntries(pt)
				_, err := m.PVWrite(pt, idx, []uint64{w, w + nvc0.PageSize<<4})
				after, _ := m.PVEntries(pt)
				if err != nil {
					if before != nil && after[idx] != before[idx] {
						t.Fatalf("refused write changed entry %d", idx)
					}
					continue
				}
				_, large, _ := m.PVTableEntries(pt)
				tr := m.tr.PTE
				if large {
					tr = m.tr.LargePTE
				}
				want, _ := tr(nvc0.DecodePTE(uint32(w), uint32(w>>32)))
				if got := decodePTE(after[idx]); got != want {
					t.Fatalf("entry %d is %+v, want %+v", idx, got, want)
				}
			case 4:
				_ = m.PVBind(uint64(arg)<<12, pick(arg))
			case 5:
				_ = m.Reclaim(nil)
			case 6:
				_ = m.PVMapPGT(pick(arg), uint32(arg)%8, 0, pick(arg>>1))
			}
			for _, h := range handles {
				if pd, err := m.PVShadowPD(h); err == nil {
					e.walk(t, pd)
				}
			}
		}
	})
}

// failingMem fails writes while fail is set.
type failingMem struct {
	*flatMem
	fail bool
}

func (m *failingMem) WriteVRAM(p []byte, addr uint64) error {
	if m.fail {
		return errors.New("injected write failure")
	}
	return m.flatMem.WriteVRAM(p, addr)
}

// A table moved between two directories over and over is listed once per
// directory for the flush before its memory is reused, not once per move
// (a guest looping MAP_PGT would otherwise grow the list, and the retired
// queue at free, without bound).
func TestPVFlushListBounded(t *testing.T) {
	e := newEnv(t)
	m := newPVManager(t, e)
	a, _ := m.PVAlloc(PVPageDir)
	b, _ := m.PVAlloc(PVPageDir)
	tab, _ := m.PVAlloc(PVLargeTable)
	for range 1000 {
		for _, pd := range []uint32{a, b} {
			if err := m.PVMapPGT(pd, 0, 0, tab); err != nil {
				t.Fatal(err)
			}
			if err := m.PVMapPGT(pd, 0, 0, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := len(m.pv.objs[tab].flushPDs); n != 2 {
		t.Errorf("the table lists %d directories to flush, want 2", n)
	}
	if err := m.PVFree(tab); err != nil {
		t.Fatal(err)
	}
	if m.Retired() != 2 {
		t.Errorf("%d retired entries after freeing the table, want 2", m.Retired())
	}
}

// A directory entry that cannot be written changes nothing: the old table
// stays linked (and held), the new one stays unlinked, and a free that
// cannot unlink keeps the handle.
func TestPVLinkWriteFailure(t *testing.T) {
	e := newEnv(t)
	fm := &failingMem{flatMem: e.mem}
	m, err := NewManager(Config{Memory: fm, Allocator: e.alloc, Translator: e.tr, MaxShadowBytes: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	m.EnablePV(PVLimits{Objects: 16, Bindings: 4})
	pd, _ := m.PVAlloc(PVPageDir)
	small, _ := m.PVAlloc(PVSmallTable)
	large, _ := m.PVAlloc(PVLargeTable)
	if err := m.PVMapPGT(pd, 5, small, 0); err != nil {
		t.Fatal(err)
	}
	fm.fail = true
	if err := m.PVMapPGT(pd, 5, 0, large); err == nil {
		t.Fatal("a failed directory write succeeded")
	}
	if err := m.PVFree(small); err == nil {
		t.Fatal("a free whose unlink failed succeeded")
	}
	fm.fail = false
	s := m.pv.objs[pd].space
	if s.small[5] != m.pv.objs[small].tab || s.large[5] != nil || m.pv.objs[small].in != s || m.pv.objs[large].in != nil {
		t.Fatalf("after failed writes the directory records small %v large %v", s.small[5], s.large[5])
	}
	shadowPD, _ := m.PVShadowPD(pd)
	if v := e.walk(t, shadowPD); len(v.tables) != 1 {
		t.Errorf("the directory links %d tables, want the small one", len(v.tables))
	}
	if err := m.PVFree(large); err != nil {
		t.Fatal(err)
	}
	_ = m.Reclaim(nil)
	if v := e.walk(t, shadowPD); len(v.tables) != 1 {
		t.Errorf("after the large table was freed the directory links %d tables", len(v.tables))
	}
}
