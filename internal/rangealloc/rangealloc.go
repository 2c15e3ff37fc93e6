// Package rangealloc is a first-fit allocator of aligned ranges inside a fixed
// address range. The guest driver uses it for VRAM and GPU virtual addresses,
// hostmem for DMA pages; it knows nothing about what the addresses mean.
package rangealloc

import (
	"errors"
	"fmt"
	"sort"
	"sync"
)

// ErrNoSpace is returned when no free range is large enough.
var ErrNoSpace = errors.New("no free range large enough")

type span struct{ start, end uint64 } // [start, end)

// Allocator hands out ranges of [base, base+size). It is safe for concurrent use.
type Allocator struct {
	mu    sync.Mutex
	base  uint64
	limit uint64
	free  []span // sorted, coalesced
	used  map[uint64]uint64
}

// New returns an allocator of [base, base+size).
func New(base, size uint64) *Allocator {
	return &Allocator{base: base, limit: base + size, free: []span{{base, base + size}}, used: map[uint64]uint64{}}
}

// Alloc returns the start of a free range of size bytes aligned to align (a power of two).
func (a *Allocator) Alloc(size, align uint64) (uint64, error) {
	if size == 0 {
		return 0, fmt.Errorf("alloc of 0 bytes")
	}
	if align == 0 || align&(align-1) != 0 {
		return 0, fmt.Errorf("alignment %#x is not a power of two", align)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, s := range a.free {
		start := (s.start + align - 1) &^ (align - 1)
		if start < s.start || start+size < start || start+size > s.end {
			continue
		}
		a.carve(i, start, start+size)
		a.used[start] = size
		return start, nil
	}
	return 0, fmt.Errorf("alloc %#x bytes aligned %#x: %w", size, align, ErrNoSpace)
}

// Reserve marks [start, start+size) as used; it must lie inside one free range.
func (a *Allocator) Reserve(start, size uint64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, s := range a.free {
		if start >= s.start && start+size <= s.end && start+size > start {
			a.carve(i, start, start+size)
			a.used[start] = size
			return nil
		}
	}
	return fmt.Errorf("reserve [%#x, %#x): not free", start, start+size)
}

func (a *Allocator) carve(i int, start, end uint64) {
	s := a.free[i]
	var repl []span
	if s.start < start {
		repl = append(repl, span{s.start, start})
	}
	if end < s.end {
		repl = append(repl, span{end, s.end})
	}
	a.free = append(a.free[:i], append(repl, a.free[i+1:]...)...)
}

// Free returns a range previously returned by Alloc or Reserve.
func (a *Allocator) Free(start uint64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	size, ok := a.used[start]
	if !ok {
		return fmt.Errorf("free %#x: not allocated", start)
	}
	delete(a.used, start)
	end := start + size
	i := sort.Search(len(a.free), func(i int) bool { return a.free[i].start >= end })
	a.free = append(a.free, span{})
	copy(a.free[i+1:], a.free[i:])
	a.free[i] = span{start, end}
	// coalesce with neighbours
	if i+1 < len(a.free) && a.free[i].end == a.free[i+1].start {
		a.free[i].end = a.free[i+1].end
		a.free = append(a.free[:i+1], a.free[i+2:]...)
	}
	if i > 0 && a.free[i-1].end == a.free[i].start {
		a.free[i-1].end = a.free[i].end
		a.free = append(a.free[:i], a.free[i+1:]...)
	}
	return nil
}

// SizeOf returns the size of an allocated range.
func (a *Allocator) SizeOf(start uint64) (uint64, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.used[start]
	return s, ok
}

// FreeBytes returns the total free space.
func (a *Allocator) FreeBytes() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var n uint64
	for _, s := range a.free {
		n += s.end - s.start
	}
	return n
}
