package nvc0

// Channel instance block (RAMIN): one 4 KiB page in VRAM per channel, and one
// each for the BAR1 and BAR3 "channels". Offsets are bytes from the block start.
const (
	RAMINSize = 0x1000

	RAMINUserLo    = 0x08  // user area (doorbell page) VRAM address bits 31:0
	RAMINUserHi    = 0x0C  // user area address bits 39:32
	RAMINGPFIFOLo  = 0x48  // GPFIFO ring GPU virtual address bits 31:0
	RAMINGPFIFOHi  = 0x4C  // bits 39:32 | log2(entries) << RAMINGPFIFOLog2Shift
	RAMINPageDir   = 0x200 // page-directory VRAM address (u64, little-endian: +0x200 low, +0x204 high)
	RAMINAddrLimit = 0x208 // highest valid virtual address of the address space (u64)

	RAMINGPFIFOLog2Shift = 16
	RAMINGPFIFOLog2Mask  = 0x1F
	RAMINGPFIFOHiMask    = 0xFF
)

// GPFIFOHiEncode encodes RAMIN +0x4C for a ring at va with 2^log2Entries entries.
func GPFIFOHiEncode(va uint64, log2Entries uint) uint32 {
	return uint32(va>>32)&RAMINGPFIFOHiMask | uint32(log2Entries&RAMINGPFIFOLog2Mask)<<RAMINGPFIFOLog2Shift
}

// GPFIFODecode decodes RAMIN +0x48/+0x4C into the ring address and entry count.
func GPFIFODecode(lo, hi uint32) (va uint64, entries uint32) {
	va = uint64(hi&RAMINGPFIFOHiMask)<<32 | uint64(lo)
	return va, 1 << ((hi >> RAMINGPFIFOLog2Shift) & RAMINGPFIFOLog2Mask)
}

// User area (doorbell page): one 4 KiB page per channel, in VRAM, seen by the
// CPU through the poll area in BAR1 (channel ch at poll base + ch*UserAreaSize).
const (
	UserAreaSize = 0x1000
	UserGPGet    = 0x88 // index of the next GPFIFO entry the GPU will fetch (GPU writes)
	UserGPPut    = 0x8C // index one past the last valid entry; writing it rings the doorbell
)

// GPFIFO entry: two words. The push buffer lies at a GPU virtual address.
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
