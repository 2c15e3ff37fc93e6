package shadow

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// MaxGPFIFOLog2Entries bounds the GPFIFO ring size (log2 of its entry count)
// a shadow RAMIN may declare. nouveau's Fermi channels use 2^10 entries; the
// bound keeps a guest from declaring a ring of 2^31 entries that the
// aggregator would have to reason about (GP_GET/GP_PUT checks, inspection).
// Larger values are clamped.
const MaxGPFIFOLog2Entries = 20

// ErrInvalidChannel is wrapped by errors that leave a shadow channel invalid:
// the aggregator must not enable (or must stop) the physical channel.
var ErrInvalidChannel = errors.New("invalid channel instance block")

// ErrNotVRAM is wrapped when a RAMIN names a page directory or user area in
// another memory target than VRAM (refused: the guest's structures live in
// its VRAM slice).
var ErrNotVRAM = errors.New("not in VRAM")

// ErrEngineContext is wrapped when a RAMIN's engine context pointer is
// refused.
var ErrEngineContext = errors.New("engine context pointer refused")

// engineContext is one engine context pointer of a RAMIN.
type engineContext struct {
	off    uint32
	name   string
	served bool // an engine the board has
}

// engineContexts lists the RAMIN's engine context pointers
// (gf100_ectx_bind: 0x210 + …; envytools GF100 RAMIN).
func engineContexts() []engineContext {
	return []engineContext{
		{nvc0.RAMINEngineGR, "GR", true}, {nvc0.RAMINEngineCE0, "CE0", true}, {nvc0.RAMINEngineCE1, "CE1", true},
		{nvc0.RAMINEngineMSPDEC, "MSPDEC", false}, {nvc0.RAMINEngineMSPPP, "MSPPP", false}, {nvc0.RAMINEngineMSVLD, "MSVLD", false},
	}
}

// putAddr stores a 4 KiB-aligned VRAM address as a RAMIN address field.
func putAddr(b []byte, addr uint64) {
	lo, hi := nvc0.RAMINAddrEncode(addr)
	binary.LittleEndian.PutUint32(b, lo)
	binary.LittleEndian.PutUint32(b[4:], hi)
}

// RAMINField describes a RAMIN field the shadow channel does not copy
// verbatim.
type RAMINField struct {
	Offset uint32 // byte offset in the instance block
	Size   uint32 // bytes
	Name   string
	// Treatment says what the shadow RAMIN holds there.
	Treatment string
}

// RAMINFields lists the RAMIN fields a shadow channel rewrites; every other
// byte of the guest block is copied as is (the board interprets no other
// field; on real hardware the remaining fields are engine state or GPU
// virtual addresses in the channel's own, shadowed, address space).
func RAMINFields() []RAMINField {
	return []RAMINField{
		{nvc0.RAMINUserLo, 8, "user area (doorbell page) VRAM address",
			"replaced by the channel's shadow user area in the reserve, which only the aggregator writes (GP_PUT) and the GPU (GP_GET); the guest's own user area must lie inside the slice or the channel is invalid"},
		{nvc0.RAMINGPFIFOLo, 4, "GPFIFO ring VA bits 31:0",
			"kept: a GPU virtual address, translated by the shadow page tables"},
		{nvc0.RAMINGPFIFOHi, 4, "GPFIFO ring VA bits 39:32 and log2(entries)",
			"re-encoded: VA bits kept, log2(entries) clamped to MaxGPFIFOLog2Entries, other bits cleared"},
		{nvc0.RAMINPageDir, 8, "page-directory VRAM address",
			"replaced by the shadow page directory of the guest's page directory (an empty one if the guest's is outside the slice; the channel is then invalid)"},
		{nvc0.RAMINAddrLimit, 8, "address-space limit",
			"kept: the shadow page directory covers the whole VA space and maps only the VM's memory"},
		{nvc0.RAMINEngineGR, 8, "GR engine context pointer",
			"kept if virtual (bit 2 set: a VA in the channel's shadowed address space) or zero; a physical pointer leaves the channel invalid and reads 0"},
		{nvc0.RAMINEngineCE0, 8, "CE0 engine context pointer", "as GR"},
		{nvc0.RAMINEngineCE1, 8, "CE1 engine context pointer", "as GR"},
		{nvc0.RAMINEngineMSPDEC, 0x30, "video engine context pointers (MSPDEC, MSPPP, MSVLD)",
			"zeroed: engines the board does not have; a non-zero pointer leaves the channel invalid"},
	}
}

