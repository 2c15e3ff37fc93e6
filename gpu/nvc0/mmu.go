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

// PDE is a decoded page-directory entry (nvkm/subdev/mmu/vmmgf100.c
// gf100_vmm_pgd_pde): word 0 is the large-page table (target 1:0, SIZE 3:2,
// address >> 12 in 31:4), word 1 the small-page table (target 1:0, VOL for
// the small table bit 2, VOL for the large table bit 3, address 31:4). A
// zero address with Present false means no table of that size.
type PDE struct {
	LargePresent bool
	LargeSys     bool   // large page table lives in system memory
	LargeAddr    uint64 // large-page table address
	LargeVol     bool
	// Size is word 0 bits 3:2 (envytools PT_SIZE: 0 FULL, 1 64M, 2 32M,
	// 3 16M of the 128 MiB a PDE covers). nouveau only writes 0; which
	// table a non-zero size shortens is undocumented. The board shortens
	// the small-page table to 1/2^Size of the range (an access beyond it
	// with no large page faults PT_TOO_SHORT), since the sizes listed are
	// what a 128 KiB-page table would cover in full.
	Size         uint32
	SmallPresent bool
	SmallSys     bool
	SmallAddr    uint64
	SmallVol     bool
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

// PDE word 1 volatile bits (gf100_vmm_pgd_pde: BIT_ULL(34), BIT_ULL(35)).
const (
	PDEW1SmallVol = 0x4
	PDEW1LargeVol = 0x8
)

// Encode returns the two little-endian words of the PDE.
func (p PDE) Encode() (w0, w1 uint32) {
	w0 = pdeWord(p.LargePresent, p.LargeSys, p.LargeAddr) | (p.Size&pdeSizeMask)<<pdeSizeShift
	w1 = pdeWord(p.SmallPresent, p.SmallSys, p.SmallAddr)
	if p.SmallVol {
		w1 |= PDEW1SmallVol
	}
	if p.LargeVol {
		w1 |= PDEW1LargeVol
	}
	return w0, w1
}

// DecodePDE decodes a page-directory entry from its two words.
func DecodePDE(w0, w1 uint32) PDE {
	var p PDE
	p.LargePresent, p.LargeSys, p.LargeAddr = pdeWordDecode(w0)
	p.Size = (w0 >> pdeSizeShift) & pdeSizeMask
	p.SmallPresent, p.SmallSys, p.SmallAddr = pdeWordDecode(w1)
	p.SmallVol, p.LargeVol = w1&PDEW1SmallVol != 0, w1&PDEW1LargeVol != 0
	return p
}

// PTE field encodings (gf100_vmm_valid, gf100_vmm_pgt_pte; envytools
// nvc0_vm.xml): low word bit 0 present, 1 privileged, 2 read-only, 3
// encrypted, 31:4 address >> 12; high word bit 0 VOL, 2:1 target, 11:4
// storage kind, 28:12 compression tag line.
const (
	PTEPresent    = 0x1 // low word bit 0
	PTEPrivileged = 0x2 // low word bit 1: only privileged engines may use it
	PTEReadOnly   = 0x4 // low word bit 2
	PTEEncrypted  = 0x8 // low word bit 3 (envytools: sysram only; nouveau never sets it)
	pteAddrMask   = 0xFFFFFFF0

	PTEHiVolatile     = 0x1 // high word bit 0 (nouveau writes 5/7 for system memory)
	pteHiTargetShift  = 1
	pteHiTargetMask   = 0x3
	pteHiKindShift    = 4
	pteHiKindMask     = 0xFF
	pteHiCompTagShift = 12
	pteHiCompTagMask  = 0x1FFFF
)

// PTE is a decoded page-table entry.
type PTE struct {
	Present    bool
	Privileged bool
	ReadOnly   bool
	Encrypted  bool
	Addr       uint64 // physical address: VRAM offset or system (machine) address
	Target     uint32 // TargetVRAM, TargetSysSnooped or TargetSysNoSnoop
	Volatile   bool
	Kind       uint32 // memory type (storage kind), high word bits 11:4
	CompTag    uint32 // compression tag line, high word bits 28:12
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
	if p.Encrypted {
		lo |= PTEEncrypted
	}
	hi = (p.Target&pteHiTargetMask)<<pteHiTargetShift | (p.Kind&pteHiKindMask)<<pteHiKindShift |
		(p.CompTag&pteHiCompTagMask)<<pteHiCompTagShift
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
		Encrypted:  lo&PTEEncrypted != 0,
		Addr:       uint64(lo&pteAddrMask) << addrShift,
		Target:     (hi >> pteHiTargetShift) & pteHiTargetMask,
		Volatile:   hi&PTEHiVolatile != 0,
		Kind:       (hi >> pteHiKindShift) & pteHiKindMask,
		CompTag:    (hi >> pteHiCompTagShift) & pteHiCompTagMask,
	}
}

// PDEIndex returns the page-directory index of a virtual address.
func PDEIndex(va uint64) uint64 { return (va >> PDEShift) & (PDECount - 1) }

// SmallPTEIndex returns the small-page-table index of a virtual address.
func SmallPTEIndex(va uint64) uint64 { return (va >> PageShift) & (SmallPTECount - 1) }

// LargePTEIndex returns the large-page-table index of a virtual address.
func LargePTEIndex(va uint64) uint64 { return (va >> LargePageShift) & (LargePTECount - 1) }
