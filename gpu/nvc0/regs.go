package nvc0

// BAR0 register offsets. The comment names the nouveau/envytools register.
const (
	// PMC
	RegBoot0     = 0x000000 // PMC_BOOT_0: chipset id, read-only (Boot0Value)
	RegPMCEnable = 0x000200 // PMC_ENABLE: engine enable mask
	// PMCEnableAll enables every engine: all bits set, as nouveau's MC
	// init writes it (nv04_mc_init: "everything enabled").
	PMCEnableAll = 0xFFFFFFFF

	// PBUS / PRAMIN window and BAR channels
	RegPRAMINWindow = 0x001700 // PRAMIN window base: VRAM address >> 16
	RegBAR1Inst     = 0x001704 // BAR1 channel instance: BARInstEncode(RAMIN)
	RegBAR3Inst     = 0x001714 // BAR3 channel instance: BARInstEncode(RAMIN)

	// PFIFO
	RegPFIFOIntr      = 0x002100 // PFIFO_INTR: pending interrupt bits (write 1 to clear)
	RegPollArea       = 0x002254 // poll area: BAR1 virtual address >> 12 | PollAreaEnable
	RegPlaylistAddr   = 0x002270 // playlist (runlist) VRAM address >> 12
	RegPlaylistSubmit = 0x002274 // PlaylistSubmitEncode(count); writing it submits the playlist
	RegPlaylistStatus = 0x00227C // bit PlaylistPending set while an update is in flight
	// RegPreempt preempts a channel: write its id; PreemptPending reads set
	// until the channel's context is off the engines (nouveau
	// gf100_chan_preempt, gf100_runl_preempt_pending).
	RegPreempt = 0x002634
	// RegEngineStatus0 is the first per-engine status register (nouveau
	// gf100_engn_status: 0x002640 + engine*4): EngineStatusBusy while the
	// engine holds a channel's context, and that channel's id.
	RegEngineStatus0 = 0x002640

	// sim: MMU fault report, after the shape of Fermi's PFIFO fault-info registers
	// (0x2800 + unit*0x10). The board keeps one report: the newest fault.
	RegFaultInst   = 0x002800 // faulting channel's RAMIN >> 12 | FaultValid
	RegFaultAddrLo = 0x002804 // faulting virtual address bits 31:0
	RegFaultAddrHi = 0x002808 // faulting virtual address bits 39:32
	RegFaultStatus = 0x00280C // FaultReason* | channel id << 16 | FaultWrite

	RegChanTable = 0x003000 // PFIFO channel table: ChanInst(ch), ChanCtl(ch)

	// PBUS flush of posted writes to VRAM
	RegFlush = 0x070000 // write FlushTrigger; FlushBusy reads set until done

	// PTIMER
	RegTimerLow  = 0x009400 // nanoseconds bits 31:0
	RegTimerHigh = 0x009410 // nanoseconds bits 63:32

	// Memory controller (what the driver is told about VRAM size)
	RegMemPartCount  = 0x022438 // number of memory partitions (FBPs)
	RegMemPartMask   = 0x022554 // mask of disabled partitions
	RegMemLTCCount   = 0x121C74 // sim: partition count as the L2 (LTC) block sees it
	RegMemPartSize0  = 0x11020C // partition 0 size in MiB; partition i at + MemPartStride*i
	MemPartStride    = 0x1000
	MaxMemPartitions = 16
	// MemPartSizeShift: a partition size register counts MiB (nouveau
	// gf100 RAM: size = rd32(0x11020c + fbp*0x1000) << 20).
	MemPartSizeShift = 20

	// PFB MMU
	RegMMUStatus       = 0x100C80 // MMUStatus*: free flush slots / flush done
	RegTLBFlushPD      = 0x100CB8 // TLB flush: page-directory address >> 8
	RegTLBFlushTrigger = 0x100CBC // TLB flush: TLBFlushTrigger | TLBFlushType*

	// Copy engines (PCOPY): channel instance bound to the engine
	RegCopy0InstLo = 0x104050
	RegCopy0InstHi = 0x104054
	RegCopy1InstLo = 0x105050
	RegCopy1InstHi = 0x105054

	// PGRAPH
	RegPGRAPHStatus = 0x400700 // non-zero while the graphics/compute engine is busy

	// FECS (the PGRAPH context-switch firmware) command interface
	RegFECSData   = 0x409500 // command data (for bind: FECSBindValid | RAMIN >> 12)
	RegFECSCmd    = 0x409504 // command (FECSCmd*)
	RegFECSStatus = 0x409800 // mailbox; FECSDone set when a command completed
	RegFECSClear  = 0x409840 // write 1s to clear bits of RegFECSStatus

	// PRAMIN: a 1 MiB window into VRAM at RegPRAMINWindow << 16.
	PRAMINBase = 0x700000
	PRAMINSize = 0x100000
)

