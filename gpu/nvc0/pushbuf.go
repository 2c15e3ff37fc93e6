package nvc0

// Push-buffer method header (one 32-bit word, followed by its data words).
const (
	MthdTypeShift  = 29
	MthdTypeMask   = 0x7
	MthdCountShift = 16
	MthdCountMask  = 0x1FFF
	MthdSubcShift  = 13
	MthdSubcMask   = 0x7
	MthdAddrMask   = 0x1FFF // method >> 2

	MthdTypeIncreasing    = 1 // data words go to method, method+4, ...
	MthdTypeNonIncreasing = 3 // all data words go to the same method
	MthdTypeImmediate     = 4 // the count field is the (13-bit) data; no data words follow
	MthdTypeIncreaseOnce  = 5 // first word to method, the rest to method+4

	NumSubchannels = 8
	MaxMethod      = MthdAddrMask << 2
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

// Methods common to every subchannel, handled by PFIFO itself (the NV906F
// channel class: SET_OBJECT and the channel semaphore).
const (
	MthdSetObject        = 0x0000 // data: class number to bind on the subchannel
	MthdSemaphoreAddrHi  = 0x0010 // semaphore GPU virtual address bits 39:32
	MthdSemaphoreAddrLo  = 0x0014 // bits 31:0 (4-byte aligned)
	MthdSemaphorePayload = 0x0018
	MthdSemaphoreTrigger = 0x001C // SemaphoreTrigger*
	MthdNonStall         = 0x0020 // NV906F_NON_STALL_INTERRUPT (ignored by the board)
	MthdFifoMax          = 0x0100 // methods below this are PFIFO methods, above go to the engine

	SemaphoreAcquireEqual = 0x1    // wait until *addr == payload
	SemaphoreRelease      = 0x2    // write payload to *addr
	SemaphoreAcquireGEq   = 0x4    // wait until *addr >= payload (unsigned)
	SemaphoreReleaseLong  = 0x1000 // with SemaphoreRelease: write payload, 0, and a 64-bit PTIMER stamp (16 bytes)
	SemaphoreOpMask       = 0x7
)

// Engine classes the board implements.
const (
	ClassFermiChannelGPFIFO = 0x906F // the channel itself
	ClassFermiCompute       = 0x90C0 // FERMI_COMPUTE_A (simplified, see the kernel ABI below)
	ClassFermiCopy          = 0x90B5 // FERMI_DMA: the copy engine
)

// Copy engine (class 0x90B5) methods, as nouveau's nvc0 copy path uses them.
const (
	CopyMthdLaunchDMA    = 0x0300 // start the copy (data: CopyLaunch* flags)
	CopyMthdOffsetInHi   = 0x0400
	CopyMthdOffsetInLo   = 0x0404
	CopyMthdOffsetOutHi  = 0x0408
	CopyMthdOffsetOutLo  = 0x040C
	CopyMthdPitchIn      = 0x0410
	CopyMthdPitchOut     = 0x0414
	CopyMthdLineLengthIn = 0x0418 // bytes per line
	CopyMthdLineCount    = 0x041C

	CopyLaunchPitch = 0x00000386 // the value nouveau launches pitch-linear copies with
	MaxCopyBytes    = 1 << 30    // sim: one LAUNCH_DMA moves at most 1 GiB
)

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

// SemaphoreTriggerDecode splits a trigger word into its operation and long flag.
func SemaphoreTriggerDecode(v uint32) (op uint32, long bool) {
	return v & SemaphoreOpMask, v&SemaphoreReleaseLong != 0
}
