package nvc0

// Memory targets (envytools rnndb/g80_defs.xml g80_mem_target; nouveau
// gf100_runl_commit, gf100_vmm_join_): where an address held in a register or
// an instance block points. The simulated board, like nouveau, keeps
// instance blocks, page directories and playlists in VRAM; any other target
// in those places is refused explicitly, never read as VRAM.
const (
	MemTargetVRAM           = 0
	MemTargetSysCoherent    = 2 // snooped system memory
	MemTargetSysNonCoherent = 3
	memTargetMask           = 0x3
)

// Instance words: the channel table, the BAR instances, the playlist base,
// the fault records, FECS and the copy engines' CHANNEL_CUR all hold a 4 KiB
// aligned address >> 12 in bits 27:0 with its memory target in bits 29:28
// (g80_channel), under flag bits.
const instTargetShift = 28

// InstEncode encodes a 4 KiB-aligned VRAM address for an instance word
// (address >> 12, target VRAM) under the given flags.
func InstEncode(addr uint64, flags uint32) uint32 {
	return flags | uint32(addr>>PageShift)&ChanInstMask
}

// InstDecode returns the address held in an instance word.
func InstDecode(v uint32) uint64 { return uint64(v&ChanInstMask) << PageShift }

// InstTarget returns the memory target of an instance word.
func InstTarget(v uint32) uint32 { return v >> instTargetShift & memTargetMask }

// The PRAMIN window (RegPRAMINWindow, envytools HOST_MEM.PMEM): OFFSET 23:0
// is the window's VRAM address >> 16, TARGET 25:24.
const (
	PRAMINWindowShift       = 16
	PRAMINWindowMask        = 0x00FFFFFF
	PRAMINWindowTargetShift = 24
)

// PRAMINWindowEncode encodes a window base (64 KiB aligned) in VRAM.
func PRAMINWindowEncode(base uint64) uint32 {
	return uint32(base>>PRAMINWindowShift) & PRAMINWindowMask
}

// PRAMINWindowDecode returns the window base and its memory target.
func PRAMINWindowDecode(v uint32) (base uint64, target uint32) {
	return uint64(v&PRAMINWindowMask) << PRAMINWindowShift, v >> PRAMINWindowTargetShift & memTargetMask
}

// BAR instance registers (RegBAR1Inst, RegBAR3Inst; envytools HOST_MEM.BAR1):
// bits 29:0 an instance word, bit 30 unknown (nouveau sets it only with its
// NvBar2Halve option), bit 31 MODE: 1 through the page tables of that
// instance block, 0 "VRAM direct". nouveau writes 0x80000000 | inst>>12
// (gf100_bar_bar1_init, gf100_bar_bar2_init).
const (
	BARInstModeVM = 0x80000000
	BARInstUnk30  = 0x40000000
)

// Copy engine CHANNEL_CUR / CHANNEL_NEXT (envytools falcon.xml): an instance
// word in bits 29:0, VALID bit 30.
const CEChanValid = 0x40000000

// TLB invalidate (nvkm/subdev/mmu/vmmgf100.c gf100_vmm_invalidate_pdb,
// gf100_vmm_flush): RegTLBFlushPD holds (page directory >> 12) << 4 with
// the page directory's memory target in bits 1:0; RegTLBFlushTrigger is
// 0x80000000 | type, type bit 0 PAGE_ALL, bit 1 ALL_PDB (the PD is
// ignored), bit 2 HUB_ONLY (nouveau sets it for the BAR VMs: it writes 5).
const (
	TLBFlushTrigger = 0x80000000
	TLBFlushPageAll = 0x00000001
	TLBFlushAllPDB  = 0x00000002
	TLBFlushHubOnly = 0x00000004
	// TLBFlushTypeVM and TLBFlushTypeBAR are the types nouveau writes for a
	// channel's VM and for a BAR VM.
	TLBFlushTypeVM  = TLBFlushPageAll
	TLBFlushTypeBAR = TLBFlushPageAll | TLBFlushHubOnly

	tlbPDShift = 8
)

// TLBFlushPDEncode encodes RegTLBFlushPD for a page directory in VRAM.
func TLBFlushPDEncode(pd uint64) uint32 { return uint32(pd>>tlbPDShift)&^0xF | MemTargetVRAM }

// TLBFlushPDDecode returns the page directory and memory target in RegTLBFlushPD.
func TLBFlushPDDecode(v uint32) (pd uint64, target uint32) {
	return uint64(v&^0xF) << tlbPDShift, v & memTargetMask
}

// PlaylistAddrEncode encodes RegPlaylistAddr for a playlist in VRAM.
func PlaylistAddrEncode(addr uint64) uint32 { return uint32(addr>>PageShift) & PlaylistAddrMask }

// PlaylistAddrDecode returns the playlist address and memory target in RegPlaylistAddr.
func PlaylistAddrDecode(v uint32) (addr uint64, target uint32) {
	return uint64(v&PlaylistAddrMask) << PageShift, v >> PlaylistAddrTargetShift & memTargetMask
}
