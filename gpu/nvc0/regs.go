package nvc0

// BAR0 register offsets. Each comment names the register as nouveau
// (drivers/gpu/drm/nouveau, "nvkm/…") or envytools (rnndb) does, and the
// function or element that is the source. Field encodings are in fifo.go
// (PFIFO, faults, PBDMA), mem.go (memory targets, BARs, PRAMIN, TLB) and
// ramin.go (RAMIN, USERD).
const (
	// PMC
	RegBoot0     = 0x000000 // PMC_BOOT_0: chip id, read-only (Boot0Value; nvkm/engine/device/base.c nvkm_device_ctor)
	RegPMCEnable = 0x000200 // PMC_ENABLE: engine enable mask
	// PMCEnableAll enables every engine: all bits set, as nouveau's MC
	// init writes it (nv04_mc_init: "everything enabled").
	PMCEnableAll = 0xFFFFFFFF

	// PBUS: PRAMIN window and BAR instances (envytools rnndb/bus/pbus.xml HOST_MEM)
	RegPRAMINWindow = 0x001700 // PMEM: window base (PRAMINWindowEncode); nvkm/subdev/instmem/nv50.c
	RegBAR1Inst     = 0x001704 // BAR1 instance (BARInstEncode); nvkm/subdev/bar/gf100.c gf100_bar_bar1_init
	RegBAR3Inst     = 0x001714 // BAR3 ("bar2" in nouveau) instance; gf100_bar_bar2_init

	// PFIFO (nvkm/engine/fifo/gf100.c; envytools rnndb/fifo/gf100_pfifo.xml)
	RegPFIFOIntr       = 0x002100 // PFIFO_INTR: PFIFOIntr* bits; 0/8/16/24 write-1-to-clear, 28..31 follow their sources
	RegPFIFOIntrEn     = 0x002140 // PFIFO_INTR_EN (nouveau writes 0x7fffffff)
	RegPollArea        = 0x002254 // USERD poll area: BAR1 VA >> 12 | PollAreaEnable (gf100_fifo_init)
	RegPlaylistAddr    = 0x002270 // runlist base: PlaylistAddrEncode (gf100_runl_commit)
	RegPlaylistSubmit  = 0x002274 // runlist submit: PlaylistSubmitEncode(count) (gf100_runl_commit)
	RegPlaylistStatus  = 0x00227C // PlaylistPending while an update is in flight (gf100_runl_pending)
	RegChanTableError  = 0x00252C // channel-table error code (ChanTableErr*), with PFIFOIntrChanTableError (gf100_fifo_intr)
	RegSchedError      = 0x00254C // scheduler error code, with PFIFOIntrSchedError (gf100_fifo_intr_sched)
	RegFaultUnitMask   = 0x00259C // MMU fault source mask: bit u = a fault record of unit u; write 1 to release it (gf100_fifo_intr_mmu_fault)
	RegPBDMAIntrSource = 0x0025A0 // PBDMA interrupt source mask: bit r = PBDMA r; write 1 to clear (gf100_fifo_intr_pbdma)
	RegRunlistIntr     = 0x002A00 // runlist interrupt: RunlistIntrDone when an update completed; write 1 to clear (gf100_fifo_intr_runlist)
	// RegPreempt preempts a channel: write its id; PreemptPending reads set
	// until the channel's context is off the engines (gf100_chan_preempt,
	// gf100_runl_preempt_pending).
	RegPreempt = 0x002634
	// RegEngineStatus0 is the first per-engine status register
	// (gf100_engn_status: 0x002640 + engine*4); see RegEngineStatus.
	RegEngineStatus0 = 0x002640
	// RegFaultRecord0 is the first per-unit MMU fault record (0x2800 + 0x10
	// * unit: instance, VA low, VA high, type; gf100_fifo_intr_mmu_fault_unit).
	RegFaultRecord0 = 0x002800

	RegChanTable = 0x003000 // PFIFO channel table: ChanInst(ch), ChanCtl(ch) (gf100_chan_bind, gf100_chan_start)

	// PBDMA ("runq"; envytools PSUBFIFO) r, at + PBDMAStride*r (gf100_runq_intr)
	RegPBDMAMethod0 = 0x0400C0 // CACHE[0].ADDR: PBDMAMethod* fields
	RegPBDMAData0   = 0x0400C4 // CACHE[0].DATA
	RegPBDMAIntr0   = 0x040108 // INTR: PBDMAIntr* bits, write 1 to clear
	RegPBDMAIntrEn0 = 0x04010C // INTR_EN (gf100_runq_init writes 0xfffffeff)
	RegPBDMAChan0   = 0x040120 // bits 6:0 the channel id, bit 8 active
	PBDMAStride     = 0x2000
	NumPBDMAs       = 3 // gf100_fifo_runq_nr on a GF100

	// PBUS flush of posted writes to VRAM
	RegFlush = 0x070000 // write FlushTrigger; FlushBusy reads set until done

	// PTIMER
	RegTimerLow  = 0x009400 // nanoseconds bits 31:0
	RegTimerHigh = 0x009410 // nanoseconds bits 63:32

	// Memory controller (what the driver is told about VRAM size;
	// nvkm/subdev/fb/ramgf100.c gf100_ram_ctor)
	RegMemPartCount  = 0x022438 // number of memory partitions (FBPs)
	RegMemPartMask   = 0x022554 // mask of disabled partitions (FBPA)
	RegMemLTCCount   = 0x121C74 // PRIV-ring ROP/FBP count (nvkm/subdev/privring/gf100.c "ropnr")
	RegMemPartSize0  = 0x11020C // partition 0 size in MiB; partition i at + MemPartStride*i
	MemPartStride    = 0x1000
	MaxMemPartitions = 16
	// MemPartSizeShift: a partition size register counts MiB (nouveau
	// gf100 RAM: size = rd32(0x11020c + fbp*0x1000) << 20).
	MemPartSizeShift = 20
	// RegVRAMPartSizeOld is the per-partition VRAM size in MiB early nouveau
	// read (nvc0_vram_init: rd32(0x10f20c) << 20 × rd32(0x121c74)).
	RegVRAMPartSizeOld = 0x10F20C

	// PFB MMU (nvkm/subdev/mmu/vmmgf100.c, nvkm/subdev/fb/gf100.c)
	RegSysmemFlushPage = 0x100C10 // a host (bus) address >> 8 of the page FB flushes write (gf100_fb_sysmem_flush_page_init)
	RegMMUStatus       = 0x100C80 // MMUStatus*: PRI FIFO space / empty (gf100_vmm_invalidate)
	RegTLBFlushPD      = 0x100CB8 // TLB invalidate page directory: TLBFlushPDEncode (gf100_vmm_invalidate_pdb)
	RegTLBFlushTrigger = 0x100CBC // TLB invalidate trigger: TLBFlushTrigger | TLBFlush* type bits (gf100_vmm_flush)

	// Copy engines (falcons at 0x104000 + 0x1000*i): CHANNEL_CUR /
	// CHANNEL_NEXT (envytools rnndb/falcon.xml; nvkm_falcon_intr reads CUR)
	RegCE0ChanCur  = 0x104050
	RegCE0ChanNext = 0x104054
	RegCE1ChanCur  = 0x105050
	RegCE1ChanNext = 0x105054

	// PGRAPH
	RegPGRAPHStatus    = 0x400700 // non-zero while the graphics/compute engine is busy (gf100_gr_wait_idle)
	RegGPCMMUDebugWr   = 0x4188B4 // GPC MMU debug write buffer: VRAM address >> 8 (gf100_gr_init_gpc_mmu)
	RegGPCMMUDebugRd   = 0x4188B8 // GPC MMU debug read buffer: VRAM address >> 8
	RegFECSData        = 0x409500 // FECS command data (an instance word for FECSCmdSetChan/BindPointer/WFIGoldenSave)
	RegFECSCmd         = 0x409504 // FECS command (FECSCmd*)
	RegFECSStatus      = 0x409800 // FECS mailbox (CC_SCRATCH 0); FECSDone set when a command completed
	RegFECSReglistData = 0x409810 // FECS mailbox 4: reglist instance / VA for commands 0x31/0x32
	RegFECSClear       = 0x409840 // CC_SCRATCH_CLR: write 1s to clear bits of RegFECSStatus
	RegFECSChanAddr    = 0x409B00 // FECS CHAN_ADDR: the current context's instance word | FECSChanValid (gf100_gr_intr)
	RegFECSChanNext    = 0x409B04 // FECS CHAN_NEXT

	// PRAMIN: a 1 MiB window into VRAM at the RegPRAMINWindow base.
	PRAMINBase = 0x700000
	PRAMINSize = 0x100000
)

