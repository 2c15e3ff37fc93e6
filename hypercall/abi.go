// Package hypercall is gpuvm's para-virtual GPU ABI: how a PV guest driver
// asks the aggregator to build its GPU page tables (GPUvm thesis §4.1.3,
// "naive para-virtualization"), written down as data, with the decoder the
// aggregator runs and the encoder a guest driver uses.
//
// The shape is the GPUvm prototype's: not real Xen hypercalls but trapped
// accesses to a small register window of the virtual GPU. Fermi's six PCI BAR
// slots are all taken (BAR1 and BAR3 are 64-bit BARs, so slots 2 and 4 are
// their upper halves), so the window is BAR5 — the board's legacy I/O BAR,
// which nouveau never uses — decoding the registers below in the PV modes
// (it reads 0 everywhere in the full-virtualization modes, so RegID tells a
// driver whether it may use hypercalls). The guest registers up to Slots
// pages of its RAM as call slots (RegSlot, RegSlotLo, RegSlotHi, RegStatus);
// a call is one trapped write of a slot index to RegCall, which returns
// once the aggregator has run the call (a Xen ioreq for an MMIO write keeps
// the vCPU blocked until the device model completes it). The call's
// arguments are in the slot page; its result code and value come back in
// the same page.
//
// A slot page holds one call: a 16-byte header (op, argument length,
// result, value) followed by the arguments. OpMulticall's arguments are a
// list of such calls, each with its own header, so one trap runs many page
// table updates (the thesis' multicall). The aggregator copies the page out
// of guest RAM once and decodes, validates and runs the copy: a guest that
// rewrites the page during a call changes nothing the call installs.
//
// Page tables live in the aggregator's reserved VRAM and are named by
// handles (OpMemAlloc), never by address: the guest never learns where they
// are, and nothing it can write reaches them. Page-table entries in the
// arguments are in the hardware's own PTE encoding (nvc0.PTE) with guest
// addresses — VRAM offsets in the guest's VRAM, or guest-physical RAM
// addresses — which the aggregator translates into the VM's slice or RAM
// and refuses (ErrFault) when they leave it.
//
// One op is not about page tables: OpYieldPoints declares scheduling
// points between a channel's GPFIFO entries (GLoop's cooperative yield),
// where the aggregator's scheduler may run another VM.
package hypercall

import "fmt"

// The hypercall register window (BAR5, 32-bit registers).
const (
	// BAR is the PCI BAR that holds the hypercall registers in PV modes.
	BAR = 5
	// RegID reads IDValue when the virtual GPU serves hypercalls, 0 otherwise.
	RegID = 0x00
	// RegSlot selects the slot RegSlotLo/RegSlotHi register (0..Slots-1).
	RegSlot = 0x04
	// RegSlotLo holds bits 31:12 of the guest-physical address of the page
	// to register, and SlotEnable (bit 0); bits 11:1 must be 0.
	RegSlotLo = 0x08
	// RegSlotHi holds address bits 63:32; writing it registers the selected
	// slot: at the page (RegSlotLo&^0xFFF | RegSlotHi<<32) if RegSlotLo has
	// SlotEnable, else the slot is unregistered. The page must lie wholly
	// inside guest RAM (page 0 is a page like any other).
	RegSlotHi = 0x0C
	// RegStatus reads the Code of the last slot registration.
	RegStatus = 0x10
	// RegCall: writing a slot index runs the call in that slot; the write
	// completes when the call has.
	RegCall = 0x14
	// RegResult reads the Code of the last call (also in the slot page,
	// unless the slot was not usable).
	RegResult = 0x18
	// RegCalls reads how many calls the VM made (wraps at 2^32).
	RegCalls = 0x1C

	// SlotEnable in RegSlotLo registers the slot; without it the slot is
	// unregistered.
	SlotEnable = 1

	// IDValue is "GPV1": hypercall ABI version 1.
	IDValue = 0x31565047

	// Slots is how many call slots a guest may register.
	Slots = 64
	// PageSize is the size of a call slot.
	PageSize = 4096
)

// Slot page layout: a call header, then its arguments.
const (
	HeaderSize = 16
	OffOp      = 0x0 // u32: the Op
	OffLen     = 0x4 // u32: bytes of arguments after the header
	OffResult  = 0x8 // u32: the Code, written by the aggregator
	OffValue   = 0xC // u32: a value the op returns (a handle, entries done), written by the aggregator
	// MaxArgs is the most argument bytes one slot holds.
	MaxArgs = PageSize - HeaderSize
)

