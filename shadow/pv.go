package shadow

import (
	"errors"
	"fmt"
	"slices"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// Para-virtual page tables (GPUvm thesis §4.1.3). A PV guest never writes a
// page table: its page directories and page tables are objects in the
// reserve, named by handles, which only the aggregator writes, entry by
// entry, after translating each guest entry with the VM's Translator —
// exactly as a scan would, except that an entry leaving the VM's memory is
// refused (the call fails, nothing of it is installed) instead of dropped.
// Nothing is scanned and nothing is watched: there is no guest copy.
//
// A PV page directory is a Space (so channels bind it as they bind a
// shadow space, reference counted); PV page tables are separate objects a
// MAP_PGT links into one page-directory entry at a time. Freed memory is
// retired and reused only after a TLB flush of every page directory that
// may have cached or walked it, as shadow memory is.

// PVKind is the kind of a PV memory object.
type PVKind int

// The PV object kinds.
const (
	PVPageDir PVKind = iota + 1
	PVSmallTable
	PVLargeTable
)

// Errors of PV operations, so the aggregator can map them to the ABI's
// result codes.
var (
	ErrPVHandle = errors.New("no such PV handle")
	ErrPVRange  = errors.New("index or count out of range")
	ErrPVFault  = errors.New("entry maps memory outside the VM")
	ErrPVBusy   = errors.New("object in use")
	ErrPVInval  = errors.New("invalid PV argument")
	ErrPVLimit  = errors.New("too many PV objects")
)

// PVLimits bound what a guest can make the aggregator hold in PV mode,
// besides the reserve bytes (Config.MaxShadowBytes).
type PVLimits struct {
	Objects  int // live handles
	Bindings int // instance blocks bound to a page directory
}

// pvState is a Manager's PV objects.
type pvState struct {
	limits PVLimits
	objs   map[uint32]*pvObject
	next   uint32
	bind   map[uint64]uint32 // guest RAMIN address -> page-directory handle
	byTab  map[*table]*pvObject
}

// pvObject is one live handle.
type pvObject struct {
	kind  PVKind
	space *Space // PVPageDir
	tab   *table // tables
	// Where a table is linked: its page directory and entry (nil: unlinked).
	in  *Space
	pde int
	// flushPDs are the shadow page directories the table was linked into
	// since it was created, each once: any of them may have walked it.
	// Bounded by the page directories that ever existed, which the handle
	// limit bounds at any one time (a directory's memory may be reused by
	// a later one at the same address: it is listed once).
	flushPDs []uint64
}

// EnablePV makes the Manager serve PV page tables (a PV vGPU). Channels then
// take their page directory from SET_PGD bindings (PVBind), not from the
// RAMIN's page-directory field.
func (m *Manager) EnablePV(l PVLimits) {
	m.pv = &pvState{limits: l, objs: map[uint32]*pvObject{}, bind: map[uint64]uint32{}, byTab: map[*table]*pvObject{}}
}

// PV reports whether the Manager serves PV page tables.
func (m *Manager) PV() bool { return m.pv != nil }

// PVObjects returns how many PV handles are live.
func (m *Manager) PVObjects() int {
	if m.pv == nil {
		return 0
	}
	return len(m.pv.objs)
}

// PVAlloc allocates a zeroed page directory or page table in the reserve
// and returns its handle (never 0).
func (m *Manager) PVAlloc(kind PVKind) (uint32, error) {
	p := m.pv
	if p == nil {
		return 0, ErrPVInval
	}
	if len(p.objs) >= p.limits.Objects {
		return 0, fmt.Errorf("PV alloc: %d objects: %w", len(p.objs), ErrPVLimit)
	}
	o := &pvObject{kind: kind}
	switch kind {
	case PVPageDir:
		s, err := m.newPVSpace()
		if err != nil {
			return 0, err
		}
		o.space = s
	case PVSmallTable, PVLargeTable:
		n := nvc0.SmallPTECount
		if kind == PVLargeTable {
			n = nvc0.LargePTECount
		}
		size := uint64(n) * nvc0.PTESize
		addr, err := m.alloc.Alloc(size, nvc0.PageSize)
		if err != nil {
			return 0, fmt.Errorf("PV alloc: %w", err)
		}
		if err := m.clear(addr, size); err != nil {
			return 0, errors.Join(fmt.Errorf("PV alloc: clear table: %w", err), m.alloc.Free(addr))
		}
		o.tab = &table{large: kind == PVLargeTable, entries: n, shadow: addr, cur: make([]uint64, n)}
	default:
		return 0, fmt.Errorf("PV alloc: kind %d: %w", kind, ErrPVInval)
	}
	for {
		p.next++
		if _, used := p.objs[p.next]; !used && p.next != 0 {
			break
		}
	}
	if o.space == nil {
		p.byTab[o.tab] = o
	}
	p.objs[p.next] = o
	return p.next, nil
}

// newPVSpace creates an empty PV page directory: a Space with no guest side.
func (m *Manager) newPVSpace() (*Space, error) {
	pd, err := m.alloc.Alloc(nvc0.PageDirSize, nvc0.PageSize)
	if err != nil {
		return nil, fmt.Errorf("PV alloc: page directory: %w", err)
	}
	if err := m.clear(pd, nvc0.PageDirSize); err != nil {
		return nil, errors.Join(fmt.Errorf("PV alloc: clear page directory: %w", err), m.alloc.Free(pd))
	}
	s := &Space{
		mirror:   mirror{mem: m.mem, tr: m.tr},
		alloc:    m.alloc,
		shadowPD: pd, shadowBytes: nvc0.PageDirSize,
		pdCur: make([]uint64, nvc0.PDECount),
		small: make([]*table, nvc0.PDECount),
		large: make([]*table, nvc0.PDECount),
		pv:    true, refs: 1, // the guest's handle
		sink: &m.counters,
	}
	s.retire = func(addr, pd uint64) { m.retire(addr, pd, true) }
	m.counters.SpacesCreated++
	return s, nil
}

// clear zeroes a new PV table with CPU writes. The aggregator's reserve is
// scrubbed when freed, so this is redundant there; it is done anyway so
// that a PV table costs what the native driver pays to clear its own
// tables (through BAR3, at the bus's per-word cost): a GPU-side clear
// would make PV beat native for a reason that has nothing to do with
// virtualization.
func (m *Manager) clear(addr, size uint64) error {
	return m.mem.WriteVRAM(make([]byte, size), addr)
}

func (m *Manager) pvObj(h uint32, kinds ...PVKind) (*pvObject, error) {
	if m.pv == nil {
		return nil, ErrPVInval
	}
	o, ok := m.pv.objs[h]
	if !ok {
		return nil, fmt.Errorf("handle %d: %w", h, ErrPVHandle)
	}
	for _, k := range kinds {
		if o.kind == k {
			return o, nil
		}
	}
	return nil, fmt.Errorf("handle %d is of kind %d: %w", h, o.kind, ErrPVHandle)
}

// PVFree frees a handle. A table is unlinked from its page directory; a
// page directory loses its bindings and its tables, and its memory goes
// once no channel uses it any more. Memory is retired (Reclaim frees it
// after a TLB flush).
func (m *Manager) PVFree(h uint32) error {
	o, err := m.pvObj(h, PVPageDir, PVSmallTable, PVLargeTable)
	if err != nil {
		return err
	}
	if o.space == nil {
		// Unlink first: if the directory entry cannot be written, the
		// table stays linked, held and the guest's.
		if o.in != nil {
			if err := o.in.pvLink(o.pde, o.tab.large, nil); err != nil {
				return err
			}
			o.in = nil
		}
		delete(m.pv.objs, h)
		delete(m.pv.byTab, o.tab)
		m.retireTable(o)
		return nil
	}
	delete(m.pv.objs, h)
	for ramin, pd := range m.pv.bind {
		if pd == h {
			delete(m.pv.bind, ramin)
			m.markRAMINDirty(ramin)
		}
	}
	return m.pvRelease(o.space)
}

// retireTable retires a table's memory with a flush of every page
// directory that had it linked.
func (m *Manager) retireTable(o *pvObject) {
	if len(o.flushPDs) == 0 {
		m.retire(o.tab.shadow, 0, false)
		return
	}
	m.retire(o.tab.shadow, o.flushPDs[0], true)
	for _, pd := range o.flushPDs[1:] {
		m.retired = append(m.retired, retired{flushPD: pd, flush: true, flushOnly: true})
	}
}

// pvRelease drops a reference on a PV page directory; the last one unlinks
// its tables and retires it.
func (m *Manager) pvRelease(s *Space) error {
	s.refs--
	if s.refs > 0 {
		return nil
	}
	var errs []error
	for _, o := range m.pv.objs {
		if o.in == s {
			o.in = nil
		}
	}
	for i := range s.small {
		s.small[i], s.large[i] = nil, nil
	}
	s.closed = true
	m.counters.SpacesFreed++
	m.retire(s.shadowPD, s.shadowPD, true)
	return errors.Join(errs...)
}

// markRAMINDirty marks the shadow channels of a guest RAMIN due for a
// Refresh (applied at their next enable or activation, as a RAMIN write is).
func (m *Manager) markRAMINDirty(ramin uint64) {
	for c := range m.channels {
		if c.guestRAMIN == ramin {
			c.dirty = true
		}
	}
}

// PVBind binds the page directory pd (0: none) to the channel instance
// block at guest VRAM address ramin: the channel uses it from its next
// Refresh.
func (m *Manager) PVBind(ramin uint64, pd uint32) error {
	if m.pv == nil {
		return ErrPVInval
	}
	if ramin%nvc0.PageSize != 0 {
		return fmt.Errorf("instance block %#x not page aligned: %w", ramin, ErrPVInval)
	}
	if _, ok := m.tr.VRAMAddr(ramin, nvc0.RAMINSize); !ok {
		return fmt.Errorf("instance block %#x: %w", ramin, ErrPVFault)
	}
	if pd == 0 {
		delete(m.pv.bind, ramin)
		m.markRAMINDirty(ramin)
		return nil
	}
	if _, err := m.pvObj(pd, PVPageDir); err != nil {
		return err
	}
	if _, ok := m.pv.bind[ramin]; !ok && len(m.pv.bind) >= m.pv.limits.Bindings {
		return fmt.Errorf("%d bindings: %w", len(m.pv.bind), ErrPVLimit)
	}
	m.pv.bind[ramin] = pd
	m.markRAMINDirty(ramin)
	return nil
}

// pvBound returns the PV page directory bound to a guest RAMIN, if any.
func (m *Manager) pvBound(ramin uint64) (*Space, bool) {
	h, ok := m.pv.bind[ramin]
	if !ok {
		return nil, false
	}
	o := m.pv.objs[h]
	if o == nil || o.space == nil {
		return nil, false
	}
	return o.space, true
}

// PVMapPGT sets page-directory entry pde of pd to the small and large
// tables (0: none). A table may be linked in one entry at a time.
func (m *Manager) PVMapPGT(pd, pde, small, large uint32) error {
	o, err := m.pvObj(pd, PVPageDir)
	if err != nil {
		return err
	}
	if pde >= nvc0.PDECount {
		return fmt.Errorf("entry %d: %w", pde, ErrPVRange)
	}
	var want [2]*pvObject
	for k, h := range []uint32{small, large} {
		if h == 0 {
			continue
		}
		kind := PVSmallTable
		if k == 1 {
			kind = PVLargeTable
		}
		t, err := m.pvObj(h, kind)
		if err != nil {
			return err
		}
		if t.in != nil && (t.in != o.space || t.pde != int(pde)) {
			return fmt.Errorf("table %d is linked elsewhere: %w", h, ErrPVBusy)
		}
		want[k] = t
	}
	s := o.space
	for k, large := range []bool{false, true} {
		cur := s.small[pde]
		if large {
			cur = s.large[pde]
		}
		var next *table
		if want[k] != nil {
			next = want[k].tab
		}
		if cur == next {
			continue
		}
		if err := s.pvLink(int(pde), large, next); err != nil {
			return err
		}
		// Only now is the table that was there unlinked.
		if old := m.pv.byTab[cur]; old != nil {
			old.in = nil
		}
		if t := want[k]; t != nil {
			t.in, t.pde = s, int(pde)
			if !slices.Contains(t.flushPDs, s.shadowPD) {
				t.flushPDs = append(t.flushPDs, s.shadowPD)
			}
		}
	}
	return nil
}

// pvLink writes one half of PDE i: the small or large table t (nil: none).
// The space's record of its tables changes only once the entry is written.
func (s *Space) pvLink(i int, large bool, t *table) error {
	small, lg := s.small[i], s.large[i]
	if large {
		lg = t
	} else {
		small = t
	}
	var e nvc0.PDE
	if small != nil {
		e.SmallPresent, e.SmallAddr = true, small.shadow
	}
	if lg != nil {
		e.LargePresent, e.LargeAddr = true, lg.shadow
	}
	w0, w1 := e.Encode()
	var st Stats
	if err := s.commit(s.shadowPD+uint64(i)*nvc0.PDESize, nvc0.PDESize, s.pdCur[i:i+1], []uint64{uint64(w0) | uint64(w1)<<32}, false, &st); err != nil {
		return fmt.Errorf("write PV page directory entry %d: %w", i, err)
	}
	s.small[i], s.large[i] = small, lg
	return nil
}

// PVWrite installs guest entries ptes (nvc0 PTE words, lo | hi<<32, guest
// addresses) at entries index, index+1, … of table pt. Every present entry
// is translated into the VM's slice or RAM first; if any cannot be, the
// call fails with ErrPVFault and nothing is written. It returns how many
// entries changed.
func (m *Manager) PVWrite(pt uint32, index uint32, ptes []uint64) (int, error) {
	o, err := m.pvObj(pt, PVSmallTable, PVLargeTable)
	if err != nil {
		return 0, err
	}
	t := o.tab
	if uint64(index)+uint64(len(ptes)) > uint64(t.entries) || len(ptes) == 0 {
		return 0, fmt.Errorf("entries [%d, +%d) of a %d-entry table: %w", index, len(ptes), t.entries, ErrPVRange)
	}
	translate := m.tr.PTE
	if t.large {
		translate = m.tr.LargePTE
	}
	if cap(m.pvNext) < len(ptes) {
		m.pvNext = make([]uint64, len(ptes))
	}
	next := m.pvNext[:len(ptes)]
	clear(next)
	for j, v := range ptes {
		lo, hi := uint32(v), uint32(v>>32)
		if lo&nvc0.PTEPresent == 0 {
			continue
		}
		sp, ok := translate(nvc0.DecodePTE(lo, hi))
		if !ok {
			return 0, fmt.Errorf("entry %d (%#x): %w", int(index)+j, v, ErrPVFault)
		}
		slo, shi := sp.Encode()
		next[j] = uint64(slo) | uint64(shi)<<32
	}
	var st Stats
	cur := t.cur[index : int(index)+len(ptes)]
	if err := m.pvMirror().commit(t.shadow+uint64(index)*nvc0.PTESize, nvc0.PTESize, cur, next, false, &st); err != nil {
		return 0, fmt.Errorf("write PV table: %w", err)
	}
	m.counters.EntriesWritten += uint64(st.EntriesWritten)
	m.counters.BytesWritten += uint64(st.BytesWritten)
	return st.EntriesWritten, nil
}

// pvMirror returns a mirror for writing PV tables.
func (m *Manager) pvMirror() *mirror {
	if m.pvm == nil {
		m.pvm = &mirror{mem: m.mem, tr: m.tr}
	}
	return m.pvm
}

// PVShadowPD returns the physical page directory of handle pd, for a TLB flush.
func (m *Manager) PVShadowPD(pd uint32) (uint64, error) {
	o, err := m.pvObj(pd, PVPageDir)
	if err != nil {
		return 0, err
	}
	return o.space.shadowPD, nil
}

// PVEntries returns the installed (physical) entries of a PV table, for
// tests and the fuzzer.
func (m *Manager) PVEntries(pt uint32) ([]uint64, error) {
	o, err := m.pvObj(pt, PVSmallTable, PVLargeTable)
	if err != nil {
		return nil, err
	}
	return append([]uint64(nil), o.tab.cur...), nil
}

// closePV frees every PV object (the VM leaves).
func (m *Manager) closePV() error {
	if m.pv == nil {
		return nil
	}
	var errs []error
	for h := range m.pv.objs {
		errs = append(errs, m.PVFree(h))
	}
	clear(m.pv.bind)
	return errors.Join(errs...)
}

// ExpandBatch fills dst with guest PTE words starting from first, each
// mapping the page after the previous one, as a MAP_BATCH describes them.
// A non-present first entry yields non-present entries. It fails
// (ErrPVRange) if the addresses run past what a PTE encodes.
func ExpandBatch(dst []uint64, first uint64, large bool) error {
	lo, hi := uint32(first), uint32(first>>32)
	if lo&nvc0.PTEPresent == 0 {
		clear(dst)
		return nil
	}
	e := nvc0.DecodePTE(lo, hi)
	step := uint64(nvc0.PageSize)
	if large {
		step = nvc0.LargePageSize
	}
	limit := maxPhysAddr()
	for j := range dst {
		if e.Addr >= limit {
			return fmt.Errorf("batch address %#x: %w", e.Addr, ErrPVRange)
		}
		a, b := e.Encode()
		dst[j] = uint64(a) | uint64(b)<<32
		e.Addr += step
	}
	return nil
}

// PVTableEntries returns how many entries table pt has and whether it is
// a large-page table.
func (m *Manager) PVTableEntries(pt uint32) (int, bool, error) {
	o, err := m.pvObj(pt, PVSmallTable, PVLargeTable)
	if err != nil {
		return 0, false, err
	}
	return o.tab.entries, o.tab.large, nil
}