// Field encodings of the registers above.
const (
	PRAMINWindowShift = 16

	// BAR instance registers (0x1704, 0x1714): nouveau writes 0x80000000 | inst>>12
	// for BAR1 and 0xc0000000 | inst>>12 for BAR3.
	BARInstValid   = 0x80000000
	BARInstBAR3Bit = 0x40000000
	BARInstMask    = 0x0FFFFFFF

	PollAreaEnable = 0x10000000
	PollAreaMask   = 0x0FFFFFFF

	PlaylistCountMask = 0x00000FFF
	PlaylistEngineAll = 0x01F00000 // the engine mask nouveau writes beside the count
	PlaylistPending   = 0x00100000
	PlaylistEntrySize = 8
	// PlaylistEntryWord1 is the second word of a playlist entry (the first
	// is the channel id), as nouveau's gf100_runl_insert_chan writes it.
	PlaylistEntryWord1 = 0x00000004

	PFIFOIntrMMUFault = 0x10000000
	PFIFOIntrChanErr  = 0x00000100 // sim: a channel stopped on a method or watchdog error

	FaultValid      = 0x80000000
	FaultWrite      = 0x00000080
	FaultReasonMask = 0x0000000F
	FaultChanShift  = 16
	FaultChanMask   = 0x7F

	FlushTrigger = 0x00000001
	FlushBusy    = 0x00000002

	MMUStatusFreeSlots = 0x00FF0000 // non-zero when the MMU accepts a TLB flush
	MMUStatusFlushDone = 0x00008000 // set when the last TLB flush completed

	TLBFlushTrigger   = 0x80000000
	TLBFlushTypeVM    = 0x00000001 // flush the VM whose page directory is in RegTLBFlushPD
	TLBFlushTypeBARVM = 0x00000004 // or'ed in for the BAR1/BAR3 VMs (nouveau writes 5)
	TLBFlushPDShift   = 8

	CopyInstValid = 0x80000000 // RegCopyNInstLo: valid | RAMIN >> 12

	// PGRAPHStatusBusy is what RegPGRAPHStatus reads while a kernel runs.
	PGRAPHStatusBusy = 0x00000001
	// PreemptPending is set in RegPreempt while a preempt is in progress;
	// the low bits read back the channel id written.
	PreemptPending  = 0x00100000
	PreemptChanMask = 0x0000007F

	// EngineStatusBusy and EngineStatusChanMask decode RegEngineStatus(e)
	// (nouveau gf100_engn_status: busy 0x10000000, chid 0x7f).
	EngineStatusBusy     = 0x10000000
	EngineStatusChanMask = 0x0000007F

	FECSCmdBindPointer = 0x00000003 // bind a channel's graphics/compute context
	FECSBindValid      = 0x80000000
	FECSDone           = 0x00000010
)

// Fault reasons (RegFaultStatus bits 3:0).
const (
	FaultReasonPDE      = 0x1 // no page table at that address
	FaultReasonPTE      = 0x2 // page not present
	FaultReasonReadOnly = 0x3 // write to a read-only page
	FaultReasonLimit    = 0x4 // beyond the address-space limit (RAMIN +0x208)
	FaultReasonTarget   = 0x5 // the target (VRAM or system memory) has nothing at that address
	FaultReasonMethod   = 0x6 // sim: invalid method or class on the channel
	FaultReasonKilled   = 0x7 // sim: channel stopped by the hypervisor (its watchdog); only a vGPU reports it
)

