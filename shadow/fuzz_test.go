package shadow

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// fuzzLayout derives a valid layout from fuzzed numbers, or reports false.
func fuzzLayout(sb, ss, rb, rs uint64) (Layout, bool) {
	const reserved = 16 << 20
	l := Layout{
		SliceBase: reserved + (sb%(1<<30))&^(nvc0.PageSize-1),
		SliceSize: (1 + ss%(1<<30)) << nvc0.PageShift >> 6 &^ (nvc0.PageSize - 1),
		RAMBase:   (rb % (1 << 39)) &^ (nvc0.PageSize - 1),
		RAMSize:   (rs % (1 << 36)) &^ (nvc0.PageSize - 1),
	}
	l.Reserved = []Range{{0, reserved}, {l.SliceBase + l.SliceSize, reserved}}
	if l.SliceSize == 0 || l.RAMBase+l.RAMSize > 1<<40 {
		return l, false
	}
	return l, true
}

func FuzzTranslatePTE(f *testing.F) {
	f.Add(uint32(0x1001), uint32(0), false, uint64(0), uint64(1<<20), uint64(1<<32), uint64(1<<30))
	f.Add(uint32(0xFFFFFFF1), uint32(0x5), true, uint64(0x123000), uint64(77), uint64(0), uint64(0))
	f.Add(uint32(0x20003), uint32(0x7|0xfe0), true, uint64(1<<29), uint64(1<<20), uint64(1<<33), uint64(1<<31))
	f.Fuzz(func(t *testing.T, lo, hi uint32, large bool, sb, ss, rb, rs uint64) {
		l, ok := fuzzLayout(sb, ss, rb, rs)
		if !ok {
			return
		}
		tr, err := NewTranslator(l)
		if err != nil {
			t.Fatalf("layout %+v: %v", l, err)
		}
		g := nvc0.DecodePTE(lo, hi)
		size, f := uint64(nvc0.PageSize), tr.PTE
		if large {
			size, f = nvc0.LargePageSize, tr.LargePTE
		}
		s, ok := f(g)
		if !g.Present {
			if !ok || s != (nvc0.PTE{}) {
				t.Fatalf("non-present guest PTE gave %+v %v", s, ok)
			}
			return
		}
		// Independent statement of when a mapping is valid.
		var base, limit uint64
		valid := g.Addr%size == 0
		switch g.Target {
		case nvc0.TargetVRAM:
			base, limit = l.SliceBase, l.SliceSize
		case nvc0.TargetSysSnooped, nvc0.TargetSysNoSnoop:
			base, limit = l.RAMBase, l.RAMSize
		default:
			valid = false
		}
		valid = valid && g.Addr+size <= limit && (base+g.Addr)%size == 0
		if ok != valid {
			t.Fatalf("guest %+v (size %#x) layout %+v: ok=%v, want %v", g, size, l, ok, valid)
		}
		if !ok {
			if s != (nvc0.PTE{}) {
				t.Fatalf("dropped PTE not zero: %+v", s)
			}
			return
		}
		if err := checkSafePTE(l, s, size); err != nil {
			t.Fatal(err)
		}
		if s.Addr != base+g.Addr || s.ReadOnly != g.ReadOnly || s.Volatile != g.Volatile || s.Kind != g.Kind || s.Target != g.Target {
			t.Fatalf("guest %+v → %+v: fields not preserved", g, s)
		}
		// The encoded shadow decodes to itself (no stray bits).
		if elo, ehi := s.Encode(); nvc0.DecodePTE(elo, ehi) != s {
			t.Fatalf("shadow %+v does not round-trip", s)
		}
	})
}

