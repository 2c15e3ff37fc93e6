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

// StreamInfo describes a stream read.
type StreamInfo struct {
	// Bytes is the whole stream; PageBytes the VRAM its page records
	// carried, re-sent pages counted each time.
	Bytes, PageBytes uint64
	Records          int
}

// streamReader reads a stream's framing, hashing every byte.
type streamReader struct {
	r     io.Reader
	h     hash.Hash
	n     uint64
	after string
	// scratch holds one page record's data as it is read, in one read
	// rather than a read per page (a pipe hands over each read).
	scratch []byte
}

func (d *streamReader) full(p []byte) error {
	k, err := io.ReadFull(d.r, p)
	d.n += uint64(k)
	d.h.Write(p[:k])
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("after the %s: %w", d.after, ErrTruncated)
		}
		return err
	}
	return nil
}

// header reads the stream header and returns the slot's VRAM it declares.
func (d *streamReader) header() (uint64, error) {
	d.after = "start"
	var hdr [StreamHeaderSize]byte
	if err := d.full(hdr[:]); err != nil {
		return 0, fmt.Errorf("header: %w", err)
	}
	if !bytes.Equal(hdr[:8], StreamMagic[:]) {
		return 0, fmt.Errorf("not a gpuvm migration stream: %w", ErrNotImage)
	}
	if v := le.Uint32(hdr[8:]); v != StreamVersion {
		return 0, fmt.Errorf("migration stream version %d: this gpuvm reads version %d: %w", v, StreamVersion, ErrVersion)
	}
	if f := le.Uint32(hdr[12:]); f != 0 {
		return 0, fmt.Errorf("header flags %#x: none defined: %w", f, ErrMalformed)
	}
	d.after = "header"
	return le.Uint64(hdr[16:]), nil
}

// record reads a record header: its type and body length, bounded.
func (d *streamReader) record() (uint16, uint64, error) {
	var h [RecordHeaderSize]byte
	if err := d.full(h[:]); err != nil {
		return 0, 0, err
	}
	typ, res, n := le.Uint16(h[0:]), le.Uint16(h[2:]), uint64(le.Uint32(h[4:]))
	limit, ok := maxRecord(typ)
	switch {
	case !ok:
		return typ, 0, fmt.Errorf("record type %d: not in stream version %d: %w", typ, StreamVersion, ErrMalformed)
	case res != 0:
		return typ, 0, fmt.Errorf("%s record: reserved field %#x: %w", recordName(typ), res, ErrMalformed)
	case n > limit:
		return typ, 0, fmt.Errorf("%s record of %d bytes, at most %d: %w", recordName(typ), n, limit, ErrMalformed)
	}
	return typ, n, nil
}

// CopyStream copies one migration stream from src to dst, record by
// record, and stops after its end record without reading further: what a
// relay (gpuvm vgpu migrate-receive, the migrating CLI) forwards. It checks
// only the framing and the record bounds; the destination daemon checks
// the rest (ReadStream).
func CopyStream(dst io.Writer, src io.Reader) (int64, error) {
	d := &streamReader{r: io.TeeReader(src, dst), h: sha256.New()}
	if _, err := d.header(); err != nil {
		return int64(d.n), err
	}
	for {
		typ, n, err := d.record()
		if err != nil {
			return int64(d.n), err
		}
		k, err := io.CopyN(io.Discard, d.r, int64(n))
		d.n += uint64(k)
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = fmt.Errorf("in a %s record: %w", recordName(typ), ErrTruncated)
			}
			return int64(d.n), err
		}
		d.after = recordName(typ) + " record"
		if typ == RecEnd {
			return int64(d.n), nil
		}
	}
}

// ReadStream reads one migration stream from r for a slot of at most
// maxVRAM bytes and returns the vGPU's image — the state image of its
// image record with the pages in use (its resident record) as last sent
// — once the framing, every bound and the checksum are checked. Pages
// must lie inside the VRAM the header declares, every range in use must
// have been sent, and the image must be of that VRAM and carry no pages.
// What it holds is at most the declared VRAM in pages, one record and
// the image. It reads nothing after the end record.
func ReadStream(r io.Reader, maxVRAM uint64) (*Image, StreamInfo, error) {
	var info StreamInfo
	pages := &pageStore{at: map[uint64]pageLoc{}}
	m, err := readStream(r, maxVRAM, pages, &info)
	if err != nil {
		pages.scrub()
		if m != nil {
			m.Scrub()
		}
		return nil, info, fmt.Errorf("migration stream: %w", err)
	}
	return m, info, nil
}

