package vgpuimage

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"hash"
	"io"
)

// The migration stream (docs/protocol.md §14): a vGPU's VRAM pages sent
// in rounds while its guest runs, then the ranges in use at the stop, the
// state image without pages and a SHA-256 over everything. It is written
// by the source daemon and read, as hostile input, by the destination's
// (ReadStream); CopyStream forwards one without reading its contents.

// StreamVersion is the migration stream format this package writes and
// reads.
const StreamVersion = 1

// StreamMagic opens every migration stream.
var StreamMagic = [8]byte{'G', 'P', 'U', 'V', 'M', 'M', 'I', 'G'}

// Record types of a version 1 stream (§14.2).
const (
	RecPages    = 1      // a VRAM offset and whole pages of data
	RecResident = 2      // the ranges in use at the stop: exactly once
	RecImage    = 3      // the state image without pages: exactly once
	RecEnd      = 0xFFFF // the SHA-256 of everything before it
)

// StreamHeaderSize and RecordHeaderSize are the fixed parts of a stream.
const (
	StreamHeaderSize = 24
	RecordHeaderSize = 8
	// MaxImageRecord bounds the image record: an image without pages is
	// at most its PV section and a few KiB.
	MaxImageRecord = 300 << 20
	// maxResident bounds the resident record's ranges.
	maxResident = 1 << 20
)

// maxRecord is the longest body a record of typ may have.
func maxRecord(typ uint16) (uint64, bool) {
	switch typ {
	case RecPages:
		return 8 + MaxPageSection, true
	case RecResident:
		return 4 + 16*maxResident, true
	case RecImage:
		return MaxImageRecord, true
	case RecEnd:
		return sha256.Size, true
	}
	return 0, false
}

// recordName names a record type for errors.
func recordName(typ uint16) string {
	switch typ {
	case RecPages:
		return "pages"
	case RecResident:
		return "resident"
	case RecImage:
		return "image"
	case RecEnd:
		return "end"
	}
	return fmt.Sprintf("type %d", typ)
}

// Range is a range of a slot's VRAM, at an offset from its base.
type Range struct{ Off, Len uint64 }

// StreamWriter writes a migration stream.
type StreamWriter struct {
	w    io.Writer
	h    hash.Hash
	vram uint64
	n    uint64
}

// NewStreamWriter writes the header of a stream for a slot of vram bytes.
func NewStreamWriter(w io.Writer, vram uint64) (*StreamWriter, error) {
	s := &StreamWriter{w: w, h: sha256.New(), vram: vram}
	var hdr [StreamHeaderSize]byte
	copy(hdr[:], StreamMagic[:])
	le.PutUint32(hdr[8:], StreamVersion)
	le.PutUint64(hdr[16:], vram)
	return s, s.write(hdr[:])
}

// Bytes is how many bytes were written so far.
func (s *StreamWriter) Bytes() uint64 { return s.n }

func (s *StreamWriter) write(b []byte) error {
	s.h.Write(b)
	n, err := s.w.Write(b)
	s.n += uint64(n)
	if err != nil {
		return fmt.Errorf("migration stream: %w", err)
	}
	return nil
}

func (s *StreamWriter) record(typ uint16, parts ...[]byte) error {
	var n int
	for _, p := range parts {
		n += len(p)
	}
	var h [RecordHeaderSize]byte
	le.PutUint16(h[0:], typ)
	le.PutUint32(h[4:], uint32(n))
	if err := s.write(h[:]); err != nil {
		return err
	}
	for _, p := range parts {
		if err := s.write(p); err != nil {
			return err
		}
	}
	return nil
}

// Pages writes data, whole pages, as the slot's VRAM at off, in records
// of at most MaxPageSection bytes.
func (s *StreamWriter) Pages(off uint64, data []byte) error {
	if n := uint64(len(data)); n == 0 || n%PageSize != 0 || off%PageSize != 0 || off >= s.vram || s.vram-off < n {
		return fmt.Errorf("migration stream: pages [%#x, +%#x) are not whole pages inside %#x bytes of VRAM: %w", off, n, s.vram, ErrMalformed)
	}
	for len(data) > 0 {
		n := min(len(data), MaxPageSection)
		var o [8]byte
		le.PutUint64(o[:], off)
		if err := s.record(RecPages, o[:], data[:n]); err != nil {
			return err
		}
		off += uint64(n)
		data = data[n:]
	}
	return nil
}

// Resident writes the ranges of the slot in use at the stop, sorted.
func (s *StreamWriter) Resident(rs []Range) error {
	b := make(buf, 0, 4+16*len(rs))
	b.u32(uint32(len(rs)))
	for _, r := range rs {
		b.u64(r.Off)
		b.u64(r.Len)
	}
	return s.record(RecResident, b)
}

// Image writes the state image m, which must carry no pages.
func (s *StreamWriter) Image(m *Image) error {
	if len(m.Pages) != 0 {
		return fmt.Errorf("migration stream: the image record carries no pages (%d given)", len(m.Pages))
	}
	var b bytes.Buffer
	if err := Encode(&b, m); err != nil {
		return fmt.Errorf("migration stream: %w", err)
	}
	return s.record(RecImage, b.Bytes())
}

// End writes the end record: the SHA-256 of everything before it.
func (s *StreamWriter) End() error {
	sum := s.h.Sum(nil)
	return s.record(RecEnd, sum)
}