// Channel is the shadow of one guest channel instance block (RAMIN): a copy
// in reserved VRAM whose address fields are rewritten (see RAMINFields). The
// physical channel table and playlist only ever name shadow RAMINs. A Channel
// is not safe for concurrent use.
type Channel struct {
	m           *Manager
	guestRAMIN  uint64 // guest VRAM address
	physRAMIN   uint64 // physical address of the guest block
	shadowRAMIN uint64
	shadowUser  uint64 // the user area the GPU uses: reserved VRAM
	space       *Space // nil while the guest page directory is invalid
	cur         [nvc0.RAMINSize]byte
	guestUser   uint64 // guest VRAM address of the guest's user area (valid when userOK)
	user        uint64 // its physical address
	userOK      bool
	userW       userWatch
	dirty       bool
	err         error
	closed      bool
}

// userWatch is a Channel's watch on its guest user area.
type userWatch struct{ c *Channel }

// GuestWrite implements Watcher: a write touching the GP_PUT word of the
// guest's user area is a doorbell, whichever aperture it came through.
func (u userWatch) GuestWrite(addr, n uint64) {
	c := u.c
	put := c.guestUser + nvc0.UserGPPut
	if c.userOK && c.m.onUser != nil && addr < put+4 && put < addr+n {
		c.m.onUser(c)
	}
}

// Unseen implements Watcher: user areas that do not trap are polled.
func (userWatch) Unseen(uint64) {}

// OpenChannel creates the shadow of the guest RAMIN at guest VRAM address
// guestRAMIN and mirrors it (Refresh). It fails only if the RAMIN is not
// inside the slice or shadow memory is short; a block whose contents are
// invalid yields a channel with Err() != nil, since a guest may fill its
// RAMIN after naming it.
func (m *Manager) OpenChannel(guestRAMIN uint64) (*Channel, error) {
	phys, ok := m.tr.VRAMAddr(guestRAMIN, nvc0.RAMINSize)
	if !ok {
		return nil, fmt.Errorf("shadow channel: RAMIN at guest %#x: %w", guestRAMIN, ErrOutsideSlice)
	}
	sh, err := m.alloc.Alloc(nvc0.RAMINSize, nvc0.RAMINSize)
	if err != nil {
		return nil, fmt.Errorf("shadow channel: allocate RAMIN: %w", err)
	}
	// The shadow user area starts zeroed (GP_GET = GP_PUT = 0): reserved
	// memory is scrubbed when freed.
	su, err := m.alloc.Alloc(nvc0.UserAreaSize, nvc0.PageSize)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("shadow channel: allocate user area: %w", err), m.alloc.Free(sh))
	}
	c := &Channel{m: m, guestRAMIN: guestRAMIN, physRAMIN: phys, shadowRAMIN: sh, shadowUser: su}
	c.userW = userWatch{c}
	if err := c.write(); err != nil { // the shadow starts as a copy of c.cur (zero)
		return nil, errors.Join(fmt.Errorf("shadow channel: %w", err), m.alloc.Free(sh), m.alloc.Free(su))
	}
	m.channels[c] = struct{}{}
	m.tracker.Watch(c, KindRAMIN, guestRAMIN, nvc0.RAMINSize)
	if err := c.Refresh(); err != nil && !errors.Is(err, ErrInvalidChannel) {
		return nil, errors.Join(err, c.Close())
	}
	return c, nil
}

