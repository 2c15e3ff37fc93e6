//go:build linux && (amd64 || arm64)

package foreign

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/xen"
	"github.com/gpuvm/gpuvm/xen/privcmd"
)

// Hole marks a guest-physical page with no RAM behind it.
const Hole = ^uint64(0)

// MaxPages bounds the guest-physical span of a RAM (64 GiB).
const MaxPages = 1 << 24

// ChunkPages is the most frames one privcmd mapping holds (256 MiB): the
// kernel takes a mapping's frame list whole, so runs are mapped in chunks.
const ChunkPages = 1 << 16

// Mapper maps frames of a domain over memory the caller reserved;
// *privcmd.Handle is one.
type Mapper interface {
	MapForeignInto(dst []byte, dom uint16, gfns []uint64) error
}

// Privcmd is what maps on Xen.
var _ Mapper = (*privcmd.Handle)(nil)

// Extent is a run of pages: First, First+1, …, First+Pages-1.
type Extent struct {
	First, Pages uint64
}

// Identity returns the frame list of a guest whose frame numbers are its
// guest-physical page numbers (HVM, PVH) and whose RAM is ram: sorted,
// disjoint, non-empty extents; pages between them are holes. The list
// spans page 0 to the end of the last extent.
func Identity(ram []Extent) ([]uint64, error) {
	if len(ram) == 0 {
		return nil, errors.New("foreign RAM: no extents")
	}
	var end uint64
	for i, e := range ram {
		switch {
		case e.Pages == 0:
			return nil, fmt.Errorf("foreign RAM: extent %d at page %#x is empty", i, e.First)
		case e.First < end:
			return nil, fmt.Errorf("foreign RAM: extent %d at page %#x overlaps or precedes the one before (ending at %#x)", i, e.First, end)
		case e.First+e.Pages < e.First || e.First+e.Pages > MaxPages:
			return nil, fmt.Errorf("foreign RAM: extent %d [%#x, +%#x) beyond %#x pages", i, e.First, e.Pages, MaxPages)
		}
		end = e.First + e.Pages
	}
	frames := make([]uint64, end)
	for i := range frames {
		frames[i] = Hole
	}
	for _, e := range ram {
		for p := e.First; p < e.First+e.Pages; p++ {
			frames[p] = p
		}
	}
	return frames, nil
}

// RAM is a domain's guest-physical memory mapped here.
type RAM struct {
	dom     uint16
	mem     []byte
	extents []Extent // guest-physical pages with RAM behind them
}

// Map maps domain dom's RAM: page i of the result is frame frames[i] of
// the domain, or, for Hole, a zero page of its own. Frames are bounded by
// privcmd.MaxFrame, the span by MaxPages; at least one page must be RAM.
func Map(m Mapper, dom uint16, frames []uint64) (*RAM, error) {
	return mapChunked(m, dom, frames, ChunkPages)
}

// MapPopulated maps the first pages guest-physical pages of domain dom, an
// HVM or PVH guest (frame = guest page), whose layout the caller does not
// know: the frames the domain has no RAM behind (the VGA hole, the MMIO
// hole, pages beyond its memory) become holes. It probes each chunk once,
// then maps the populated frames as Map does; a domain that balloons in
// between makes it fail rather than map a frame it no longer owns.
func MapPopulated(m Mapper, dom uint16, pages int) (*RAM, error) {
	return mapPopulated(m, dom, pages, ChunkPages)
}

func mapPopulated(m Mapper, dom uint16, pages, chunk int) (*RAM, error) {
	if pages < 1 || pages > MaxPages {
		return nil, fmt.Errorf("foreign RAM of domain %d: %d pages, want 1..%d", dom, pages, MaxPages)
	}
	frames := make([]uint64, pages)
	for i := range frames {
		frames[i] = uint64(i)
	}
	scratch, err := unix.Mmap(-1, 0, min(pages, chunk)*xen.PageSize, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("foreign RAM of domain %d: reserve a probe window: %w", dom, err)
	}
	defer unix.Munmap(scratch)
	for off := 0; off < pages; off += chunk {
		n := min(chunk, pages-off)
		err := m.MapForeignInto(scratch[:n*xen.PageSize], dom, frames[off:off+n])
		var be *privcmd.BatchError
		switch {
		case errors.As(err, &be):
			for _, i := range be.Indices {
				frames[off+i] = Hole
			}
		case err != nil:
			return nil, fmt.Errorf("foreign RAM of domain %d: probing guest pages %#x..%#x: %w", dom, off, off+n-1, err)
		}
		// Drop the probe's mapping whole before the next: mapping the next
		// chunk over part of it would split a privcmd mapping, which the
		// kernel refuses (ENOMEM).
		if _, err := unix.MmapPtr(-1, 0, unsafe.Pointer(&scratch[0]), uintptr(len(scratch)), unix.PROT_NONE,
			unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE|unix.MAP_FIXED); err != nil {
			return nil, fmt.Errorf("foreign RAM of domain %d: releasing the probe window: %w", dom, err)
		}
	}
	return Map(m, dom, frames)
}

