package shadow

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// BARSpace is the shadow of a guest's BAR1 or BAR3 address space: the
// guest's BAR instance block names a page directory whose PDE 0 names a
// small-page table; the entries covering the VM's aperture slice are
// translated (by the same code as channel page tables) into the VM's slice
// of the physical BAR page table, which the aggregator owns. Guest aperture
// page i is physical aperture page (slice start + i). The guest's instance
// block, PDE 0 and page table are watched through the Manager's tracker.
// Large pages and PDEs beyond the first are not used by BAR apertures this
// small (at most 128 MiB, one PDE) and are not shadowed.
type BARSpace struct {
	m *Manager
	mirror
	t table // the slice of the physical BAR page table (t.shadow) and the guest table it mirrors

	valid      bool
	guestRAMIN uint64
	watched    []watched // the guest pages watched now
	guest      []uint64  // guest VRAM page each aperture page maps, or NoGuestPage
	dirty      bool
	// pv: the aperture is mapped by hypercalls (PVSet), not mirrored from
	// guest tables; Sync keeps what is installed.
	pv bool

	totals Counters
}

// NoGuestPage marks an aperture page that maps no guest VRAM.
const NoGuestPage = ^uint64(0)

type watched struct {
	kind       Kind
	addr, size uint64
}

// NewBARSpace shadows a BAR aperture slice of pages pages whose physical
// page-table entries start at VRAM address dst (in the aggregator's
// physical BAR page table). It maps nothing until SetInstance and Sync.
func (m *Manager) NewBARSpace(dst uint64, pages int) *BARSpace {
	b := &BARSpace{
		m:      m,
		mirror: mirror{mem: m.mem, tr: m.tr, next: make([]uint64, pages)},
		t:      table{shadow: dst, entries: pages, cur: make([]uint64, pages), guestRaw: make([]uint64, pages)},
		guest:  make([]uint64, pages),
	}
	for i := range b.guest {
		b.guest[i] = NoGuestPage
	}
	return b
}

// SetInstance records a guest write of the BAR instance register: the
// instance block at guest VRAM address guestRAMIN, used if valid. Sync
// applies it.
func (b *BARSpace) SetInstance(valid bool, guestRAMIN uint64) {
	b.valid, b.guestRAMIN, b.dirty = valid, guestRAMIN, true
}

// GuestPD returns the guest page directory the last Sync found, or
// NoGuestPage.
func (b *BARSpace) GuestPD() uint64 {
	for _, w := range b.watched {
		if w.kind == KindPageDirectory {
			return w.addr
		}
	}
	return NoGuestPage
}

// GuestPage returns the guest VRAM address of the page aperture page i maps
// (NoGuestPage if none, or if it maps system memory).
func (b *BARSpace) GuestPage(i int) uint64 { return b.guest[i] }

// Access reports whether aperture page i maps anything now (in the shadow
// the board uses) and whether the mapping is read-only.
func (b *BARSpace) Access(i int) (mapped, readOnly bool) {
	e := b.t.cur[i]
	if e == 0 {
		return false, false
	}
	return true, nvc0.DecodePTE(uint32(e), uint32(e>>32)).ReadOnly
}

// Pages returns the number of aperture pages.
func (b *BARSpace) Pages() int { return len(b.guest) }

// Dirty reports whether a watched guest page was written since the last Sync.
func (b *BARSpace) Dirty() bool { return b.dirty }

// Totals returns the BAR space's cumulative counters.
func (b *BARSpace) Totals() Counters { return b.totals }

// GuestWrite implements Watcher.
func (b *BARSpace) GuestWrite(uint64, uint64) { b.dirty = true }

// Unseen implements Watcher.
func (b *BARSpace) Unseen(uint64) { b.dirty = true }

// Sync re-reads the guest's BAR instance block, PDE 0 and page table and
// writes the physical entries that changed. Anything the guest names
// outside its slice maps nothing. The caller flushes the physical BAR TLB
// if the stats report a change.
func (b *BARSpace) Sync() (Stats, error) {
	if b.pv {
		return Stats{}, nil
	}
	start := time.Now()
	st := Stats{Kind: ScanFull}
	b.gen++
	b.dirty = false
	want := b.scanGuest()
	var n int
	var ws []watched
	var err error
	if want.ok {
		n = want.entries
		ws = want.watch
		b.t.guest = want.pt
		err = b.scanTable(&b.t, 0, n, false, &st)
	}
	// Entries beyond what the guest maps are cleared; a zero guest entry
	// is the one whose translation is zero, so the diff stays consistent.
	zero := b.next[:len(b.t.cur)-n]
	clear(zero)
	if cerr := b.commit(b.t.shadow+uint64(n)*nvc0.PTESize, nvc0.PTESize, b.t.cur[n:], zero, false, &st); cerr != nil {
		err = errors.Join(err, cerr)
	}
	clear(b.t.guestRaw[n:])
	b.rewatch(ws)
	for i := range b.guest {
		b.guest[i] = NoGuestPage
		if i >= n || b.t.cur[i] == 0 {
			continue
		}
		raw := b.t.guestRaw[i]
		if e := nvc0.DecodePTE(uint32(raw), uint32(raw>>32)); !e.IsSystem() {
			b.guest[i] = e.Addr
		}
	}
	st.Duration = time.Since(start)
	b.totals.add(st)
	if err != nil {
		b.dirty = true
		return st, fmt.Errorf("BAR shadow: %w", err)
	}
	return st, nil
}

