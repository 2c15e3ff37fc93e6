package shadow

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// ErrQuota is wrapped by allocation errors when a VM's shadows would exceed
// Config.MaxShadowBytes.
var ErrQuota = errors.New("shadow memory quota exceeded")

// Counters are cumulative shadowing counters of a Space or of a Manager (all
// its spaces, including released ones, and its channels).
type Counters struct {
	FullScans        uint64
	IncrementalScans uint64
	PDEsScanned      uint64
	PTEsScanned      uint64
	PTEsDropped      uint64
	PDEsDropped      uint64
	TablesBuilt      uint64
	EntriesWritten   uint64
	BytesWritten     uint64
	ShadowTime       time.Duration // time spent scanning

	// Manager only.
	WritesNoted      uint64 // NoteWrite calls that hit a watched page
	SpacesCreated    uint64
	SpacesFreed      uint64
	ChannelRefreshes uint64
}

func (c *Counters) add(st Stats) {
	switch st.Kind {
	case ScanFull:
		c.FullScans++
	case ScanIncremental:
		c.IncrementalScans++
	}
	c.PDEsScanned += uint64(st.PDEs)
	c.PTEsScanned += uint64(st.PTEsScanned)
	c.PTEsDropped += uint64(st.PTEsDropped)
	c.PDEsDropped += uint64(st.PDEsDropped)
	c.TablesBuilt += uint64(st.TablesBuilt)
	c.EntriesWritten += uint64(st.EntriesWritten)
	c.BytesWritten += uint64(st.BytesWritten)
	c.ShadowTime += st.Duration
}

// budget is an Allocator that bounds the bytes allocated through it.
type budget struct {
	a     Allocator
	limit uint64 // 0: no bound
	used  uint64
	sizes map[uint64]uint64
}

func (b *budget) Alloc(size, align uint64) (uint64, error) {
	if b.limit > 0 && (size > b.limit || b.used > b.limit-size) {
		return 0, fmt.Errorf("allocate %#x bytes with %#x of %#x in use: %w", size, b.used, b.limit, ErrQuota)
	}
	addr, err := b.a.Alloc(size, align)
	if err != nil {
		return 0, err
	}
	b.sizes[addr] = size
	b.used += size
	return addr, nil
}

func (b *budget) Free(addr uint64) error {
	size, ok := b.sizes[addr]
	if !ok {
		return fmt.Errorf("free %#x: not allocated by this VM's shadows", addr)
	}
	if err := b.a.Free(addr); err != nil {
		return err
	}
	delete(b.sizes, addr)
	b.used -= size
	return nil
}

// Config configures a Manager.
type Config struct {
	Memory     Memory
	Allocator  Allocator // reserved VRAM, possibly shared by all VMs
	Translator *Translator
	// MaxShadowBytes bounds the reserved VRAM this VM's shadow structures
	// may hold; 0 means no bound. A guest controls how many shadow tables
	// exist (every PDE may name the same guest table, and each gets its own
	// 256 KiB shadow), so the aggregator should set a bound to keep one VM
	// from exhausting the reserved region shared by all VMs.
	MaxShadowBytes uint64
	// TrapUserAreas keeps the pages holding channel user areas trapped, so
	// that a GP_PUT written there through any aperture is seen
	// (UserAreaWrite); without it the aggregator polls the user areas.
	TrapUserAreas bool
	// UserAreaWrite, if set, is called when a trapped guest write touches
	// the GP_PUT word of a channel's user area, whichever aperture it came
	// through: a doorbell. It runs on the VM's goroutine.
	UserAreaWrite func(c *Channel)
}

// retired is shadow memory no longer in use, waiting for Reclaim.
type retired struct {
	addr    uint64
	flushPD uint64 // the shadow page directory whose TLB may still name it
	flush   bool
	// flushOnly: no memory, only one more page directory to flush before
	// the entries retired with it are freed (a PV table linked in several).
	flushOnly bool
}

