package nvc0

import "fmt"

// Channel table: two words per channel from RegChanTable
// (envytools rnndb/fifo/gf100_pfifo.xml CHAN_TABLE; nvkm/engine/fifo/gf100.c).
const (
	ChanTableStride = 8
	MaxChannels     = 128

	// Instance word (g80_channel): bits 27:0 RAMIN >> 12, 29:28 its
	// memory target (MemTarget*), bit 30 POLL_ENABLE, bit 31 VALID.
	// gf100_chan_bind writes 0xc0000000 | inst>>12.
	ChanInstValid       = 0x80000000
	ChanInstPollEnable  = 0x40000000
	ChanInstTargetShift = 28
	ChanInstMask        = 0x0FFFFFFF

	// Control word (envytools CHAN_TABLE.STATE): bit 0 RUNNABLE (the
	// enable bit gf100_chan_start sets and gf100_chan_stop clears), bits
	// 20:16 the engine (0x1f none), bit 28 PENDING: the channel has work
	// not yet done.
	ChanCtlEnable  = 0x00000001
	ChanCtlPending = 0x10000000
	ChanCtlDefault = 0x001F0001 // what gf100_chan_start writes
)

// ChanInst returns the BAR0 offset of channel ch's instance word.
func ChanInst(ch int) uint32 { return RegChanTable + uint32(ch)*ChanTableStride }

// ChanCtl returns the BAR0 offset of channel ch's control word.
func ChanCtl(ch int) uint32 { return RegChanTable + uint32(ch)*ChanTableStride + 4 }

// ChanFromTableOffset reports which channel and which word (0 instance, 1
// control) a BAR0 offset in the channel table addresses.
func ChanFromTableOffset(off uint32) (ch int, word int, ok bool) {
	if off < RegChanTable || off >= RegChanTable+MaxChannels*ChanTableStride || off%4 != 0 {
		return 0, 0, false
	}
	rel := off - RegChanTable
	return int(rel / ChanTableStride), int(rel%ChanTableStride) / 4, true
}

// Playlist (runlist): RegPlaylistAddr holds the address >> 12 in bits 27:0
// and its memory target in 29:28 (gf100_runl_commit); RegPlaylistSubmit
// 0x01f00000 | count; entries are {chid, 0x00000004} (gf100_runl_insert_chan).
const (
	PlaylistAddrMask        = 0x0FFFFFFF
	PlaylistAddrTargetShift = 28
	PlaylistCountMask       = 0x00000FFF
	PlaylistEngineAll       = 0x01F00000
	PlaylistPending         = 0x00100000 // RegPlaylistStatus bit 20 (gf100_runl_pending)
	PlaylistEntrySize       = 8
	PlaylistEntryWord1      = 0x00000004
)

// RunlistIntrDone is RegRunlistIntr's "runlist update done" bit
// (gf100_fifo_intr_runlist acks 0x10000000).
const RunlistIntrDone = 0x10000000

// PlaylistSubmitEncode encodes the playlist-submit register for count entries.
func PlaylistSubmitEncode(count int) uint32 {
	return PlaylistEngineAll | uint32(count)&PlaylistCountMask
}

// Preempt and engine status.
const (
	// PreemptPending is set in RegPreempt while a preempt is in progress;
	// the low bits read back the channel id written (gf100_runl_preempt_pending).
	PreemptPending  = 0x00100000
	PreemptChanMask = 0x0000007F

	// EngineStatusBusy and EngineStatusChanMask decode RegEngineStatus(e)
	// (gf100_engn_status: busy 0x10000000, chid 0x7f).
	EngineStatusBusy     = 0x10000000
	EngineStatusChanMask = 0x0000007F
)

// PFIFO engine ids, the index of RegEngineStatus (gf100_fifo_runl_ctor: GR 0,
// MSPDEC 1, MSPPP 2, MSVLD 3, CE0 4, CE1 5).
const (
	EngineGR  = 0
	EngineCE0 = 4
	EngineCE1 = 5
)

// RegEngineStatus returns the BAR0 offset of PFIFO engine e's status word.
func RegEngineStatus(e int) uint32 { return RegEngineStatus0 + uint32(e)*4 }

// PFIFO_INTR bits (gf100_fifo_intr; envytools gf100_pfifo_intr). Bits 0, 8,
// 16 and 24 latch and are cleared by writing 1; bits 28 to 31 are levels:
// they read set while their source register (RegFaultUnitMask,
// RegPBDMAIntrSource, …) is non-zero.
const (
	PFIFOIntrChanTableError = 0x00000001
	PFIFOIntrSchedError     = 0x00000100 // envytools PLAYLIST; nouveau SCHED_ERROR (code in 0x254c)
	PFIFOIntrMMUFault       = 0x10000000
	PFIFOIntrPBDMA          = 0x20000000
	PFIFOIntrRunlist        = 0x40000000
	PFIFOIntrEngine         = 0x80000000 // non-stall
)

