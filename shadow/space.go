package shadow

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// ErrOutsideSlice is wrapped by errors about a guest address that does not
// lie entirely inside the VM's VRAM slice.
var ErrOutsideSlice = errors.New("guest address outside the VM's VRAM slice")

// ScanKind says how a scan was done.
type ScanKind int

// Scan kinds.
const (
	ScanFull        ScanKind = iota + 1 // every guest PDE and every present page table
	ScanIncremental                     // only guest pages noted dirty since the last scan
)

// String returns "full" or "incremental".
func (k ScanKind) String() string {
	switch k {
	case ScanFull:
		return "full"
	case ScanIncremental:
		return "incremental"
	}
	return fmt.Sprintf("ScanKind(%d)", int(k))
}

// Stats describes one scan of a guest address space.
type Stats struct {
	Kind           ScanKind
	PDEs           int // guest PDEs read and (re)processed
	TablesBuilt    int // shadow page tables allocated and filled from scratch
	PTEsScanned    int // guest PTEs read and translated
	PTEsDropped    int // present guest PTEs shadowed as not present
	PDEsDropped    int // present guest PDE halves (small or large table) not shadowed
	PrivCleared    int // present guest PTEs whose privileged bit was cleared
	EntriesWritten int // shadow PDEs and PTEs written to VRAM
	BytesRead      int // guest table bytes read
	BytesWritten   int // shadow bytes written
	Duration       time.Duration
}

// Changed reports whether the scan modified the shadow in VRAM; if so the
// aggregator must flush the GPU TLB for the shadow page directory before the
// change is guaranteed visible.
func (s Stats) Changed() bool { return s.EntriesWritten > 0 }

// ownerKind says which structure of a Space a watched guest page belongs to.
type ownerKind uint8

const (
	ownPD ownerKind = iota
	ownSmall
	ownLarge
)

// owner names a structure held (partly) in a watched guest page.
type owner struct {
	kind ownerKind
	pde  int32
}

// Space is the shadow of one guest page directory: a shadow page directory
// plus shadow small- and large-page tables allocated on demand from reserved
// VRAM. It knows which guest VRAM pages hold the guest page directory and the
// guest page tables it mirrors, so trapped guest writes can be turned into an
// incremental rescan. A Space is not safe for concurrent use.
type Space struct {
	mirror
	alloc Allocator
	// tracker, if set, learns which guest pages the space watches; retire,
	// if set, takes shadow memory the space no longer uses (the Manager
	// frees it only after flushing the TLB of shadowPD).
	tracker *Tracker
	retire  func(addr, flushPD uint64)

	guestPD  uint64 // guest VRAM address of the guest page directory
	physPD   uint64 // its physical address (inside the slice)
	shadowPD uint64 // physical address of the shadow page directory

	guestPDE []uint64 // guest PDEs as last read (w0 | w1<<32)
	pdCur    []uint64 // shadow PDEs as written
	pdWant   []uint64 // shadow PDEs being computed
	small    []*table
	large    []*table

	watch    map[uint64][]owner  // guest VRAM page number -> structures in it
	dirty    map[uint64]struct{} // watched guest pages written since the last scan
	allDirty bool                // next SyncIncremental must be a full scan

	pendingFree []*table // tables unlinked during this scan, freed once the PD is written
	zombies     []uint64 // shadow memory that may still be referenced after a write error
	shadowBytes uint64

	pdBuf []byte // guest page-directory bytes being processed

	totals Counters
	sink   *Counters // the Manager's counters, or nil

	// Manager bookkeeping.
	refs   int
	closed bool
	// pv: a para-virtual page directory (pv.go): the aggregator writes it
	// entry by entry; there is no guest copy to scan.
	pv bool
}

