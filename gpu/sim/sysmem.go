package sim

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// System memory ("machine memory" as the GPU sees it over the bus) is the set
// of regions registered with RegisterSystemMemory. Each region gets a 1 GiB
// aligned machine address below 2^40; a system-memory PTE that points outside
// every region faults with FaultReasonTarget.
const (
	sysRegionAlign = 1 << 30
	sysFirstBase   = sysRegionAlign // keep machine address 0 unmapped: it catches zeroed PTEs
	sysAddrLimit   = nvc0.VASize
)

var errClosed = errors.New("sim: board closed")

type sysRegion struct {
	base uint64
	mem  []byte
}

func (r sysRegion) end() uint64 { return r.base + uint64(len(r.mem)) }

// span is the machine-address range the region reserves (rounded to 1 GiB).
func (r sysRegion) spanEnd() uint64 {
	return r.base + (uint64(len(r.mem))+sysRegionAlign-1)&^(sysRegionAlign-1)
}

// sysmem is the registry. Lookups read an immutable sorted slice through an
// atomic pointer; updates copy it under mu.
type sysmem struct {
	mu      sync.Mutex
	regions atomic.Pointer[[]sysRegion]
}

func (s *sysmem) list() []sysRegion {
	if p := s.regions.Load(); p != nil {
		return *p
	}
	return nil
}

// lookup returns the memory at machine address [addr, addr+n), which must lie
// inside one region. Callers pin system memory (Board.pin) around the
// lookup and every use of the slice it returns.
func (s *sysmem) lookup(addr, n uint64) ([]byte, bool) {
	rs := s.list()
	i, found := slices.BinarySearchFunc(rs, addr, func(r sysRegion, a uint64) int {
		switch {
		case a < r.base:
			return 1
		case a >= r.end():
			return -1
		}
		return 0
	})
	if !found {
		return nil, false
	}
	r := rs[i]
	off := addr - r.base
	if n > uint64(len(r.mem))-off {
		return nil, false
	}
	return r.mem[off : off+n], true
}

// RegisterSystemMemory makes mem (page-aligned, a whole number of pages, e.g.
// a VM's RAM memfd mapping) reachable by the GPU as machine memory, and
// returns its machine (bus) address: 1 GiB aligned, below 2^40, never
// overlapping another region. The caller keeps mem mapped until it
// unregisters it, and must not unregister it while the GPU may still DMA into
// it.
func (b *Board) RegisterSystemMemory(mem []byte) (uint64, error) {
	if !b.enter() {
		return 0, errClosed
	}
	defer b.leave()
	if len(mem) == 0 || len(mem)%nvc0.PageSize != 0 {
		return 0, fmt.Errorf("sim: register system memory: size %#x is not a positive multiple of %#x", len(mem), nvc0.PageSize)
	}
	if addrOf(mem)%nvc0.PageSize != 0 {
		return 0, fmt.Errorf("sim: register system memory: %#x is not page aligned", addrOf(mem))
	}
	s := &b.sys
	s.mu.Lock()
	defer s.mu.Unlock()
	rs := s.list()
	size := (uint64(len(mem)) + sysRegionAlign - 1) &^ (sysRegionAlign - 1)
	base := uint64(sysFirstBase)
	pos := 0
	for pos < len(rs) && rs[pos].base < base+size {
		base = rs[pos].spanEnd()
		pos++
	}
	if base+size > sysAddrLimit {
		return 0, fmt.Errorf("sim: register system memory: no room for %#x bytes below %#x", len(mem), uint64(sysAddrLimit))
	}
	next := slices.Insert(slices.Clone(rs), pos, sysRegion{base: base, mem: mem})
	s.regions.Store(&next)
	return base, nil
}

// UnregisterSystemMemory removes the region registered at base and waits
// until no engine is still moving bytes of it: when it returns, the caller
// may unmap the memory. A channel that still names the region afterwards
// faults on its next access (FaultReasonTarget).
func (b *Board) UnregisterSystemMemory(base uint64) error {
	if !b.enter() {
		return errClosed
	}
	defer b.leave()
	s := &b.sys
	s.mu.Lock()
	defer s.mu.Unlock()
	rs := s.list()
	i := slices.IndexFunc(rs, func(r sysRegion) bool { return r.base == base })
	if i < 0 {
		return fmt.Errorf("sim: unregister system memory: no region at %#x", base)
	}
	next := slices.Delete(slices.Clone(rs), i, i+1)
	s.regions.Store(&next)
	// Accesses that looked the region up before it left the list hold
	// sysMu for reading until their bytes are moved: wait them out.
	b.sysMu.Lock()
	b.sysMu.Unlock() //nolint:staticcheck // an empty critical section is the point: a grace period
	return nil
}
