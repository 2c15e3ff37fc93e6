package nvc0

import "testing"

// TestABIParity pins every register offset and field of the GF100 ABI the
// board, the guest driver and the aggregator rely on to its public value,
// with the public source that gives it (nouveau = drivers/gpu/drm/nouveau
// in Linux; envytools = rnndb; cl906f.h = NVIDIA's class header). A change
// that drifts from the hardware fails here. The facts and their sources are
// collected in docs/design.md ("Fermi ABI").
func TestABIParity(t *testing.T) {
	for _, c := range []struct {
		name   string
		ours   uint64
		public uint64
		source string
	}{
		// PCI Express capability (the PCIe Base Specification; Linux's
		// include/uapi/linux/pci_regs.h names the same values)
		{"Status: capability list", PCIStatusCapList, 0x10, "PCI_STATUS_CAP_LIST"},
		{"capability pointer", PCICapPtr, 0x34, "PCI_CAPABILITY_LIST"},
		{"capability ID: PCI Express", PCICapIDExp, 0x10, "PCI_CAP_ID_EXP"},
		{"PCIe capabilities register", PCIExpFlags, 2, "PCI_EXP_FLAGS"},
		{"Device Capabilities", PCIExpDevCap, 4, "PCI_EXP_DEVCAP"},
		{"Device Capabilities: FLR", PCIExpDevCapFLR, 0x10000000, "PCI_EXP_DEVCAP_FLR"},
		{"Device Control", PCIExpDevCtl, 8, "PCI_EXP_DEVCTL"},
		{"Device Control: initiate FLR", PCIExpDevCtlFLR, 0x8000, "PCI_EXP_DEVCTL_BCR_FLR"},
		{"Device Status", PCIExpDevSta, 0x0A, "PCI_EXP_DEVSTA"},
		{"Link Capabilities", PCIExpLnkCap, 0x0C, "PCI_EXP_LNKCAP"},
		{"Link Status", PCIExpLnkSta, 0x12, "PCI_EXP_LNKSTA"},

		// PMC / PBUS
		{"PMC_BOOT_0 (Quadro 6000, GF100 A3)", Boot0Value, 0x0C0C00A3, "nvkm_device_ctor decode; GPUvm's nvc0.h NVC0_REG0"},
		{"PRAMIN window register", RegPRAMINWindow, 0x1700, "nv50 instmem; envytools HOST_MEM.PMEM"},
		{"PRAMIN window target shift", PRAMINWindowTargetShift, 24, "envytools HOST_MEM.PMEM TARGET 25:24"},
		{"BAR1 instance", RegBAR1Inst, 0x1704, "gf100_bar_bar1_init"},
		{"BAR3 instance", RegBAR3Inst, 0x1714, "gf100_bar_bar2_init"},
		{"BAR instance MODE (page tables)", BARInstModeVM, 0x80000000, "gf100_bar_bar*_init write 0x80000000 | inst >> 12"},

		// PFIFO
		{"PFIFO_INTR", RegPFIFOIntr, 0x2100, "gf100_fifo_intr"},
		{"PFIFO_INTR_EN", RegPFIFOIntrEn, 0x2140, "gf100_fifo_init"},
		{"PFIFO_INTR channel-table error", PFIFOIntrChanTableError, 1 << 0, "gf100_fifo_intr"},
		{"PFIFO_INTR scheduler error", PFIFOIntrSchedError, 1 << 8, "gf100_fifo_intr_sched; envytools PLAYLIST"},
		{"PFIFO_INTR MMU fault", PFIFOIntrMMUFault, 1 << 28, "gf100_fifo_intr_mmu_fault"},
		{"PFIFO_INTR PBDMA", PFIFOIntrPBDMA, 1 << 29, "gf100_fifo_intr_pbdma"},
		{"PFIFO_INTR runlist", PFIFOIntrRunlist, 1 << 30, "gf100_fifo_intr_runlist"},
		{"channel-table error code", RegChanTableError, 0x252C, "gf100_fifo_intr"},
		{"channel-table INVALID_TARGET", ChanTableErrInvalidTarget, 6, "envytools CHAN_TABLE_ERROR"},
		{"scheduler error code", RegSchedError, 0x254C, "gf100_fifo_intr_sched"},
		{"poll area", RegPollArea, 0x2254, "gf100_fifo_init"},
		{"poll area enable", PollAreaEnable, 0x10000000, "gf100_fifo_init"},
		{"runlist base", RegPlaylistAddr, 0x2270, "gf100_runl_commit"},
		{"runlist submit", RegPlaylistSubmit, 0x2274, "gf100_runl_commit"},
		{"runlist submit engines", PlaylistEngineAll, 0x01F00000, "gf100_runl_commit"},
		{"runlist pending", RegPlaylistStatus, 0x227C, "gf100_runl_pending"},
		{"runlist pending bit", PlaylistPending, 0x00100000, "gf100_runl_pending"},
		{"runlist entry word 1", PlaylistEntryWord1, 4, "gf100_runl_insert_chan"},
		{"MMU fault unit mask", RegFaultUnitMask, 0x259C, "gf100_fifo_intr_mmu_fault"},
		{"PBDMA interrupt source", RegPBDMAIntrSource, 0x25A0, "gf100_fifo_intr_pbdma"},
		{"runlist interrupt", RegRunlistIntr, 0x2A00, "gf100_fifo_intr_runlist"},
		{"runlist interrupt: update done", RunlistIntrDone, 0x10000000, "gf100_fifo_intr_runlist"},
		{"preempt", RegPreempt, 0x2634, "gf100_chan_preempt"},
		{"preempt pending", PreemptPending, 0x00100000, "gf100_runl_preempt_pending"},
		{"engine status", RegEngineStatus0, 0x2640, "gf100_engn_status"},
		{"engine status busy", EngineStatusBusy, 0x10000000, "gf100_engn_status"},
		{"engine CE0", EngineCE0, 4, "gf100_fifo_runl_ctor"},
		{"engine CE1", EngineCE1, 5, "gf100_fifo_runl_ctor"},
		{"fault record unit 0", RegFaultRecord0, 0x2800, "gf100_fifo_intr_mmu_fault_unit"},
		{"fault record stride", uint64(RegFaultInst(1) - RegFaultInst(0)), 0x10, "gf100_fifo_intr_mmu_fault_unit"},
		{"fault type: reason mask", FaultTypeReasonMask, 0xF, "gf100_fifo_intr_mmu_fault_unit"},
		{"fault type: hub", FaultTypeHub, 0x40, "gf100_fifo_intr_mmu_fault_unit"},
		{"fault type: write", FaultTypeWrite, 0x80, "gf100_fifo_intr_mmu_fault_unit"},
		{"fault type: client shift", FaultTypeClientShift, 8, "gf100_fifo_intr_mmu_fault_unit"},
		{"fault unit GR", FaultUnitGR, 0x00, "gf100_fifo_mmu_fault_engine"},
		{"fault unit BAR1", FaultUnitBAR1, 0x04, "gf100_fifo_mmu_fault_engine"},
		{"fault unit BAR3", FaultUnitBAR3, 0x05, "gf100_fifo_mmu_fault_engine"},
		{"fault unit PFIFO", FaultUnitPFIFO, 0x07, "gf100_fifo_mmu_fault_engine"},
		{"fault unit CE0", FaultUnitCE0, 0x15, "gf100_fifo_mmu_fault_engine"},
		{"fault unit CE1", FaultUnitCE1, 0x16, "gf100_fifo_mmu_fault_engine"},
		{"fault reason PT_NOT_PRESENT", FaultReasonPTNotPresent, 0, "gf100_fifo_mmu_fault_reason"},
		{"fault reason PT_TOO_SHORT", FaultReasonPTTooShort, 1, "gf100_fifo_mmu_fault_reason"},
		{"fault reason PAGE_NOT_PRESENT", FaultReasonPageNotPresent, 2, "gf100_fifo_mmu_fault_reason"},
		{"fault reason VM_LIMIT_EXCEEDED", FaultReasonVMLimit, 3, "gf100_fifo_mmu_fault_reason"},
		{"fault reason NO_CHANNEL", FaultReasonNoChannel, 4, "gf100_fifo_mmu_fault_reason"},
		{"fault reason PAGE_SYSTEM_ONLY", FaultReasonPageSystemOnly, 5, "gf100_fifo_mmu_fault_reason"},
		{"fault reason PAGE_READ_ONLY", FaultReasonReadOnly, 6, "gf100_fifo_mmu_fault_reason"},
		{"fault client PFIFO (hub)", FaultClientPFIFO, 0x06, "gf100_fifo_mmu_fault_hubclient"},
		{"fault client PCOPY0 (hub)", FaultClientPCOPY0, 0x01, "gf100_fifo_mmu_fault_hubclient"},

		// PBDMA
		{"PBDMA method cache", RegPBDMAMethod0, 0x400C0, "gf100_runq_intr"},
		{"PBDMA data cache", RegPBDMAData0, 0x400C4, "gf100_runq_intr"},
		{"PBDMA INTR", RegPBDMAIntr0, 0x40108, "gf100_runq_intr"},
		{"PBDMA INTR_EN", RegPBDMAIntrEn0, 0x4010C, "gf100_runq_init"},
		{"PBDMA channel", RegPBDMAChan0, 0x40120, "gf100_runq_intr"},
		{"PBDMA stride", PBDMAStride, 0x2000, "gf100_runq_intr"},
		{"PBDMA count", NumPBDMAs, 3, "envytools PSUBFIFO length 3"},
		{"PBDMA method mask", PBDMAMethodMask, 0x3FFC, "gf100_runq_intr: addr & 0x3ffc"},
		{"PBDMA ILLEGAL_MTHD", PBDMAIntrIllegalMthd, 1 << 21, "gf100_runq_intr_0_names"},
		{"PBDMA EMPTY_SUBC", PBDMAIntrEmptySubc, 1 << 23, "gf100_runq_intr_0_names"},
		{"PBDMA of GR", PBDMAGR, 0, "gf100_fifo_init_pbdmas"},
		{"PBDMA of CE0", PBDMACE0, 2, "gf100_fifo_init_pbdmas"},

		// Channel table
		{"channel table", RegChanTable, 0x3000, "gf100_chan_bind"},
		{"channel instance: bind value flags", ChanInstValid | ChanInstPollEnable, 0xC0000000, "gf100_chan_bind"},
		{"channel control: start value", ChanCtlDefault, 0x001F0001, "gf100_chan_start"},
		{"channel control: PENDING", ChanCtlPending, 1 << 28, "envytools CHAN_TABLE.STATE PENDING"},

		// MMU
		{"host flush page", RegSysmemFlushPage, 0x100C10, "gf100_fb_sysmem_flush_page_init"},
		{"MMU status", RegMMUStatus, 0x100C80, "gf100_vmm_invalidate"},
		{"MMU status: PRI FIFO space", MMUStatusFreeSlots, 0x00FF0000, "gf100_vmm_invalidate"},
		{"MMU status: flush done", MMUStatusFlushDone, 0x00008000, "gf100_vmm_invalidate"},
		{"TLB invalidate PDB", RegTLBFlushPD, 0x100CB8, "gf100_vmm_invalidate_pdb"},
		{"TLB invalidate trigger", RegTLBFlushTrigger, 0x100CBC, "gf100_vmm_invalidate"},
		{"TLB invalidate: BAR type", TLBFlushTrigger | TLBFlushTypeBAR, 0x80000005, "gf100_vmm_flush (type 5 for BARs)"},
		{"TLB invalidate: PDB of 0x123000", uint64(TLBFlushPDEncode(0x123000)), 0x1230, "gf100_vmm_invalidate_pdb: addr >> 8"},
		{"PDE small-table VOL", PDEW1SmallVol, 0x4, "gf100_vmm_pgd_pde BIT_ULL(34)"},
		{"PDE large-table VOL", PDEW1LargeVol, 0x8, "gf100_vmm_pgd_pde BIT_ULL(35)"},
		{"PTE privileged", PTEPrivileged, 0x2, "envytools nvc0_vm PTE"},
		{"PTE read-only", PTEReadOnly, 0x4, "gf100_vmm_valid"},
		{"PTE encrypted", PTEEncrypted, 0x8, "envytools nvc0_vm PTE"},
		{"PTE compression tag shift (high word)", pteHiCompTagShift, 12, "gf100_vmm_valid: comp << 44"},

		// Memory controller
		{"partition count", RegMemPartCount, 0x22438, "gf100_ram_ctor"},
		{"partition size", RegMemPartSize0, 0x11020C, "gf100_ram_ctor"},
		{"old per-partition VRAM size", RegVRAMPartSizeOld, 0x10F20C, "nvc0_vram_init"},

		// Copy engines, PGRAPH, FECS
		{"CE0 CHANNEL_CUR", RegCE0ChanCur, 0x104050, "nvkm_falcon_intr; envytools falcon.xml"},
		{"CE0 CHANNEL_NEXT", RegCE0ChanNext, 0x104054, "envytools falcon.xml"},
		{"CE1 CHANNEL_CUR", RegCE1ChanCur, 0x105050, "gf100_ce_new: 0x104000 + inst * 0x1000"},
		{"CE CHANNEL valid", CEChanValid, 1 << 30, "envytools falcon.xml"},
		{"GPC MMU debug write buffer", RegGPCMMUDebugWr, 0x4188B4, "gf100_gr_init_gpc_mmu"},
		{"GPC MMU debug read buffer", RegGPCMMUDebugRd, 0x4188B8, "gf100_gr_init_gpc_mmu"},
		{"FECS data", RegFECSData, 0x409500, "gf100_gr_fecs_ctrl_ctxsw"},
		{"FECS command", RegFECSCmd, 0x409504, "gf100_gr_fecs_ctrl_ctxsw"},
		{"FECS mailbox", RegFECSStatus, 0x409800, "gf100_gr_fecs_ctx_size"},
		{"FECS reglist data", RegFECSReglistData, 0x409810, "gf100_gr_fecs_bind_pointer (NVIDIA firmware path)"},
		{"FECS CHAN_ADDR", RegFECSChanAddr, 0x409B00, "gf100_gr_intr"},
		{"FECS bind pointer", FECSCmdBindPointer, 0x03, "gf100_gr_fecs_bind_pointer"},
		{"FECS WFI golden save", FECSCmdWFIGoldenSave, 0x09, "gf100_gr_fecs_wfi_golden_save"},
		{"FECS image size", FECSCmdImageSize, 0x10, "gf100_gr_fecs_discover_image_size"},
		{"FECS stop ctxsw", FECSCmdStopCtxsw, 0x38, "gf100_gr_fecs_stop_ctxsw"},

		// RAMIN and USERD
		{"RAMIN USERD", RAMINUserLo, 0x08, "gf100_chan_ramfc_write"},
		{"RAMIN signature", RAMINSignature, 0x10, "gf100_chan_ramfc_write"},
		{"RAMIN signature value", RAMINSignatureValue, 0xFACE, "gf100_chan_ramfc_write"},
		{"RAMIN GPFIFO", RAMINGPFIFOLo, 0x48, "gf100_chan_ramfc_write"},
		{"RAMIN page directory", RAMINPageDir, 0x200, "gf100_vmm_join_"},
		{"RAMIN address limit", RAMINAddrLimit, 0x208, "gf100_vmm_join_"},
		{"RAMIN GR context", RAMINEngineGR, 0x210, "gf100_ectx_bind"},
		{"RAMIN CE0 context", RAMINEngineCE0, 0x230, "gf100_ectx_bind"},
		{"RAMIN CE1 context", RAMINEngineCE1, 0x240, "gf100_ectx_bind"},
		{"RAMIN context pointer: virtual", RAMINEngineVirtual, 4, "gf100_ectx_bind: addr | 4"},
		{"USERD DMA_GET", UserDMAGet, 0x44, "cl906f.h Nv906fControl Get"},
		{"USERD reference", UserRef, 0x48, "cl906f.h Nv906fControl Reference"},
		{"USERD DMA_GET high", UserDMAGetHi, 0x60, "cl906f.h Nv906fControl GetHi"},
		{"USERD GP_GET", UserGPGet, 0x88, "cl906f.h Nv906fControl GPGet"},
		{"USERD GP_PUT", UserGPPut, 0x8C, "cl906f.h Nv906fControl GPPut"},

		// Push buffer and host methods
		{"method field mask (method >> 2)", MthdAddrMask, 0xFFF, "cl906f.h NV906F_DMA_METHOD_ADDRESS 11:0"},
		{"SEC_OP END_PB_SEGMENT", MthdTypeEndSegment, 7, "cl906f.h NV906F_DMA_SEC_OP_END_PB_SEGMENT"},
		{"SEC_OP IMMD_DATA_METHOD", MthdTypeImmediate, 4, "cl906f.h"},
		{"SET_REFERENCE", MthdSetReference, 0x50, "cl906f.h NV906F_SET_REFERENCE"},
		{"FB_FLUSH", MthdFBFlush, 0x24, "cl906f.h NV906F_FB_FLUSH"},
		{"SEMAPHORED", MthdSemaphoreTrigger, 0x1C, "cl906f.h NV906F_SEMAPHORED"},
		{"SEMAPHORED ACQUIRE_SWITCH", SemaphoreAcquireSwitch, 1 << 12, "cl906f.h"},
		{"SEMAPHORED RELEASE_SIZE_4BYTE", SemaphoreRelease4Byte, 1 << 24, "cl906f.h"},
		{"SEMAPHORED ACQ_GEQ", SemaphoreAcquireGEq, 4, "cl906f.h"},
		{"SEMAPHORED ACQ_AND", SemaphoreAcquireAnd, 8, "cl906f.h"},

		// Copy class (nouveau's CE microcode)
		{"copy EXEC", CopyMthdExec, 0x300, "ce/fuc/com.fuc dispatch_table; nvc0_bo_move_copy"},
		{"copy SRC_ADDRESS_HIGH", CopyMthdSrcAddrHi, 0x30C, "nvc0_bo_move_copy"},
		{"copy YCNT", CopyMthdYCount, 0x328, "nvc0_bo_move_copy"},
		{"copy EXEC linear", CopyExecLinear, 0x110, "nvc0_bo_move_copy"},
		{"copy YCNT mask (8191 lines)", CopyYCountMask, 0x1FFF, "com.fuc; nvc0_bo_move_copy"},
		{"FERMI_DMA class", ClassFermiCopy, 0x90B5, "gf100_ce_new"},
		{"FERMI_DECOMPRESS class", ClassFermiDecompress, 0x90B8, "gf100_ce_new"},
	} {
		if c.ours != c.public {
			t.Errorf("%s: ours %#x, public %#x (%s)", c.name, c.ours, c.public, c.source)
		}
	}
}
