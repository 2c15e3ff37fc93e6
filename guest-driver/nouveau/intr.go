package nouveau

import (
	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// Error reports, collected as nouveau's PFIFO interrupt handler does
// (nvkm/engine/fifo/gf100.c gf100_fifo_intr): MMU fault records per unit
// (gf100_fifo_intr_mmu_fault) and PBDMA errors (gf100_runq_intr). Each
// report is filed against the channel it names and released, so the next
// report of that unit or PBDMA can show. A channel's first report stays
// filed until the channel is released: the GPU stopped it.

// maxReportsPerCollect bounds one collection (a GPU raising reports
// without end cannot keep the driver here).
const maxReportsPerCollect = 256

// pbdmaNop is what nouveau writes over a PBDMA's cached method before
// clearing its interrupt: VALID with the NOP method (gf100_runq_intr).
const pbdmaNop = nvc0.PBDMAMethodValid | 0x00600000 | nvc0.MthdNop

// collectErrors drains and files the GPU's error reports.
func (d *Device) collectErrors() error {
	d.errMu.Lock()
	defer d.errMu.Unlock()
	intr := d.rd(nvc0.RegPFIFOIntr)
	if intr == nvc0.ReadAllOnes {
		return ErrDeviceGone
	}
	if latched := intr & (nvc0.PFIFOIntrChanTableError | nvc0.PFIFOIntrSchedError); latched != 0 {
		d.log.Warn("PFIFO error", "intr", intr, "chan_table", d.rd(nvc0.RegChanTableError), "sched", d.rd(nvc0.RegSchedError))
		d.wr(nvc0.RegPFIFOIntr, latched)
	}
	if intr&nvc0.PFIFOIntrRunlist != 0 { // playlist updates done (gf100_fifo_intr_runlist)
		d.wr(nvc0.RegRunlistIntr, d.rd(nvc0.RegRunlistIntr))
	}
	if intr&(nvc0.PFIFOIntrMMUFault|nvc0.PFIFOIntrPBDMA) == 0 {
		return nil
	}
	for n := 0; n < maxReportsPerCollect; {
		mask := d.rd(nvc0.RegFaultUnitMask)
		src := d.rd(nvc0.RegPBDMAIntrSource)
		if mask == 0 && src == 0 {
			return nil
		}
		for u := range nvc0.NumFaultUnits {
			if mask&(1<<u) == 0 {
				continue
			}
			n++
			inst := d.rd(nvc0.RegFaultInst(u))
			typ := d.rd(nvc0.RegFaultType(u))
			fe := &FaultError{Known: true, MMU: true, Unit: u,
				Addr:   uint64(d.rd(nvc0.RegFaultVAHi(u)))<<32 | uint64(d.rd(nvc0.RegFaultVALo(u))),
				Reason: typ & nvc0.FaultTypeReasonMask, Write: typ&nvc0.FaultTypeWrite != 0}
			d.wr(nvc0.RegFaultUnitMask, 1<<u)
			d.file(d.channelByInst(inst), fe)
		}
		for r := range nvc0.NumPBDMAs {
			if src&(1<<r) == 0 {
				continue
			}
			n++
			stat := d.rd(nvc0.RegPBDMAIntr(r))
			mthd := d.rd(nvc0.RegPBDMAMethod(r))
			fe := &FaultError{Known: true, PBDMA: r, Intr: stat,
				Method: mthd & nvc0.PBDMAMethodMask, Subc: mthd >> nvc0.PBDMAMethodSubcShift & nvc0.MthdSubcMask,
				Data: d.rd(nvc0.RegPBDMAData(r))}
			ch := int(d.rd(nvc0.RegPBDMAChan(r)) & nvc0.PBDMAChanMask)
			d.wr(nvc0.RegPBDMAMethod(r), pbdmaNop)
			d.wr(nvc0.RegPBDMAIntr(r), stat)
			d.wr(nvc0.RegPBDMAIntrSource, 1<<r)
			d.file(ch, fe)
		}
	}
	d.log.Warn("error reports keep coming; collection cut short", "max", maxReportsPerCollect)
	return nil
}

// channelByInst returns the id of the channel whose RAMIN an instance word
// names, or -1.
func (d *Device) channelByInst(inst uint32) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	for id, c := range d.chans {
		if c != nil && c.ramin != nil && nvc0.InstDecode(inst) == c.ramin.addr && nvc0.InstTarget(inst) == nvc0.MemTargetVRAM {
			return id
		}
	}
	return -1
}

// file records a report against channel ch (keeping its first one); a
// report naming no channel of ours is logged.
func (d *Device) file(ch int, fe *FaultError) {
	if ch < 0 || ch >= len(d.errs) {
		d.log.Warn("GPU error report for no channel of this driver", "report", fe.Error())
		return
	}
	fe.Channel = ch
	if d.errs[ch] == nil {
		d.errs[ch] = fe
	}
}

// channelError returns the report filed against channel ch, if any.
func (d *Device) channelError(ch int) *FaultError {
	d.errMu.Lock()
	defer d.errMu.Unlock()
	return d.errs[ch]
}

// forgetError drops channel ch's report (its id is being released).
func (d *Device) forgetError(ch int) {
	d.errMu.Lock()
	d.errs[ch] = nil
	d.errMu.Unlock()
}