// fuzzGuest interprets fuzz bytes as edits of a guest address space: each
// record is 13 bytes, op then three words. Ops: PDE with structured table
// addresses, raw PDE, PTE with structured address, raw 64-bit word anywhere.
// It calls note for every written range and returns the bytes it did not use.
func fuzzGuest(e *env, pd uint64, data []byte, maxRecords int, note func(addr, n uint64)) []byte {
	pages := e.l.SliceSize / nvc0.PageSize
	for n := 0; len(data) >= 13 && n < maxRecords; n++ {
		op, a, b, c := data[0], binary.LittleEndian.Uint32(data[1:]), binary.LittleEndian.Uint32(data[5:]), binary.LittleEndian.Uint32(data[9:])
		data = data[13:]
		var addr, v uint64
		switch op % 4 {
		case 0: // structured PDE
			p := nvc0.PDE{
				SmallPresent: b&1 != 0, SmallSys: b&2 != 0, Size: (b >> 2) & 3,
				SmallAddr:    uint64(b>>4) % pages * nvc0.PageSize,
				LargePresent: c&1 != 0, LargeSys: c&2 != 0,
				LargeAddr: uint64(c>>4) % pages * nvc0.PageSize,
			}
			addr, v = pd+uint64(a%32)*nvc0.PDESize, pdeWord(p)
		case 1: // raw PDE
			addr, v = pd+uint64(a%nvc0.PDECount)*nvc0.PDESize, uint64(b)|uint64(c)<<32
		case 2: // PTE with a structured address
			p := nvc0.DecodePTE(b, c)
			p.Addr = uint64(b>>8) % (pages + 64) * nvc0.PageSize
			if p.IsSystem() {
				p.Addr = uint64(b>>8) * nvc0.PageSize % (e.l.RAMSize + 1<<20)
			}
			lo, hi := p.Encode()
			addr, v = uint64(a)%e.l.SliceSize&^7, uint64(lo)|uint64(hi)<<32
		default: // raw word anywhere in the slice
			addr, v = uint64(a)%e.l.SliceSize&^7, uint64(b)|uint64(c)<<32
		}
		if addr+8 > e.l.SliceSize {
			continue
		}
		e.setG64(addr, v)
		note(addr, 8)
	}
	return data
}

func FuzzShadowBuilder(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0}, []byte{})
	rec := func(op byte, a, b, c uint32) []byte {
		r := []byte{op}
		r = binary.LittleEndian.AppendUint32(r, a)
		r = binary.LittleEndian.AppendUint32(r, b)
		return binary.LittleEndian.AppendUint32(r, c)
	}
	seed := []byte{3, 1, 4, 1}
	seed = append(seed, rec(0, 0, 1|0x40<<4, 1|0x50<<4)...)         // PDE 0: small table page 0x40, large page 0x50
	seed = append(seed, rec(0, 1, 1|2<<2|0x60<<4, 0)...)            // PDE 1: quarter-size small table
	seed = append(seed, rec(0, 2, 3|0x40<<4, 0)...)                 // PDE 2: system-memory table (dropped)
	seed = append(seed, rec(2, 0x40000, 0x2001, 0)...)              // PTE in table 0x40
	seed = append(seed, rec(2, 0x40008, 0xFFFFF001, 0)...)          // out of range
	seed = append(seed, rec(2, 0x50000, 0x20001, 0)...)             // large PTE
	seed = append(seed, rec(2, 0x40010, 0x3003, 5)...)              // privileged sysmem
	seed = append(seed, rec(1, 3, 0xFFFFFF01, 0xFFFFFF01)...)       // raw PDE outside
	seed = append(seed, rec(3, 0x60000, 0x12345677, 0x9abcdef0)...) // raw word
	f.Add(seed, append(rec(2, 0x40018, 0x3101, 0), rec(0, 0, 1|0x70<<4, 0)...))
	f.Fuzz(func(t *testing.T, data, edits []byte) {
		if len(data) < 4 {
			return
		}
		h := data[:4]
		data = data[4:]
		const reserved = 4 << 20
		l := Layout{
			SliceBase: reserved + uint64(h[0]%8)*nvc0.PageSize,
			SliceSize: (1 << 20) + uint64(h[1]%32)*nvc0.PageSize,
			RAMBase:   uint64(h[2]) << 28,
			RAMSize:   uint64(h[3]%16) << 20,
			Reserved:  []Range{{0, reserved}},
		}
		l.Reserved = append(l.Reserved, Range{l.SliceBase + l.SliceSize, nvc0.LargePageSize})
		e := newEnvLayout(t, l, l.SliceBase+l.SliceSize+nvc0.LargePageSize)
		pd := uint64(h[0]/8%4) * 0x8004 // page aligned or not, even entry aligned or not
		fuzzGuest(e, pd, data, 256, func(uint64, uint64) {})

		m := newManager(t, e, 3<<20)
		s, err := m.Acquire(pd)
		if err != nil {
			t.Fatal(err)
		}
		check := func(st Stats, err error) {
			t.Helper()
			if err != nil && !errors.Is(err, ErrQuota) {
				t.Fatal(err)
			}
			got := e.walk(t, s.ShadowPD()) // checks the safety properties
			if err == nil {
				diffViews(t, got, e.expected(pd))
			}
		}
		check(s.Sync())
		// Incremental edits, each noted.
		for len(edits) >= 13 {
			edits = fuzzGuest(e, pd, edits, 8, func(a, n uint64) { m.NoteWrite(a, 4); m.NoteWrite(a+4, n-4) })
			check(s.SyncIncremental())
		}
		if err := errors.Join(m.Close(), m.Reclaim(nil)); err != nil {
			t.Fatal(err)
		}
		if len(e.alloc.live) != 0 {
			t.Fatalf("%d allocations live after Close and Reclaim", len(e.alloc.live))
		}
	})
}
