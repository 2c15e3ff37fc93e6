package aggregator

import (
	"encoding/binary"
	"errors"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/hypercall"
	"github.com/gpuvm/gpuvm/internal/rangealloc"
	"github.com/gpuvm/gpuvm/shadow"
)

// Para-virtualization: the hypercall window (BAR5 in PV modes, package
// hypercall). A call is a trapped write of a slot index to RegCall: the
// slot page is copied out of guest RAM once, and that copy is decoded,
// validated and run; the guest page receives only the result and value
// words. Every page-table entry goes through the VM's translator into its
// slice or RAM (shadow/pv.go); what cannot is refused with ErrFault and
// counted in pv_rejected.

// PV limits: what a guest can make the aggregator hold besides the reserve
// bytes of its shadow budget.
const (
	pvMaxObjects  = 1024 // live page-directory and page-table handles
	pvMaxBindings = 256  // instance blocks bound to a page directory
)

// hypercalls is a PV vGPU's hypercall register state. Guarded by VGPU.mu.
type hypercalls struct {
	dec    *hypercall.Decoder
	slots  [hypercall.Slots]uint64 // guest-physical address of each slot page
	used   [hypercall.Slots]bool
	sel    uint32
	lo, hi uint32
	status hypercall.Code // of the last slot registration
	last   hypercall.Code // of the last call
	calls  uint32
	page   [hypercall.PageSize]byte // the copy being run
	ptes   []uint64                 // scratch for batch expansion and unmaps (scratch)
	// What the call being run asked to flush, done once when it ends (a
	// multicall of 128 flushes costs one flush per directory, not 128
	// under the board's lock), and whether the remap table needs a look.
	flushPDs map[uint64]struct{}
	flushBAR [2]bool
	remap    bool
}

// hcHandler runs one decoded call and returns its value and result.
type hcHandler func(v *VGPU, c *hypercall.Call) (uint32, hypercall.Code)

// hcHandlers is the table of operations (OpMulticall is the caller's).
func hcHandlers() map[hypercall.Op]hcHandler {
	return map[hypercall.Op]hcHandler{
		hypercall.OpMemAlloc:    hcMemAlloc,
		hypercall.OpMemFree:     hcMemFree,
		hypercall.OpSetPGD:      hcSetPGD,
		hypercall.OpMapPGT:      hcMapPGT,
		hypercall.OpMap:         hcMap,
		hypercall.OpMapBatch:    hcMapBatch,
		hypercall.OpMapSGBatch:  hcMapSG,
		hypercall.OpUnmapBatch:  hcUnmap,
		hypercall.OpVMFlush:     hcVMFlush,
		hypercall.OpBARMap:      hcBARMap,
		hypercall.OpBARUnmap:    hcBARUnmap,
		hypercall.OpYieldPoints: hcYieldPoints,
	}
}

// pvCodes maps the shadow package's PV errors to result codes.
func pvCodes() []struct {
	err  error
	code hypercall.Code
} {
	return []struct {
		err  error
		code hypercall.Code
	}{
		{shadow.ErrPVHandle, hypercall.ErrHandle},
		{shadow.ErrPVRange, hypercall.ErrRange},
		{shadow.ErrPVFault, hypercall.ErrFault},
		{shadow.ErrPVBusy, hypercall.ErrBusy},
		{shadow.ErrPVInval, hypercall.ErrInval},
		{shadow.ErrPVLimit, hypercall.ErrNoMem},
		{shadow.ErrQuota, hypercall.ErrNoMem},
		// The shared reserve running out is reported as the VM's own
		// budget would be: the difference would tell a guest about other
		// VMs' allocations.
		{rangealloc.ErrNoSpace, hypercall.ErrNoMem},
	}
}

func pvCode(err error) hypercall.Code {
	if err == nil {
		return hypercall.OK
	}
	for _, p := range pvCodes() {
		if errors.Is(err, p.err) {
			return p.code
		}
	}
	return hypercall.ErrFailed
}

