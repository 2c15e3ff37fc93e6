package vgpuimage

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash"
	"io"
)

// Section types of version 1, in the order they appear (docs/protocol.md
// §13.2).
const (
	SecIdentity = 1
	SecRegs     = 2
	SecChans    = 3
	SecPV       = 4 // exactly when the identity says PV
	SecAccount  = 5
	SecPage     = 6 // zero or more
	SecEnd      = 7
	SecPVDRM    = 8 // exactly when the identity says pvdrm, after the account
)

// HeaderSize, SectionHeaderSize and TrailerSize are the fixed parts.
const (
	HeaderSize        = 16
	SectionHeaderSize = 8
	TrailerSize       = sha256.Size
)

const (
	chanEnabled = 1 << 0
	chanListed  = 1 << 1
	chanKilled  = 1 << 2
	chanState   = 1 << 3
	chanFlags   = chanEnabled | chanListed | chanKilled | chanState

	idPV    = 1 << 0
	idPVDRM = 1 << 1
	idFlags = idPV | idPVDRM
)

var le = binary.LittleEndian

// Encode writes m to w as a version 1 image. An image outside the format's
// bounds is refused before anything is written.
func Encode(w io.Writer, m *Image) error {
	if err := m.check(); err != nil {
		return fmt.Errorf("encode vGPU image: %w", err)
	}
	return encodeUnchecked(w, m)
}

// encodeUnchecked writes m without checking it (Encode checks first; the tests
// write images the decoder must refuse).
func encodeUnchecked(w io.Writer, m *Image) error {
	e := &encoder{w: w, h: sha256.New()}
	var hdr [HeaderSize]byte
	copy(hdr[:], Magic[:])
	le.PutUint32(hdr[8:], Version)
	e.write(hdr[:])
	e.section(SecIdentity, identityBody(&m.Identity))
	e.section(SecRegs, regsBody(m.Regs))
	e.section(SecChans, chansBody(m.Chans))
	if m.PV != nil {
		e.section(SecPV, pvBody(m.PV))
	}
	e.section(SecAccount, accountBody(&m.Account))
	if m.PVDRM != nil {
		e.section(SecPVDRM, pvdrmBody(m.PVDRM))
	}
	for _, p := range m.Pages {
		var off [8]byte
		le.PutUint64(off[:], p.Off)
		e.sectionParts(SecPage, off[:], p.Data)
	}
	e.section(SecEnd, nil)
	sum := e.h.Sum(nil)
	if e.err == nil {
		_, e.err = w.Write(sum)
	}
	if e.err != nil {
		return fmt.Errorf("encode vGPU image: %w", e.err)
	}
	return nil
}

type encoder struct {
	w   io.Writer
	h   hash.Hash
	err error
}

func (e *encoder) write(b []byte) {
	if e.err != nil {
		return
	}
	e.h.Write(b)
	_, e.err = e.w.Write(b)
}

func (e *encoder) section(typ uint16, body []byte) { e.sectionParts(typ, body) }

func (e *encoder) sectionParts(typ uint16, parts ...[]byte) {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	var h [SectionHeaderSize]byte
	le.PutUint16(h[0:], typ)
	le.PutUint32(h[4:], uint32(n))
	e.write(h[:])
	for _, p := range parts {
		e.write(p)
	}
}

// buf appends little-endian fields.
type buf []byte

func (b *buf) u8(v uint8)   { *b = append(*b, v) }
func (b *buf) u16(v uint16) { *b = le.AppendUint16(*b, v) }
func (b *buf) u32(v uint32) { *b = le.AppendUint32(*b, v) }
func (b *buf) u64(v uint64) { *b = le.AppendUint64(*b, v) }
func (b *buf) str(s string) { b.u16(uint16(len(s))); *b = append(*b, s...) }
func (b *buf) u64s(vs []uint64) {
	b.u32(uint32(len(vs)))
	for _, v := range vs {
		b.u64(v)
	}
}

func identityBody(id *Identity) []byte {
	var b buf
	b.str(id.Mode)
	b.str(id.Profile)
	b.str(id.Name)
	b.u32(id.DomID)
	b.u64(id.RAM)
	b.u64(id.VRAM)
	b.u32(id.Channels)
	b.u64(id.BAR1)
	b.u64(id.BAR3)
	var f uint32
	if id.PV {
		f |= idPV
	}
	if id.PVDRM {
		f |= idPVDRM
	}
	b.u32(f)
	return b
}

func regsBody(regs []Reg) []byte {
	var b buf
	b.u32(uint32(len(regs)))
	for _, r := range regs {
		b.u32(r.Off)
		b.u32(r.Val)
	}
	return b
}

func chansBody(chans []Chan) []byte {
	var b buf
	b.u32(uint32(len(chans)))
	for _, c := range chans {
		b.u32(c.Inst)
		b.u32(c.Ctl)
		b.u32(c.Put)
		var f uint32
		if c.Enabled {
			f |= chanEnabled
		}
		if c.Listed {
			f |= chanListed
		}
		if c.Killed {
			f |= chanKilled
		}
		if c.State != nil {
			f |= chanState
		}
		b.u32(f)
		b.u32(uint32(len(c.State)))
		for _, w := range c.State {
			b.u32(w)
		}
	}
	return b
}

func pvBody(p *PV) []byte {
	var b buf
	b.u32(p.Next)
	b.u32(uint32(len(p.Objects)))
	for _, o := range p.Objects {
		b.u32(o.Handle)
		b.u8(o.Kind)
		b.u8(0)
		b.u16(0)
		b.u32(o.In)
		b.u32(o.PDE)
		b.u64s(o.Entries)
	}
	b.u32(uint32(len(p.Bindings)))
	for _, x := range p.Bindings {
		b.u64(x.RAMIN)
		b.u32(x.PD)
	}
	b.u64s(p.BAR1)
	b.u64s(p.BAR3)
	b.u32(uint32(len(p.HC.Slots)))
	for _, s := range p.HC.Slots {
		b.u32(s.Index)
		b.u64(s.GPA)
	}
	for _, v := range []uint32{p.HC.Sel, p.HC.Lo, p.HC.Hi, p.HC.Status, p.HC.Last, p.HC.N} {
		b.u32(v)
	}
	return b
}

func accountBody(a *Account) []byte {
	var b buf
	for _, v := range []uint64{a.Submissions, a.GPUTimeNs, a.QueueWaitNs, a.Released, a.SLOViolations, a.SLOBoosted} {
		b.u64(v)
	}
	b.u64s(a.Waits)
	return b
}
