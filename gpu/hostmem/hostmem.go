// Package hostmem is memory the GPU can reach by DMA: a memfd-backed region
// (so it can be handed to another process, as a VM's RAM is handed to the
// aggregator) with a page allocator for pinned buffers.
//
// The bus address of a byte is BusBase + its offset in the region: on the native
// path BusBase is where the board registered the region in machine memory; inside
// a VM it is the guest-physical base of the RAM, translated to machine frames by
// the aggregator's shadow page tables.
package hostmem

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/internal/rangealloc"
)

// SizeSeals are the memfd seals New applies: the region can never shrink or
// grow, so a process that maps another's region cannot be made to SIGBUS.
const SizeSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// Buffer is a pinned, physically contiguous piece of the region.
type Buffer struct {
	Bytes []byte // CPU view
	Bus   uint64 // bus address of Bytes[0] as the GPU sees it
}

// RAM is a memfd-backed region with a page allocator. Safe for concurrent use.
type RAM struct {
	fd      int
	mem     []byte
	busBase uint64
	alloc   *rangealloc.Allocator
}

// New creates a region of size bytes (rounded up to pages), mapped shared.
func New(name string, size uint64) (*RAM, error) {
	size = (size + nvc0.PageSize - 1) &^ (nvc0.PageSize - 1)
	if size == 0 {
		return nil, fmt.Errorf("hostmem %q: zero size", name)
	}
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("hostmem %q: memfd_create: %w", name, err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("hostmem %q: ftruncate %d: %w", name, size, err)
	}
	// Whoever maps this memory later (the aggregator maps a VM's RAM) must not
	// be made to fault by a truncation: fix the size for good.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, SizeSeals); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("hostmem %q: seal: %w", name, err)
	}
	return mapFd(name, fd, size)
}

// FromFd maps an existing memfd of size bytes; the RAM takes ownership of fd.
func FromFd(name string, fd int, size uint64) (*RAM, error) {
	if size == 0 || size%nvc0.PageSize != 0 {
		return nil, fmt.Errorf("hostmem %q: size %d is not a positive page multiple", name, size)
	}
	return mapFd(name, fd, size)
}

func mapFd(name string, fd int, size uint64) (*RAM, error) {
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("hostmem %q: mmap %d: %w", name, size, err)
	}
	return &RAM{fd: fd, mem: mem, alloc: rangealloc.New(0, size)}, nil
}

// Fd returns the memfd (for passing to another process).
func (r *RAM) Fd() int { return r.fd }

// File returns a new *os.File on a duplicate of the memfd (to pass to
// another process); the caller closes it. The RAM keeps its own descriptor.
func (r *RAM) File() (*os.File, error) {
	fd, err := unix.FcntlInt(uintptr(r.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("hostmem: dup: %w", err)
	}
	return os.NewFile(uintptr(fd), "hostmem"), nil
}

// Bytes returns the whole region.
func (r *RAM) Bytes() []byte { return r.mem }

// Size returns the region size in bytes.
func (r *RAM) Size() uint64 { return uint64(len(r.mem)) }

// SetBusBase sets the bus address of offset 0. Call it before allocating.
func (r *RAM) SetBusBase(base uint64) { r.busBase = base }

// BusBase returns the bus address of offset 0.
func (r *RAM) BusBase() uint64 { return r.busBase }

// Alloc returns a zeroed page-aligned buffer of at least size bytes.
func (r *RAM) Alloc(size uint64) (Buffer, error) {
	size = (size + nvc0.PageSize - 1) &^ (nvc0.PageSize - 1)
	off, err := r.alloc.Alloc(size, nvc0.PageSize)
	if err != nil {
		return Buffer{}, fmt.Errorf("host memory: %w", err)
	}
	b := r.mem[off : off+size : off+size]
	clear(b)
	return Buffer{Bytes: b, Bus: r.busBase + off}, nil
}

// Free returns a buffer to the region.
func (r *RAM) Free(b Buffer) error {
	if b.Bus < r.busBase || b.Bus >= r.busBase+uint64(len(r.mem)) {
		return fmt.Errorf("host memory: free of foreign buffer at %#x", b.Bus)
	}
	return r.alloc.Free(b.Bus - r.busBase)
}

// Close unmaps the region and closes the memfd.
func (r *RAM) Close() error {
	if r.mem == nil {
		return nil
	}
	err := unix.Munmap(r.mem)
	r.mem = nil
	if cerr := unix.Close(r.fd); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("hostmem close: %w", err)
	}
	return nil
}