// GuestRAMIN returns the guest VRAM address of the guest RAMIN.
func (c *Channel) GuestRAMIN() uint64 { return c.guestRAMIN }

// ShadowRAMIN returns the physical VRAM address of the shadow RAMIN: the
// instance the physical channel table and playlist must hold.
func (c *Channel) ShadowRAMIN() uint64 { return c.shadowRAMIN }

// Space returns the shadow space of the channel's page directory, or nil if
// the guest's page directory is invalid.
func (c *Channel) Space() *Space { return c.space }

// UserArea returns the physical VRAM address of the guest's user area
// (inside the slice), where the aggregator mirrors GP_GET and, when user
// areas are polled, reads the guest's GP_PUT. The GPU never uses it.
func (c *Channel) UserArea() uint64 { return c.user }

// GuestUserArea returns the guest VRAM address of the guest's user area.
func (c *Channel) GuestUserArea() uint64 { return c.guestUser }

// ShadowUserArea returns the physical VRAM address of the user area the
// shadow RAMIN names: in reserved memory, so only the aggregator writes
// GP_PUT there (the dispatcher, when the scheduler releases a submission)
// and only the GPU writes GP_GET.
func (c *Channel) ShadowUserArea() uint64 { return c.shadowUser }

// GPFIFOEntries returns the GPFIFO ring size the shadow RAMIN declares,
// from the aggregator's own copy of it (no VRAM read).
func (c *Channel) GPFIFOEntries() uint32 {
	_, n := nvc0.GPFIFODecode(binary.LittleEndian.Uint32(c.cur[nvc0.RAMINGPFIFOLo:]), binary.LittleEndian.Uint32(c.cur[nvc0.RAMINGPFIFOHi:]))
	return n
}

// Err returns why the channel is invalid, or nil.
func (c *Channel) Err() error { return c.err }

// Valid reports whether the last Refresh found the guest RAMIN valid.
func (c *Channel) Valid() bool { return c.err == nil }

// Dirty reports whether the guest RAMIN was written since the last Refresh.
func (c *Channel) Dirty() bool { return c.dirty }

// holds reports whether guestAddr's page holds part of the guest RAMIN.
func (c *Channel) holds(guestAddr uint64) bool {
	p := guestAddr >> nvc0.PageShift
	return p >= c.guestRAMIN>>nvc0.PageShift && p <= (c.guestRAMIN+nvc0.RAMINSize-1)>>nvc0.PageShift
}

// GuestWrite implements Watcher: a trapped write hit the guest RAMIN.
func (c *Channel) GuestWrite(addr, n uint64) { c.NoteWrite(addr, n) }

// Unseen implements Watcher: the RAMIN may have changed without a trap.
func (c *Channel) Unseen(uint64) { c.dirty = true }

// NoteWrite records a guest write to [guestAddr, guestAddr+n) of its VRAM
// and reports whether it touched the guest RAMIN (the channel is then due
// for a Refresh).
func (c *Channel) NoteWrite(guestAddr, n uint64) bool {
	if n == 0 {
		return false
	}
	end := guestAddr + n
	if end < guestAddr {
		end = ^uint64(0)
	}
	if guestAddr < c.guestRAMIN+nvc0.RAMINSize && c.guestRAMIN < end {
		c.dirty = true
		return true
	}
	return false
}