// mapChunked is Map with chunk frames per mapping at most.
func mapChunked(m Mapper, dom uint16, frames []uint64, chunk int) (*RAM, error) {
	if len(frames) < 1 || len(frames) > MaxPages {
		return nil, fmt.Errorf("foreign RAM of domain %d: %d pages, want 1..%d", dom, len(frames), MaxPages)
	}
	var extents []Extent
	for i, f := range frames {
		switch {
		case f == Hole:
			continue
		case f >= privcmd.MaxFrame:
			return nil, fmt.Errorf("foreign RAM of domain %d: page %#x is frame %#x, beyond %#x", dom, i, f, uint64(privcmd.MaxFrame))
		case len(extents) > 0 && extents[len(extents)-1].First+extents[len(extents)-1].Pages == uint64(i):
			extents[len(extents)-1].Pages++
		default:
			extents = append(extents, Extent{First: uint64(i), Pages: 1})
		}
	}
	if len(extents) == 0 {
		return nil, fmt.Errorf("foreign RAM of domain %d: every page is a hole", dom)
	}
	// Zero pages of our own everywhere; the domain's frames then replace
	// them where it has RAM.
	mem, err := unix.Mmap(-1, 0, len(frames)*xen.PageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("foreign RAM of domain %d: reserve %d pages: %w", dom, len(frames), err)
	}
	for _, e := range extents {
		for off := e.First; off < e.First+e.Pages; off += uint64(chunk) {
			n := min(uint64(chunk), e.First+e.Pages-off)
			dst := mem[off*xen.PageSize : (off+n)*xen.PageSize]
			if err := m.MapForeignInto(dst, dom, frames[off:off+n]); err != nil {
				return nil, errors.Join(fmt.Errorf("foreign RAM of domain %d: guest pages %#x..%#x: %w", dom, off, off+n-1, err), unix.Munmap(mem))
			}
		}
	}
	return &RAM{dom: dom, mem: mem, extents: extents}, nil
}

// Bytes returns the guest-physical memory: byte a is guest-physical
// address a. Nil after Close.
func (r *RAM) Bytes() []byte { return r.mem }

// Size returns the guest-physical span in bytes.
func (r *RAM) Size() uint64 { return uint64(len(r.mem)) }

// Domain returns the domain whose RAM this is.
func (r *RAM) Domain() uint16 { return r.dom }

// Extents returns the guest-physical pages with RAM behind them.
func (r *RAM) Extents() []Extent { return slices.Clone(r.extents) }

// Contains reports whether n bytes at guest-physical address gpa are all
// the domain's RAM (no hole, nothing beyond the span): what a DMA target
// must be.
func (r *RAM) Contains(gpa, n uint64) bool {
	if n == 0 || gpa+n < gpa || gpa+n > r.Size() {
		return false
	}
	first, last := gpa/xen.PageSize, (gpa+n-1)/xen.PageSize
	i := sort.Search(len(r.extents), func(i int) bool { return r.extents[i].First+r.extents[i].Pages > first })
	return i < len(r.extents) && r.extents[i].First <= first && last < r.extents[i].First+r.extents[i].Pages
}

// Close unmaps the RAM; the domain's frames are released. Closing twice
// is a no-op.
func (r *RAM) Close() error {
	if r.mem == nil {
		return nil
	}
	err := unix.Munmap(r.mem)
	r.mem = nil
	if err != nil {
		return fmt.Errorf("foreign RAM of domain %d: unmap: %w", r.dom, err)
	}
	return nil
}