// Channel-table error codes in RegChanTableError (envytools
// gf100_pfifo.xml CHAN_TABLE_ERROR).
const ChanTableErrInvalidTarget = 6

// SchedErrorInvalidTarget is the RegSchedError code the board latches for a
// playlist outside VRAM. sim: the code is the board's own; nouveau only
// prints the value (gf100_fifo_intr_sched).
const SchedErrorInvalidTarget = 0x100

// MMU fault units: the bit of RegFaultUnitMask and the record index
// (gf100_fifo_mmu_fault_engine; envytools GF100_VM_ENGINE).
const (
	FaultUnitGR    = 0x00
	FaultUnitBAR1  = 0x04
	FaultUnitBAR3  = 0x05
	FaultUnitPFIFO = 0x07
	FaultUnitCE0   = 0x15
	FaultUnitCE1   = 0x16
	NumFaultUnits  = 32
)

// RegFaultInst, RegFaultVALo, RegFaultVAHi and RegFaultType return the BAR0
// offsets of fault unit u's record: the faulting channel's instance word
// (g80_channel: inst >> 12 and target), the VA bits 31:0 and 63:32, and the
// type word (FaultType*).
func RegFaultInst(u int) uint32 { return RegFaultRecord0 + uint32(u)*0x10 }

// RegFaultVALo is the record's VA bits 31:0 (see RegFaultInst).
func RegFaultVALo(u int) uint32 { return RegFaultRecord0 + uint32(u)*0x10 + 4 }

// RegFaultVAHi is the record's VA bits 63:32 (see RegFaultInst).
func RegFaultVAHi(u int) uint32 { return RegFaultRecord0 + uint32(u)*0x10 + 8 }

// RegFaultType is the record's type word (see RegFaultInst).
func RegFaultType(u int) uint32 { return RegFaultRecord0 + uint32(u)*0x10 + 0xC }

// Fault type word (gf100_fifo_intr_mmu_fault_unit; envytools VM_FAULT):
// reason 3:0, bit 6 hub (client is a hub client), bit 7 write, client
// 12:8, GPC 28:24.
const (
	FaultTypeReasonMask  = 0x0000000F
	FaultTypeHub         = 0x00000040
	FaultTypeWrite       = 0x00000080
	FaultTypeClientShift = 8
	FaultTypeClientMask  = 0x1F
	FaultTypeGPCShift    = 24
	FaultTypeGPCMask     = 0x1F
	// FaultTypeOverflow is sim and vGPU only (bit 31, unused on GF100,
	// whose units hold one record each): records of this unit were
	// dropped on a full queue since the presented one was queued.
	FaultTypeOverflow = 0x80000000
)

// Hub clients (gf100_fifo_mmu_fault_hubclient) and the GPC client a shader
// access reports (gf100_fifo_mmu_fault_gpcclient TEX).
const (
	FaultClientPCOPY0   = 0x01
	FaultClientPCOPY1   = 0x02
	FaultClientPFIFO    = 0x06
	FaultClientBARRead  = 0x07
	FaultClientBARWrite = 0x08
	FaultClientGPCTex   = 0x01 // a GPC client (FaultTypeHub clear)
)

// Fault reasons (type word bits 3:0; gf100_fifo_mmu_fault_reason, envytools
// GF100_VM_FAULT), and the two the simulated board adds in codes the
// hardware leaves unused.
const (
	FaultReasonPTNotPresent       = 0x0 // no page table where the PDE points
	FaultReasonPTTooShort         = 0x1 // beyond a page table shortened by the PDE size field
	FaultReasonPageNotPresent     = 0x2
	FaultReasonVMLimit            = 0x3 // beyond the address-space limit (RAMIN +0x208)
	FaultReasonNoChannel          = 0x4
	FaultReasonPageSystemOnly     = 0x5 // envytools PAGE_SUPERVISOR_ONLY: a privileged page
	FaultReasonReadOnly           = 0x6
	FaultReasonCompressedSysram   = 0xA
	FaultReasonInvalidStorageType = 0xC
	// FaultReasonHostStopped is sim (and vGPU) only: the hypervisor stopped
	// the channel (its watchdog). A GF100 host driver does the same with
	// a ctxsw-timeout recovery that injects an MMU fault on the engine.
	FaultReasonHostStopped = 0xD
	// FaultReasonNoMemory is sim only: a translation landed on an address
	// no memory backs (unregistered system memory, beyond VRAM); a real
	// bus would return garbage or hang.
	FaultReasonNoMemory = 0xF
	// FaultReasonTargetUnsupported is sim only: a USERD, page directory or
	// engine context that is not in VRAM. nouveau keeps them all in VRAM;
	// the board refuses other targets rather than misread them.
	FaultReasonTargetUnsupported = 0xE
)