// Field encodings of PBUS, PGRAPH and FECS registers.
const (
	PollAreaEnable = 0x10000000 // RegPollArea bit 28 (gf100_fifo_init: 0x10000000 | bar1 >> 12)
	PollAreaMask   = 0x0FFFFFFF

	FlushTrigger = 0x00000001
	FlushBusy    = 0x00000002

	// MMUStatusFreeSlots: nouveau waits for these bits to be non-zero before
	// a TLB invalidate (PRI FIFO space); MMUStatusFlushDone after it (PRI
	// FIFO empty) (gf100_vmm_invalidate).
	MMUStatusFreeSlots = 0x00FF0000
	MMUStatusFlushDone = 0x00008000

	// PGRAPHStatusBusy is what RegPGRAPHStatus reads while a kernel runs.
	PGRAPHStatusBusy = 0x00000001

	// FECS commands on RegFECSCmd (nouveau gr/gf100.c for NVIDIA's
	// firmware; gr/fuc/hub.fuc for nouveau's own).
	FECSCmdSetChan       = 0x01 // nouveau firmware: set the channel (data: physical instance word)
	FECSCmdSave          = 0x02 // nouveau firmware: save the current context
	FECSCmdBindPointer   = 0x03 // bind a channel's context (data: physical instance word)
	FECSCmdHalt          = 0x04 // halt the pipeline
	FECSCmdWFIGoldenSave = 0x09 // wait for idle and save the golden context (data: physical instance word)
	FECSCmdImageSize     = 0x10 // discover the context image size
	FECSCmdZcullSize     = 0x16
	FECSCmdWatchdog      = 0x21 // set the watchdog timeout (data: a time, not an address)
	FECSCmdPMSize        = 0x25
	FECSCmdReglistSize   = 0x30
	FECSCmdReglistInst   = 0x31 // data in RegFECSReglistData: an instance word
	FECSCmdReglistVA     = 0x32 // data in RegFECSReglistData: a VA >> 8
	FECSCmdStopCtxsw     = 0x38 // stop context switching (for every channel)
	FECSCmdStartCtxsw    = 0x39
	FECSBindValid        = 0x80000000 // FECS instance words: 0x80000000 | inst >> 12
	FECSChanValid        = 0x80000000 // RegFECSChanAddr bit 31
	FECSDone             = 0x00000010 // sim: the mailbox bit the board sets when a command completed
)

// TimerSplit splits a nanosecond time into the PTIMER low and high words.
func TimerSplit(ns uint64) (lo, hi uint32) { return uint32(ns), uint32(ns >> 32) }

// MemPartSize returns the BAR0 offset of memory partition i's size register.
func MemPartSize(i int) uint32 { return RegMemPartSize0 + uint32(i)*MemPartStride }

// RegCEChanCur and RegCEChanNext return copy engine i's CHANNEL_CUR and
// CHANNEL_NEXT registers.
func RegCEChanCur(i int) uint32  { return RegCE0ChanCur + uint32(i)*0x1000 }
func RegCEChanNext(i int) uint32 { return RegCE0ChanNext + uint32(i)*0x1000 }

// NumCopyEngines is the number of PCOPY engines (CE0 and CE1).
const NumCopyEngines = 2
