package vgpuimage

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"hash"
	"io"
)

// maxBody is the longest body a section of each type may have in version 1.
func maxBody(typ uint16) (uint64, bool) {
	switch typ {
	case SecIdentity:
		return maxIdentityBody, true
	case SecRegs:
		return 4 + 8*MaxRegs, true
	case SecChans:
		return 4 + MaxChannels*(20+4*MaxStateWords), true
	case SecPV:
		return 8 + MaxPVObjects*(24+8*SmallTableLen) + 4 + MaxPVBindings*12 +
			4 + 8*MaxBAR1/PageSize + 4 + 8*MaxBAR3/PageSize + 4 + MaxHCSlots*12 + 24, true
	case SecAccount:
		return 48 + 4 + 8*MaxWaitBuckets, true
	case SecPage:
		return 8 + MaxPageSection, true
	case SecPVDRM:
		return maxPVDRMBody, true
	case SecEnd:
		return 0, true
	}
	return 0, false
}

// SectionName names a section type for errors and documentation.
func SectionName(typ uint16) string {
	switch typ {
	case SecIdentity:
		return "identity"
	case SecRegs:
		return "registers"
	case SecChans:
		return "channels"
	case SecPV:
		return "PV"
	case SecAccount:
		return "account"
	case SecPage:
		return "VRAM page"
	case SecPVDRM:
		return "pvdrm"
	case SecEnd:
		return "end"
	}
	return fmt.Sprintf("type %d", typ)
}

// Decode reads one image from r and returns it once its structure, every
// bound and its checksum are checked; anything else is refused with an
// error wrapping ErrNotImage, ErrVersion, ErrTruncated, ErrChecksum or
// ErrMalformed. What Decode allocates is bounded by the limits and by the
// VRAM the image declares (§13.4), and grows only as bytes arrive. Bytes
// after the trailer are refused.
func Decode(r io.Reader) (*Image, error) {
	m, err := decode(r)
	if err != nil {
		if m != nil {
			m.Scrub()
		}
		return nil, fmt.Errorf("vGPU image: %w", err)
	}
	return m, nil
}

func decode(r io.Reader) (*Image, error) {
	d := &decoder{r: r, h: sha256.New()}
	var hdr [HeaderSize]byte
	if err := d.full(hdr[:]); err != nil {
		return nil, fmt.Errorf("header: %w", err)
	}
	if !bytes.Equal(hdr[:8], Magic[:]) {
		return nil, ErrNotImage
	}
	if v := le.Uint32(hdr[8:]); v != Version {
		return nil, fmt.Errorf("image version %d: this gpuvm reads version %d: %w", v, Version, ErrVersion)
	}
	if f := le.Uint32(hdr[12:]); f != 0 {
		return nil, fmt.Errorf("header flags %#x: none defined: %w", f, ErrMalformed)
	}
	m := &Image{}
	want := []uint16{SecIdentity, SecRegs, SecChans}
	seen := map[uint16]bool{}
	var end uint64
	for {
		typ, body, err := d.section()
		if err != nil {
			return m, err
		}
		if len(want) > 0 {
			if typ != want[0] {
				return m, fmt.Errorf("%s section where the %s section belongs: %w", SectionName(typ), SectionName(want[0]), ErrMalformed)
			}
			want = want[1:]
		}
		// Every section but the pages comes once (§13.2): a second one
		// would replace what the first said after it was checked.
		if typ != SecPage && seen[typ] {
			return m, fmt.Errorf("a second %s section: %w", SectionName(typ), ErrMalformed)
		}
		seen[typ] = true
		c := &cursor{b: body}
		switch typ {
		case SecIdentity:
			m.Identity = c.identity()
			if err := c.done(); err != nil {
				return m, fmt.Errorf("identity: %w", err)
			}
			if err := m.Identity.check(); err != nil {
				return m, fmt.Errorf("identity: %w", err)
			}
		case SecRegs:
			m.Regs = c.regs()
			if err := c.done(); err != nil {
				return m, fmt.Errorf("registers: %w", err)
			}
			if err := checkRegs(m.Regs); err != nil {
				return m, fmt.Errorf("registers: %w", err)
			}
		case SecChans:
			m.Chans = c.chans()
			if err := c.done(); err != nil {
				return m, fmt.Errorf("channels: %w", err)
			}
			if err := m.checkChans(); err != nil {
				return m, fmt.Errorf("channels: %w", err)
			}
			if m.Identity.PV {
				want = append(want, SecPV)
			}
			want = append(want, SecAccount)
			if m.Identity.PVDRM {
				want = append(want, SecPVDRM)
			}
		case SecPV:
			m.PV = c.pv()
			if err := c.done(); err != nil {
				return m, fmt.Errorf("PV: %w", err)
			}
			if err := m.PV.check(&m.Identity); err != nil {
				return m, fmt.Errorf("PV: %w", err)
			}
		case SecAccount:
			m.Account = c.account()
			if err := c.done(); err != nil {
				return m, fmt.Errorf("account: %w", err)
			}
			if len(m.Account.Waits) > MaxWaitBuckets {
				return m, fmt.Errorf("account: %d wait buckets: %w", len(m.Account.Waits), ErrMalformed)
			}
		case SecPVDRM:
			m.PVDRM = c.pvdrm()
			if err := c.done(); err != nil {
				return m, fmt.Errorf("pvdrm: %w", err)
			}
			if err := m.PVDRM.check(&m.Identity); err != nil {
				return m, fmt.Errorf("pvdrm: %w", err)
			}
		case SecPage:
			off := c.u64()
			if c.err != nil {
				return m, fmt.Errorf("VRAM page %d: %w", len(m.Pages), c.err)
			}
			p := Page{Off: off, Data: c.b}
			if err := checkPage(p.Off, uint64(len(p.Data)), end, m.Identity.VRAM); err != nil {
				return m, fmt.Errorf("VRAM page %d: %w", len(m.Pages), err)
			}
			end = p.Off + uint64(len(p.Data))
			m.Pages = append(m.Pages, p)
		case SecEnd:
			if err := d.trailer(); err != nil {
				return m, err
			}
			return m, m.check()
		}
	}
}

