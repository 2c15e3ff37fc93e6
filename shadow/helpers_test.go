package shadow

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/internal/rangealloc"
)

// flatMem is physical VRAM as one byte slice.
type flatMem struct {
	vram         []byte
	reads        int
	writes       int
	bytesWritten int
}

func newFlatMem(size uint64) *flatMem { return &flatMem{vram: make([]byte, size)} }

func (m *flatMem) check(n int, addr uint64) error {
	if addr > uint64(len(m.vram)) || uint64(n) > uint64(len(m.vram))-addr {
		return fmt.Errorf("vram access [%#x +%#x) beyond %#x", addr, n, len(m.vram))
	}
	return nil
}

func (m *flatMem) ReadVRAM(p []byte, addr uint64) error {
	if err := m.check(len(p), addr); err != nil {
		return err
	}
	m.reads++
	copy(p, m.vram[addr:])
	return nil
}

func (m *flatMem) WriteVRAM(p []byte, addr uint64) error {
	if err := m.check(len(p), addr); err != nil {
		return err
	}
	m.writes++
	m.bytesWritten += len(p)
	copy(m.vram[addr:], p)
	return nil
}

func (m *flatMem) read64(addr uint64) uint64 { return binary.LittleEndian.Uint64(m.vram[addr:]) }

func (m *flatMem) write64(addr, v uint64) { binary.LittleEndian.PutUint64(m.vram[addr:], v) }

// recAlloc is a rangealloc.Allocator that records live allocations.
type recAlloc struct {
	a    *rangealloc.Allocator
	live map[uint64]uint64
}

func newRecAlloc(base, size uint64) *recAlloc {
	return &recAlloc{a: rangealloc.New(base, size), live: map[uint64]uint64{}}
}

func (r *recAlloc) Alloc(size, align uint64) (uint64, error) {
	addr, err := r.a.Alloc(size, align)
	if err == nil {
		r.live[addr] = size
	}
	return addr, err
}

func (r *recAlloc) Free(addr uint64) error {
	if err := r.a.Free(addr); err != nil {
		return err
	}
	delete(r.live, addr)
	return nil
}

// env is a test machine: reserved VRAM [0, reservedSize), then the VM's slice.
type env struct {
	mem   *flatMem
	alloc *recAlloc
	tr    *Translator
	l     Layout

	onWrite func(guestAddr, old, new uint64)
}

const (
	testReserved = 8 << 20
	testSlice    = 4 << 20
)

func newEnv(t testing.TB) *env {
	t.Helper()
	l := Layout{
		SliceBase: testReserved, SliceSize: testSlice,
		RAMBase: 1 << 32, RAMSize: 64 << 20,
		Reserved: []Range{{0, testReserved}},
	}
	return newEnvLayout(t, l, testReserved+testSlice+nvc0.LargePageSize)
}

func newEnvLayout(t testing.TB, l Layout, vramSize uint64) *env {
	t.Helper()
	tr, err := NewTranslator(l)
	if err != nil {
		t.Fatal(err)
	}
	return &env{mem: newFlatMem(vramSize), alloc: newRecAlloc(l.Reserved[0].Base, l.Reserved[0].Size), tr: tr, l: l}
}

// guest helpers: addresses are guest VRAM addresses.

func (e *env) g64(ga uint64) uint64 { return e.mem.read64(e.l.SliceBase + ga) }

// setG64 writes a guest word; onWrite, if set, sees it first.
func (e *env) setG64(ga, v uint64) {
	if e.onWrite != nil {
		e.onWrite(ga, e.g64(ga), v)
	}
	e.mem.write64(e.l.SliceBase+ga, v)
}

func pdeWord(p nvc0.PDE) uint64 {
	w0, w1 := p.Encode()
	return uint64(w0) | uint64(w1)<<32
}

func pteWord(p nvc0.PTE) uint64 {
	lo, hi := p.Encode()
	return uint64(lo) | uint64(hi)<<32
}

func decodePDE(v uint64) nvc0.PDE { return nvc0.DecodePDE(uint32(v), uint32(v>>32)) }

func decodePTE(v uint64) nvc0.PTE { return nvc0.DecodePTE(uint32(v), uint32(v>>32)) }

func (e *env) setPDE(pd uint64, i int, p nvc0.PDE) uint64 {
	a := pd + uint64(i)*nvc0.PDESize
	e.setG64(a, pdeWord(p))
	return a
}

func (e *env) setPTE(table uint64, i int, p nvc0.PTE) uint64 {
	a := table + uint64(i)*nvc0.PTESize
	e.setG64(a, pteWord(p))
	return a
}

// key names one PTE slot of an address space.
type key struct {
	pde   int
	large bool
	idx   int
}

// tkey names one page table of an address space.
type tkey struct {
	pde   int
	large bool
}

// view is the logical content of an address space: present PTE words and
// the tables (with their entry counts).
type view struct {
	ptes   map[key]uint64
	tables map[tkey]int
}

func newView() view { return view{ptes: map[key]uint64{}, tables: map[tkey]int{}} }

