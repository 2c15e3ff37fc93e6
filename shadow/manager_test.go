package shadow

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

func newManager(t testing.TB, e *env, quota uint64) *Manager {
	t.Helper()
	m, err := NewManager(Config{Memory: e.mem, Allocator: e.alloc, Translator: e.tr, MaxShadowBytes: quota})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestManagerSharesSpaces(t *testing.T) {
	e := newEnv(t)
	buildGuest(e)
	const gPD2 = 0x200000
	e.setPDE(gPD2, 0, nvc0.PDE{SmallPresent: true, SmallAddr: gSmall0}) // shares a table with gPD
	m := newManager(t, e, 0)
	a, err := m.Acquire(gPD)
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Acquire(gPD)
	if err != nil {
		t.Fatal(err)
	}
	c, err := m.Acquire(gPD2)
	if err != nil {
		t.Fatal(err)
	}
	if a != b || a == c || m.NumSpaces() != 2 {
		t.Fatalf("sharing: a==b %v a==c %v spaces %d", a == b, a == c, m.NumSpaces())
	}
	if _, err := m.Acquire(e.l.SliceSize); !errors.Is(err, ErrOutsideSlice) {
		t.Errorf("Acquire outside slice: %v", err)
	}
	for _, s := range []*Space{a, c} {
		if _, err := s.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	diffViews(t, e.walk(t, c.ShadowPD()), e.expected(gPD2))

	// A write to the shared guest table reaches both spaces.
	addr := e.setPTE(gSmall0, 3, nvc0.PTE{Present: true, Addr: 0xc000})
	if !m.NoteWrite(addr, nvc0.PTESize) || !m.IsSensitive(addr) {
		t.Fatal("write to a shared table not noted")
	}
	if m.NoteWrite(gData, 8) || m.IsSensitive(gData) {
		t.Fatal("data page reported sensitive")
	}
	for _, s := range []*Space{a, c} {
		st, err := s.SyncIncremental()
		if err != nil || st.Kind != ScanIncremental || st.EntriesWritten != 1 {
			t.Fatalf("shared table incremental: %+v %v", st, err)
		}
	}
	diffViews(t, e.walk(t, a.ShadowPD()), e.expected(gPD))
	diffViews(t, e.walk(t, c.ShadowPD()), e.expected(gPD2))
	cn := m.Counters()
	if cn.FullScans != 2 || cn.IncrementalScans != 2 || cn.WritesNoted != 1 || cn.PTEsScanned == 0 || cn.ShadowTime <= 0 {
		t.Errorf("counters %+v", cn)
	}

	// Release: shared space stays until its last reference goes.
	for _, s := range []*Space{a, c} {
		if err := m.Release(s); err != nil {
			t.Fatal(err)
		}
	}
	if m.NumSpaces() != 1 || m.ShadowBytes() == 0 {
		t.Fatalf("after partial release: %d spaces", m.NumSpaces())
	}
	if err := m.Release(b); err != nil {
		t.Fatal(err)
	}
	if err := m.Release(b); err == nil {
		t.Error("double release accepted")
	}
	if m.Retired() == 0 || len(e.alloc.live) == 0 {
		t.Fatal("released shadow memory was freed before Reclaim")
	}
	if err := m.Reclaim(nil); err != nil {
		t.Fatal(err)
	}
	if m.NumSpaces() != 0 || m.ShadowBytes() != 0 || len(e.alloc.live) != 0 {
		t.Fatalf("after release: %d spaces, %d bytes, %d live allocations", m.NumSpaces(), m.ShadowBytes(), len(e.alloc.live))
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestManagerQuota: a guest pointing every PDE at the same table cannot make
// the VM's shadows exceed the quota; the shadow stays safe and all memory is
// returned.
func TestManagerQuota(t *testing.T) {
	e := newEnv(t)
	for i := range 64 {
		e.setPDE(gPD, i, nvc0.PDE{SmallPresent: true, SmallAddr: gSmall0})
	}
	e.setPTE(gSmall0, 0, nvc0.PTE{Present: true, Addr: gData})
	m := newManager(t, e, 1<<20)
	s, err := m.Acquire(gPD)
	if err != nil {
		t.Fatal(err)
	}
	st, err := s.Sync()
	if !errors.Is(err, ErrQuota) {
		t.Fatalf("Sync: %v", err)
	}
	if st.TablesBuilt != 3 || m.ShadowBytes() > 1<<20 {
		t.Errorf("built %d tables, %d bytes", st.TablesBuilt, m.ShadowBytes())
	}
	v := e.walk(t, s.ShadowPD())
	if len(v.tables) != 3 {
		t.Errorf("%d shadow tables linked", len(v.tables))
	}
	if !s.Dirty() {
		t.Error("failed scan does not force a full rescan")
	}
	if err := errors.Join(m.Close(), m.Reclaim(nil)); err != nil {
		t.Fatal(err)
	}
	if len(e.alloc.live) != 0 {
		t.Errorf("%d allocations live", len(e.alloc.live))
	}
}

// TestChannelRefusesUnsafeRAMIN: what a RAMIN names outside the page tables
// — engine contexts at physical addresses, contexts for engines the board
// lacks, a page directory or user area outside VRAM — leaves the channel
// invalid, and the shadow never names it.
func TestChannelRefusesUnsafeRAMIN(t *testing.T) {
	for _, tc := range []struct {
		name string
		off  int
		val  uint32 // written to the low word
		want error
	}{
		{"physical CE0 context (another VM's VRAM)", nvc0.RAMINEngineCE0, 0x0100_0000, ErrEngineContext},
		{"physical GR context", nvc0.RAMINEngineGR, 0x0000_1000, ErrEngineContext},
		{"video engine context", nvc0.RAMINEngineMSVLD, 0x1000 | nvc0.RAMINEngineVirtual, ErrEngineContext},
		{"page directory in system memory", nvc0.RAMINPageDir, uint32(gPD) | nvc0.MemTargetSysCoherent, ErrNotVRAM},
		{"user area in system memory", nvc0.RAMINUserLo, uint32(gUser) | nvc0.MemTargetSysNonCoherent, ErrNotVRAM},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			buildGuest(e)
			m := newManager(t, e, 0)
			e.writeRAMIN(gRAMIN, gPD, gUser, 0x1000_0000, 10, nvc0.VASize-1)
			g := e.mem.vram[e.l.SliceBase+gRAMIN:][:nvc0.RAMINSize]
			binary.LittleEndian.PutUint32(g[tc.off:], tc.val)
			c, err := m.OpenChannel(gRAMIN)
			if err != nil {
				t.Fatal(err)
			}
			if c.Valid() || !errors.Is(c.Err(), ErrInvalidChannel) || !errors.Is(c.Err(), tc.want) {
				t.Fatalf("channel valid %v, err %v; want %v", c.Valid(), c.Err(), tc.want)
			}
			sh := e.mem.vram[c.ShadowRAMIN():][:nvc0.RAMINSize]
			if tc.want == ErrEngineContext && binary.LittleEndian.Uint32(sh[tc.off:]) != 0 {
				t.Errorf("the shadow holds the refused pointer %#x", binary.LittleEndian.Uint32(sh[tc.off:]))
			}
			if lo := binary.LittleEndian.Uint32(sh[nvc0.RAMINPageDir:]); lo&nvc0.RAMINAddrTargetMask != nvc0.MemTargetVRAM {
				t.Errorf("shadow page directory target %d", lo&nvc0.RAMINAddrTargetMask)
			}
		})
	}
}

// Guest RAMIN layout for the channel tests.
const (
	gRAMIN = 0x300000
	gUser  = 0x301000
)

func (e *env) writeRAMIN(ramin, pd, user, gpfifoVA uint64, log2 uint, limit uint64) {
	b := e.mem.vram[e.l.SliceBase+ramin:]
	for i := range nvc0.RAMINSize {
		b[i] = byte(i*7 + 1) // opaque engine state, copied as is
	}
	binary.LittleEndian.PutUint32(b[nvc0.RAMINUserLo:], uint32(user))
	binary.LittleEndian.PutUint32(b[nvc0.RAMINUserHi:], uint32(user>>32))
	// Engine contexts as gf100_ectx_bind writes them (VA | 4); no video
	// engines.
	for i, e := range engineContexts() {
		lo, hi := uint32(0), uint32(0)
		if e.served {
			lo, hi = nvc0.RAMINEngineEncode(0x7_0000_0000 + uint64(i)*nvc0.EngineContextSize)
		}
		binary.LittleEndian.PutUint32(b[e.off:], lo)
		binary.LittleEndian.PutUint32(b[e.off+4:], hi)
	}
	binary.LittleEndian.PutUint32(b[nvc0.RAMINGPFIFOLo:], uint32(gpfifoVA))
	binary.LittleEndian.PutUint32(b[nvc0.RAMINGPFIFOHi:], nvc0.GPFIFOHiEncode(gpfifoVA, log2))
	binary.LittleEndian.PutUint64(b[nvc0.RAMINPageDir:], pd)
	binary.LittleEndian.PutUint64(b[nvc0.RAMINAddrLimit:], limit)
}

func TestChannel(t *testing.T) {
	e := newEnv(t)
	buildGuest(e)
	m := newManager(t, e, 0)
	const ringVA = 0x12_3456_7000
	e.writeRAMIN(gRAMIN, gPD, gUser, ringVA, 25, nvc0.VASize-1)
	c, err := m.OpenChannel(gRAMIN)
	if err != nil {
		t.Fatal(err)
	}
	if !c.Valid() {
		t.Fatal(c.Err())
	}
	st, err := c.Activate()
	if err != nil || st.Kind != ScanFull {
		t.Fatalf("Activate: %+v %v", st, err)
	}
	diffViews(t, e.walk(t, c.Space().ShadowPD()), e.expected(gPD))

	sh := e.mem.vram[c.ShadowRAMIN():][:nvc0.RAMINSize]
	g := e.mem.vram[e.l.SliceBase+gRAMIN:][:nvc0.RAMINSize]
	if pd := binary.LittleEndian.Uint64(sh[nvc0.RAMINPageDir:]); pd != c.Space().ShadowPD() {
		t.Errorf("shadow PD field %#x, want %#x", pd, c.Space().ShadowPD())
	}
	user := uint64(binary.LittleEndian.Uint32(sh[nvc0.RAMINUserHi:]))<<32 | uint64(binary.LittleEndian.Uint32(sh[nvc0.RAMINUserLo:]))
	if user != c.ShadowUserArea() || user >= testReserved || user%nvc0.PageSize != 0 {
		t.Errorf("shadow RAMIN user area %#x, want the shadow user area %#x in the reserve", user, c.ShadowUserArea())
	}
	if c.UserArea() != e.l.SliceBase+gUser || c.GuestUserArea() != gUser {
		t.Errorf("guest user area %#x (guest %#x), want %#x", c.UserArea(), c.GuestUserArea(), e.l.SliceBase+gUser)
	}
	va, entries := nvc0.GPFIFODecode(binary.LittleEndian.Uint32(sh[nvc0.RAMINGPFIFOLo:]), binary.LittleEndian.Uint32(sh[nvc0.RAMINGPFIFOHi:]))
	if va != ringVA || entries != 1<<MaxGPFIFOLog2Entries {
		t.Errorf("shadow GPFIFO %#x/%d entries, want %#x/%d", va, entries, uint64(ringVA), 1<<MaxGPFIFOLog2Entries)
	}
	special := map[int]bool{}
	for _, f := range RAMINFields() {
		if f.Offset == nvc0.RAMINGPFIFOLo || f.Offset == nvc0.RAMINAddrLimit {
			continue // kept: compared below with the rest
		}
		for i := range int(f.Size) {
			special[int(f.Offset)+i] = true
		}
	}
	for i := range nvc0.RAMINSize {
		if !special[i] && sh[i] != g[i] {
			t.Fatalf("shadow RAMIN byte %#x = %#x, guest %#x", i, sh[i], g[i])
		}
	}
	// Virtual engine context pointers are kept.
	for _, off := range []int{nvc0.RAMINEngineGR, nvc0.RAMINEngineCE0, nvc0.RAMINEngineCE1} {
		if binary.LittleEndian.Uint64(sh[off:]) != binary.LittleEndian.Uint64(g[off:]) {
			t.Errorf("engine context pointer at +%#x not kept", off)
		}
	}

	// The guest moves its user area outside the slice: invalid, and the
	// shadow never names memory outside the slice.
	binary.LittleEndian.PutUint32(g[nvc0.RAMINUserLo:], uint32(e.l.SliceSize))
	if !m.NoteWrite(gRAMIN+nvc0.RAMINUserLo, 4) || !c.Dirty() || !m.IsSensitive(gRAMIN) {
		t.Fatal("RAMIN write not noted")
	}
	if _, err := c.Activate(); !errors.Is(err, ErrInvalidChannel) || !errors.Is(err, ErrOutsideSlice) {
		t.Fatalf("Activate with bad user area: %v", err)
	}
	if c.Valid() {
		t.Fatal("channel valid with user area outside the slice")
	}
	user = uint64(binary.LittleEndian.Uint32(sh[nvc0.RAMINUserHi:]))<<32 | uint64(binary.LittleEndian.Uint32(sh[nvc0.RAMINUserLo:]))
	if user != c.ShadowUserArea() {
		t.Fatalf("invalid channel's shadow RAMIN names user area %#x, not its shadow", user)
	}
	// The field holds a page address: the low bits are the memory target
	// and flags, so a user area cannot straddle the slice end.
	binary.LittleEndian.PutUint32(g[nvc0.RAMINUserLo:], uint32(e.l.SliceSize-nvc0.UserAreaSize/2))
	if err := c.Refresh(); err != nil || c.GuestUserArea() != e.l.SliceSize-nvc0.UserAreaSize {
		t.Fatalf("sub-page user area: %v, at %#x", err, c.GuestUserArea())
	}
	binary.LittleEndian.PutUint32(g[nvc0.RAMINUserLo:], gUser)
	if err := c.Refresh(); err != nil {
		t.Fatal(err)
	}

	// The guest switches page directory: the channel moves to another space,
	// the old one is released.
	const gPD2 = 0x200000
	e.setPDE(gPD2, 0, nvc0.PDE{SmallPresent: true, SmallAddr: gSmallX})
	old := c.Space()
	binary.LittleEndian.PutUint64(g[nvc0.RAMINPageDir:], gPD2)
	m.NoteWrite(gRAMIN+nvc0.RAMINPageDir, 8)
	if _, err := c.Activate(); err != nil {
		t.Fatal(err)
	}
	if c.Space() == old || c.Space().GuestPD() != gPD2 || m.NumSpaces() != 1 {
		t.Fatalf("space not switched (%d spaces)", m.NumSpaces())
	}
	if binary.LittleEndian.Uint64(sh[nvc0.RAMINPageDir:]) != c.Space().ShadowPD() {
		t.Fatal("shadow PD field not updated")
	}
	// A page directory outside the slice: invalid, empty shadow PD.
	binary.LittleEndian.PutUint64(g[nvc0.RAMINPageDir:], e.l.SliceSize)
	if err := c.Refresh(); !errors.Is(err, ErrInvalidChannel) {
		t.Fatalf("PD outside slice: %v", err)
	}
	if c.Space() != nil || m.NumSpaces() != 0 {
		t.Fatal("space kept for invalid PD")
	}
	if v := e.walk(t, binary.LittleEndian.Uint64(sh[nvc0.RAMINPageDir:])); len(v.tables) != 0 {
		t.Fatal("invalid channel's shadow PD maps something")
	}

	if _, err := m.OpenChannel(e.l.SliceSize - 0x800); !errors.Is(err, ErrOutsideSlice) {
		t.Errorf("RAMIN straddling slice end: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(m.Close(), m.Reclaim(nil)); err != nil {
		t.Fatal(err)
	}
	if len(e.alloc.live) != 0 {
		t.Errorf("%d allocations live after Close", len(e.alloc.live))
	}
}

func TestRAMINFieldsDocumented(t *testing.T) {
	seen := map[uint32]bool{}
	for _, f := range RAMINFields() {
		if f.Name == "" || f.Treatment == "" || f.Size == 0 || f.Offset+f.Size > nvc0.RAMINSize || seen[f.Offset] {
			t.Errorf("bad field %+v", f)
		}
		seen[f.Offset] = true
	}
	for _, off := range []uint32{nvc0.RAMINUserLo, nvc0.RAMINPageDir, nvc0.RAMINGPFIFOHi} {
		if !seen[off] {
			t.Errorf("field %#x missing", off)
		}
	}
}
