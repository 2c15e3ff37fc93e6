package sim

import (
	"errors"
	"fmt"
	"sync"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// The GPU MMU. An address space is named by its page directory's VRAM address
// (and by whether it is a BAR address space, since TLB flushes name the two
// kinds separately). Each address space has a bounded TLB of 4 KiB
// translations. Like the real TLB it is never kept coherent with the page
// tables: a changed PTE takes effect once a TLB flush names that page
// directory (or once the entry happens to be evicted).

// tlbMaxEntries bounds each address space's TLB.
const tlbMaxEntries = 4096

// faultError is a translation or access failure of a GPU virtual address.
// Its source (the fault unit and client) is set by whoever made the access
// (withSource); an unset source is PFIFO's own fetch.
type faultError struct {
	va     uint64
	reason uint32 // nvc0.FaultReason*
	write  bool
	src    *faultSource
}

// faultSource is the unit and client an MMU fault is reported for.
type faultSource struct {
	unit   int    // nvc0.FaultUnit*
	client uint32 // nvc0.FaultClient*
	hub    bool   // client is a hub client (else a GPC client)
}

// Fault sources of the board's engines (gf100_fifo_mmu_fault_engine,
// _hubclient, _gpcclient).
var (
	srcPFIFO = faultSource{unit: nvc0.FaultUnitPFIFO, client: nvc0.FaultClientPFIFO, hub: true}
	srcGR    = faultSource{unit: nvc0.FaultUnitGR, client: nvc0.FaultClientGPCTex}
	srcCE    = [nvc0.NumCopyEngines]faultSource{
		{unit: nvc0.FaultUnitCE0, client: nvc0.FaultClientPCOPY0, hub: true},
		{unit: nvc0.FaultUnitCE1, client: nvc0.FaultClientPCOPY1, hub: true},
	}
)

// withSource attributes a fault in err (if it has no source yet) to src.
func withSource(err error, src faultSource) error {
	var fe *faultError
	if errors.As(err, &fe) && fe.src == nil {
		fe.src = &src
	}
	return err
}

// source returns the fault's source.
func (e *faultError) source() faultSource {
	if e.src == nil {
		return srcPFIFO
	}
	return *e.src
}

func (e *faultError) Error() string {
	op := "read"
	if e.write {
		op = "write"
	}
	return fmt.Sprintf("gpu mmu fault: %s at %#x: %s", op, e.va, nvc0.FaultReasonName(e.reason))
}

type tlbEntry struct {
	page phys // physical address of the 4 KiB page
	ro   bool
}

type addrSpace struct {
	// walks is held for reading by a TLB miss from its page walk until its
	// result is cached, and for writing by a flush: a flush completes only
	// after the walks in flight, so no walk that read a page table before
	// the flush caches its result after it (a real MMU's invalidate is
	// likewise ordered after outstanding walks).
	walks sync.RWMutex
	mu    sync.Mutex
	tlb   map[uint64]tlbEntry // va >> PageShift -> translation
}

type spaceKey struct {
	pd  uint64
	bar bool
}

type mmu struct {
	b      *Board
	mu     sync.Mutex
	spaces map[spaceKey]*addrSpace
}

func newMMU(b *Board) *mmu { return &mmu{b: b, spaces: make(map[spaceKey]*addrSpace)} }

// space returns the address space with that page directory, creating it.
// Spaces are never dropped (a flush empties their TLB), so a vm may keep the
// pointer.
func (m *mmu) space(pd uint64, bar bool) *addrSpace {
	k := spaceKey{pd, bar}
	m.mu.Lock()
	defer m.mu.Unlock()
	as := m.spaces[k]
	if as == nil {
		as = &addrSpace{tlb: make(map[uint64]tlbEntry)}
		m.spaces[k] = as
	}
	return as
}

// flush drops cached translations as a TLB invalidate of type typ
// (nvc0.TLBFlush*) for the page directory at pd does: with ALL_PDB those of
// every address space, otherwise those of pd's; with HUB_ONLY only the BAR
// (hub) address spaces, otherwise channel and BAR spaces alike.
func (m *mmu) flush(pd uint64, typ uint32) {
	m.b.st.tlbFlushes.Add(1)
	hubOnly, all := typ&nvc0.TLBFlushHubOnly != 0, typ&nvc0.TLBFlushAllPDB != 0
	m.mu.Lock()
	var spaces []*addrSpace
	for k, as := range m.spaces {
		if (all || k.pd == pd) && (k.bar || !hubOnly) {
			spaces = append(spaces, as)
		}
	}
	m.mu.Unlock()
	for _, as := range spaces {
		as.walks.Lock()
		as.mu.Lock()
		clear(as.tlb)
		as.mu.Unlock()
		as.walks.Unlock()
	}
}

// vm is a view of an address space as one RAMIN describes it: the page
// directory and the address-space limit.
type vm struct {
	as    *addrSpace
	pd    uint64
	limit uint64
}

// vmFromRAMIN reads the page directory and limit of the RAMIN at ramin. A
// page directory outside VRAM is refused (FaultReasonTargetUnsupported).
func (b *Board) vmFromRAMIN(ramin uint64, bar bool) (*vm, error) {
	pd, target := nvc0.RAMINAddrDecode(b.vramRead32(ramin+nvc0.RAMINPageDir), b.vramRead32(ramin+nvc0.RAMINPageDir+4))
	if target != nvc0.MemTargetVRAM {
		return nil, &faultError{va: 0, reason: nvc0.FaultReasonTargetUnsupported}
	}
	limit := b.vramRead64(ramin + nvc0.RAMINAddrLimit)
	return &vm{as: b.mmu.space(pd, bar), pd: pd, limit: limit}, nil
}

// translate returns the physical address of va.
func (b *Board) translate(v *vm, va uint64, write bool) (phys, error) {
	if va > v.limit || va >= nvc0.VASize {
		return phys{}, &faultError{va: va, reason: nvc0.FaultReasonVMLimit, write: write}
	}
	key := va >> nvc0.PageShift
	v.as.mu.Lock()
	e, hit := v.as.tlb[key]
	v.as.mu.Unlock()
	if hit {
		b.st.tlbHits.Add(1)
	} else {
		b.st.tlbMisses.Add(1)
		var reason uint32
		var ok bool
		v.as.walks.RLock()
		e, reason, ok = b.walk(v.pd, va)
		if b.afterWalk != nil {
			b.afterWalk()
		}
		if ok {
			v.as.mu.Lock()
			if len(v.as.tlb) >= tlbMaxEntries {
				for k := range v.as.tlb { // evict an arbitrary entry
					delete(v.as.tlb, k)
					break
				}
			}
			v.as.tlb[key] = e
			v.as.mu.Unlock()
		}
		v.as.walks.RUnlock()
		if !ok {
			return phys{}, &faultError{va: va, reason: reason, write: write}
		}
	}
	if write && e.ro {
		return phys{}, &faultError{va: va, reason: nvc0.FaultReasonReadOnly, write: write}
	}
	return phys{sys: e.page.sys, addr: e.page.addr + va&(nvc0.PageSize-1)}, nil
}

// readPTE reads a page-table entry; ok is false if the table is not backed.
func (b *Board) readPTE(table phys, index uint64) (nvc0.PTE, bool) {
	lo, hi, ok := b.physRead64(phys{sys: table.sys, addr: table.addr + index*nvc0.PTESize})
	if !ok {
		return nvc0.PTE{}, false
	}
	return nvc0.DecodePTE(lo, hi), true
}

// walk translates va through the page directory at pd (in VRAM): the small
// page table first, then the large one. ok is false if it faults, with the
// fault reason.
func (b *Board) walk(pd, va uint64) (e tlbEntry, reason uint32, ok bool) {
	w0, w1, ok := b.physRead64(phys{addr: pd + nvc0.PDEIndex(va)*nvc0.PDESize})
	if !ok {
		return tlbEntry{}, nvc0.FaultReasonNoMemory, false
	}
	pde := nvc0.DecodePDE(w0, w1)
	if !pde.SmallPresent && !pde.LargePresent {
		return tlbEntry{}, nvc0.FaultReasonPTNotPresent, false
	}
	reason = nvc0.FaultReasonPageNotPresent
	if pde.SmallPresent {
		// The small table covers the first 1/2^Size of the PDE's range.
		if idx := nvc0.SmallPTEIndex(va); idx < nvc0.SmallPTECount>>pde.Size {
			pte, ok := b.readPTE(phys{sys: pde.SmallSys, addr: pde.SmallAddr}, idx)
			if !ok {
				return tlbEntry{}, nvc0.FaultReasonNoMemory, false
			}
			if pte.Present {
				return b.pageEntry(pte, 0)
			}
		} else if !pde.LargePresent {
			reason = nvc0.FaultReasonPTTooShort
		}
	}
	if pde.LargePresent {
		pte, ok := b.readPTE(phys{sys: pde.LargeSys, addr: pde.LargeAddr}, nvc0.LargePTEIndex(va))
		if !ok {
			return tlbEntry{}, nvc0.FaultReasonNoMemory, false
		}
		if pte.Present {
			return b.pageEntry(pte, va&(nvc0.LargePageSize-1)&^(nvc0.PageSize-1))
		}
	}
	return tlbEntry{}, reason, false
}

// pageEntry builds the TLB entry for the 4 KiB page at offset sub inside the
// page a present PTE maps, checking that memory backs it.
func (b *Board) pageEntry(pte nvc0.PTE, sub uint64) (tlbEntry, uint32, bool) {
	if pte.Target != nvc0.TargetVRAM && !pte.IsSystem() {
		return tlbEntry{}, nvc0.FaultReasonNoMemory, false
	}
	p := phys{sys: pte.IsSystem(), addr: pte.Addr + sub}
	if _, ok := b.slice(p, nvc0.PageSize); !ok {
		return tlbEntry{}, nvc0.FaultReasonNoMemory, false
	}
	return tlbEntry{page: p, ro: pte.ReadOnly}, 0, true
}

// vmPage translates va and returns where it lands and how many of the n
// bytes from va stay inside va's page.
func (b *Board) vmPage(v *vm, va, n uint64, write bool) (phys, uint64, error) {
	p, err := b.translate(v, va, write)
	if err != nil {
		return phys{}, 0, err
	}
	return p, min(n, nvc0.PageSize-va&(nvc0.PageSize-1)), nil
}

// vmRead copies [va, va+len(p)) into p.
func (b *Board) vmRead(v *vm, p []byte, va uint64) error {
	for len(p) > 0 {
		pa, n, err := b.vmPage(v, va, uint64(len(p)), false)
		if err != nil {
			return err
		}
		if !b.physCopyOut(p[:n], pa) {
			return &faultError{va: va, reason: nvc0.FaultReasonNoMemory}
		}
		p, va = p[n:], va+n
	}
	return nil
}

// vmWrite copies p to [va, va+len(p)).
func (b *Board) vmWrite(v *vm, p []byte, va uint64) error {
	for len(p) > 0 {
		pa, n, err := b.vmPage(v, va, uint64(len(p)), true)
		if err != nil {
			return err
		}
		if !b.physCopyIn(pa, p[:n]) {
			return &faultError{va: va, reason: nvc0.FaultReasonNoMemory, write: true}
		}
		p, va = p[n:], va+n
	}
	return nil
}

// vmCopy copies up to n bytes from src to dst (both virtual), stopping at
// the first page boundary of either, and returns how many it copied and
// whether either side was system memory.
func (b *Board) vmCopy(v *vm, dst, src, n uint64) (uint64, bool, error) {
	spa, n, err := b.vmPage(v, src, n, false)
	if err != nil {
		return 0, false, err
	}
	dpa, n, err := b.vmPage(v, dst, n, true)
	if err != nil {
		return 0, false, err
	}
	if !b.physMove(dpa, spa, n) {
		return 0, false, &faultError{va: src, reason: nvc0.FaultReasonNoMemory}
	}
	return n, spa.sys || dpa.sys, nil
}

// vmRead32 reads the aligned word at va atomically.
func (b *Board) vmRead32(v *vm, va uint64) (uint32, error) {
	pa, n, err := b.vmPage(v, va, 4, false)
	if err != nil {
		return 0, err
	}
	if n < 4 {
		return 0, &faultError{va: va, reason: nvc0.FaultReasonNoMemory}
	}
	val, ok := b.physRead32(pa)
	if !ok {
		return 0, &faultError{va: va, reason: nvc0.FaultReasonNoMemory}
	}
	return val, nil
}

// vmWrite32 writes the aligned word at va atomically.
func (b *Board) vmWrite32(v *vm, va uint64, val uint32) error {
	pa, n, err := b.vmPage(v, va, 4, true)
	if err != nil {
		return err
	}
	if n < 4 {
		return &faultError{va: va, reason: nvc0.FaultReasonNoMemory, write: true}
	}
	if !b.physWrite32(pa, val) {
		return &faultError{va: va, reason: nvc0.FaultReasonNoMemory, write: true}
	}
	return nil
}