type decoder struct {
	r io.Reader
	h hash.Hash
	// after is the section the stream is in, for a truncation's error.
	after string
}

// full reads len(p) bytes, hashing them.
func (d *decoder) full(p []byte) error {
	if _, err := io.ReadFull(d.r, p); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return ErrTruncated
		}
		return err
	}
	d.h.Write(p)
	return nil
}

// section reads one section's header and body; the body is read as it
// arrives, never allocated ahead of the bytes.
func (d *decoder) section() (uint16, []byte, error) {
	var h [SectionHeaderSize]byte
	if err := d.full(h[:]); err != nil {
		if d.after == "" {
			return 0, nil, fmt.Errorf("before the first section: %w", err)
		}
		return 0, nil, fmt.Errorf("after the %s section: %w", d.after, err)
	}
	typ, res, n := le.Uint16(h[0:]), le.Uint16(h[2:]), uint64(le.Uint32(h[4:]))
	limit, ok := maxBody(typ)
	switch {
	case !ok:
		return typ, nil, fmt.Errorf("section type %d: not in version %d: %w", typ, Version, ErrMalformed)
	case res != 0:
		return typ, nil, fmt.Errorf("%s section: reserved field %#x: %w", SectionName(typ), res, ErrMalformed)
	case n > limit:
		return typ, nil, fmt.Errorf("%s section of %d bytes, at most %d: %w", SectionName(typ), n, limit, ErrMalformed)
	}
	body, err := io.ReadAll(io.LimitReader(d.r, int64(n)))
	if err != nil {
		return typ, nil, fmt.Errorf("%s section: %w", SectionName(typ), err)
	}
	d.h.Write(body)
	if uint64(len(body)) != n {
		return typ, nil, fmt.Errorf("in the %s section (%d of %d bytes): %w", SectionName(typ), len(body), n, ErrTruncated)
	}
	d.after = SectionName(typ)
	return typ, body, nil
}

// trailer checks the SHA-256 of everything before it, and that nothing
// follows it.
func (d *decoder) trailer() error {
	sum := d.h.Sum(nil)
	var got [TrailerSize]byte
	if _, err := io.ReadFull(d.r, got[:]); err != nil {
		return fmt.Errorf("in the checksum trailer: %w", ErrTruncated)
	}
	if subtle.ConstantTimeCompare(sum, got[:]) != 1 {
		return ErrChecksum
	}
	var one [1]byte
	if n, _ := io.ReadFull(d.r, one[:]); n != 0 {
		return fmt.Errorf("bytes after the checksum trailer: %w", ErrMalformed)
	}
	return nil
}

// cursor reads little-endian fields of a section body; the first short
// read sticks.
type cursor struct {
	b   []byte
	err error
}

func (c *cursor) take(n uint64) []byte {
	if c.err != nil {
		return nil
	}
	if uint64(len(c.b)) < n {
		c.err = fmt.Errorf("field past the end of the section: %w", ErrMalformed)
		c.b = nil
		return nil
	}
	p := c.b[:n:n]
	c.b = c.b[n:]
	return p
}

func (c *cursor) u8() uint8 {
	if p := c.take(1); p != nil {
		return p[0]
	}
	return 0
}