// NewSpace creates the shadow of the guest page directory at guest VRAM
// address guestPD, which must lie entirely inside the slice. It allocates and
// clears the shadow page directory; the shadow maps nothing until the first
// Sync (SyncIncremental also does a full scan first).
func NewSpace(mem Memory, alloc Allocator, tr *Translator, guestPD uint64) (*Space, error) {
	phys, ok := tr.VRAMAddr(guestPD, nvc0.PageDirSize)
	if !ok {
		return nil, fmt.Errorf("shadow space: page directory at guest %#x (+%#x): %w", guestPD, nvc0.PageDirSize, ErrOutsideSlice)
	}
	s := &Space{
		mirror:  mirror{mem: mem, tr: tr, next: make([]uint64, nvc0.SmallPTECount)},
		alloc:   alloc,
		guestPD: guestPD, physPD: phys,
		guestPDE: make([]uint64, nvc0.PDECount),
		pdCur:    make([]uint64, nvc0.PDECount),
		pdWant:   make([]uint64, nvc0.PDECount),
		small:    make([]*table, nvc0.PDECount),
		large:    make([]*table, nvc0.PDECount),
		watch:    make(map[uint64][]owner),
		dirty:    make(map[uint64]struct{}),
		allDirty: true,
	}
	pd, err := alloc.Alloc(nvc0.PageDirSize, nvc0.PageSize)
	if err != nil {
		return nil, fmt.Errorf("shadow space: allocate page directory: %w", err)
	}
	if err := mem.WriteVRAM(make([]byte, nvc0.PageDirSize), pd); err != nil {
		return nil, errors.Join(fmt.Errorf("shadow space: clear page directory at %#x: %w", pd, err), alloc.Free(pd))
	}
	s.shadowPD = pd
	s.shadowBytes = nvc0.PageDirSize
	s.watchRange(guestPD, nvc0.PageDirSize, owner{kind: ownPD})
	return s, nil
}

// track registers the space's watched pages with a tracker (the Manager
// does it once the space is created) and sends its frees to retire.
func (s *Space) track(t *Tracker, retire func(addr, flushPD uint64)) {
	s.tracker, s.retire = t, retire
	for p, os := range s.watch {
		for _, k := range ownerKinds(os) {
			t.Watch(s, k, p<<nvc0.PageShift, nvc0.PageSize)
		}
	}
}

// ownerKinds returns the tracker kinds of a page's owners, without repeats.
func ownerKinds(os []owner) []Kind {
	var ks []Kind
	for _, o := range os {
		if k := o.trackKind(); !slices.Contains(ks, k) {
			ks = append(ks, k)
		}
	}
	return ks
}

func (o owner) trackKind() Kind {
	if o.kind == ownPD {
		return KindPageDirectory
	}
	return KindPageTable
}

// GuestWrite implements Watcher: a trapped guest write hit a page holding
// the guest page directory or a mirrored page table.
func (s *Space) GuestWrite(addr, n uint64) { s.NoteWrite(addr, n) }

// Unseen implements Watcher: the page may have changed without a trap.
func (s *Space) Unseen(page uint64) {
	if _, ok := s.watch[page]; ok {
		s.dirty[page] = struct{}{}
	}
}

// free gives shadow memory back: to the retire hook (the Manager frees it
// after a TLB flush of this space) or straight to the allocator.
func (s *Space) free(addr uint64) error {
	if s.retire != nil {
		s.retire(addr, s.shadowPD)
		return nil
	}
	return s.alloc.Free(addr)
}

// ShadowPD returns the physical VRAM address of the shadow page directory,
// the value a shadow RAMIN holds at its page-directory field.
func (s *Space) ShadowPD() uint64 { return s.shadowPD }

// GuestPD returns the guest VRAM address of the guest page directory.
func (s *Space) GuestPD() uint64 { return s.guestPD }

// ShadowBytes returns the reserved VRAM the space holds.
func (s *Space) ShadowBytes() uint64 { return s.shadowBytes }

// Totals returns the space's cumulative counters.
func (s *Space) Totals() Counters { return s.totals }

// Dirty reports whether a scan is due: a watched page was written, or a full
// scan was requested, since the last scan.
func (s *Space) Dirty() bool { return !s.pv && (s.allDirty || len(s.dirty) > 0) }

// Closed reports whether the space was closed (its memory retired).
func (s *Space) Closed() bool { return s.closed }

// PV reports whether the space is a para-virtual page directory (built by
// hypercalls, never scanned).
func (s *Space) PV() bool { return s.pv }

// Watches reports whether the guest VRAM page holding guestAddr holds part of
// the guest page directory or of a guest page table this space mirrors.
func (s *Space) Watches(guestAddr uint64) bool {
	_, ok := s.watch[guestAddr>>nvc0.PageShift]
	return ok
}

