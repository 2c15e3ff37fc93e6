package nvc0

// GPU virtual memory: 40-bit addresses, a page directory of 8192 PDEs each
// covering 128 MiB, and under each PDE a small-page table (4 KiB pages) and/or
// a large-page table (128 KiB pages).
const (
	VABits        = 40
	VASize        = 1 << VABits
	PDEShift      = 27 // each PDE covers 128 MiB
	PDECoverage   = 1 << PDEShift
	PDECount      = 1 << (VABits - PDEShift) // 8192
	PDESize       = 8
	PageDirSize   = PDECount * PDESize // 64 KiB
	PTESize       = 8
	SmallPTECount = PDECoverage >> PageShift      // 32768
	LargePTECount = PDECoverage >> LargePageShift // 1024
	SmallPTSize   = SmallPTECount * PTESize       // 256 KiB
	LargePTSize   = LargePTECount * PTESize       // 8 KiB
)

// Page-table and page-directory targets (PDE bits 1:0 of each word; PTE high word bits 2:1).
const (
	TargetVRAM          = 0
	TargetSysSnooped    = 2
	TargetSysNoSnoop    = 3
	pdeTargetMask       = 0x3
	pdeTargetVRAM       = 0x1 // PDE word: page table in VRAM (nouveau writes addr>>8 | 1)
	pdeTargetSysSnoop   = 0x2
	pdeTargetSysNoSnoop = 0x3
	pdeSizeShift        = 2
	pdeSizeMask         = 0x3
	pdeAddrMask         = 0xFFFFFFF0
	addrShift           = 8
)

// PDE is a decoded page-directory entry. A zero address with Present false
// means no table of that size.
type PDE struct {
	LargePresent bool
	LargeSys     bool   // large page table lives in system memory
	LargeAddr    uint64 // large-page table address
	// Size is PDE word0 bits 3:2: the share of the 128 MiB covered by the
	// small-page table is 1/2^Size (0 = all of it, as nouveau uses).
	Size         uint32
	SmallPresent bool
	SmallSys     bool
	SmallAddr    uint64
}

func pdeWord(present, sys bool, addr uint64) uint32 {
	if !present {
		return 0
	}
	t := uint32(pdeTargetVRAM)
	if sys {
		t = pdeTargetSysSnoop
	}
	return uint32(addr>>addrShift)&pdeAddrMask | t
}

func pdeWordDecode(w uint32) (present, sys bool, addr uint64) {
	t := w & pdeTargetMask
	return t != 0, t >= pdeTargetSysSnoop, uint64(w&pdeAddrMask) << addrShift
}

// Encode returns the two little-endian words of the PDE.
func (p PDE) Encode() (w0, w1 uint32) {
	w0 = pdeWord(p.LargePresent, p.LargeSys, p.LargeAddr) | (p.Size&pdeSizeMask)<<pdeSizeShift
	w1 = pdeWord(p.SmallPresent, p.SmallSys, p.SmallAddr)
	return w0, w1
}

// DecodePDE decodes a page-directory entry from its two words.
func DecodePDE(w0, w1 uint32) PDE {
	var p PDE
	p.LargePresent, p.LargeSys, p.LargeAddr = pdeWordDecode(w0)
	p.Size = (w0 >> pdeSizeShift) & pdeSizeMask
	p.SmallPresent, p.SmallSys, p.SmallAddr = pdeWordDecode(w1)
	return p
}

// PTE field encodings.
const (
	PTEPresent    = 0x1 // low word bit 0
	PTEPrivileged = 0x2 // low word bit 1: only privileged engines may use it
	PTEReadOnly   = 0x4 // low word bit 2
	pteAddrMask   = 0xFFFFFFF0

	PTEHiVolatile    = 0x1 // high word bit 0 (nouveau writes 5/7 for system memory)
	pteHiTargetShift = 1
	pteHiTargetMask  = 0x3
	pteHiKindShift   = 4
	pteHiKindMask    = 0xFF
)

// PTE is a decoded page-table entry.
type PTE struct {
	Present    bool
	Privileged bool
	ReadOnly   bool
	Addr       uint64 // physical address: VRAM offset or system (machine) address
	Target     uint32 // TargetVRAM, TargetSysSnooped or TargetSysNoSnoop
	Volatile   bool
	Kind       uint32 // memory type (storage kind), high word bits 11:4
}

// IsSystem reports whether the PTE targets system memory.
func (p PTE) IsSystem() bool { return p.Target == TargetSysSnooped || p.Target == TargetSysNoSnoop }

// Encode returns the two little-endian words of the PTE.
func (p PTE) Encode() (lo, hi uint32) {
	lo = uint32(p.Addr>>addrShift) & pteAddrMask
	if p.Present {
		lo |= PTEPresent
	}
	if p.Privileged {
		lo |= PTEPrivileged
	}
	if p.ReadOnly {
		lo |= PTEReadOnly
	}
	hi = (p.Target&pteHiTargetMask)<<pteHiTargetShift | (p.Kind&pteHiKindMask)<<pteHiKindShift
	if p.Volatile {
		hi |= PTEHiVolatile
	}
	return lo, hi
}

// DecodePTE decodes a page-table entry from its two words.
func DecodePTE(lo, hi uint32) PTE {
	return PTE{
		Present:    lo&PTEPresent != 0,
		Privileged: lo&PTEPrivileged != 0,
		ReadOnly:   lo&PTEReadOnly != 0,
		Addr:       uint64(lo&pteAddrMask) << addrShift,
		Target:     (hi >> pteHiTargetShift) & pteHiTargetMask,
		Volatile:   hi&PTEHiVolatile != 0,
		Kind:       (hi >> pteHiKindShift) & pteHiKindMask,
	}
}

// PDEIndex returns the page-directory index of a virtual address.
func PDEIndex(va uint64) uint64 { return (va >> PDEShift) & (PDECount - 1) }

// SmallPTEIndex returns the small-page-table index of a virtual address.
func SmallPTEIndex(va uint64) uint64 { return (va >> PageShift) & (SmallPTECount - 1) }

// LargePTEIndex returns the large-page-table index of a virtual address.
func LargePTEIndex(va uint64) uint64 { return (va >> LargePageShift) & (LargePTECount - 1) }
