package sim

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// vram is the board's device memory: a sparse memfd mapped shared. Pages cost
// host memory only once written; ScrubVRAM punches them out again. The
// mapping is accessed without locks (like real memory, concurrent device and
// CPU accesses are the driver's business).
type vram struct {
	fd  int
	mem []byte
}

func newVRAM(size uint64) (*vram, error) {
	fd, err := unix.MemfdCreate("gpuvm-vram", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("vram memfd: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("vram ftruncate %d: %w", size, err)
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_NORESERVE)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("vram mmap %d: %w", size, err)
	}
	return &vram{fd: fd, mem: mem}, nil
}

func (v *vram) close() error {
	err := unix.Munmap(v.mem)
	v.mem = nil
	if cerr := unix.Close(v.fd); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("vram release: %w", err)
	}
	return nil
}

// inRange reports whether [off, off+n) lies inside VRAM.
func (v *vram) inRange(off, n uint64) bool {
	size := uint64(len(v.mem))
	return off <= size && n <= size-off
}

// VRAMFd returns the memfd that backs VRAM, so that aperture pages can be
// mmap'd into other processes. The board owns it; it is closed by Close.
func (b *Board) VRAMFd() int { return b.vram.fd }

// ReadVRAM copies VRAM at off into p (host-side access, bypassing the MMU).
func (b *Board) ReadVRAM(p []byte, off uint64) error {
	if !b.enter() {
		return errClosed
	}
	defer b.leave()
	if !b.vram.inRange(off, uint64(len(p))) {
		return fmt.Errorf("sim: read VRAM [%#x, +%#x): beyond %#x", off, len(p), b.cfg.VRAMSize)
	}
	copy(p, b.vram.mem[off:])
	return nil
}

// WriteVRAM copies p into VRAM at off (host-side access, bypassing the MMU).
func (b *Board) WriteVRAM(p []byte, off uint64) error {
	if !b.enter() {
		return errClosed
	}
	defer b.leave()
	if !b.vram.inRange(off, uint64(len(p))) {
		return fmt.Errorf("sim: write VRAM [%#x, +%#x): beyond %#x", off, len(p), b.cfg.VRAMSize)
	}
	copy(b.vram.mem[off:], p)
	return nil
}

// ScrubVRAM zeroes [off, off+n). Whole pages are punched out of the memfd
// (returning their host memory); partial pages at the ends are cleared.
func (b *Board) ScrubVRAM(off, n uint64) error {
	if !b.enter() {
		return errClosed
	}
	defer b.leave()
	if !b.vram.inRange(off, n) {
		return fmt.Errorf("sim: scrub VRAM [%#x, +%#x): beyond %#x", off, n, b.cfg.VRAMSize)
	}
	end := off + n
	lo := (off + nvc0.PageSize - 1) &^ (nvc0.PageSize - 1)
	hi := end &^ (nvc0.PageSize - 1)
	if lo >= hi {
		clear(b.vram.mem[off:end])
		return nil
	}
	clear(b.vram.mem[off:lo])
	clear(b.vram.mem[hi:end])
	err := unix.Fallocate(b.vram.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, int64(lo), int64(hi-lo))
	if err != nil {
		// A filesystem without hole punching still gets the right contents.
		clear(b.vram.mem[lo:hi])
	}
	return nil
}
