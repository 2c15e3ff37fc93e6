package aggregator

import (
	"log/slog"
	"sync"

	"github.com/gpuvm/gpuvm/gpu/errreport"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// Error reports. The board reports MMU faults per fault unit and method
// errors per PBDMA (gpu/errreport); only the aggregator, as the host
// driver, reads and releases the physical registers. Each report is
// attributed to the channel it names — an MMU record by the shadow
// instance it carries, a PBDMA error by its physical channel id, a BAR
// fault by the VM slice its aperture offset falls in — and the owning vGPU
// gets a translated copy (guest instance, guest channel id, guest BAR
// offset) in its own virtual register file; a report no current channel
// owns is counted and dropped. The physical channel is marked errored so
// the dispatcher ends its submission. Routes are removed only after a
// collection that follows the channel's stop, so a report never reaches a
// later tenant of the same physical channel or shadow memory.

// maxReportsPerCollect bounds one collection.
const maxReportsPerCollect = 1024

// virtualQueue bounds each vGPU's queued records per unit and PBDMA.
const virtualQueue = 16

// faultRoute is where a physical channel's reports go.
type faultRoute struct {
	v         *VGPU
	ch        int    // guest channel index
	guestInst uint32 // the guest's instance word (guest RAMIN)
}

// barRoute is a vGPU's slice of a physical BAR aperture.
type barRoute struct {
	v          *VGPU
	base, size uint64
	guestInst  uint32 // the guest's BAR instance register
}

// physFaults collects the board's error reports.
type physFaults struct {
	gpu HostGPU
	log *slog.Logger

	mu       sync.Mutex
	byInst   map[uint64]faultRoute // shadow RAMIN address -> channel
	byPhys   map[int]faultRoute    // physical channel id -> channel
	inst     map[int]uint64        // physical channel id -> its shadow RAMIN
	bars     [2]map[*VGPU]barRoute // BAR1, BAR3
	hadError map[int]bool          // physical channels with a report since their last start
	// unclaimed counts reports that named no current channel; host counts
	// board-level errors (channel-table and scheduler errors).
	unclaimed, host uint64
}

func newPhysFaults(g HostGPU, log *slog.Logger) *physFaults {
	return &physFaults{gpu: g, log: log, byInst: map[uint64]faultRoute{}, byPhys: map[int]faultRoute{},
		inst: map[int]uint64{}, bars: [2]map[*VGPU]barRoute{{}, {}}, hadError: map[int]bool{}}
}

// reset drops every route: the board came back from power-on (Reinit), its
// channels name nothing of before. The totals stay.
func (f *physFaults) reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.byInst, f.byPhys, f.inst = map[uint64]faultRoute{}, map[int]faultRoute{}, map[int]uint64{}
	f.bars = [2]map[*VGPU]barRoute{{}, {}}
	f.hadError = map[int]bool{}
}

// bind routes physical channel p, running on the shadow RAMIN shadow, to
// guest channel ch of v (whose instance word is guestInst).
func (f *physFaults) bind(p int, shadow uint64, v *VGPU, ch int, guestInst uint32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if old, ok := f.inst[p]; ok {
		delete(f.byInst, old)
	}
	r := faultRoute{v: v, ch: ch, guestInst: guestInst}
	f.byInst[shadow], f.byPhys[p], f.inst[p] = r, r, shadow
}

// unbind removes physical channel p's route. Collect first: the channel
// must be stopped and its reports delivered.
func (f *physFaults) unbind(p int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if old, ok := f.inst[p]; ok {
		delete(f.byInst, old)
	}
	delete(f.byPhys, p)
	delete(f.inst, p)
	delete(f.hadError, p)
}

// bindBAR routes faults in [base, base+size) of BAR bar (0 BAR1, 1 BAR3)
// to v, whose BAR instance register holds guestInst.
func (f *physFaults) bindBAR(bar int, v *VGPU, base, size uint64, guestInst uint32) {
	f.mu.Lock()
	f.bars[bar][v] = barRoute{v: v, base: base, size: size, guestInst: guestInst}
	f.mu.Unlock()
}

