package xenguest

import (
	"fmt"
	"math"
	"os"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// mapShared maps size bytes of path at offset off, shared and writable.
// With uncached the file is opened O_SYNC: Linux then maps /dev/mem
// uncached (UC-) on x86, as registers want; a sysfs resourceN file is
// mapped uncached whatever the flags (its _wc sibling would be
// write-combining). A regular file (the tests' stand-in for a device)
// must hold the whole range, or touching the rest would SIGBUS.
func mapShared(path string, off, size uint64, uncached bool) ([]byte, error) {
	if size == 0 || size > math.MaxInt || off > math.MaxInt64 {
		return nil, fmt.Errorf("map %s: range %#x+%#x out of reach", path, off, size)
	}
	flags := unix.O_RDWR | unix.O_CLOEXEC
	if uncached {
		flags |= unix.O_SYNC
	}
	fd, err := unix.Open(path, flags, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd) // the mapping outlives the descriptor
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG && uint64(st.Size) < off+size {
		return nil, fmt.Errorf("map %s: range %#x+%#x is beyond the file's %#x bytes", path, off, size, st.Size)
	}
	mem, err := unix.Mmap(fd, int64(off), int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap %s at %#x, %#x bytes: %w", path, off, size, err)
	}
	return mem, nil
}

// memWindow is a memory BAR mapped into the process.
type memWindow struct{ mem []byte }

func mapFile(path string, off, size uint64, uncached bool) (window, error) {
	mem, err := mapShared(path, off, size, uncached)
	if err != nil {
		return nil, err
	}
	return &memWindow{mem: mem}, nil
}

// load32 is one 32-bit load: atomic.LoadUint32 is a plain MOV on amd64 (and
// a single load-acquire elsewhere), and the compiler may neither split,
// merge nor drop it.
func (w *memWindow) load32(off uint64) uint32 {
	return atomic.LoadUint32((*uint32)(unsafe.Pointer(&w.mem[off])))
}

func (w *memWindow) store32(off uint64, v uint32) {
	store32((*uint32)(unsafe.Pointer(&w.mem[off])), v)
}

// store32 is one 32-bit store: a plain MOVL on amd64. Not atomic.Store:
// on amd64 that is an XCHG, which Xen's instruction emulator must treat as
// a read and a write of the register (two ioreqs, and a read the driver
// never asked for, which a register with read side effects would notice).
// It is kept out of line so that the compiler cannot merge it with, or drop
// it in favour of, another store to the same address in its caller (dead
// stores are eliminated only within one function).
//
//go:noinline
func store32(p *uint32, v uint32) { *p = v }

// fill32 stores v into the n words from off with one string instruction,
// or declines (false) where there is none.
func (w *memWindow) fill32(off uint64, v uint32, n int) bool {
	if !fillIsOneInstruction {
		return false
	}
	fillWords((*uint32)(unsafe.Pointer(&w.mem[off])), v, uint64(n))
	return true
}

func (w *memWindow) size() uint64 { return uint64(len(w.mem)) }

func (w *memWindow) close() error {
	if w.mem == nil {
		return nil
	}
	err := unix.Munmap(w.mem)
	w.mem = nil
	return err
}
