package nvc0

// Channel instance block (RAMIN): one 4 KiB page in VRAM per channel, and one
// each for the BAR1 and BAR3 address spaces. RAMFC (0x000–0x1ff) is what
// nvkm/engine/fifo/gf100.c gf100_chan_ramfc_write fills; 0x200–0x20f is the
// address space (nvkm/subdev/mmu/vmmgf100.c gf100_vmm_join_); 0x210… are the
// engine context pointers (gf100_ectx_bind). Offsets are bytes.
const (
	RAMINSize = 0x1000

	RAMINUserLo    = 0x08  // USERD (user area) address bits 31:12 | target in 1:0
	RAMINUserHi    = 0x0C  // USERD address bits 39:32
	RAMINSignature = 0x10  // 0x0000face: only the low 16 bits are checked (envytools SIG)
	RAMINGPFIFOLo  = 0x48  // GPFIFO ring GPU virtual address bits 31:0
	RAMINGPFIFOHi  = 0x4C  // bits 39:32 | log2(entries) << RAMINGPFIFOLog2Shift
	RAMINPageDir   = 0x200 // page directory: address bits 31:12 | VOL bit 2 | target 1:0; +0x204 bits 39:32
	RAMINAddrLimit = 0x208 // highest valid virtual address of the address space (u64)

	// RAMINEngineGR, RAMINEngineCE0 and RAMINEngineCE1 hold the engine
	// context pointers: a virtual address in the channel's own address
	// space (bits 31:8 of the low word, the high word bits 39:32) with
	// RAMINEngineVirtual set, as gf100_ectx_bind writes them (addr | 4).
	RAMINEngineGR  = 0x210
	RAMINEngineCE0 = 0x230
	RAMINEngineCE1 = 0x240
	// The video engines' context pointers (gf100_ectx_bind); the board
	// has none of these engines.
	RAMINEngineMSPDEC = 0x250
	RAMINEngineMSPPP  = 0x260
	RAMINEngineMSVLD  = 0x270

	RAMINSignatureValue  = 0x0000FACE
	RAMINSignatureMask   = 0x0000FFFF
	RAMINGPFIFOLog2Shift = 16
	RAMINGPFIFOLog2Mask  = 0x1F
	RAMINGPFIFOHiMask    = 0xFF
	// RAMINAddrTargetMask selects the memory target (MemTarget*) in the low
	// word of the USERD and page-directory addresses; the address is the
	// rest of the word (4 KiB aligned).
	RAMINAddrTargetMask  = 0x3
	RAMINPageDirVolatile = 0x4
	// RAMINEngineVirtual is bit 2 of an engine context pointer: the pointer
	// is a virtual address (nouveau writes |4; NVIDIA's Volta dev_ram
	// documents the same bit as WFI_MODE VIRTUAL, 0 meaning physical).
	RAMINEngineVirtual  = 0x4
	RAMINEngineAddrMask = 0xFFFFFF00
)

// RAMINAddrEncode encodes a 4 KiB-aligned VRAM address for a RAMIN address
// field (USERD, page directory) as its low and high words.
func RAMINAddrEncode(addr uint64) (lo, hi uint32) {
	return uint32(addr) &^ (PageSize - 1), uint32(addr >> 32)
}

// RAMINAddrDecode decodes a RAMIN address field: the address and its
// memory target.
func RAMINAddrDecode(lo, hi uint32) (addr uint64, target uint32) {
	return uint64(hi)<<32 | uint64(lo&^(PageSize-1)), lo & RAMINAddrTargetMask
}

// RAMINEngineEncode encodes an engine context pointer to the virtual
// address va (256-byte aligned).
func RAMINEngineEncode(va uint64) (lo, hi uint32) {
	return uint32(va)&RAMINEngineAddrMask | RAMINEngineVirtual, uint32(va >> 32)
}

// RAMINEngineDecode decodes an engine context pointer: the address and
// whether it is virtual (a physical pointer names VRAM directly).
func RAMINEngineDecode(lo, hi uint32) (addr uint64, virtual bool) {
	return uint64(hi)<<32 | uint64(lo&RAMINEngineAddrMask), lo&RAMINEngineVirtual != 0
}

// GPFIFOHiEncode encodes RAMIN +0x4C for a ring at va with 2^log2Entries entries.
func GPFIFOHiEncode(va uint64, log2Entries uint) uint32 {
	return uint32(va>>32)&RAMINGPFIFOHiMask | uint32(log2Entries&RAMINGPFIFOLog2Mask)<<RAMINGPFIFOLog2Shift
}

// GPFIFODecode decodes RAMIN +0x48/+0x4C into the ring address and entry count.
func GPFIFODecode(lo, hi uint32) (va uint64, entries uint32) {
	va = uint64(hi&RAMINGPFIFOHiMask)<<32 | uint64(lo)
	return va, 1 << ((hi >> RAMINGPFIFOLog2Shift) & RAMINGPFIFOLog2Mask)
}

// User area (USERD): one 4 KiB page per channel, in VRAM, seen by the CPU
// through the poll area in BAR1 (channel ch at poll base + ch*UserAreaSize)
// (cl906f.h Nv906fControl; envytools "channel control area").
const (
	UserAreaSize = 0x1000
	UserDMAPut   = 0x40 // Put: push-buffer put (not used in GPFIFO mode)
	UserDMAGet   = 0x44 // Get: the GPU's push-buffer fetch address bits 31:0 (GPU writes)
	UserRef      = 0x48 // Reference: the last SET_REFERENCE value (GPU writes)
	UserDMAPutHi = 0x4C
	UserDMAGetHi = 0x60 // GetHi: fetch address bits 39:32 (GPU writes)
	UserGPGet    = 0x88 // GPGet: index of the next GPFIFO entry the GPU will fetch (GPU writes)
	UserGPPut    = 0x8C // GPPut: index one past the last valid entry; writing it rings the doorbell
)

// GPFIFO entry: two words (cl906f.h NV906F_GP_ENTRY0/1). Word 0 bits 31:2
// are the push buffer's address bits 31:2 (bit 0 FETCH, bit 1
// NO_CONTEXT_SWITCH); word 1 bits 7:0 address bits 39:32, bit 8 PRIV, bit
// 9 LEVEL, bits 30:10 the length in words, bit 31 SYNC.
const (
	GPFIFOEntrySize    = 8
	GPFIFOLenShift     = 10
	GPFIFOLenMask      = 0x1FFFFF
	GPFIFOAddrHiMask   = 0xFF
	MaxPushBufferWords = GPFIFOLenMask
)

// GPFIFOEncode builds a GPFIFO entry for a push buffer at va of words 32-bit words.
func GPFIFOEncode(va uint64, words uint32) (w0, w1 uint32) {
	return uint32(va) &^ 3, uint32(va>>32)&GPFIFOAddrHiMask | (words&GPFIFOLenMask)<<GPFIFOLenShift
}

// GPFIFODecodeEntry decodes a GPFIFO entry.
func GPFIFODecodeEntry(w0, w1 uint32) (va uint64, words uint32) {
	return uint64(w1&GPFIFOAddrHiMask)<<32 | uint64(w0&^3), (w1 >> GPFIFOLenShift) & GPFIFOLenMask
}