// WatchedPages returns the guest VRAM page numbers (address >> page shift)
// that hold the guest page directory and mirrored page tables, sorted.
func (s *Space) WatchedPages() []uint64 {
	out := make([]uint64, 0, len(s.watch))
	for p := range s.watch {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// NoteWrite records that the guest wrote [guestAddr, guestAddr+n) of its
// VRAM. Pages holding mirrored structures are marked dirty for the next
// SyncIncremental. It reports whether any watched page was hit. The cost is
// one map lookup per page written (or one per watched page for huge writes).
func (s *Space) NoteWrite(guestAddr, n uint64) bool {
	if n == 0 || len(s.watch) == 0 {
		return false
	}
	first := guestAddr >> nvc0.PageShift
	end := guestAddr + n - 1
	if end < guestAddr {
		end = ^uint64(0)
	}
	last := end >> nvc0.PageShift
	hit := false
	if last-first >= uint64(len(s.watch)) {
		for p := range s.watch {
			if p >= first && p <= last {
				s.dirty[p] = struct{}{}
				hit = true
			}
		}
		return hit
	}
	for p := first; ; p++ {
		if _, ok := s.watch[p]; ok {
			s.dirty[p] = struct{}{}
			hit = true
		}
		if p == last {
			break
		}
	}
	return hit
}

// MarkAllDirty makes the next SyncIncremental a full scan. Call it when the
// guest tables may have changed without a trapped write: the GPU itself wrote
// guest VRAM, or a remapped (pass-through) aperture covered them.
func (s *Space) MarkAllDirty() { s.allDirty = true }

// Sync does a full scan: it reads the whole guest page directory, and for
// every present PDE the whole guest small/large page table, translates every
// PTE, and writes the shadow entries that changed. PDEs whose table is
// outside the slice (or in system memory) are shadowed as absent. On an error
// the shadow stays safe (every entry written is a translated one) but may be
// stale; the next SyncIncremental is then a full scan again.
func (s *Space) Sync() (Stats, error) {
	if s.closed {
		return Stats{}, errors.New("shadow space: sync after close")
	}
	if s.pv {
		return Stats{}, nil // nothing to scan
	}
	start := time.Now()
	st := Stats{Kind: ScanFull}
	s.gen++
	clear(s.dirty)
	s.allDirty = false
	raw, err := s.readGuest(&s.pdBuf, s.physPD, nvc0.PageDirSize, &st)
	if err == nil {
		err = s.scanPDEs(0, raw, true, &st)
	}
	return s.finish(st, start, err)
}

// SyncIncremental re-scans only the guest pages noted dirty since the last
// scan: a dirty page-directory page re-reads its 512 PDEs and rebuilds the
// tables of the PDEs that changed; a dirty page-table page re-reads its 512
// PTEs. It does a full scan instead if none was done yet, or after
// MarkAllDirty or a failed scan.
func (s *Space) SyncIncremental() (Stats, error) {
	if s.closed {
		return Stats{}, errors.New("shadow space: sync after close")
	}
	if s.allDirty || s.pv {
		return s.Sync()
	}
	start := time.Now()
	st := Stats{Kind: ScanIncremental}
	s.gen++
	pages := make([]uint64, 0, len(s.dirty))
	for p := range s.dirty {
		pages = append(pages, p)
	}
	clear(s.dirty)
	slices.Sort(pages)
	var errs []error
	// Page-directory pages first: they may relink tables, which then get
	// whole-table scans and need no per-page rescan.
	for _, p := range pages {
		if !slices.Contains(s.watch[p], owner{kind: ownPD}) {
			continue
		}
		first, n := overlap(p, s.guestPD, nvc0.PageDirSize, nvc0.PDESize)
		raw, err := s.readGuest(&s.pdBuf, s.physPD+uint64(first)*nvc0.PDESize, uint64(n)*nvc0.PDESize, &st)
		if err == nil {
			err = s.scanPDEs(first, raw, false, &st)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	for _, p := range pages {
		for _, o := range s.watch[p] {
			var t *table
			switch o.kind {
			case ownSmall:
				t = s.small[o.pde]
			case ownLarge:
				t = s.large[o.pde]
			}
			if t == nil || t.gen == s.gen {
				continue
			}
			from, n := overlap(p, t.guest, t.bytes(), nvc0.PTESize)
			if err := s.scanTable(t, from, from+n, false, &st); err != nil {
				errs = append(errs, fmt.Errorf("PDE %d: %w", o.pde, err))
			}
		}
	}
	return s.finish(st, start, errors.Join(errs...))
}

// overlap returns the entries [first, first+n) of a structure of size bytes
// at guest address base, made of entries of entrySize bytes, that lie (even
// partly) in guest page p.
func overlap(p, base, size, entrySize uint64) (first, n int) {
	lo := max(p<<nvc0.PageShift, base)
	hi := min((p+1)<<nvc0.PageShift, base+size)
	if hi <= lo {
		return 0, 0
	}
	f := (lo - base) / entrySize
	l := (hi - base + entrySize - 1) / entrySize
	return int(f), int(l - f)
}

func (s *Space) finish(st Stats, start time.Time, err error) (Stats, error) {
	st.Duration = time.Since(start)
	if err != nil {
		s.allDirty = true
		err = fmt.Errorf("shadow space (guest PD %#x): %s scan: %w", s.guestPD, st.Kind, err)
	}
	s.totals.add(st)
	if s.sink != nil {
		s.sink.add(st)
	}
	return st, err
}

// scanPDEs processes the guest PDEs first, first+1, … whose bytes are raw.
// With full set every PDE's tables are rescanned; otherwise only PDEs whose
// guest value changed are processed.
func (s *Space) scanPDEs(first int, raw []byte, full bool, st *Stats) error {
	n := len(raw) / nvc0.PDESize
	// The page directory's desired entries are computed into their own
	// buffer: scanning tables reuses s.next.
	want := s.pdWant[:n]
	copy(want, s.pdCur[first:first+n])
	var errs []error
	for k := range n {
		i := first + k
		w0 := binary.LittleEndian.Uint32(raw[k*nvc0.PDESize:])
		w1 := binary.LittleEndian.Uint32(raw[k*nvc0.PDESize+4:])
		v := uint64(w0) | uint64(w1)<<32
		if !full && v == s.guestPDE[i] {
			continue
		}
		s.guestPDE[i] = v
		st.PDEs++
		g := nvc0.DecodePDE(w0, w1)
		var sp nvc0.PDE
		addr, ok, err := s.syncTable(i, false, g.SmallPresent, g.SmallSys, g.SmallAddr, nvc0.SmallPTECount>>g.Size, full, st)
		if err != nil {
			errs = append(errs, fmt.Errorf("PDE %d small table: %w", i, err))
		}
		if ok {
			sp.SmallPresent, sp.SmallAddr, sp.Size = true, addr, g.Size
		}
		addr, ok, err = s.syncTable(i, true, g.LargePresent, g.LargeSys, g.LargeAddr, nvc0.LargePTECount, full, st)
		if err != nil {
			errs = append(errs, fmt.Errorf("PDE %d large table: %w", i, err))
		}
		if ok {
			sp.LargePresent, sp.LargeAddr = true, addr
		}
		e0, e1 := sp.Encode()
		want[k] = uint64(e0) | uint64(e1)<<32
	}
	// Link new tables only after they are filled (done above), unlink old
	// ones before freeing them.
	if err := s.commit(s.shadowPD+uint64(first)*nvc0.PDESize, nvc0.PDESize, s.pdCur[first:first+n], want, false, st); err != nil {
		for _, t := range s.pendingFree {
			s.zombies = append(s.zombies, t.shadow)
		}
		s.pendingFree = s.pendingFree[:0]
		return errors.Join(append(errs, fmt.Errorf("write shadow page directory: %w", err))...)
	}
	for _, t := range s.pendingFree {
		if err := s.freeTable(t); err != nil {
			errs = append(errs, err)
		}
	}
	s.pendingFree = s.pendingFree[:0]
	return errors.Join(errs...)
}

// syncTable brings the small (large=false) or large table of PDE i in line
// with the guest PDE half (present, sys, guestAddr, entries) and returns the
// shadow table address to link, if any.
func (s *Space) syncTable(i int, large, present, sys bool, guestAddr uint64, entries int, full bool, st *Stats) (uint64, bool, error) {
	slot := &s.small[i]
	kind := ownSmall
	if large {
		slot, kind = &s.large[i], ownLarge
	}
	t := *slot
	size := uint64(entries) * nvc0.PTESize
	ok := false
	if present && !sys {
		_, ok = s.tr.VRAMAddr(guestAddr, size)
	}
	if present && !ok {
		st.PDEsDropped++
	}
	if t != nil && (!ok || t.entries != entries) {
		s.unwatchRange(t.guest, t.bytes(), owner{kind, int32(i)})
		s.pendingFree = append(s.pendingFree, t)
		*slot, t = nil, nil
	}
	if !ok {
		return 0, false, nil
	}
	if t == nil {
		addr, err := s.alloc.Alloc(size, nvc0.PageSize)
		if err != nil {
			st.PDEsDropped++
			return 0, false, fmt.Errorf("allocate shadow table of %#x bytes: %w", size, err)
		}
		t = &table{large: large, guest: guestAddr, entries: entries, shadow: addr, cur: make([]uint64, entries), guestRaw: make([]uint64, entries)}
		s.shadowBytes += size
		if err := s.scanTable(t, 0, entries, true, st); err != nil {
			st.PDEsDropped++
			return 0, false, errors.Join(err, s.freeTable(t))
		}
		st.TablesBuilt++
		s.watchRange(guestAddr, size, owner{kind, int32(i)})
		*slot = t
		return t.shadow, true, nil
	}
	if t.guest != guestAddr {
		s.unwatchRange(t.guest, t.bytes(), owner{kind, int32(i)})
		t.guest = guestAddr
		s.watchRange(guestAddr, size, owner{kind, int32(i)})
		full = true
	}
	if full {
		if err := s.scanTable(t, 0, entries, false, st); err != nil {
			return t.shadow, true, err // stale but every entry is a translated one
		}
	}
	return t.shadow, true, nil
}

func (s *Space) freeTable(t *table) error {
	s.shadowBytes -= t.bytes()
	if err := s.free(t.shadow); err != nil {
		return fmt.Errorf("free shadow table at %#x: %w", t.shadow, err)
	}
	return nil
}

// watchRange records o as an owner of the guest pages of [guestAddr,
// +size); the tracker learns of a page once per kind of owner, however many
// PDEs name it, so a write costs one notification, not one per PDE.
func (s *Space) watchRange(guestAddr, size uint64, o owner) {
	k := o.trackKind()
	for p := guestAddr >> nvc0.PageShift; p <= (guestAddr+size-1)>>nvc0.PageShift; p++ {
		first := !slices.Contains(ownerKinds(s.watch[p]), k)
		s.watch[p] = append(s.watch[p], o)
		if first && s.tracker != nil {
			s.tracker.Watch(s, k, p<<nvc0.PageShift, nvc0.PageSize)
		}
	}
}

func (s *Space) unwatchRange(guestAddr, size uint64, o owner) {
	k := o.trackKind()
	for p := guestAddr >> nvc0.PageShift; p <= (guestAddr+size-1)>>nvc0.PageShift; p++ {
		os := s.watch[p]
		if i := slices.Index(os, o); i >= 0 {
			os = slices.Delete(os, i, i+1)
		}
		if len(os) == 0 {
			delete(s.watch, p)
		} else {
			s.watch[p] = os
		}
		if s.tracker != nil && !slices.Contains(ownerKinds(os), k) {
			s.tracker.Unwatch(s, k, p<<nvc0.PageShift, nvc0.PageSize)
		}
	}
}

// Close frees the shadow page directory and every shadow table (through the
// retire hook when the space belongs to a Manager). The space must no
// longer be referenced by a shadow RAMIN a running channel may use. Close
// is idempotent.
func (s *Space) Close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	var errs []error
	free := func(addr uint64) {
		if err := s.free(addr); err != nil {
			errs = append(errs, fmt.Errorf("free shadow memory at %#x: %w", addr, err))
		}
	}
	for i := range nvc0.PDECount {
		for _, t := range []*table{s.small[i], s.large[i]} {
			if t != nil {
				free(t.shadow)
			}
		}
		s.small[i], s.large[i] = nil, nil
	}
	for _, a := range s.zombies {
		free(a)
	}
	s.zombies = nil
	free(s.shadowPD)
	s.shadowBytes = 0
	if s.tracker != nil {
		for p, os := range s.watch {
			for _, k := range ownerKinds(os) {
				s.tracker.Unwatch(s, k, p<<nvc0.PageShift, nvc0.PageSize)
			}
		}
	}
	clear(s.watch)
	clear(s.dirty)
	if len(errs) > 0 {
		return fmt.Errorf("shadow space (guest PD %#x): close: %w", s.guestPD, errors.Join(errs...))
	}
	return nil
}
