package aggregator

import (
	"sort"

	"github.com/gpuvm/gpuvm/gpu/errreport"
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

// visibility says what the value a guest reads from a register may depend
// on. The rule (issue 20): nothing a VM reads depends on another VM — each
// readable register reflects only the VM's own vGPU, or a constant of the
// board model, or a value deliberately shared, with the reason stated.
type visibility int

const (
	visUnstated visibility = iota // not allowed for a readable register (TestRegisterVisibility)
	visOwn                        // only this VM's own vGPU
	visConstant                   // a constant of the board model
	visShared                     // the same for every VM, deliberately (see why)
)

// String names the visibility.
func (v visibility) String() string {
	return [...]string{"unstated", "own", "constant", "shared"}[v]
}

// regHandler handles one register. A nil read or write is denied. Handlers
// run with the vGPU's lock held. A readable register states its
// visibility; a shared one says why sharing it is harmless.
type regHandler struct {
	class regClass
	read  func(v *VGPU, off uint32) uint32
	write func(v *VGPU, off uint32, val uint32)
	vis   visibility
	why   string
	// plain: the register is plain per-VM storage (emulated): a state
	// image may carry its value (stateimage.go).
	plain bool
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
var emulated = regHandler{class: regEmulated, read: emuRead, write: emuWrite, vis: visOwn, plain: true}

// fixed is a read-only register holding a constant of the board model.
func fixed(c uint32) regHandler {
	return regHandler{class: regEmulated, read: constant(c), vis: visConstant}
}

// ptimer is PTIMER, the one value every VM reads alike: nanoseconds since
// the board came up. Sharing it is harmless: it carries no VM's activity,
// and each VM has the same clock through its CPU (Xen's own time sources).
const ptimerWhy = "a clock: carries no VM's activity, and every VM has the same time from its CPU"

func newRegTable() regTable {
	t := regTable{exact: map[uint32]regHandler{
		nvc0.RegBoot0:     fixed(nvc0.Boot0Value),
		nvc0.RegPMCEnable: emulated, // a VM must not switch engines off for everyone

		nvc0.RegPRAMINWindow: {class: regEmulated, read: emuRead, write: praminWindowWrite, vis: visOwn},
		nvc0.RegBAR1Inst:     {class: regTranslated, read: emuRead, write: func(v *VGPU, off, val uint32) { v.emu[off] = val; v.bars[0].setInst(val) }, vis: visOwn},
		nvc0.RegBAR3Inst:     {class: regTranslated, read: emuRead, write: func(v *VGPU, off, val uint32) { v.emu[off] = val; v.bars[1].setInst(val) }, vis: visOwn},

		nvc0.RegPollArea: {class: regEmulated, read: emuRead, write: func(v *VGPU, off, val uint32) {
			v.emu[off] = val
			v.pollOn = val&nvc0.PollAreaEnable != 0
			v.pollBase = uint64(val&nvc0.PollAreaMask) << nvc0.PageShift
			v.remapStale = true
		}, vis: visOwn},
		nvc0.RegPlaylistAddr:                 emulated,
		nvc0.RegPlaylistSubmit:               {class: regTranslated, read: emuRead, write: func(v *VGPU, off, val uint32) { v.emu[off] = val; v.submitPlaylist(val) }, vis: visOwn},
		nvc0.RegPlaylistStatus:               fixed(0), // submissions complete inside the trap
		nvc0.RegPreempt:                      {class: regEmulated, read: emuRead, write: preemptWrite, vis: visOwn},
		nvc0.RegEngineStatus(nvc0.EngineGR):  {class: regTranslated, read: engineStatusRead, vis: visOwn},
		nvc0.RegEngineStatus(nvc0.EngineCE0): {class: regTranslated, read: engineStatusRead, vis: visOwn},
		nvc0.RegEngineStatus(nvc0.EngineCE1): {class: regTranslated, read: engineStatusRead, vis: visOwn},

		// A flush completes inside the trap (the board's does at once), so
		// it always reads done.
		nvc0.RegFlush: {class: regPassthrough, read: constant(0), write: func(v *VGPU, _, val uint32) {
			v.agg.gpu.Write32(nvc0.BAR0, nvc0.RegFlush, val&nvc0.FlushTrigger)
		}, vis: visConstant},
		nvc0.RegTimerLow:  {class: regPassthrough, read: physRead, vis: visShared, why: ptimerWhy},
		nvc0.RegTimerHigh: {class: regPassthrough, read: physRead, vis: visShared, why: ptimerWhy},

		// The guest sees one memory partition holding its whole slice, by
		// the current registers and by the ones older nouveau read.
		nvc0.RegMemPartCount:    fixed(1),
		nvc0.RegMemPartMask:     fixed(0),
		nvc0.RegMemLTCCount:     fixed(1),
		nvc0.MemPartSize(0):     {class: regEmulated, read: sliceMiB, vis: visOwn},
		nvc0.RegVRAMPartSizeOld: {class: regEmulated, read: sliceMiB, vis: visOwn},

		// Physical addresses outside the page tables: per-VM storage that
		// never reaches the board (the host page FB flushes, the GPC MMU
		// debug buffers).
		nvc0.RegSysmemFlushPage: emulated,
		nvc0.RegGPCMMUDebugWr:   emulated,
		nvc0.RegGPCMMUDebugRd:   emulated,

		// Flushes complete inside the trap, so the MMU always looks idle and done.
		nvc0.RegMMUStatus:       fixed(nvc0.MMUStatusFreeSlots | nvc0.MMUStatusFlushDone),
		nvc0.RegTLBFlushPD:      emulated,
		nvc0.RegTLBFlushTrigger: {class: regTranslated, read: emuRead, write: func(v *VGPU, off, val uint32) { v.emu[off] = val; v.tlbFlush(val) }, vis: visOwn},

		// Busy only while the compute engine runs one of the VM's own channels.
		nvc0.RegPGRAPHStatus:    {class: regTranslated, read: pgraphStatusRead, vis: visOwn},
		nvc0.RegFECSData:        emulated,
		nvc0.RegFECSCmd:         {class: regTranslated, read: emuRead, write: func(v *VGPU, off, val uint32) { v.emu[off] = val; v.fecsCommand(val) }, vis: visOwn},
		nvc0.RegFECSStatus:      emulated,
		nvc0.RegFECSReglistData: emulated,
		nvc0.RegFECSClear: {class: regEmulated, write: func(v *VGPU, _, val uint32) {
			v.emu[nvc0.RegFECSStatus] &^= val
		}, vis: visOwn},
		// The channel an engine has loaded: translated to the guest's own
		// instance, or none; the host never writes these.
		nvc0.RegFECSChanAddr: {class: regTranslated, read: ownInstRead(nvc0.FECSChanValid, nvc0.EngineGR), vis: visOwn},
		nvc0.RegFECSChanNext: {class: regTranslated, read: ownInstRead(nvc0.FECSChanValid, nvc0.EngineGR), vis: visOwn},
	}}
	for i := 1; i < nvc0.MaxMemPartitions; i++ {
		t.exact[nvc0.MemPartSize(i)] = fixed(0)
	}
	for i, engine := range [nvc0.NumCopyEngines]int{nvc0.EngineCE0, nvc0.EngineCE1} {
		t.exact[nvc0.RegCEChanCur(i)] = regHandler{class: regTranslated, read: ownInstRead(nvc0.CEChanValid, engine), vis: visOwn}
		t.exact[nvc0.RegCEChanNext(i)] = regHandler{class: regTranslated, read: ownInstRead(nvc0.CEChanValid, engine), vis: visOwn}
	}
	// The error-report registers: each VM's own register file, holding the
	// board's reports about its channels, translated (faults.go).
	for _, off := range errreport.Offsets() {
		t.exact[off] = regHandler{class: regTranslated, read: errRegRead, write: errRegWrite, vis: visOwn}
	}
	t.ranges = []rangeHandler{
		{nvc0.RegChanTable, nvc0.RegChanTable + nvc0.MaxChannels*nvc0.ChanTableStride,
			regHandler{class: regTranslated, read: chanTableRead, write: chanTableWrite, vis: visOwn}},
		{nvc0.PRAMINBase, nvc0.PRAMINBase + nvc0.PRAMINSize,
			regHandler{class: regTranslated, read: praminRead, write: praminWrite, vis: visOwn}},
	}
	sort.Slice(t.ranges, func(i, j int) bool { return t.ranges[i].lo < t.ranges[j].lo })
	return t
}

// sliceMiB reads the VM's VRAM slice size in MiB.
func sliceMiB(v *VGPU, _ uint32) uint32 { return uint32(v.Slot.VRAM.Size >> nvc0.MemPartSizeShift) }

// praminWindowWrite moves the guest's PRAMIN window. A window on memory
// other than VRAM is refused: accesses through it are denied until the
// guest points it at VRAM again.
func praminWindowWrite(v *VGPU, off, val uint32) {
	v.emu[off] = val
	base, target := nvc0.PRAMINWindowDecode(val)
	v.window, v.windowOK = base, target == nvc0.MemTargetVRAM
	if !v.windowOK {
		v.gripeLog("PRAMIN window outside VRAM refused", "value", val)
	}
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
	if !v.windowOK {
		v.deny("read", nvc0.BAR0, uint64(off), 0)
		return 0
	}
	g := v.window + uint64(off-nvc0.PRAMINBase)
	val, ok := v.guestVRAMRead32(g)
	if !ok {
		v.deny("read", nvc0.BAR0, uint64(off), 0)
	}
	return val
}

func praminWrite(v *VGPU, off, val uint32) {
	g := v.window + uint64(off-nvc0.PRAMINBase)
	if !v.windowOK || !v.guestVRAMWrite32(g, val) {
		v.deny("write", nvc0.BAR0, uint64(off), val)
	}
}

// pgraphStatusRead shows the compute engine busy only while it runs one of
// the VM's own channels (the engine status register names the channel):
// another VM's kernels read idle.
func pgraphStatusRead(v *VGPU, _ uint32) uint32 {
	if engineStatusRead(v, nvc0.RegEngineStatus(nvc0.EngineGR)) != 0 {
		return nvc0.PGRAPHStatusBusy
	}
	return 0
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

// RegisterVisibility returns what a guest's read of the BAR0 offset off may
// depend on ("own", "constant" or "shared", with the reason for a shared
// one), and whether the offset is readable at all.
func (a *Aggregator) RegisterVisibility(off uint32) (vis, why string, readable bool) {
	h, ok := a.regs.lookup(off)
	if !ok || h.read == nil {
		return "", "", false
	}
	return h.vis.String(), h.why, true
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