// FaultReasonName names a fault reason for error messages.
func FaultReasonName(r uint32) string {
	switch r {
	case FaultReasonPDE:
		return "page directory entry not present"
	case FaultReasonPTE:
		return "page table entry not present"
	case FaultReasonReadOnly:
		return "write to read-only page"
	case FaultReasonLimit:
		return "address beyond address-space limit"
	case FaultReasonTarget:
		return "no memory at physical target"
	case FaultReasonMethod:
		return "invalid method"
	case FaultReasonKilled:
		return "channel killed"
	}
	return "unknown fault"
}

// Channel table layout: two words per channel from RegChanTable.
const (
	ChanTableStride = 8
	MaxChannels     = 128

	ChanInstValid = 0x80000000
	ChanInstVRAM  = 0x40000000 // RAMIN lives in VRAM (nouveau writes 0xc0000000 | inst>>12)
	ChanInstMask  = 0x0FFFFFFF

	ChanCtlEnable  = 0x00000001
	ChanCtlDefault = 0x001F0001 // what nouveau writes to enable a channel
	// sim: the board reports a faulted channel in bit 28 of the
	// control word; the driver reads it to turn a hung fence into an error.
	ChanCtlFaulted = 0x10000000
	ChanCtlBusy    = 0x01000000 // sim: the channel has unfetched GPFIFO entries or a running command
)

// ChanInst returns the BAR0 offset of channel ch's instance word.
func ChanInst(ch int) uint32 { return RegChanTable + uint32(ch)*ChanTableStride }

// ChanCtl returns the BAR0 offset of channel ch's control word.
func ChanCtl(ch int) uint32 { return RegChanTable + uint32(ch)*ChanTableStride + 4 }

// ChanFromTableOffset reports which channel and which word (0 instance, 1 control)
// a BAR0 offset in the channel table addresses.
func ChanFromTableOffset(off uint32) (ch int, word int, ok bool) {
	if off < RegChanTable || off >= RegChanTable+MaxChannels*ChanTableStride || off%4 != 0 {
		return 0, 0, false
	}
	rel := off - RegChanTable
	return int(rel / ChanTableStride), int(rel%ChanTableStride) / 4, true
}

// PFIFO engine ids, the index of RegEngineStatus (nouveau
// gf100_fifo_runl_ctor: GR 0, MSPDEC 1, MSPPP 2, MSVLD 3, CE0 4, CE1 5).
const (
	EngineGR  = 0
	EngineCE0 = 4
	EngineCE1 = 5
)

// RegEngineStatus returns the BAR0 offset of PFIFO engine e's status word.
func RegEngineStatus(e int) uint32 { return RegEngineStatus0 + uint32(e)*4 }

// MemPartSize returns the BAR0 offset of memory partition i's size register.
func MemPartSize(i int) uint32 { return RegMemPartSize0 + uint32(i)*MemPartStride }

// InstEncode encodes a 4 KiB-aligned RAMIN address for the channel table, BAR
// instance, copy-engine and FECS registers (address >> 12 under the given flags).
func InstEncode(addr uint64, flags uint32) uint32 {
	return flags | uint32(addr>>PageShift)&ChanInstMask
}

// InstDecode returns the RAMIN address held in an instance word.
func InstDecode(v uint32) uint64 { return uint64(v&ChanInstMask) << PageShift }

// PlaylistSubmitEncode encodes the playlist-submit register for count entries.
func PlaylistSubmitEncode(count int) uint32 {
	return PlaylistEngineAll | uint32(count)&PlaylistCountMask
}

// TimerSplit splits a nanosecond time into the PTIMER low and high words.
func TimerSplit(ns uint64) (lo, hi uint32) { return uint32(ns), uint32(ns >> 32) }