// Refresh re-mirrors the guest RAMIN into the shadow RAMIN: it copies the
// block, binds the shadow space of the guest's page directory (acquiring a
// new one and releasing the old if it changed; the space is not scanned
// here), translates the user area and bounds the GPFIFO size, and writes the
// shadow block if it changed. An error wrapping ErrInvalidChannel leaves a
// safe shadow (empty page directory, user area at the slice base) that the
// aggregator must not activate.
func (c *Channel) Refresh() error {
	if c.closed {
		return errors.New("shadow channel: refresh after close")
	}
	c.m.counters.ChannelRefreshes++
	var blk [nvc0.RAMINSize]byte
	if err := c.m.mem.ReadVRAM(blk[:], c.physRAMIN); err != nil {
		return fmt.Errorf("shadow channel (guest RAMIN %#x): read: %w", c.guestRAMIN, err)
	}
	var invalid []error

	// Page directory. The old space is released only once the new shadow
	// block is written, so the shadow RAMIN never names freed memory. Only
	// a page directory in VRAM is accepted (the guest's slice).
	gpd, target := nvc0.RAMINAddrDecode(binary.LittleEndian.Uint32(blk[nvc0.RAMINPageDir:]), binary.LittleEndian.Uint32(blk[nvc0.RAMINPageDir+4:]))
	old, sp := c.space, c.space
	switch {
	case c.m.pv != nil:
		// PV: the page directory is the one SET_PGD bound to this
		// instance block; the RAMIN's own field means nothing.
		bound, ok := c.m.pvBound(c.guestRAMIN)
		switch {
		case !ok:
			sp = nil
			invalid = append(invalid, fmt.Errorf("no page directory bound to the instance block: %w", ErrPVHandle))
		case bound != old:
			bound.refs++
			sp = bound
		}
	case target != nvc0.MemTargetVRAM:
		sp = nil
		invalid = append(invalid, fmt.Errorf("page directory at guest %#x: memory target %d: %w", gpd, target, ErrNotVRAM))
	case old == nil || old.GuestPD() != gpd:
		var err error
		if sp, err = c.m.Acquire(gpd); err != nil {
			if !errors.Is(err, ErrOutsideSlice) {
				return fmt.Errorf("shadow channel (guest RAMIN %#x): %w", c.guestRAMIN, err)
			}
			invalid = append(invalid, err)
		}
	}
	undo := func() {
		if sp != nil && sp != old {
			_ = c.m.Release(sp) // just acquired: dropping our reference cannot fail
		}
	}
	var pd uint64
	if sp != nil {
		pd = sp.ShadowPD()
	} else {
		var err error
		if pd, err = c.m.emptyShadowPD(); err != nil {
			return fmt.Errorf("shadow channel (guest RAMIN %#x): %w", c.guestRAMIN, err)
		}
	}
	putAddr(blk[nvc0.RAMINPageDir:], pd)

	// User area: the GPU gets the shadow; the guest's is checked and
	// watched (a GP_PUT written into it is a doorbell).
	gu, target := nvc0.RAMINAddrDecode(binary.LittleEndian.Uint32(blk[nvc0.RAMINUserLo:]), binary.LittleEndian.Uint32(blk[nvc0.RAMINUserHi:]))
	user, userOK := c.m.tr.VRAMAddr(gu, nvc0.UserAreaSize)
	switch {
	case target != nvc0.MemTargetVRAM:
		userOK = false
		invalid = append(invalid, fmt.Errorf("user area at guest %#x: memory target %d: %w", gu, target, ErrNotVRAM))
	case !userOK:
		invalid = append(invalid, fmt.Errorf("user area at guest %#x: %w", gu, ErrOutsideSlice))
	}
	putAddr(blk[nvc0.RAMINUserLo:], c.shadowUser)
	c.setUser(gu, user, userOK)

	// Engine context pointers: a virtual address in the channel's own
	// (shadowed) address space is kept; a physical one would let the
	// engine load and save at any VRAM address, so it is refused.
	for _, e := range engineContexts() {
		lo, hi := binary.LittleEndian.Uint32(blk[e.off:]), binary.LittleEndian.Uint32(blk[e.off+4:])
		if _, virtual := nvc0.RAMINEngineDecode(lo, hi); !virtual && (lo != 0 || hi != 0) || !e.served && (lo != 0 || hi != 0) {
			why := "a physical address (bit 2 clear)"
			if !e.served {
				why = "an engine the board does not have"
			}
			invalid = append(invalid, fmt.Errorf("%s context pointer %#x:%#x at +%#x is %s: %w", e.name, hi, lo, e.off, why, ErrEngineContext))
			lo, hi = 0, 0
		}
		binary.LittleEndian.PutUint32(blk[e.off:], lo)
		binary.LittleEndian.PutUint32(blk[e.off+4:], hi)
	}

	// GPFIFO: the VA is kept, the size bounded.
	va, entries := nvc0.GPFIFODecode(binary.LittleEndian.Uint32(blk[nvc0.RAMINGPFIFOLo:]), binary.LittleEndian.Uint32(blk[nvc0.RAMINGPFIFOHi:]))
	log2 := uint(bits.TrailingZeros32(entries))
	binary.LittleEndian.PutUint32(blk[nvc0.RAMINGPFIFOHi:], nvc0.GPFIFOHiEncode(va, min(log2, MaxGPFIFOLog2Entries)))

	if blk != c.cur {
		prev := c.cur
		c.cur = blk
		if err := c.write(); err != nil {
			c.cur = prev
			undo()
			c.err = fmt.Errorf("shadow channel (guest RAMIN %#x): %w: %w", c.guestRAMIN, ErrInvalidChannel, err)
			return c.err
		}
	}
	c.space = sp
	if old != nil && old != sp {
		if err := c.m.Release(old); err != nil {
			return fmt.Errorf("shadow channel (guest RAMIN %#x): %w", c.guestRAMIN, err)
		}
	}
	c.dirty = false
	c.err = nil
	if len(invalid) > 0 {
		c.err = fmt.Errorf("shadow channel (guest RAMIN %#x): %w: %w", c.guestRAMIN, ErrInvalidChannel, errors.Join(invalid...))
	}
	return c.err
}