// Limits.
const (
	// MaxSGEntries bounds OpMapSGBatch (the prototype's 128).
	MaxSGEntries = 128
	// MaxMulticall bounds the calls of one OpMulticall.
	MaxMulticall = 128
	// MaxYieldPoints bounds the entry indices of one OpYieldPoints.
	MaxYieldPoints = 256
)

// Op is a hypercall operation.
type Op uint32

// The operations.
const (
	OpMemAlloc   Op = 1  // allocate a page directory or page table in the aggregator's memory
	OpMemFree    Op = 2  // free one
	OpSetPGD     Op = 3  // bind a page directory to a channel instance block
	OpMapPGT     Op = 4  // link page tables into a page-directory entry
	OpMap        Op = 5  // write one PTE
	OpMapBatch   Op = 6  // write Count PTEs of consecutive pages
	OpMapSGBatch Op = 7  // write Count PTEs given one by one
	OpUnmapBatch Op = 8  // clear Count PTEs
	OpVMFlush    Op = 9  // flush the GPU TLB of a page directory
	OpBARMap     Op = 10 // map BAR1/BAR3 aperture pages
	OpBARUnmap   Op = 11 // unmap BAR1/BAR3 aperture pages
	OpMulticall  Op = 12 // run a list of calls
	// OpYieldPoints declares scheduling points after GPFIFO entries of a
	// channel (GLoop's cooperative yield).
	OpYieldPoints Op = 13
)

// Kinds of memory objects (OpMemAlloc).
const (
	KindPageDir    = 1 // a page directory (nvc0.PageDirSize)
	KindSmallTable = 2 // a small-page table covering a whole PDE (nvc0.SmallPTSize)
	KindLargeTable = 3 // a large-page table (nvc0.LargePTSize)
)

// Code is a call's result.
type Code uint32

// Result codes.
const (
	OK        Code = 0
	ErrInval  Code = 1 // malformed: wrong length, reserved field set, bad kind or BAR
	ErrNoSys  Code = 2 // unknown op (or a multicall inside a multicall)
	ErrRange  Code = 3 // a count or index beyond its limit
	ErrFault  Code = 4 // an address outside the VM's VRAM or RAM, or a target that is neither
	ErrHandle Code = 5 // a handle this VM does not hold, or of the wrong kind
	ErrNoMem  Code = 6 // the VM's page-table budget or the reserve is exhausted
	ErrBusy   Code = 7 // the object is in use (a table linked elsewhere)
	ErrSlot   Code = 8 // the slot is out of range, unregistered, or not in guest RAM
	ErrFailed Code = 9 // the aggregator could not complete the call (GPU error)
)

var codeNames = map[Code]string{
	OK: "ok", ErrInval: "invalid argument", ErrNoSys: "no such operation", ErrRange: "out of range",
	ErrFault: "address outside the VM", ErrHandle: "bad handle", ErrNoMem: "out of page-table memory",
	ErrBusy: "busy", ErrSlot: "bad slot", ErrFailed: "failed",
}

func (c Code) String() string {
	if s, ok := codeNames[c]; ok {
		return s
	}
	return fmt.Sprintf("code %d", uint32(c))
}

// Error makes a Code an error.
func (c Code) Error() string { return "hypercall: " + c.String() }

// Field names an argument field.
type Field struct {
	Name string
	Off  int // byte offset in the arguments
	Size int // 4 or 8
	Doc  string
}

// Spec is one operation's argument layout: Fixed bytes of fields, then (for
// OpMapSGBatch) Count elements of Elem bytes.
type Spec struct {
	Op       Op
	Name     string
	Fields   []Field
	Fixed    int
	Elem     int // bytes per trailing element (0: none)
	MaxElems int
	Value    string // what OffValue returns
	Doc      string
}