// FaultReasonName names a fault reason for error messages.
func FaultReasonName(r uint32) string {
	switch r {
	case FaultReasonPTNotPresent:
		return "PT_NOT_PRESENT"
	case FaultReasonPTTooShort:
		return "PT_TOO_SHORT"
	case FaultReasonPageNotPresent:
		return "PAGE_NOT_PRESENT"
	case FaultReasonVMLimit:
		return "VM_LIMIT_EXCEEDED"
	case FaultReasonNoChannel:
		return "NO_CHANNEL"
	case FaultReasonPageSystemOnly:
		return "PAGE_SYSTEM_ONLY"
	case FaultReasonReadOnly:
		return "PAGE_READ_ONLY"
	case FaultReasonCompressedSysram:
		return "COMPRESSED_SYSRAM"
	case FaultReasonInvalidStorageType:
		return "INVALID_STORAGE_TYPE"
	case FaultReasonHostStopped:
		return "stopped by the hypervisor"
	case FaultReasonNoMemory:
		return "no memory at the target"
	case FaultReasonTargetUnsupported:
		return "memory target not supported (VRAM only)"
	}
	return fmt.Sprintf("fault reason %#x", r)
}

// PBDMA interrupt bits (RegPBDMAIntr; envytools gf100_psubfifo_intr, nouveau
// gf100_runq_intr_0_names).
const (
	PBDMAIntrIBPutOverflow  = 1 << 14
	PBDMAIntrIBEntryInvalid = 1 << 15
	PBDMAIntrIllegalCmd     = 1 << 18
	PBDMAIntrIllegalMthd    = 1 << 21
	PBDMAIntrEmptySubc      = 1 << 23 // envytools SW_MTHD
	PBDMAIntrIllegalSem     = 1 << 25
	PBDMAIntrSigMismatch    = 1 << 31
)

// PBDMAs serving each engine (gf100_fifo_init_pbdmas writes ~(1 << pbdma)
// to 0x2208 + 4*engine: GR on PBDMA 0, CE1 and the video engines on 1, CE0
// on 2). The board reports a method error on the PBDMA of the engine the
// method was for, and host-method and push-buffer errors on PBDMA 0.
const (
	PBDMAGR  = 0
	PBDMACE1 = 1
	PBDMACE0 = 2
)

// PBDMA method cache word (RegPBDMAMethod; envytools PSUBFIFO.CACHE.ADDR):
// the byte method in bits 13:2 (nouveau: addr & 0x3ffc), the subchannel in
// 18:16, valid bit 31. RegPBDMAChan: chid 6:0, active bit 8.
const (
	PBDMAMethodMask      = 0x00003FFC
	PBDMAMethodSubcShift = 16
	PBDMAMethodValid     = 0x80000000
	PBDMAChanMask        = 0x7F
	PBDMAChanActive      = 0x100
	// PBDMAChanOverflow is sim and vGPU only (bit 30 of the channel
	// register): errors of this PBDMA were dropped on a full queue since
	// the presented one was queued.
	PBDMAChanOverflow = 0x40000000
)

// RegPBDMAIntr returns the BAR0 offset of PBDMA r's INTR register.
func RegPBDMAIntr(r int) uint32 { return RegPBDMAIntr0 + uint32(r)*PBDMAStride }

// RegPBDMAIntrEn returns PBDMA r's INTR_EN register.
func RegPBDMAIntrEn(r int) uint32 { return RegPBDMAIntrEn0 + uint32(r)*PBDMAStride }

// RegPBDMAMethod returns PBDMA r's method cache register.
func RegPBDMAMethod(r int) uint32 { return RegPBDMAMethod0 + uint32(r)*PBDMAStride }

// RegPBDMAData returns PBDMA r's data cache register.
func RegPBDMAData(r int) uint32 { return RegPBDMAData0 + uint32(r)*PBDMAStride }

// RegPBDMAChan returns PBDMA r's channel register.
func RegPBDMAChan(r int) uint32 { return RegPBDMAChan0 + uint32(r)*PBDMAStride }