func (v *VGPU) enablePV() {
	v.shadows.EnablePV(shadow.PVLimits{Objects: pvMaxObjects, Bindings: pvMaxBindings})
	v.hc = &hypercalls{dec: hypercall.NewDecoder(), flushPDs: map[uint64]struct{}{}}
	v.hcOps = hcHandlers()
	for _, b := range v.bars {
		b.sp.SetPV()
	}
}

// hypercallRead handles a guest read of the hypercall window.
func (v *VGPU) hypercallRead(off uint64) uint32 {
	h := v.hc
	if h == nil {
		return 0 // FV: the I/O stub
	}
	switch off {
	case hypercall.RegID:
		return hypercall.IDValue
	case hypercall.RegSlot:
		return h.sel
	case hypercall.RegSlotLo:
		return h.lo
	case hypercall.RegSlotHi:
		return h.hi
	case hypercall.RegStatus:
		return uint32(h.status)
	case hypercall.RegResult:
		return uint32(h.last)
	case hypercall.RegCalls:
		return h.calls
	}
	return 0
}

// hypercallWrite handles a guest write of the hypercall window.
func (v *VGPU) hypercallWrite(off uint64, val uint32) {
	h := v.hc
	if h == nil {
		return
	}
	switch off {
	case hypercall.RegSlot:
		h.sel = val
	case hypercall.RegSlotLo:
		h.lo = val
	case hypercall.RegSlotHi:
		h.hi = val
		h.status = v.registerSlot(h.sel, h.lo&hypercall.SlotEnable != 0, uint64(h.lo&^hypercall.SlotEnable)|uint64(val)<<32)
		if h.status != hypercall.OK {
			v.ctr.pvRejected.Add(1)
		}
	case hypercall.RegCall:
		v.hypercall(val)
	default:
		v.deny("write", hypercall.BAR, off, val)
	}
}

// registerSlot points slot at the guest page gpa, or unregisters it.
func (v *VGPU) registerSlot(slot uint32, enable bool, gpa uint64) hypercall.Code {
	h := v.hc
	if slot >= hypercall.Slots {
		return hypercall.ErrSlot
	}
	if !enable {
		h.used[slot], h.slots[slot] = false, 0
		return hypercall.OK
	}
	if gpa%hypercall.PageSize != 0 || gpa >= uint64(len(v.ram)) || uint64(len(v.ram))-gpa < hypercall.PageSize {
		return hypercall.ErrSlot
	}
	h.used[slot], h.slots[slot] = true, gpa
	return hypercall.OK
}

// hypercall runs the call in a slot.
func (v *VGPU) hypercall(slot uint32) {
	h := v.hc
	h.calls++
	v.ctr.hypercalls.Add(1)
	if slot >= hypercall.Slots || !h.used[slot] {
		h.last = hypercall.ErrSlot
		v.ctr.pvRejected.Add(1)
		return
	}
	guest := v.ram[h.slots[slot] : h.slots[slot]+hypercall.PageSize]
	copy(h.page[:], guest) // the one read of the guest's page
	calls, codes, top := h.dec.Decode(h.page[:])
	if top != hypercall.OK {
		h.last = top
		v.ctr.pvRejected.Add(1)
		hypercall.PutResult(guest, 0, top, 0)
		v.gripeLog("hypercall refused", "op", hypercall.Op(binary.LittleEndian.Uint32(h.page[hypercall.OffOp:])), "code", top)
		return
	}
	first := hypercall.OK
	for i := range calls {
		c := &calls[i]
		code, val := codes[i], uint32(0)
		if code == hypercall.OK {
			val, code = v.hcOps[c.Op](v, c)
		}
		v.ctr.hypercallOps.Add(1)
		if code != hypercall.OK {
			v.ctr.pvRejected.Add(1)
			v.gripeLog("hypercall refused", "op", c.Op, "code", code)
			if first == hypercall.OK {
				first = code
			}
		}
		hypercall.PutResult(guest, c.At, code, val)
	}
	if err := v.hcFlush(); err != nil && first == hypercall.OK {
		first = hypercall.ErrFailed
	}
	if len(calls) > 1 || calls[0].At != 0 {
		hypercall.PutResult(guest, 0, first, uint32(len(calls)))
	}
	h.last = first
}