type barWant struct {
	ok      bool
	pt      uint64
	entries int
	watch   []watched
}

// scanGuest finds the guest table to mirror: the instance block, its page
// directory's PDE 0 and the small-page table, each entirely in the slice.
func (b *BARSpace) scanGuest() barWant {
	var w barWant
	if !b.valid {
		return w
	}
	read := func(g, n uint64) []byte {
		phys, ok := b.tr.VRAMAddr(g, n)
		if !ok {
			return nil
		}
		buf := make([]byte, n)
		if b.mem.ReadVRAM(buf, phys) != nil {
			return nil
		}
		return buf
	}
	ramin := read(b.guestRAMIN, nvc0.RAMINSize)
	if ramin == nil {
		return w
	}
	w.watch = append(w.watch, watched{KindBARInstance, b.guestRAMIN, nvc0.RAMINSize})
	pd, target := nvc0.RAMINAddrDecode(binary.LittleEndian.Uint32(ramin[nvc0.RAMINPageDir:]), binary.LittleEndian.Uint32(ramin[nvc0.RAMINPageDir+4:]))
	if target != nvc0.MemTargetVRAM {
		return w // a page directory outside VRAM maps nothing
	}
	limit := binary.LittleEndian.Uint64(ramin[nvc0.RAMINAddrLimit:])
	pde := read(pd, nvc0.PDESize)
	if pde == nil {
		return w
	}
	w.watch = append(w.watch, watched{KindPageDirectory, pd, nvc0.PDESize})
	d := nvc0.DecodePDE(binary.LittleEndian.Uint32(pde), binary.LittleEndian.Uint32(pde[4:]))
	if !d.SmallPresent || d.SmallSys {
		return w
	}
	n := uint64(len(b.t.cur))
	if pages := (limit + 1) / nvc0.PageSize; limit != 0 && pages < n {
		n = pages
	}
	if n > nvc0.SmallPTECount>>d.Size {
		n = nvc0.SmallPTECount >> d.Size
	}
	if _, ok := b.tr.VRAMAddr(d.SmallAddr, n*nvc0.PTESize); !ok || n == 0 {
		return w
	}
	w.watch = append(w.watch, watched{KindPageTable, d.SmallAddr, n * nvc0.PTESize})
	w.ok, w.pt, w.entries = true, d.SmallAddr, int(n)
	return w
}

// rewatch moves the tracker's watches to ws.
func (b *BARSpace) rewatch(ws []watched) {
	for _, w := range b.watched {
		b.m.tracker.Unwatch(b, w.kind, w.addr, w.size)
	}
	for _, w := range ws {
		b.m.tracker.Watch(b, w.kind, w.addr, w.size)
	}
	b.watched = ws
}

// Clear unmaps the whole slice and drops the watches (the VM leaves). The
// caller flushes the physical BAR TLB.
func (b *BARSpace) Clear() (Stats, error) {
	b.valid, b.pv = false, false
	return b.Sync()
}

// SetPV makes the aperture para-virtual: mapped by PVSet only, never from
// guest tables (the guest's BAR instance register is then ignored).
func (b *BARSpace) SetPV() { b.pv, b.valid = true, false }

// PVSet installs guest entries ptes (nvc0 PTE words with guest addresses;
// 0 unmaps) at aperture pages first, first+1, …: each present entry is
// translated into the VM's slice or RAM, and if any cannot be the call
// fails with ErrPVFault and nothing changes. The caller flushes the
// physical BAR TLB if the stats report a change.
func (b *BARSpace) PVSet(first int, ptes []uint64) (Stats, error) {
	var st Stats
	if !b.pv {
		return st, ErrPVInval
	}
	if first < 0 || len(ptes) == 0 || first+len(ptes) > len(b.guest) || first+len(ptes) < first {
		return st, fmt.Errorf("aperture pages [%d, +%d) of %d: %w", first, len(ptes), len(b.guest), ErrPVRange)
	}
	next := make([]uint64, len(ptes))
	guest := make([]uint64, len(ptes))
	for j, v := range ptes {
		guest[j] = NoGuestPage
		lo, hi := uint32(v), uint32(v>>32)
		if lo&nvc0.PTEPresent == 0 {
			continue
		}
		e := nvc0.DecodePTE(lo, hi)
		sp, ok := b.tr.PTE(e)
		if !ok {
			return st, fmt.Errorf("aperture page %d (%#x): %w", first+j, v, ErrPVFault)
		}
		slo, shi := sp.Encode()
		next[j] = uint64(slo) | uint64(shi)<<32
		if !e.IsSystem() {
			guest[j] = e.Addr
		}
	}
	start := time.Now()
	err := b.commit(b.t.shadow+uint64(first)*nvc0.PTESize, nvc0.PTESize, b.t.cur[first:first+len(ptes)], next, false, &st)
	for j := range next {
		// What the board now holds is what guest[] says: after a failed
		// write, only the entries that did land.
		if err == nil || b.t.cur[first+j] == next[j] {
			b.guest[first+j] = guest[j]
		}
	}
	st.Duration = time.Since(start)
	return st, err
}
