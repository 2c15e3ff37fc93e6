//go:build linux && (amd64 || arm64)

package pvdrm

// The GART heap over grants (docs/pvdrm.md §8). The front end allocates
// the heap with gntalloc, granted to the back end's domain, and lays its
// chunks out contiguously; it publishes the heap's grant references in a
// chain of directory pages, granted read-only, whose first reference and
// the heap's size in pages go to xenstore with the ring (keys gart-ref and
// gart-pages). A directory page is little-endian 32-bit words:
//
//	word 0      the next directory page's grant reference (0: the last)
//	word 1      how many references this page holds (1..GARTRefsPerDirPage)
//	word 2...   the heap pages' grant references, in heap order
//
// The back end copies each directory page out before it looks at it (the
// guest can rewrite it meanwhile), checks every field, and maps the heap's
// chunks contiguously at an address it chose.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/xen"
	"github.com/gpuvm/gpuvm/xen/xenbus"
)

// Xenstore keys of the GART heap, and their bounds.
const (
	xenKeyGARTRef   = "gart-ref"
	xenKeyGARTPages = "gart-pages"
	// GARTRefsPerDirPage is how many references one directory page holds.
	GARTRefsPerDirPage = xen.PageSize/4 - 2
	// MaxXenGARTPages bounds a heap over grants: 64 MiB.
	MaxXenGARTPages = 16384
)

// gartDirPages is how many directory pages a heap of pages pages needs.
func gartDirPages(pages int) int { return (pages + GARTRefsPerDirPage - 1) / GARTRefsPerDirPage }

// encodeGARTDir fills the directory pages dir (len(dirRefs) pages, granted
// under dirRefs) with refs.
func encodeGARTDir(dir []byte, dirRefs, refs []uint32) error {
	if len(dirRefs) != gartDirPages(len(refs)) || len(dir) < len(dirRefs)*xen.PageSize {
		return fmt.Errorf("pvdrm xen: %d directory pages for %d references", len(dirRefs), len(refs))
	}
	clear(dir)
	for i := range dirRefs {
		page := dir[i*xen.PageSize : (i+1)*xen.PageSize]
		var next uint32
		if i+1 < len(dirRefs) {
			next = dirRefs[i+1]
		}
		chunk := refs[i*GARTRefsPerDirPage : min(len(refs), (i+1)*GARTRefsPerDirPage)]
		binary.LittleEndian.PutUint32(page[0:], next)
		binary.LittleEndian.PutUint32(page[4:], uint32(len(chunk)))
		for j, r := range chunk {
			binary.LittleEndian.PutUint32(page[8+4*j:], r)
		}
	}
	return nil
}

// parseGARTDirPage reads one directory page (a copy the guest can no
// longer change) of a heap that still needs left references: the next
// page's reference and this page's references, every field checked.
func parseGARTDirPage(page []byte, left int) (next uint32, refs []uint32, err error) {
	if len(page) != xen.PageSize {
		return 0, nil, fmt.Errorf("directory page of %d bytes", len(page))
	}
	next = binary.LittleEndian.Uint32(page[0:])
	n := binary.LittleEndian.Uint32(page[4:])
	want := min(left, GARTRefsPerDirPage)
	if int(n) != want {
		return 0, nil, fmt.Errorf("directory page holds %d references, want %d (%d still to come)", n, want, left)
	}
	refs = make([]uint32, n)
	for i := range refs {
		refs[i] = binary.LittleEndian.Uint32(page[8+4*i:])
		if refs[i] < xen.GrantRefFirst {
			return 0, nil, fmt.Errorf("heap page reference %d is reserved", refs[i])
		}
	}
	switch last := int(n) == left; {
	case last && next != 0:
		return 0, nil, fmt.Errorf("the directory goes on (next %d) past the heap's %d pages", next, left)
	case !last && next < xen.GrantRefFirst:
		return 0, nil, fmt.Errorf("the directory ends (next %d) with %d references still to come", next, left-int(n))
	}
	return next, refs, nil
}

// XenGART is the front end's GART heap over grants.
type XenGART struct {
	mem    []byte // the heap, contiguous
	chunks []*xen.GrantedPages
	dir    *xen.GrantedPages
	pages  int
}

// NewXenGART allocates a heap of pages pages, granted writable to domain
// back in chunks laid out contiguously, and its directory, granted
// read-only.
func NewXenGART(gnt *xen.Gntalloc, back uint16, pages int) (g *XenGART, err error) {
	if pages < 1 || pages > MaxXenGARTPages {
		return nil, fmt.Errorf("pvdrm xen: GART heap of %d pages: want 1..%d", pages, MaxXenGARTPages)
	}
	g = &XenGART{pages: pages}
	defer func() {
		if err != nil {
			err = errors.Join(err, g.Close())
			g = nil
		}
	}()
	size := pages * xen.PageSize
	if g.mem, err = unix.Mmap(-1, 0, size, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS); err != nil {
		return g, fmt.Errorf("pvdrm xen: reserve the GART heap: %w", err)
	}
	refs := make([]uint32, 0, pages)
	for off := 0; off < pages; off += xen.MaxGrantPages {
		n := min(xen.MaxGrantPages, pages-off)
		c, err := gnt.ShareAt(back, n, true, unsafe.Pointer(&g.mem[off*xen.PageSize]))
		if err != nil {
			return g, fmt.Errorf("pvdrm xen: GART heap pages %d..%d (Linux's gntalloc allows 1024 grants unless its module parameter limit is raised): %w", off, off+n-1, err)
		}
		g.chunks = append(g.chunks, c)
		refs = append(refs, c.Refs()...)
	}
	if g.dir, err = gnt.Share(back, gartDirPages(pages), false); err != nil {
		return g, fmt.Errorf("pvdrm xen: GART directory: %w", err)
	}
	return g, encodeGARTDir(g.dir.Mem(), g.dir.Refs(), refs)
}