// hcFlush does the flushes the call asked for, each once, and recomputes
// what is remapped if a BAR mapping changed.
func (v *VGPU) hcFlush() error {
	h := v.hc
	var errs []error
	for pd := range h.flushPDs {
		if err := v.agg.phys.flush(pd, false); err != nil {
			v.log.Error("physical TLB flush", "err", err)
			errs = append(errs, err)
		}
	}
	clear(h.flushPDs)
	for i, b := range v.bars {
		if h.flushBAR[i] {
			if err := v.agg.phys.flush(b.phys.pd, true); err != nil {
				v.log.Error("BAR TLB flush", "bar", b.bar, "err", err)
				errs = append(errs, err)
			}
		}
	}
	h.flushBAR = [2]bool{}
	if h.remap {
		h.remap = false
		v.remapStale = true
		v.updateRemap()
	}
	return errors.Join(errs...)
}

// pvKind maps an ABI object kind to the shadow package's.
func pvKind(k uint32) (shadow.PVKind, bool) {
	switch k {
	case hypercall.KindPageDir:
		return shadow.PVPageDir, true
	case hypercall.KindSmallTable:
		return shadow.PVSmallTable, true
	case hypercall.KindLargeTable:
		return shadow.PVLargeTable, true
	}
	return 0, false
}

func hcMemAlloc(v *VGPU, c *hypercall.Call) (uint32, hypercall.Code) {
	kind, ok := pvKind(c.Kind)
	if !ok {
		return 0, hypercall.ErrInval
	}
	h, err := v.shadows.PVAlloc(kind)
	return h, pvCode(err)
}

func hcMemFree(v *VGPU, c *hypercall.Call) (uint32, hypercall.Code) {
	return 0, pvCode(v.shadows.PVFree(c.Handle))
}

func hcSetPGD(v *VGPU, c *hypercall.Call) (uint32, hypercall.Code) {
	return 0, pvCode(v.shadows.PVBind(c.RAMIN, c.PD))
}

func hcMapPGT(v *VGPU, c *hypercall.Call) (uint32, hypercall.Code) {
	return 0, pvCode(v.shadows.PVMapPGT(c.PD, c.PDE, c.Small, c.Large))
}

// pvWrite installs entries and counts the present ones mapped.
func (v *VGPU) pvWrite(pt, index uint32, ptes []uint64) (uint32, hypercall.Code) {
	if _, err := v.shadows.PVWrite(pt, index, ptes); err != nil {
		return 0, pvCode(err)
	}
	v.ctr.ptesMapped.Add(presentEntries(ptes))
	return uint32(len(ptes)), hypercall.OK
}

// presentEntries counts the entries that map something.
func presentEntries(ptes []uint64) uint64 {
	n := uint64(0)
	for _, p := range ptes {
		if uint32(p)&nvc0.PTEPresent != 0 {
			n++
		}
	}
	return n
}

func hcMap(v *VGPU, c *hypercall.Call) (uint32, hypercall.Code) {
	return v.pvWrite(c.PT, c.Index, []uint64{c.PTE})
}

// batch expands a MAP_BATCH/BAR_MAP description after bounding its count
// (limit entries: a whole table or aperture).
func (v *VGPU) batch(pte uint64, count uint32, large bool, limit int) ([]uint64, hypercall.Code) {
	if count == 0 || count > uint32(limit) {
		return nil, hypercall.ErrRange
	}
	ptes := v.hc.scratch(int(count))
	if err := shadow.ExpandBatch(ptes, pte, large); err != nil {
		return nil, pvCode(err)
	}
	return ptes, hypercall.OK
}

