package nvc0

// Push-buffer method header (one 32-bit word, followed by its data words;
// cl906f.h NV906F_DMA_*, nouveau include/nvif/push906f.h PUSH_HDR): SEC_OP
// bits 31:29, count 28:16 (the data itself for an immediate), subchannel
// 15:13, method >> 2 in bits 11:0 (bit 12 unused).
const (
	MthdTypeShift  = 29
	MthdTypeMask   = 0x7
	MthdCountShift = 16
	MthdCountMask  = 0x1FFF
	MthdSubcShift  = 13
	MthdSubcMask   = 0x7
	MthdAddrMask   = 0xFFF // method >> 2

	// MthdTypeOldIncreasing is the old (NV4-style) format's SEC_OP 0. With
	// count 0 it consumes nothing: the all-zero word is NV906F_DMA_NOP,
	// which nouveau pushes NOUVEAU_DMA_SKIPS (32) of at channel start.
	// sim: other uses of the old formats (SEC_OP 0 and 2) are not decoded.
	MthdTypeOldIncreasing = 0
	MthdTypeIncreasing    = 1 // data words go to method, method+4, ...
	MthdTypeNonIncreasing = 3 // all data words go to the same method
	MthdTypeImmediate     = 4 // the count field is the (13-bit) data; no data words follow
	MthdTypeIncreaseOnce  = 5 // first word to method, the rest to method+4
	MthdTypeEndSegment    = 7 // END_PB_SEGMENT: the rest of the push buffer is skipped

	NumSubchannels = 8
	MaxMethod      = MthdAddrMask << 2 // 0x3ffc
)

// MethodHeader is a decoded push-buffer method header.
type MethodHeader struct {
	Type       uint32
	Count      uint32 // data words following (or the immediate data for MthdTypeImmediate)
	Subchannel uint32
	Method     uint32 // byte offset of the method (header field << 2)
}

// Encode returns the header word.
func (h MethodHeader) Encode() uint32 {
	return (h.Type&MthdTypeMask)<<MthdTypeShift | (h.Count&MthdCountMask)<<MthdCountShift |
		(h.Subchannel&MthdSubcMask)<<MthdSubcShift | (h.Method>>2)&MthdAddrMask
}

// DecodeMethodHeader decodes a header word.
func DecodeMethodHeader(w uint32) MethodHeader {
	return MethodHeader{
		Type:       (w >> MthdTypeShift) & MthdTypeMask,
		Count:      (w >> MthdCountShift) & MthdCountMask,
		Subchannel: (w >> MthdSubcShift) & MthdSubcMask,
		Method:     (w & MthdAddrMask) << 2,
	}
}

// Incr encodes an increasing-method header with count data words.
func Incr(subc, method, count uint32) uint32 {
	return MethodHeader{Type: MthdTypeIncreasing, Count: count, Subchannel: subc, Method: method}.Encode()
}

// NonIncr encodes a non-increasing-method header with count data words.
func NonIncr(subc, method, count uint32) uint32 {
	return MethodHeader{Type: MthdTypeNonIncreasing, Count: count, Subchannel: subc, Method: method}.Encode()
}

// Immd encodes an immediate-data method (data must fit in 13 bits).
func Immd(subc, method, data uint32) uint32 {
	return MethodHeader{Type: MthdTypeImmediate, Count: data, Subchannel: subc, Method: method}.Encode()
}