// unbindBARs removes v's BAR routes.
func (f *physFaults) unbindBARs(v *VGPU) {
	f.mu.Lock()
	delete(f.bars[0], v)
	delete(f.bars[1], v)
	f.mu.Unlock()
}

// started clears physical channel p's error mark (it starts afresh).
func (f *physFaults) started(p int) {
	f.mu.Lock()
	delete(f.hadError, p)
	f.mu.Unlock()
}

// errored reports whether physical channel p had a report since its last
// start, as of the last collection.
func (f *physFaults) errored(p int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hadError[p]
}

func (f *physFaults) rd(off uint32) uint32 { return f.gpu.Read32(nvc0.BAR0, uint64(off)) }
func (f *physFaults) wr(off, v uint32)     { f.gpu.Write32(nvc0.BAR0, uint64(off), v) }

// collect drains the board's error reports, routes each, and releases it.
func (f *physFaults) collect() {
	f.mu.Lock()
	defer f.mu.Unlock()
	intr := f.rd(nvc0.RegPFIFOIntr)
	if intr == nvc0.ReadAllOnes {
		return
	}
	if latched := intr & (nvc0.PFIFOIntrChanTableError | nvc0.PFIFOIntrSchedError); latched != 0 {
		f.host++
		f.log.Error("PFIFO error", "intr", intr, "chan_table", f.rd(nvc0.RegChanTableError), "sched", f.rd(nvc0.RegSchedError))
		f.wr(nvc0.RegPFIFOIntr, latched)
	}
	if intr&nvc0.PFIFOIntrRunlist != 0 { // the aggregator's own playlist updates
		f.wr(nvc0.RegRunlistIntr, f.rd(nvc0.RegRunlistIntr))
	}
	if intr&(nvc0.PFIFOIntrMMUFault|nvc0.PFIFOIntrPBDMA) == 0 {
		return
	}
	for n := 0; n < maxReportsPerCollect; {
		mask, src := f.rd(nvc0.RegFaultUnitMask), f.rd(nvc0.RegPBDMAIntrSource)
		if mask == 0 && src == 0 || mask == nvc0.ReadAllOnes {
			return
		}
		for u := range nvc0.NumFaultUnits {
			if mask&(1<<u) != 0 {
				n++
				rec := errreport.Fault{Inst: f.rd(nvc0.RegFaultInst(u)), VALo: f.rd(nvc0.RegFaultVALo(u)),
					VAHi: f.rd(nvc0.RegFaultVAHi(u)), Type: f.rd(nvc0.RegFaultType(u))}
				f.wr(nvc0.RegFaultUnitMask, 1<<u)
				f.routeFault(u, rec)
			}
		}
		for p := range nvc0.NumPBDMAs {
			if src&(1<<p) != 0 {
				n++
				e := errreport.PBDMAError{Intr: f.rd(nvc0.RegPBDMAIntr(p)), Method: f.rd(nvc0.RegPBDMAMethod(p)),
					Data: f.rd(nvc0.RegPBDMAData(p)), Chan: f.rd(nvc0.RegPBDMAChan(p))}
				f.wr(nvc0.RegPBDMAMethod(p), nvc0.PBDMAMethodValid|0x00600000|nvc0.MthdNop) // as gf100_runq_intr
				f.wr(nvc0.RegPBDMAIntr(p), e.Intr)
				f.wr(nvc0.RegPBDMAIntrSource, 1<<p)
				f.routePBDMA(p, e)
			}
		}
	}
	f.log.Warn("error reports keep coming; collection cut short", "max", maxReportsPerCollect)
}