// scratch returns the VM's reused entry buffer with n entries (at most a
// table's or an aperture's: the callers bound n first).
func (h *hypercalls) scratch(n int) []uint64 {
	if cap(h.ptes) < n {
		h.ptes = make([]uint64, n)
	}
	return h.ptes[:n]
}

func hcMapBatch(v *VGPU, c *hypercall.Call) (uint32, hypercall.Code) {
	entries, large, err := v.shadows.PVTableEntries(c.PT)
	if err != nil {
		return 0, pvCode(err)
	}
	if c.Index >= uint32(entries) {
		return 0, hypercall.ErrRange
	}
	ptes, code := v.batch(c.PTE, c.Count, large, entries-int(c.Index))
	if code != hypercall.OK {
		return 0, code
	}
	return v.pvWrite(c.PT, c.Index, ptes)
}

func hcMapSG(v *VGPU, c *hypercall.Call) (uint32, hypercall.Code) {
	if c.Count == 0 {
		return 0, hypercall.ErrRange
	}
	return v.pvWrite(c.PT, c.Index, c.PTEs)
}

func hcUnmap(v *VGPU, c *hypercall.Call) (uint32, hypercall.Code) {
	entries, _, err := v.shadows.PVTableEntries(c.PT)
	if err != nil {
		return 0, pvCode(err)
	}
	if c.Count == 0 || c.Index >= uint32(entries) || c.Count > uint32(entries)-c.Index {
		return 0, hypercall.ErrRange
	}
	zero := v.hc.scratch(int(c.Count))
	clear(zero)
	return v.pvWrite(c.PT, c.Index, zero)
}

func hcVMFlush(v *VGPU, c *hypercall.Call) (uint32, hypercall.Code) {
	pd, err := v.shadows.PVShadowPD(c.PD)
	if err != nil {
		return 0, pvCode(err)
	}
	v.ctr.tlbFlushes.Add(1)
	v.hc.flushPDs[pd] = struct{}{} // done when the call ends (hcFlush)
	return 0, hypercall.OK
}

// pvBAR returns the BAR shadow a BAR op names.
func (v *VGPU) pvBAR(bar uint32) (*barShadow, bool) {
	switch bar {
	case nvc0.BAR1:
		return v.bars[0], true
	case nvc0.BAR3:
		return v.bars[1], true
	}
	return nil, false
}

// barSet installs aperture entries, flushes the BAR's TLB and recomputes
// what is remapped.
func (v *VGPU) barSet(b *barShadow, first uint32, ptes []uint64) (uint32, hypercall.Code) {
	st, err := b.sp.PVSet(int(first), ptes)
	if st.Changed() {
		v.hc.flushBAR[b.index()] = true // flushed, and remap recomputed, when the call ends
		v.hc.remap = true
	}
	if err != nil {
		return 0, pvCode(err)
	}
	v.ctr.ptesMapped.Add(presentEntries(ptes))
	return uint32(len(ptes)), hypercall.OK
}

func hcBARMap(v *VGPU, c *hypercall.Call) (uint32, hypercall.Code) {
	b, ok := v.pvBAR(c.BAR)
	if !ok {
		return 0, hypercall.ErrInval
	}
	if c.Index >= uint32(b.sp.Pages()) {
		return 0, hypercall.ErrRange
	}
	ptes, code := v.batch(c.PTE, c.Count, false, b.sp.Pages()-int(c.Index))
	if code != hypercall.OK {
		return 0, code
	}
	return v.barSet(b, c.Index, ptes)
}

func hcBARUnmap(v *VGPU, c *hypercall.Call) (uint32, hypercall.Code) {
	b, ok := v.pvBAR(c.BAR)
	if !ok {
		return 0, hypercall.ErrInval
	}
	if c.Count == 0 || c.Index >= uint32(b.sp.Pages()) || c.Count > uint32(b.sp.Pages())-c.Index {
		return 0, hypercall.ErrRange
	}
	zero := v.hc.scratch(int(c.Count))
	clear(zero)
	return v.barSet(b, c.Index, zero)
}