func readStream(r io.Reader, maxVRAM uint64, pages *pageStore, info *StreamInfo) (*Image, error) {
	d := &streamReader{r: r, h: sha256.New()}
	defer func() { info.Bytes = d.n }()
	vram, err := d.header()
	if err != nil {
		return nil, err
	}
	if vram == 0 || vram%VRAMGranule != 0 || vram > maxVRAM {
		return nil, fmt.Errorf("a slot of %d bytes of VRAM: want a multiple of %d up to %d: %w", vram, VRAMGranule, maxVRAM, ErrMalformed)
	}
	var resident []Range
	var m *Image
	for {
		sum := d.h.Sum(nil) // of everything before this record
		typ, n, err := d.record()
		if err != nil {
			return m, err
		}
		info.Records++
		switch {
		case typ == RecPages && resident == nil:
			if err := d.pages(n, vram, pages); err != nil {
				return m, err
			}
			info.PageBytes += n - 8
		case typ == RecResident && resident == nil:
			if resident, err = d.resident(n, vram); err != nil {
				return m, err
			}
		case typ == RecImage && resident != nil && m == nil:
			if m, err = d.image(n, vram); err != nil {
				return m, err
			}
		case typ == RecEnd && m != nil:
			got := make([]byte, n)
			if err := d.full(got); err != nil {
				return m, err
			}
			if n != sha256.Size || subtle.ConstantTimeCompare(sum, got) != 1 {
				return m, ErrChecksum
			}
			if err := m.takePages(resident, pages); err != nil {
				return m, err
			}
			return m, nil
		default:
			return m, fmt.Errorf("a %s record after the %s: records go pages, resident, image, end: %w", recordName(typ), d.after, ErrMalformed)
		}
		d.after = recordName(typ) + " record"
	}
}

// pages reads a page record's body of n bytes into pages, one page at a
// time: nothing is allocated beyond one buffer per page of the slot.
func (d *streamReader) pages(n, vram uint64, pages *pageStore) error {
	var o [8]byte
	if n < 8 {
		return fmt.Errorf("pages record of %d bytes: %w", n, ErrMalformed)
	}
	if err := d.full(o[:]); err != nil {
		return err
	}
	off, size := le.Uint64(o[:]), n-8
	if size == 0 || size%PageSize != 0 || off%PageSize != 0 || off >= vram || vram-off < size {
		return fmt.Errorf("pages [%#x, +%#x): not whole pages inside the slot's %#x bytes of VRAM: %w", off, size, vram, ErrMalformed)
	}
	if d.scratch == nil {
		d.scratch = make([]byte, MaxPageSection)
	}
	data := d.scratch[:size]
	defer clear(data)
	if err := d.full(data); err != nil {
		return fmt.Errorf("in a pages record: %w", err)
	}
	for p := uint64(0); p < size; p += PageSize {
		copy(pages.page(off+p), data[p:p+PageSize])
	}
	return nil
}

// resident reads the resident record: ranges sorted, not overlapping,
// whole pages inside the slot.
func (d *streamReader) resident(n, vram uint64) ([]Range, error) {
	body := make([]byte, n)
	if err := d.full(body); err != nil {
		return nil, err
	}
	c := &cursor{b: body}
	k := c.count(16)
	rs := make([]Range, 0, k)
	var end uint64
	for range k {
		r := Range{Off: c.u64(), Len: c.u64()}
		switch {
		case r.Len == 0 || r.Len%PageSize != 0 || r.Off%PageSize != 0:
			return nil, fmt.Errorf("resident range [%#x, +%#x): not whole pages: %w", r.Off, r.Len, ErrMalformed)
		case r.Off < end:
			return nil, fmt.Errorf("resident range at %#x before the end of the previous one (%#x): %w", r.Off, end, ErrMalformed)
		case r.Off >= vram || vram-r.Off < r.Len:
			return nil, fmt.Errorf("resident range [%#x, +%#x) past the slot's %#x bytes of VRAM: %w", r.Off, r.Len, vram, ErrMalformed)
		}
		end = r.Off + r.Len
		rs = append(rs, r)
	}
	if err := c.done(); err != nil {
		return nil, fmt.Errorf("resident record: %w", err)
	}
	return rs, nil
}