// Specs is the ABI: every operation's layout. docs/protocol.md §12 is
// written from it (TestProtocolDoc checks they agree).
func Specs() []Spec {
	pt := Field{"pt", 0, 4, "page-table handle"}
	idx := Field{"index", 4, 4, "first entry"}
	cnt := Field{"count", 8, 4, "entries"}
	cnt4 := Field{"count", 4, 4, "entry indices that follow"}
	pad := func(off int) Field { return Field{"reserved", off, 4, "must be 0"} }
	return []Spec{
		{OpMemAlloc, "MEM_ALLOC", []Field{{"kind", 0, 4, "KindPageDir, KindSmallTable or KindLargeTable"}, pad(4)}, 8, 0, 0,
			"the new handle", "allocate a zeroed page directory or page table in the aggregator's reserved VRAM, charged to the VM's page-table budget"},
		{OpMemFree, "MEM_FREE", []Field{{"handle", 0, 4, "handle to free"}, pad(4)}, 8, 0, 0,
			"0", "free a handle: a table is unlinked from the page directory it is in; a page directory is unbound from every instance block (a channel using it keeps it until its next enable); memory is reused only after a TLB flush"},
		{OpSetPGD, "SET_PGD", []Field{{"ramin", 0, 8, "guest VRAM address of a channel instance block (4 KiB aligned)"}, {"pd", 8, 4, "page-directory handle, 0 to unbind"}, pad(12)}, 16, 0, 0,
			"0", "the channel whose instance block is at ramin uses page directory pd from its next enable (the instance block's own page-directory field is ignored in PV modes)"},
		{OpMapPGT, "MAP_PGT", []Field{{"pd", 0, 4, "page-directory handle"}, {"pde", 4, 4, "entry index (< 8192)"}, {"small", 8, 4, "small-page table handle, 0 for none"}, {"large", 12, 4, "large-page table handle, 0 for none"}}, 16, 0, 0,
			"0", "link tables into a page-directory entry (a table is linked in at most one entry)"},
		{OpMap, "MAP", []Field{pt, idx, {"pte", 8, 8, "guest PTE (nvc0 encoding, guest address)"}}, 16, 0, 0,
			"1", "write one entry"},
		{OpMapBatch, "MAP_BATCH", []Field{pt, idx, cnt, pad(12), {"pte", 16, 8, "guest PTE of the first page; each next entry maps the next page"}}, 24, 0, 0,
			"count", "write count entries mapping consecutive pages (count ≤ the table's entries)"},
		{OpMapSGBatch, "MAP_SG_BATCH", []Field{pt, idx, cnt, pad(12)}, 16, 8, MaxSGEntries,
			"count", "write count entries given one by one (count ≤ 128 guest PTEs follow)"},
		{OpUnmapBatch, "UNMAP_BATCH", []Field{pt, idx, cnt, pad(12)}, 16, 0, 0,
			"count", "clear count entries"},
		{OpVMFlush, "VM_FLUSH", []Field{{"pd", 0, 4, "page-directory handle"}, pad(4)}, 8, 0, 0,
			"0", "flush the GPU TLB of the page directory (nouveau flushes after every update; so must a PV guest)"},
		{OpBARMap, "BAR_MAP", []Field{{"bar", 0, 4, "1 or 3"}, {"page", 4, 4, "first aperture page"}, cnt, pad(12), {"pte", 16, 8, "guest PTE of the first page; each next page maps the next"}}, 24, 0, 0,
			"count", "map aperture pages of the VM's BAR1 or BAR3 and flush the BAR's TLB"},
		{OpBARUnmap, "BAR_UNMAP", []Field{{"bar", 0, 4, "1 or 3"}, {"page", 4, 4, "first aperture page"}, cnt, pad(12)}, 16, 0, 0,
			"count", "unmap aperture pages and flush the BAR's TLB"},
		{OpYieldPoints, "YIELD_POINTS", []Field{{"channel", 0, 4, "the guest's channel id"}, cnt4, pad(8), pad(12)}, 16, 4, MaxYieldPoints,
			"count", "declare scheduling points after count GPFIFO entries (u32 indices follow) of the channel, not yet submitted, in ring order from its GP_PUT: the dispatcher may run another VM between such an entry and the next"},
		{OpMulticall, "MULTICALL", nil, 0, 0, MaxMulticall,
			"calls run", "the arguments are up to 128 calls, each a 16-byte header and its arguments padded to 8 bytes; each gets its own result and value; the multicall's result is the first failing call's"},
	}
}

// SpecOf returns op's Spec.
func SpecOf(op Op) (Spec, bool) {
	for _, s := range Specs() {
		if s.Op == op {
			return s, true
		}
	}
	return Spec{}, false
}

func (op Op) String() string {
	if s, ok := SpecOf(op); ok {
		return s.Name
	}
	return fmt.Sprintf("op %d", uint32(op))
}
