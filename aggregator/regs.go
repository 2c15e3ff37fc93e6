package aggregator

import (
	"sort"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// regClass says how a register is virtualized.
type regClass int

const (
	regDenied      regClass = iota // dropped and counted (the default for anything not in the table)
	regEmulated                    // per-VM state; never reaches the board
	regTranslated                  // values are translated (addresses, channel ids) and the effect applied to the board
	regPassthrough                 // read from the board as is (harmless, global state)
)

// String names the class.
func (c regClass) String() string {
	return [...]string{"denied", "emulated", "translated", "passthrough"}[c]
}

// regHandler handles one register. A nil read or write is denied. Handlers
// run with the vGPU's lock held.
type regHandler struct {
	class regClass
	read  func(v *VGPU, off uint32) uint32
	write func(v *VGPU, off uint32, val uint32)
}

type rangeHandler struct {
	lo, hi uint32 // [lo, hi)
	h      regHandler
}

// regTable is the BAR0 virtualization table: exact offsets first, then ranges.
type regTable struct {
	exact  map[uint32]regHandler
	ranges []rangeHandler
}

func (t regTable) lookup(off uint32) (regHandler, bool) {
	if h, ok := t.exact[off]; ok {
		return h, true
	}
	i := sort.Search(len(t.ranges), func(i int) bool { return t.ranges[i].hi > off })
	if i < len(t.ranges) && off >= t.ranges[i].lo {
		return t.ranges[i].h, true
	}
	return regHandler{}, false
}

// Handlers shared by many registers.
func emuRead(v *VGPU, off uint32) uint32           { return v.emu[off] }
func emuWrite(v *VGPU, off uint32, val uint32)     { v.emu[off] = val }
func constant(c uint32) func(*VGPU, uint32) uint32 { return func(*VGPU, uint32) uint32 { return c } }
func physRead(v *VGPU, off uint32) uint32          { return v.agg.gpu.Read32(nvc0.BAR0, uint64(off)) }

// emulated is plain per-VM storage.
var emulated = regHandler{class: regEmulated, read: emuRead, write: emuWrite}

func newRegTable() regTable {
	t := regTable{exact: map[uint32]regHandler{
		nvc0.RegBoot0:     {class: regEmulated, read: constant(nvc0.Boot0Value)},
		nvc0.RegPMCEnable: emulated, // a VM must not switch engines off for everyone

		nvc0.RegPRAMINWindow: {class: regEmulated, read: emuRead, write: func(v *VGPU, off, val uint32) {
			v.emu[off] = val
			v.window = uint64(val) << nvc0.PRAMINWindowShift
		}},
		nvc0.RegBAR1Inst: {class: regTranslated, read: emuRead, write: func(v *VGPU, off, val uint32) { v.emu[off] = val; v.bars[0].setInst(val) }},
		nvc0.RegBAR3Inst: {class: regTranslated, read: emuRead, write: func(v *VGPU, off, val uint32) { v.emu[off] = val; v.bars[1].setInst(val) }},

		nvc0.RegPFIFOIntr: {class: regEmulated, read: func(v *VGPU, _ uint32) uint32 { return v.intr }, write: func(v *VGPU, _, val uint32) { v.intr &^= val }},
		nvc0.RegPollArea: {class: regEmulated, read: emuRead, write: func(v *VGPU, off, val uint32) {
			v.emu[off] = val
			v.pollOn = val&nvc0.PollAreaEnable != 0
			v.pollBase = uint64(val&nvc0.PollAreaMask) << nvc0.PageShift
			v.remapStale = true
		}},
		nvc0.RegPlaylistAddr:                 emulated,
		nvc0.RegPlaylistSubmit:               {class: regTranslated, read: emuRead, write: func(v *VGPU, off, val uint32) { v.emu[off] = val; v.submitPlaylist(val) }},
		nvc0.RegPlaylistStatus:               {class: regEmulated, read: constant(0)}, // submissions complete inside the trap
		nvc0.RegPreempt:                      {class: regEmulated, read: emuRead, write: preemptWrite},
		nvc0.RegEngineStatus(nvc0.EngineGR):  {class: regTranslated, read: engineStatusRead},
		nvc0.RegEngineStatus(nvc0.EngineCE0): {class: regTranslated, read: engineStatusRead},
		nvc0.RegEngineStatus(nvc0.EngineCE1): {class: regTranslated, read: engineStatusRead},

		nvc0.RegFaultInst:   {class: regTranslated, read: faultRead},
		nvc0.RegFaultAddrLo: {class: regTranslated, read: faultRead},
		nvc0.RegFaultAddrHi: {class: regTranslated, read: faultRead},
		nvc0.RegFaultStatus: {class: regTranslated, read: faultRead},

		nvc0.RegFlush: {class: regPassthrough, read: constant(0), write: func(v *VGPU, _, val uint32) {
			v.agg.gpu.Write32(nvc0.BAR0, nvc0.RegFlush, val&nvc0.FlushTrigger)
		}},
		nvc0.RegTimerLow:  {class: regPassthrough, read: physRead},
		nvc0.RegTimerHigh: {class: regPassthrough, read: physRead},

		// The guest sees one memory partition holding its whole slice.
		nvc0.RegMemPartCount: {class: regEmulated, read: constant(1)},
		nvc0.RegMemPartMask:  {class: regEmulated, read: constant(0)},
		nvc0.RegMemLTCCount:  {class: regEmulated, read: constant(1)},
		nvc0.MemPartSize(0):  {class: regEmulated, read: func(v *VGPU, _ uint32) uint32 { return uint32(v.Slot.VRAM.Size >> nvc0.MemPartSizeShift) }},

		// Flushes complete inside the trap, so the MMU always looks idle and done.
		nvc0.RegMMUStatus:       {class: regEmulated, read: constant(nvc0.MMUStatusFreeSlots | nvc0.MMUStatusFlushDone)},
		nvc0.RegTLBFlushPD:      emulated,
		nvc0.RegTLBFlushTrigger: {class: regTranslated, read: emuRead, write: func(v *VGPU, off, val uint32) { v.emu[off] = val; v.tlbFlush(val) }},

		nvc0.RegCopy0InstLo: {class: regTranslated, read: emuRead, write: func(v *VGPU, off, val uint32) { v.emu[off] = val; v.copyBind(nvc0.RegCopy0InstLo, val) }},
		nvc0.RegCopy0InstHi: emulated,
		nvc0.RegCopy1InstLo: {class: regTranslated, read: emuRead, write: func(v *VGPU, off, val uint32) { v.emu[off] = val; v.copyBind(nvc0.RegCopy1InstLo, val) }},
		nvc0.RegCopy1InstHi: emulated,

		nvc0.RegPGRAPHStatus: {class: regPassthrough, read: physRead},
		nvc0.RegFECSData:     emulated,
		nvc0.RegFECSCmd:      {class: regTranslated, read: emuRead, write: func(v *VGPU, off, val uint32) { v.emu[off] = val; v.fecsCommand(val) }},
		nvc0.RegFECSStatus:   emulated,
		nvc0.RegFECSClear: {class: regEmulated, write: func(v *VGPU, _, val uint32) {
			v.emu[nvc0.RegFECSStatus] &^= val
		}},
	}}
	for i := 1; i < nvc0.MaxMemPartitions; i++ {
		t.exact[nvc0.MemPartSize(i)] = regHandler{class: regEmulated, read: constant(0)}
	}
	t.ranges = []rangeHandler{
		{nvc0.RegChanTable, nvc0.RegChanTable + nvc0.MaxChannels*nvc0.ChanTableStride,
			regHandler{class: regTranslated, read: chanTableRead, write: chanTableWrite}},
		{nvc0.PRAMINBase, nvc0.PRAMINBase + nvc0.PRAMINSize,
			regHandler{class: regTranslated, read: praminRead, write: praminWrite}},
	}
	sort.Slice(t.ranges, func(i, j int) bool { return t.ranges[i].lo < t.ranges[j].lo })
	return t
}

// bar0Read and bar0Write run a trapped BAR0 access through the table.
func (v *VGPU) bar0Read(off uint32) uint32 {
	h, ok := v.agg.regs.lookup(off)
	if !ok || h.read == nil {
		v.deny("read", nvc0.BAR0, uint64(off), 0)
		return 0
	}
	return h.read(v, off)
}

func (v *VGPU) bar0Write(off, val uint32) {
	h, ok := v.agg.regs.lookup(off)
	if !ok || h.write == nil {
		v.deny("write", nvc0.BAR0, uint64(off), val)
		return
	}
	h.write(v, off, val)
}

// deny counts and logs (at debug level, it may be a flood) a dropped access.
func (v *VGPU) deny(op string, bar int, off uint64, val uint32) {
	v.ctr.denied.Add(1)
	v.log.Debug("access denied", "op", op, "bar", bar, "offset", off, "value", val)
}

func praminRead(v *VGPU, off uint32) uint32 {
	g := v.window + uint64(off-nvc0.PRAMINBase)
	val, ok := v.guestVRAMRead32(g)
	if !ok {
		v.deny("read", nvc0.BAR0, uint64(off), 0)
	}
	return val
}

func praminWrite(v *VGPU, off, val uint32) {
	g := v.window + uint64(off-nvc0.PRAMINBase)
	if !v.guestVRAMWrite32(g, val) {
		v.deny("write", nvc0.BAR0, uint64(off), val)
	}
}

// engineStatusRead shows a PFIFO engine busy only with one of the VM's own
// channels (as the guest's channel id); another VM's work reads idle.
func engineStatusRead(v *VGPU, off uint32) uint32 {
	st := v.agg.gpu.Read32(nvc0.BAR0, uint64(off))
	p := int(st & nvc0.EngineStatusChanMask)
	if st&nvc0.EngineStatusBusy == 0 || p < v.Slot.ChanBase || p >= v.Slot.ChanBase+len(v.chans) {
		return 0
	}
	return nvc0.EngineStatusBusy | uint32(p-v.Slot.ChanBase)
}

func faultRead(v *VGPU, off uint32) uint32 {
	v.refreshFault()
	return v.fault[(off-nvc0.RegFaultInst)/4]
}

// RegisterClass returns how the aggregator virtualizes the BAR0 offset off
// ("emulated", "translated", "passthrough" or "denied") and whether the
// register table names it explicitly; an offset it does not name is denied.
func (a *Aggregator) RegisterClass(off uint32) (class string, explicit bool) {
	h, ok := a.regs.lookup(off)
	if !ok {
		return regDenied.String(), false
	}
	return h.class.String(), true
}
