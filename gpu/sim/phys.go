package sim

import (
	"encoding/binary"
	"sync/atomic"
	"unsafe"
)

// Physical memory: a byte range is either VRAM (an offset into the memfd) or
// system memory (a machine address inside a registered region). These helpers
// are the only way the board's engines touch memory.
//
// System memory is pinned while it is accessed: every access to it holds
// b.sysMu for reading from the region lookup until the bytes are moved, and
// UnregisterSystemMemory takes it for writing after removing the region, so
// once it returns no engine touches the region's memory any more and the
// caller may unmap it. Each pinned section moves at most one page, so an
// unregister waits microseconds, not for a whole copy or kernel.

// phys names a physical location.
type phys struct {
	sys  bool
	addr uint64
}

// slice returns the n bytes at p, or false if nothing backs all of them.
func (b *Board) slice(p phys, n uint64) ([]byte, bool) {
	if p.sys {
		return b.sys.lookup(p.addr, n)
	}
	if !b.vram.inRange(p.addr, n) {
		return nil, false
	}
	return b.vram.mem[p.addr : p.addr+n : p.addr+n], true
}

func addrOf(p []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(p))) }

// load32 reads a little-endian word; an aligned word is read atomically so a
// concurrent 32-bit writer is never seen torn.
func load32(m []byte) uint32 {
	if addrOf(m)%4 == 0 {
		return atomic.LoadUint32((*uint32)(unsafe.Pointer(unsafe.SliceData(m))))
	}
	return binary.LittleEndian.Uint32(m)
}

// store32 writes a little-endian word, atomically when aligned.
func store32(m []byte, v uint32) {
	if addrOf(m)%4 == 0 {
		atomic.StoreUint32((*uint32)(unsafe.Pointer(unsafe.SliceData(m))), v)
		return
	}
	binary.LittleEndian.PutUint32(m, v)
}

// pin pins system memory for an access to p (a no-op for VRAM, which is
// never unmapped while the board lives) and returns the unpin function.
func (b *Board) pin(p phys) func() {
	if !p.sys {
		return func() {}
	}
	b.sysMu.RLock()
	return b.sysMu.RUnlock
}

// physRead32 reads a word at p; ok is false when nothing backs it.
func (b *Board) physRead32(p phys) (uint32, bool) {
	defer b.pin(p)()
	m, ok := b.slice(p, 4)
	if !ok {
		return 0, false
	}
	return load32(m), true
}

// physWrite32 writes a word at p; it reports false when nothing backs it.
func (b *Board) physWrite32(p phys, v uint32) bool {
	defer b.pin(p)()
	m, ok := b.slice(p, 4)
	if !ok {
		return false
	}
	store32(m, v)
	return true
}

// physRead64 reads two words at p (each atomically).
func (b *Board) physRead64(p phys) (lo, hi uint32, ok bool) {
	defer b.pin(p)()
	m, ok := b.slice(p, 8)
	if !ok {
		return 0, 0, false
	}
	return load32(m[:4]), load32(m[4:]), true
}

// physCopyOut fills buf from p; it reports false when nothing backs it all.
func (b *Board) physCopyOut(buf []byte, p phys) bool {
	defer b.pin(p)()
	m, ok := b.slice(p, uint64(len(buf)))
	if ok {
		copy(buf, m)
	}
	return ok
}

// physCopyIn writes buf to p; it reports false when nothing backs it all.
func (b *Board) physCopyIn(p phys, buf []byte) bool {
	defer b.pin(p)()
	m, ok := b.slice(p, uint64(len(buf)))
	if ok {
		copy(m, buf)
	}
	return ok
}

// physMove copies n bytes from src to dst (one pinned section).
func (b *Board) physMove(dst, src phys, n uint64) bool {
	if dst.sys || src.sys {
		b.sysMu.RLock()
		defer b.sysMu.RUnlock()
	}
	from, ok := b.slice(src, n)
	if !ok {
		return false
	}
	to, ok := b.slice(dst, n)
	if !ok {
		return false
	}
	if b.inDMA != nil {
		b.inDMA()
	}
	copy(to, from)
	return true
}

// vramRead32 reads a VRAM word (0 if out of range).
func (b *Board) vramRead32(addr uint64) uint32 {
	v, _ := b.physRead32(phys{addr: addr})
	return v
}

// vramRead64 reads a little-endian u64 from VRAM as two words (0 if out of range).
func (b *Board) vramRead64(addr uint64) uint64 {
	return uint64(b.vramRead32(addr)) | uint64(b.vramRead32(addr+4))<<32
}