// expected translates the guest's tables with the reference rules, walking
// guest memory directly (independently of Space).
func (e *env) expected(guestPD uint64) view {
	v := newView()
	for i := range nvc0.PDECount {
		g := decodePDE(e.g64(guestPD + uint64(i)*nvc0.PDESize))
		halves := []struct {
			large, present, sys bool
			addr                uint64
			n                   int
		}{
			{false, g.SmallPresent, g.SmallSys, g.SmallAddr, nvc0.SmallPTECount >> g.Size},
			{true, g.LargePresent, g.LargeSys, g.LargeAddr, nvc0.LargePTECount},
		}
		for _, h := range halves {
			if !h.present || h.sys || h.addr+uint64(h.n)*nvc0.PTESize > e.l.SliceSize {
				continue
			}
			v.tables[tkey{i, h.large}] = h.n
			for j := range h.n {
				p := decodePTE(e.g64(h.addr + uint64(j)*nvc0.PTESize))
				tr := e.tr.PTE
				if h.large {
					tr = e.tr.LargePTE
				}
				if s, ok := tr(p); ok && s.Present {
					v.ptes[key{i, h.large, j}] = pteWord(s)
				}
			}
		}
	}
	return v
}

// walk reads the shadow address space at shadowPD from physical memory and
// checks the safety properties: every table pointer names a live allocation
// large enough, every present PTE lands in the slice or RAM and never in
// reserved memory.
func (e *env) walk(t testing.TB, shadowPD uint64) view {
	t.Helper()
	v := newView()
	for i := range nvc0.PDECount {
		p := decodePDE(e.mem.read64(shadowPD + uint64(i)*nvc0.PDESize))
		halves := []struct {
			large, present, sys bool
			addr                uint64
			n                   int
		}{
			{false, p.SmallPresent, p.SmallSys, p.SmallAddr, nvc0.SmallPTECount >> p.Size},
			{true, p.LargePresent, p.LargeSys, p.LargeAddr, nvc0.LargePTECount},
		}
		for _, h := range halves {
			if !h.present {
				continue
			}
			if h.sys {
				t.Fatalf("shadow PDE %d points into system memory", i)
			}
			if size, ok := e.alloc.live[h.addr]; !ok || size < uint64(h.n)*nvc0.PTESize {
				t.Fatalf("shadow PDE %d (large=%v) points at %#x, not a live shadow table (size %#x)", i, h.large, h.addr, size)
			}
			v.tables[tkey{i, h.large}] = h.n
			for j := range h.n {
				w := e.mem.read64(h.addr + uint64(j)*nvc0.PTESize)
				s := decodePTE(w)
				if !s.Present {
					if w != 0 {
						t.Fatalf("shadow PTE %d/%v/%d not present but not zero: %#x", i, h.large, j, w)
					}
					continue
				}
				e.checkSafe(t, s, h.large)
				v.ptes[key{i, h.large, j}] = w
			}
		}
	}
	return v
}

// checkSafe fails unless a present shadow PTE maps only the VM's memory.
func (e *env) checkSafe(t testing.TB, s nvc0.PTE, large bool) {
	t.Helper()
	size := uint64(nvc0.PageSize)
	if large {
		size = nvc0.LargePageSize
	}
	if err := checkSafePTE(e.l, s, size); err != nil {
		t.Fatal(err)
	}
}

func checkSafePTE(l Layout, s nvc0.PTE, size uint64) error {
	if s.Privileged {
		return fmt.Errorf("shadow PTE %+v is privileged", s)
	}
	switch {
	case s.Target == nvc0.TargetVRAM:
		if s.Addr < l.SliceBase || s.Addr+size > l.SliceBase+l.SliceSize {
			return fmt.Errorf("shadow PTE %+v (size %#x) outside slice [%#x +%#x)", s, size, l.SliceBase, l.SliceSize)
		}
		for _, r := range l.Reserved {
			if s.Addr < r.End() && r.Base < s.Addr+size {
				return fmt.Errorf("shadow PTE %+v reaches reserved [%#x +%#x)", s, r.Base, r.Size)
			}
		}
	case s.IsSystem():
		if s.Addr < l.RAMBase || s.Addr+size > l.RAMBase+l.RAMSize {
			return fmt.Errorf("shadow PTE %+v (size %#x) outside RAM [%#x +%#x)", s, size, l.RAMBase, l.RAMSize)
		}
	default:
		return fmt.Errorf("shadow PTE %+v has an unknown target", s)
	}
	return nil
}

func diffViews(t testing.TB, got, want view) {
	t.Helper()
	n := 0
	for k, w := range want.ptes {
		if g, ok := got.ptes[k]; !ok || g != w {
			if n++; n <= 5 {
				t.Errorf("PTE %+v: shadow %#x (present %v), want %#x", k, g, ok, w)
			}
		}
	}
	for k, g := range got.ptes {
		if _, ok := want.ptes[k]; !ok {
			if n++; n <= 5 {
				t.Errorf("PTE %+v: shadow maps %#x, guest has no valid mapping", k, g)
			}
		}
	}
	for k, w := range want.tables {
		if g := got.tables[k]; g != w {
			if n++; n <= 5 {
				t.Errorf("table %+v: shadow has %d entries, want %d", k, g, w)
			}
		}
	}
	for k := range got.tables {
		if _, ok := want.tables[k]; !ok {
			if n++; n <= 5 {
				t.Errorf("table %+v present in shadow, not valid in guest", k)
			}
		}
	}
	if n > 0 {
		t.Fatalf("%d differences between shadow and guest", n)
	}
}
