package errreport

import (
	"testing"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// TestReportsLikeGF100: records present one at a time per unit and PBDMA,
// PFIFO_INTR's level bits follow them and its latched bits clear on a
// write of 1, and the queues are bounded.
func TestReportsLikeGF100(t *testing.T) {
	r := New(2)
	rd := func(off uint32) uint32 {
		v, ok := r.Read(off)
		if !ok {
			t.Fatalf("offset %#x not decoded", off)
		}
		return v
	}
	if rd(nvc0.RegPFIFOIntr) != 0 || r.Pending() {
		t.Fatal("a new register file has something pending")
	}
	r.AddFault(nvc0.FaultUnitCE0, Fault{Inst: 1, VALo: 0x1000, Type: nvc0.FaultReasonReadOnly})
	r.AddFault(nvc0.FaultUnitCE0, Fault{Inst: 2, VALo: 0x2000})
	if r.AddFault(nvc0.FaultUnitCE0, Fault{Inst: 3}) || r.Dropped() != 1 {
		t.Fatal("a third record for a unit bounded at 2 was queued")
	}
	r.AddPBDMA(nvc0.PBDMACE0, PBDMAError{Intr: nvc0.PBDMAIntrIllegalMthd | nvc0.PBDMAIntrEmptySubc, Chan: 5})
	r.ChanTableError(nvc0.ChanTableErrInvalidTarget)
	want := uint32(nvc0.PFIFOIntrMMUFault | nvc0.PFIFOIntrPBDMA | nvc0.PFIFOIntrChanTableError)
	if got := rd(nvc0.RegPFIFOIntr); got != want {
		t.Fatalf("PFIFO_INTR %#x, want %#x", got, want)
	}
	if rd(nvc0.RegFaultUnitMask) != 1<<nvc0.FaultUnitCE0 || rd(nvc0.RegPBDMAIntrSource) != 1<<nvc0.PBDMACE0 {
		t.Fatal("source masks")
	}
	if rd(nvc0.RegFaultInst(nvc0.FaultUnitCE0)) != 1 || rd(nvc0.RegFaultVALo(nvc0.FaultUnitCE0)) != 0x1000 ||
		rd(nvc0.RegFaultType(nvc0.FaultUnitCE0)) != nvc0.FaultReasonReadOnly || rd(nvc0.RegFaultInst(0)) != 0 {
		t.Fatal("presented record")
	}
	// Level bits do not clear on a write; latched ones do.
	r.Write(nvc0.RegPFIFOIntr, 0xFFFFFFFF)
	if got := rd(nvc0.RegPFIFOIntr); got != nvc0.PFIFOIntrMMUFault|nvc0.PFIFOIntrPBDMA || rd(nvc0.RegChanTableError) != nvc0.ChanTableErrInvalidTarget {
		t.Fatalf("PFIFO_INTR after writing all ones: %#x", got)
	}
	// Releasing the unit presents the next record; then none.
	r.Write(nvc0.RegFaultUnitMask, 1<<nvc0.FaultUnitCE0)
	if rd(nvc0.RegFaultInst(nvc0.FaultUnitCE0)) != 2 || rd(nvc0.RegFaultType(nvc0.FaultUnitCE0))&nvc0.FaultTypeOverflow == 0 {
		t.Fatal("the next record was not presented, or does not say that one after it was dropped")
	}
	r.Write(nvc0.RegFaultUnitMask, 1<<nvc0.FaultUnitCE0)
	if rd(nvc0.RegFaultUnitMask) != 0 || rd(nvc0.RegPFIFOIntr)&nvc0.PFIFOIntrMMUFault != 0 {
		t.Fatal("MMU fault still pending after both releases")
	}
	// A PBDMA error goes once all its INTR bits are written back; nouveau's
	// NOP write to the method cache is taken and ignored.
	if !r.Write(nvc0.RegPBDMAMethod(nvc0.PBDMACE0), 0x80600008) || rd(nvc0.RegPBDMAChan(nvc0.PBDMACE0)) != 5 {
		t.Fatal("method-cache write")
	}
	r.Write(nvc0.RegPBDMAIntr(nvc0.PBDMACE0), nvc0.PBDMAIntrIllegalMthd)
	if rd(nvc0.RegPBDMAIntr(nvc0.PBDMACE0)) != nvc0.PBDMAIntrEmptySubc {
		t.Fatal("partial clear")
	}
	r.Write(nvc0.RegPBDMAIntr(nvc0.PBDMACE0), nvc0.PBDMAIntrEmptySubc)
	if r.Pending() {
		t.Fatal("still pending")
	}
	r.RunlistDone()
	if rd(nvc0.RegPFIFOIntr) != nvc0.PFIFOIntrRunlist || rd(nvc0.RegRunlistIntr) != nvc0.RunlistIntrDone {
		t.Fatal("runlist done")
	}
	r.Write(nvc0.RegRunlistIntr, nvc0.RunlistIntrDone)
	if r.Pending() {
		t.Fatal("runlist done not cleared")
	}
	if r.Write(nvc0.RegPBDMAChan(0), 1) || r.Write(0x1234, 1) {
		t.Fatal("a read-only or unknown register took a write")
	}
	if _, ok := r.Read(nvc0.RegFaultRecord0 + nvc0.NumFaultUnits*0x10 + 4); ok {
		t.Fatal("an offset past the records decoded")
	}
}