// routeFault delivers an MMU fault record. Call with f.mu held.
func (f *physFaults) routeFault(u int, rec errreport.Fault) {
	if u == nvc0.FaultUnitBAR1 || u == nvc0.FaultUnitBAR3 {
		bar := 0
		if u == nvc0.FaultUnitBAR3 {
			bar = 1
		}
		va := rec.VA()
		for _, r := range f.bars[bar] {
			if va >= r.base && va-r.base < r.size {
				g := rec
				g.Inst = r.guestInst & (nvc0.ChanInstMask | 3<<nvc0.ChanInstTargetShift)
				off := va - r.base
				g.VALo, g.VAHi = uint32(off), uint32(off>>32)
				r.v.deliverFault(u, g)
				return
			}
		}
		f.unclaimed++
		f.log.Warn("BAR fault of the aggregator's own access", "unit", u, "va", va, "type", rec.Type)
		return
	}
	r, ok := f.byInst[nvc0.InstDecode(rec.Inst)]
	if !ok || nvc0.InstTarget(rec.Inst) != nvc0.MemTargetVRAM {
		f.unclaimed++
		f.log.Warn("MMU fault naming no VM's channel", "unit", u, "inst", rec.Inst, "va", rec.VA(), "type", rec.Type)
		return
	}
	for p, route := range f.byPhys {
		if route == r {
			f.hadError[p] = true
		}
	}
	g := rec
	g.Inst = r.guestInst & (nvc0.ChanInstMask | 3<<nvc0.ChanInstTargetShift)
	r.v.deliverFault(u, g)
}

// routePBDMA delivers a PBDMA error. Call with f.mu held.
func (f *physFaults) routePBDMA(p int, e errreport.PBDMAError) {
	ch := int(e.Chan & nvc0.PBDMAChanMask)
	r, ok := f.byPhys[ch]
	if !ok {
		f.unclaimed++
		f.log.Warn("PBDMA error naming no VM's channel", "pbdma", p, "channel", ch, "intr", e.Intr)
		return
	}
	f.hadError[ch] = true
	g := e
	g.Chan = e.Chan&^nvc0.PBDMAChanMask | uint32(r.ch)
	r.v.deliverPBDMA(p, g)
}

// deliverFault queues a translated MMU fault record for the guest.
func (v *VGPU) deliverFault(u int, rec errreport.Fault) {
	if !v.verr.AddFault(u, rec) {
		v.ctr.reportsDropped.Add(1)
	}
	v.ctr.faultReports.Add(1)
	v.raiseIRQ() // the guest looks at its fault registers
}

// deliverPBDMA queues a translated PBDMA error for the guest.
func (v *VGPU) deliverPBDMA(p int, e errreport.PBDMAError) {
	if !v.verr.AddPBDMA(p, e) {
		v.ctr.reportsDropped.Add(1)
	}
	v.ctr.faultReports.Add(1)
	v.raiseIRQ() // the guest looks at its fault registers
}

// reportKilled makes guest channel i's stop by the aggregator (its
// watchdog) visible to the guest as an MMU fault record of the GR unit
// with reason nvc0.FaultReasonHostStopped, as a host driver's
// context-switch-timeout recovery would raise.
func (v *VGPU) reportKilled(i int) {
	c := &v.chans[i]
	c.killed = true
	c.enabled = false
	c.ctl &^= nvc0.ChanCtlEnable
	v.deliverFault(nvc0.FaultUnitGR, errreport.Fault{
		Inst: c.inst & (nvc0.ChanInstMask | 3<<nvc0.ChanInstTargetShift),
		Type: nvc0.FaultReasonHostStopped,
	})
}

// errRegRead and errRegWrite serve the guest's error-report registers from
// its own register file.
func errRegRead(v *VGPU, off uint32) uint32 {
	if off == nvc0.RegPFIFOIntr {
		v.agg.faults.collect() // what the board has reported so far
	}
	val, _ := v.verr.Read(off)
	return val
}

func errRegWrite(v *VGPU, off, val uint32) {
	if !v.verr.Write(off, val) {
		v.deny("write", nvc0.BAR0, uint64(off), val)
	}
}