// Manager holds one VM's shadow spaces and shadow channels. Channels with the
// same guest page directory share one Space (reference counted). A Manager is
// not safe for concurrent use: the aggregator serves each VM from one
// goroutine.
type Manager struct {
	mem      Memory
	alloc    *budget
	tr       *Translator
	tracker  *Tracker
	onUser   func(*Channel)
	spaces   map[uint64]*Space // guest PD address -> space
	channels map[*Channel]struct{}
	emptyPD  uint64 // a cleared shadow PD for channels without a valid one
	hasEmpty bool
	retired  []retired
	counters Counters // scan counters arrive through Space.sink
	pv       *pvState // PV page tables (pv.go); nil for a FV vGPU
	pvm      *mirror  // writes PV tables
	pvNext   []uint64 // PVWrite's translated entries, reused (at most one table's)
}

// NewManager returns an empty Manager.
func NewManager(c Config) (*Manager, error) {
	if c.Memory == nil || c.Allocator == nil || c.Translator == nil {
		return nil, errors.New("shadow manager: Memory, Allocator and Translator are required")
	}
	return &Manager{
		mem:      c.Memory,
		alloc:    &budget{a: c.Allocator, limit: c.MaxShadowBytes, sizes: make(map[uint64]uint64)},
		tr:       c.Translator,
		tracker:  NewTracker(c.TrapUserAreas),
		onUser:   c.UserAreaWrite,
		spaces:   make(map[uint64]*Space),
		channels: make(map[*Channel]struct{}),
	}, nil
}

// Translator returns the VM's translator.
func (m *Manager) Translator() *Translator { return m.tr }

// Tracker returns the VM's page tracker: every structure of the manager
// watches its guest pages there, and others (the BAR shadows) may too.
func (m *Manager) Tracker() *Tracker { return m.tracker }

// retire queues shadow memory that is no longer linked anywhere. It stays
// allocated (and counted against the VM's budget) until Reclaim, which
// first flushes the TLB of flushPD (when flush is set): a GPU walk or a
// cached translation may still name it until then.
func (m *Manager) retire(addr, flushPD uint64, flush bool) {
	m.retired = append(m.retired, retired{addr: addr, flushPD: flushPD, flush: flush})
}

// Retired returns how many shadow allocations wait for Reclaim.
func (m *Manager) Retired() int { return len(m.retired) }

// Reclaim frees retired shadow memory. First it flushes the GPU TLB of
// every shadow page directory whose translations may name that memory
// (flush; nil when no GPU uses the shadows, as in tests), so that nothing
// walks or caches it once it is reused. The caller must also have stopped
// every channel whose shadow RAMIN named a retired page directory, RAMIN or
// user area (the aggregator stops a channel before it changes or closes
// its shadow). If a flush fails nothing is freed: retired memory stays
// held rather than reused while the GPU may use it.
func (m *Manager) Reclaim(flush func(pd uint64) error) error {
	if len(m.retired) == 0 {
		return nil
	}
	if flush != nil {
		done := map[uint64]bool{}
		for _, r := range m.retired {
			if !r.flush || done[r.flushPD] {
				continue
			}
			if err := flush(r.flushPD); err != nil {
				return fmt.Errorf("shadow manager: reclaim: TLB flush of %#x: %w", r.flushPD, err)
			}
			done[r.flushPD] = true
		}
	}
	var errs []error
	for _, r := range m.retired {
		if !r.flushOnly {
			errs = append(errs, m.alloc.Free(r.addr))
		}
	}
	m.retired = m.retired[:0]
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("shadow manager: reclaim: %w", err)
	}
	return nil
}

// Acquire returns the shared Space of the guest page directory at guest VRAM
// address guestPD, creating it (unsynced) on first use, and takes a
// reference. Every Acquire must be paired with a Release.
func (m *Manager) Acquire(guestPD uint64) (*Space, error) {
	if s, ok := m.spaces[guestPD]; ok {
		s.refs++
		return s, nil
	}
	s, err := NewSpace(m.mem, m.alloc, m.tr, guestPD)
	if err != nil {
		return nil, fmt.Errorf("shadow manager: %w", err)
	}
	s.sink = &m.counters
	s.track(m.tracker, func(addr, pd uint64) { m.retire(addr, pd, true) })
	s.refs = 1
	m.spaces[guestPD] = s
	m.counters.SpacesCreated++
	return s, nil
}