// Host methods, common to every subchannel and handled by PFIFO itself
// (class 0x906F, cl906f.h).
const (
	MthdSetObject        = 0x0000 // SET_OBJECT: class 15:0 (engine 20:16) bound on the subchannel
	MthdIllegal          = 0x0004
	MthdNop              = 0x0008
	MthdSemaphoreAddrHi  = 0x0010 // SEMAPHOREA: semaphore GPU virtual address bits 39:32
	MthdSemaphoreAddrLo  = 0x0014 // SEMAPHOREB: bits 31:0 (4-byte aligned)
	MthdSemaphorePayload = 0x0018 // SEMAPHOREC
	MthdSemaphoreTrigger = 0x001C // SEMAPHORED: Semaphore* fields
	MthdNonStall         = 0x0020 // NON_STALL_INTERRUPT (sim: no interrupt is raised)
	MthdFBFlush          = 0x0024
	MthdMemOpA           = 0x0028
	MthdMemOpB           = 0x002C
	MthdSetReference     = 0x0050 // SET_REFERENCE: the GPU writes the value to USERD +0x48
	MthdYield            = 0x0080
	MthdFifoMax          = 0x0100 // methods below this are host methods, above go to the engine

	SetObjectClassMask = 0xFFFF

	// SEMAPHORED (nvc0_fence.c emits 0x2 to release, 0x1004 to wait):
	// operation 3:0, ACQUIRE_SWITCH bit 12, RELEASE_WFI bit 20 (0 = wait
	// for idle), RELEASE_SIZE bit 24 (0 = 16 bytes, 1 = 4 bytes).
	SemaphoreAcquireEqual  = 0x1 // wait until *addr == payload
	SemaphoreRelease       = 0x2 // write payload (16 bytes: payload, 0, 64-bit PTIMER; or 4)
	SemaphoreAcquireGEq    = 0x4 // wait until (int32)(*addr - payload) >= 0
	SemaphoreAcquireAnd    = 0x8 // wait until *addr & payload != 0
	SemaphoreOpMask        = 0xF
	SemaphoreAcquireSwitch = 0x00001000 // let other channels run while waiting
	SemaphoreReleaseNoWFI  = 0x00100000
	SemaphoreRelease4Byte  = 0x01000000
	SemaphoreLongBytes     = 16
)

// Engine classes the board implements.
const (
	ClassFermiChannelGPFIFO = 0x906F // the channel itself
	ClassFermiCompute       = 0x90C0 // FERMI_COMPUTE_A (simplified, see the kernel ABI below)
	ClassFermiCopy          = 0x90B5 // FERMI_DMA: copy engine CE0 (nvkm/engine/ce/gf100.c)
	ClassFermiDecompress    = 0x90B8 // FERMI_DECOMPRESS: copy engine CE1, same methods (nvkm/engine/ce/gf100.c)
)

// Copy engine (class 0x90B5 FERMI_DMA) methods as nouveau's own copy-engine
// microcode implements them on a GF100 (nvkm/engine/ce/fuc/com.fuc
// dispatch_table) and nouveau_bo90b5.c nvc0_bo_move_copy uses them: the
// addresses, pitches and counts at 0x30C–0x328, EXEC at 0x300. (NVIDIA's
// cl90b5.h puts the same fields at 0x400–0x41C for its own firmware, which
// nouveau does not load.)
const (
	CopyMthdExec      = 0x0300 // start the copy (data: CopyExec* flags)
	CopyMthdSrcAddrHi = 0x030C // bits 39:32 (mask CopyAddrHiMask)
	CopyMthdSrcAddrLo = 0x0310
	CopyMthdDstAddrHi = 0x0314
	CopyMthdDstAddrLo = 0x0318
	CopyMthdSrcPitch  = 0x031C // mask CopyPitchMask
	CopyMthdDstPitch  = 0x0320
	CopyMthdXCount    = 0x0324 // bytes per line (mask CopyXCountMask)
	CopyMthdYCount    = 0x0328 // lines (mask CopyYCountMask)

	// Methods the microcode accepts and the board records but does not
	// act on: tiled layouts, FORMAT swizzles and queries are refused at
	// EXEC (the board copies pitch-linear bytes only).
	CopyMthdNop          = 0x0100
	CopyMthdPMTrigger    = 0x0140
	CopyMthdSrcTile      = 0x0200 // 0x200–0x218: SRC tile mode, sizes and offsets
	CopyMthdDstTile      = 0x0220 // 0x220–0x238: the same for DST
	CopyMthdWrCacheFlush = 0x0304
	CopyMthdFormat       = 0x032C
	CopyMthdSwzConst0    = 0x0330
	CopyMthdSwzConst1    = 0x0334
	CopyMthdQueryAddrHi  = 0x0338
	CopyMthdQueryAddrLo  = 0x033C
	CopyMthdQueryCounter = 0x0340

	CopyExecFormat     = 0x0001 // apply the FORMAT swizzle (sim: not supported)
	CopyExecSrcLinear  = 0x0010 // pitch-linear source (sim: tiled is not supported)
	CopyExecDstLinear  = 0x0100
	CopyExecQuery      = 0x1000 // write the query after the copy (sim: not supported)
	CopyExecQueryShort = 0x2000
	// CopyExecLinear is what nvc0_bo_move_copy launches with.
	CopyExecLinear = CopyExecSrcLinear | CopyExecDstLinear

	CopyAddrHiMask = 0xFF
	CopyPitchMask  = 0x7FFFF
	CopyXCountMask = 0xFFFF
	CopyYCountMask = 0x1FFF // nvc0_bo_move_copy copies at most 8191 lines per EXEC
	MaxCopyBytes   = CopyXCountMask * CopyYCountMask
)