func (c *cursor) u16() uint16 {
	if p := c.take(2); p != nil {
		return le.Uint16(p)
	}
	return 0
}

func (c *cursor) u32() uint32 {
	if p := c.take(4); p != nil {
		return le.Uint32(p)
	}
	return 0
}

func (c *cursor) u64() uint64 {
	if p := c.take(8); p != nil {
		return le.Uint64(p)
	}
	return 0
}

func (c *cursor) str() string { return string(c.take(uint64(c.u16()))) }

// count reads a count of items of size bytes each, refusing one the rest
// of the body cannot hold (so nothing is allocated for items not there).
func (c *cursor) count(size uint64) int {
	n := uint64(c.u32())
	if c.err == nil && n*size > uint64(len(c.b)) {
		c.err = fmt.Errorf("count %d of %d-byte items in %d bytes left: %w", n, size, len(c.b), ErrMalformed)
	}
	if c.err != nil {
		return 0
	}
	return int(n)
}

func (c *cursor) u64s() []uint64 {
	n := c.count(8)
	if n == 0 {
		return nil
	}
	out := make([]uint64, n)
	for i := range out {
		out[i] = c.u64()
	}
	return out
}

func (c *cursor) done() error {
	if c.err != nil {
		return c.err
	}
	if len(c.b) != 0 {
		return fmt.Errorf("%d bytes left over at the end of the section: %w", len(c.b), ErrMalformed)
	}
	return nil
}

func (c *cursor) identity() Identity {
	id := Identity{Mode: c.str(), Profile: c.str(), Name: c.str(), DomID: c.u32(), RAM: c.u64(), VRAM: c.u64(),
		Channels: c.u32(), BAR1: c.u64(), BAR3: c.u64()}
	f := c.u32()
	if c.err == nil && f&^idFlags != 0 {
		c.err = fmt.Errorf("flags %#x: unknown bits: %w", f, ErrMalformed)
	}
	id.PV, id.PVDRM = f&idPV != 0, f&idPVDRM != 0
	return id
}

func (c *cursor) regs() []Reg {
	n := c.count(8)
	if n == 0 {
		return nil
	}
	out := make([]Reg, n)
	for i := range out {
		out[i] = Reg{Off: c.u32(), Val: c.u32()}
	}
	return out
}

func (c *cursor) chans() []Chan {
	n := c.count(20)
	out := make([]Chan, 0, n)
	for range n {
		ch := Chan{Inst: c.u32(), Ctl: c.u32(), Put: c.u32()}
		f := c.u32()
		words := c.count(4)
		if c.err != nil {
			return out
		}
		if f&^chanFlags != 0 || (f&chanState == 0) != (words == 0) {
			c.err = fmt.Errorf("channel %d: flags %#x with %d state words: %w", len(out), f, words, ErrMalformed)
			return out
		}
		ch.Enabled, ch.Listed, ch.Killed = f&chanEnabled != 0, f&chanListed != 0, f&chanKilled != 0
		if words > 0 {
			ch.State = make([]uint32, words)
			for i := range ch.State {
				ch.State[i] = c.u32()
			}
		}
		out = append(out, ch)
	}
	return out
}

func (c *cursor) pv() *PV {
	p := &PV{Next: c.u32()}
	n := c.count(24)
	for range n {
		o := PVObject{Handle: c.u32(), Kind: c.u8()}
		if pad1, pad2 := c.u8(), c.u16(); c.err == nil && (pad1 != 0 || pad2 != 0) {
			c.err = fmt.Errorf("object %d: padding not zero: %w", o.Handle, ErrMalformed)
		}
		o.In, o.PDE = c.u32(), c.u32()
		o.Entries = c.u64s()
		if c.err != nil {
			return p
		}
		p.Objects = append(p.Objects, o)
	}
	n = c.count(12)
	for range n {
		p.Bindings = append(p.Bindings, PVBinding{RAMIN: c.u64(), PD: c.u32()})
	}
	p.BAR1 = c.u64s()
	p.BAR3 = c.u64s()
	n = c.count(12)
	for range n {
		p.HC.Slots = append(p.HC.Slots, HCSlot{Index: c.u32(), GPA: c.u64()})
	}
	p.HC.Sel, p.HC.Lo, p.HC.Hi, p.HC.Status, p.HC.Last, p.HC.N = c.u32(), c.u32(), c.u32(), c.u32(), c.u32(), c.u32()
	return p
}

func (c *cursor) account() Account {
	a := Account{Submissions: c.u64(), GPUTimeNs: c.u64(), QueueWaitNs: c.u64(), Released: c.u64(),
		SLOViolations: c.u64(), SLOBoosted: c.u64()}
	a.Waits = c.u64s()
	return a
}