// setUser points the channel at the guest user area gu (physical user;
// ok when inside the slice) and moves the tracker's watch there.
func (c *Channel) setUser(gu, user uint64, ok bool) {
	if c.userOK && (!ok || gu != c.guestUser) {
		c.m.tracker.Unwatch(c.userW, KindUserArea, c.guestUser, nvc0.UserAreaSize)
	}
	if ok && (!c.userOK || gu != c.guestUser) {
		c.m.tracker.Watch(c.userW, KindUserArea, gu, nvc0.UserAreaSize)
	}
	c.guestUser, c.user, c.userOK = gu, user, ok
	if !ok {
		c.guestUser, c.user = 0, 0
	}
}

// write stores c.cur in the shadow RAMIN.
func (c *Channel) write() error {
	if err := c.m.mem.WriteVRAM(c.cur[:], c.shadowRAMIN); err != nil {
		return fmt.Errorf("write shadow RAMIN at %#x: %w", c.shadowRAMIN, err)
	}
	return nil
}

// Activate prepares the channel for use by the GPU (call it on a doorbell or
// a context bind: GPUvm's lazy shadowing): it refreshes the shadow RAMIN if
// the guest wrote it, then brings the shadow page tables up to date with an
// incremental scan. The aggregator must flush the TLB for Space().ShadowPD()
// if the returned stats report a change.
func (c *Channel) Activate() (Stats, error) {
	if c.dirty {
		if err := c.Refresh(); err != nil {
			return Stats{}, err
		}
	}
	if c.err != nil {
		return Stats{}, c.err
	}
	return c.space.SyncIncremental()
}

// Close releases the channel's space and retires the shadow RAMIN and user
// area (the Manager's Reclaim frees them). The physical channel must be
// stopped and no longer name them. Close is idempotent.
func (c *Channel) Close() error {
	if c.closed {
		return nil
	}
	c.closed = true
	delete(c.m.channels, c)
	c.m.tracker.Unwatch(c, KindRAMIN, c.guestRAMIN, nvc0.RAMINSize)
	c.setUser(0, 0, false)
	var errs []error
	if c.space != nil {
		errs = append(errs, c.m.Release(c.space))
		c.space = nil
	}
	c.m.retire(c.shadowRAMIN, 0, false)
	c.m.retire(c.shadowUser, 0, false)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("shadow channel (guest RAMIN %#x): close: %w", c.guestRAMIN, err)
	}
	return nil
}