// CopyMethodMask returns the data bits the copy-engine microcode allows for
// method m (com.fuc dispatch_table; a write with other bits raises
// INVALID_BITFIELD), and false for a method it does not have
// (ILLEGAL_MTHD). EXEC's bits are checked separately.
func CopyMethodMask(m uint32) (uint32, bool) {
	// The seven tile methods: mode, xsize, ysize, zsize, zoff, xoff, yoff.
	tile := [7]uint32{0xFFF, 0x7FFFF, 0x1FFF, 0x7FF, 0xFFF, 0x7FFFF, 0x1FFF}
	switch {
	case m >= CopyMthdSrcTile && m < CopyMthdSrcTile+4*7 && m%4 == 0:
		return tile[(m-CopyMthdSrcTile)/4], true
	case m >= CopyMthdDstTile && m < CopyMthdDstTile+4*7 && m%4 == 0:
		return tile[(m-CopyMthdDstTile)/4], true
	}
	switch m {
	case CopyMthdNop, CopyMthdPMTrigger, CopyMthdWrCacheFlush, CopyMthdSrcAddrLo, CopyMthdDstAddrLo,
		CopyMthdSwzConst0, CopyMthdSwzConst1, CopyMthdQueryAddrLo, CopyMthdQueryCounter, CopyMthdExec:
		return 0xFFFFFFFF, true
	case CopyMthdSrcAddrHi, CopyMthdDstAddrHi, CopyMthdQueryAddrHi:
		return CopyAddrHiMask, true
	case CopyMthdSrcPitch, CopyMthdDstPitch:
		return CopyPitchMask, true
	case CopyMthdXCount:
		return CopyXCountMask, true
	case CopyMthdYCount:
		return CopyYCountMask, true
	case CopyMthdFormat:
		return 0x0333FFFF, true
	}
	return 0, false
}

// EngineContextSize is the size of an engine context image the board loads
// from and saves to an engine context pointer (nvkm_falcon_cclass_bind
// allocates 256 bytes for a copy engine's; sim: the GR context is given the
// same size, holding the compute method state).
const EngineContextSize = 0x100

// Compute (class 0x90C0) methods the board implements. sim: a simplified
// subset: the launch reads a code object and a constant buffer of parameters.
// The offsets are those of FERMI_COMPUTE_A where it has the same method.
const (
	ComputeMthdCodeAddrHi = 0x1608 // CODE_ADDRESS_HIGH: code segment base bits 39:32
	ComputeMthdCodeAddrLo = 0x160C // CODE_ADDRESS_LOW
	ComputeMthdCBSize     = 0x1280 // constant (parameter) buffer size in bytes
	ComputeMthdCBAddrHi   = 0x1284
	ComputeMthdCBAddrLo   = 0x1288
	ComputeMthdStartID    = 0x03B4 // CP_START_ID: byte offset of the code object in the segment
	ComputeMthdGridDimX   = 0x0238 // recorded, informational: the built-in kernels take sizes from parameters
	ComputeMthdLaunch     = 0x0368 // LAUNCH: run the kernel

	MaxConstBufferSize = 0x10000
)

// SemaphoreTriggerDecode splits a SEMAPHORED word into its operation and
// whether a release writes 16 bytes (the default) or 4.
func SemaphoreTriggerDecode(v uint32) (op uint32, long bool) {
	return v & SemaphoreOpMask, v&SemaphoreRelease4Byte == 0
}