// image reads the image record: a whole state image (its own checksum
// checked by Decode) of the stream's VRAM, without pages.
func (d *streamReader) image(n, vram uint64) (*Image, error) {
	lr := &io.LimitedReader{R: d.r, N: int64(n)}
	m, err := Decode(io.TeeReader(lr, d.h))
	d.n += n - uint64(lr.N)
	if err != nil {
		if lr.N > 0 && errors.Is(err, ErrTruncated) {
			return nil, err
		}
		return nil, fmt.Errorf("image record: %w", err)
	}
	switch {
	case m.Identity.VRAM != vram:
		m.Scrub()
		return nil, fmt.Errorf("image record: a vGPU of %d bytes of VRAM in a stream of a %d-byte slot: %w", m.Identity.VRAM, vram, ErrMalformed)
	case len(m.Pages) != 0:
		n := len(m.Pages)
		m.Scrub()
		return nil, fmt.Errorf("image record: it carries %d VRAM pages; a stream's pages are page records: %w", n, ErrMalformed)
	}
	return m, nil
}

// pageStore holds the pages a stream sent, each as last sent, in slabs
// of MaxPageSection bytes handed out a page at a time: no allocation per
// page, and pages sent in order of their offsets (round 0) lie in order
// in the slabs, so that the image's sections are slices of them, not
// copies. It holds at most one page per page of the slot, and one slab
// partly used.
type pageStore struct {
	slabs [][]byte
	used  int // bytes handed out of the last slab
	at    map[uint64]pageLoc
}

type pageLoc struct{ slab, off int }

// page is the buffer of the page at off, handed out on its first use.
func (s *pageStore) page(off uint64) []byte {
	l, ok := s.at[off]
	if !ok {
		if len(s.slabs) == 0 || s.used == MaxPageSection {
			s.slabs = append(s.slabs, make([]byte, MaxPageSection))
			s.used = 0
		}
		l = pageLoc{slab: len(s.slabs) - 1, off: s.used}
		s.used += PageSize
		s.at[off] = l
	}
	return s.slabs[l.slab][l.off : l.off+PageSize : l.off+PageSize]
}

// scrub zeroes every page held.
func (s *pageStore) scrub() {
	for _, b := range s.slabs {
		clear(b)
	}
	s.slabs = nil
	clear(s.at)
}

// takePages sets m's pages to the resident ranges' pages as sections of
// at most MaxPageSection bytes — each a run of pages that lie in order in
// one slab — and zeroes every page sent outside them. A resident page
// that was never sent is refused.
func (m *Image) takePages(resident []Range, pages *pageStore) error {
	for _, r := range resident {
		var sec Page
		var at pageLoc
		for p := r.Off; p < r.Off+r.Len; p += PageSize {
			l, ok := pages.at[p]
			if !ok {
				return fmt.Errorf("page %#x is in use but was never sent: %w", p, ErrMalformed)
			}
			delete(pages.at, p)
			if sec.Data != nil && l.slab == at.slab && l.off == at.off+len(sec.Data) && len(sec.Data) < MaxPageSection {
				sec.Data = pages.slabs[at.slab][at.off : at.off+len(sec.Data)+PageSize : at.off+len(sec.Data)+PageSize]
				continue
			}
			if sec.Data != nil {
				m.Pages = append(m.Pages, sec)
			}
			sec, at = Page{Off: p, Data: pages.slabs[l.slab][l.off : l.off+PageSize : l.off+PageSize]}, l
		}
		if sec.Data != nil {
			m.Pages = append(m.Pages, sec)
		}
	}
	for _, l := range pages.at { // sent, then freed: not the guest's any more
		clear(pages.slabs[l.slab][l.off : l.off+PageSize])
	}
	clear(pages.at)
	return m.check()
}