// Release drops a reference taken by Acquire; the last one closes the space
// and frees its shadow memory.
func (m *Manager) Release(s *Space) error {
	if s != nil && s.pv && m.pv != nil {
		return m.pvRelease(s)
	}
	if s == nil || m.spaces[s.guestPD] != s {
		return errors.New("shadow manager: release of a space this manager does not hold")
	}
	s.refs--
	if s.refs > 0 {
		return nil
	}
	delete(m.spaces, s.guestPD)
	m.counters.SpacesFreed++
	return s.Close()
}

// Space returns the space of a guest page directory, if one is held.
func (m *Manager) Space(guestPD uint64) (*Space, bool) {
	s, ok := m.spaces[guestPD]
	return s, ok
}

// Spaces returns the live spaces, in guest page-directory order.
func (m *Manager) Spaces() []*Space {
	out := make([]*Space, 0, len(m.spaces))
	for _, s := range m.spaces {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b *Space) int { return cmp.Compare(a.guestPD, b.guestPD) })
	return out
}

// NumSpaces returns the number of live spaces.
func (m *Manager) NumSpaces() int { return len(m.spaces) }

// NoteWrite reports a trapped guest write to [guestAddr, guestAddr+n) of its
// VRAM to the tracker, which tells every structure watching those pages. It
// reports whether a watched page was hit.
func (m *Manager) NoteWrite(guestAddr, n uint64) bool {
	hit := m.tracker.Write(guestAddr, n)
	if hit {
		m.counters.WritesNoted++
	}
	return hit
}

// MarkAllDirty makes every space's next incremental scan a full one and every
// channel's RAMIN due for a refresh: the GPU, or a remapped aperture, may have
// written guest VRAM without a trap.
func (m *Manager) MarkAllDirty() {
	for _, s := range m.spaces {
		s.MarkAllDirty()
	}
	for c := range m.channels {
		c.dirty = true
	}
}

// IsSensitive reports whether the guest VRAM page holding guestAddr must
// stay trapped (not BAR-remapped): the tracker holds a RAMIN, page
// directory or page table there (or a user area, when user areas trap).
func (m *Manager) IsSensitive(guestAddr uint64) bool { return m.tracker.Trapped(guestAddr) }

// Counters returns the VM's cumulative counters.
func (m *Manager) Counters() Counters { return m.counters }

// ShadowBytes returns the reserved VRAM the VM's shadows hold.
func (m *Manager) ShadowBytes() uint64 { return m.alloc.used }

// emptyShadowPD returns a cleared shadow page directory (maps nothing), for
// channels whose guest page directory is invalid.
func (m *Manager) emptyShadowPD() (uint64, error) {
	if m.hasEmpty {
		return m.emptyPD, nil
	}
	pd, err := m.alloc.Alloc(nvc0.PageDirSize, nvc0.PageSize)
	if err != nil {
		return 0, fmt.Errorf("allocate empty page directory: %w", err)
	}
	if err := m.mem.WriteVRAM(make([]byte, nvc0.PageDirSize), pd); err != nil {
		return 0, errors.Join(fmt.Errorf("clear empty page directory: %w", err), m.alloc.Free(pd))
	}
	m.emptyPD, m.hasEmpty = pd, true
	return pd, nil
}

// Close closes every channel and space still held and retires all their
// shadow memory; Reclaim then frees it. No channel may run on any of it.
func (m *Manager) Close() error {
	var errs []error
	for c := range m.channels {
		errs = append(errs, c.Close())
	}
	for pd, s := range m.spaces {
		delete(m.spaces, pd)
		m.counters.SpacesFreed++
		errs = append(errs, s.Close())
	}
	errs = append(errs, m.closePV())
	if m.hasEmpty {
		m.retire(m.emptyPD, m.emptyPD, true)
		m.hasEmpty = false
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("shadow manager: close: %w", err)
	}
	return nil
}