// Mem returns the heap.
func (g *XenGART) Mem() []byte { return g.mem }

// Keys returns what the front end publishes with its ring.
func (g *XenGART) Keys() []xenbus.Extra {
	return []xenbus.Extra{{Key: xenKeyGARTRef, Value: uint64(g.dir.Refs()[0])}, {Key: xenKeyGARTPages, Value: uint64(g.pages)}}
}

// Close revokes the grants and unmaps the heap.
func (g *XenGART) Close() error {
	var errs []error
	if g.dir != nil {
		errs = append(errs, g.dir.Close())
		g.dir = nil
	}
	for _, c := range g.chunks {
		errs = append(errs, c.Close())
	}
	g.chunks = nil
	if g.mem != nil {
		errs = append(errs, unix.Munmap(g.mem))
		g.mem = nil
	}
	return errors.Join(errs...)
}

// XenGARTKeys are the keys the back end reads with the ring.
func XenGARTKeys() []xenbus.ExtraKey {
	return []xenbus.ExtraKey{{Key: xenKeyGARTRef, Lo: xen.GrantRefFirst, Hi: 1<<32 - 1}, {Key: xenKeyGARTPages, Lo: 1, Hi: MaxXenGARTPages}}
}

// XenGARTMapping is the back end's mapping of a front end's heap.
type XenGARTMapping struct {
	gnt    *xen.Gntdev // closed with the mapping, if set
	chunks []*xen.GrantMapping
	// Maps counts the grant mappings made (directory pages and chunks),
	// Unmaps those ended (each directory page at once, the chunks by Close).
	Maps, Unmaps int
}

// MapXenGART reads the directory of the heap domain front published (its
// first reference and page count, from XenGARTKeys) and maps the heap's
// pages at address at, which must have room for pages pages (the caller
// reserved it). On error nothing stays mapped.
func MapXenGART(gnt *xen.Gntdev, front uint16, dirRef uint32, pages int, at unsafe.Pointer) (m *XenGARTMapping, err error) {
	if pages < 1 || pages > MaxXenGARTPages {
		return nil, fmt.Errorf("pvdrm xen: GART heap of %d pages: want 1..%d", pages, MaxXenGARTPages)
	}
	m = &XenGARTMapping{}
	refs := make([]uint32, 0, pages)
	var page [xen.PageSize]byte
	for ref := dirRef; len(refs) < pages; {
		d, err := gnt.Map(front, []uint32{ref}, false)
		if err != nil {
			return nil, fmt.Errorf("pvdrm xen: GART directory page %d: %w", ref, err)
		}
		m.Maps++
		copy(page[:], d.Mem()) // once: the guest may rewrite it
		if err := d.Close(); err != nil {
			return nil, err
		}
		m.Unmaps++
		next, got, err := parseGARTDirPage(page[:], pages-len(refs))
		if err != nil {
			return nil, fmt.Errorf("pvdrm xen: GART directory page %d: %w", ref, err)
		}
		refs = append(refs, got...)
		ref = next
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, m.Close())
			m = nil
		}
	}()
	for off := 0; off < pages; off += xen.MaxGrantPages {
		n := min(xen.MaxGrantPages, pages-off)
		c, err := gnt.MapAt(front, refs[off:off+n], true, unsafe.Add(at, off*xen.PageSize))
		if err != nil {
			return m, fmt.Errorf("pvdrm xen: GART heap pages %d..%d: %w", off, off+n-1, err)
		}
		m.Maps++
		m.chunks = append(m.chunks, c)
	}
	return m, nil
}

// Close unmaps the heap (its range stays reserved for the caller to
// release) and releases the grants.
func (m *XenGARTMapping) Close() error {
	var errs []error
	for _, c := range m.chunks {
		errs = append(errs, c.Close())
		m.Unmaps++
	}
	m.chunks = nil
	if m.gnt != nil {
		errs = append(errs, m.gnt.Close())
		m.gnt = nil
	}
	return errors.Join(errs...)
}

// XenShares are the GART buffers GEM_MMAP shares on the xen transport:
// ranges of the front end's heap, which it maps already.
type XenShares struct {
	heap []byte
	maps atomic.Uint64
}

// NewXenShares serves shares of heap.
func NewXenShares(heap []byte) *XenShares { return &XenShares{heap: heap} }

// Map returns the range (GEM_MMAP's results), checked against the heap.
func (s *XenShares) Map(_ uint32, pages uint32, offset uint64) ([]byte, error) {
	n := uint64(pages) * pageSize
	size := uint64(len(s.heap))
	if pages == 0 || offset%pageSize != 0 || offset > size || n > size-offset {
		return nil, fmt.Errorf("pvdrm xen: share of %d pages at %#x outside the %d-byte GART heap", pages, offset, size)
	}
	s.maps.Add(1)
	return s.heap[offset : offset+n : offset+n], nil
}

// Unmap does nothing: the heap stays mapped.
func (s *XenShares) Unmap([]byte) error { return nil }

// Mappings returns how many shares were taken.
func (s *XenShares) Mappings() uint64 { return s.maps.Load() }

// Close does nothing: the heap is the front end's to free.
func (s *XenShares) Close() error { return nil }
