// Package errreport is the GF100 PFIFO error-report register file as data:
// MMU fault records per fault unit (0x2800 + 0x10·unit, announced in the
// unit mask 0x259C and PFIFO_INTR bit 28), PBDMA errors (INTR, method,
// data and channel of each PBDMA, announced in 0x25A0 and PFIFO_INTR bit
// 29), the runlist-done interrupt (0x2A00, PFIFO_INTR bit 30) and
// PFIFO_INTR's latched bits (nvkm/engine/fifo/gf100.c gf100_fifo_intr,
// gf100_fifo_intr_mmu_fault, gf100_runq_intr, gf100_fifo_intr_runlist). The
// simulated board presents its own errors through it and the aggregator
// presents each VM's (translated) errors through another instance.
//
// Software reads the presented record of a unit or PBDMA and then releases
// it (writes the unit's bit to 0x259C, or the INTR bits back to the PBDMA);
// the next record queued for that unit or PBDMA is then presented. A real
// engine stalls until its error is handled; a Reports queues instead, up to
// a bound per unit and PBDMA, and counts what it drops.
package errreport

import (
	"sync"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// Fault is one MMU fault as a fault unit's record shows it.
type Fault struct {
	Inst       uint32 // instance word: address >> 12 and memory target
	VALo, VAHi uint32
	Type       uint32 // nvc0.FaultType* fields
}

// VA returns the faulting address.
func (f Fault) VA() uint64 { return uint64(f.VAHi)<<32 | uint64(f.VALo) }

// PBDMAError is one push-buffer or method error as a PBDMA shows it.
type PBDMAError struct {
	Intr   uint32 // nvc0.PBDMAIntr* bits
	Method uint32 // method cache word (nvc0.PBDMAMethod* fields)
	Data   uint32
	Chan   uint32 // channel register (nvc0.PBDMAChan* fields)
}

// Reports is the register file. It is safe for concurrent use.
type Reports struct {
	max int // records queued per unit or PBDMA, the presented one included

	mu       sync.Mutex
	latched  uint32 // PFIFO_INTR bits that latch (0, 8, 16, 24)
	intrEn   uint32
	chanErr  uint32 // RegChanTableError
	schedErr uint32 // RegSchedError
	runlist  uint32 // RegRunlistIntr
	faults   [nvc0.NumFaultUnits][]Fault
	pbdma    [nvc0.NumPBDMAs][]PBDMAError
	pbdmaEn  [nvc0.NumPBDMAs]uint32
	dropped  uint64
}

// New returns an empty register file that queues up to limit records per
// unit and per PBDMA (at least 1).
func New(limit int) *Reports { return &Reports{max: max(limit, 1)} }

// AddFault queues an MMU fault record for unit u; it reports false (and
// counts a drop) if u is not a unit or its queue is full. A drop sets
// nvc0.FaultTypeOverflow in the last queued record, so software learns
// that records were lost after it.
func (r *Reports) AddFault(u int, f Fault) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if u < 0 || u >= nvc0.NumFaultUnits {
		r.dropped++
		return false
	}
	if q := r.faults[u]; len(q) >= r.max {
		r.dropped++
		q[len(q)-1].Type |= nvc0.FaultTypeOverflow
		return false
	}
	r.faults[u] = append(r.faults[u], f)
	return true
}

// AddPBDMA queues an error on PBDMA p, as AddFault; a drop sets
// nvc0.PBDMAChanOverflow in the last queued error's channel register.
func (r *Reports) AddPBDMA(p int, e PBDMAError) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p < 0 || p >= nvc0.NumPBDMAs {
		r.dropped++
		return false
	}
	if q := r.pbdma[p]; len(q) >= r.max {
		r.dropped++
		q[len(q)-1].Chan |= nvc0.PBDMAChanOverflow
		return false
	}
	r.pbdma[p] = append(r.pbdma[p], e)
	return true
}

// ChanTableError latches PFIFO_INTR bit 0 with the error code.
func (r *Reports) ChanTableError(code uint32) {
	r.mu.Lock()
	r.chanErr = code
	r.latched |= nvc0.PFIFOIntrChanTableError
	r.mu.Unlock()
}

// SchedError latches PFIFO_INTR bit 8 with the error code.
func (r *Reports) SchedError(code uint32) {
	r.mu.Lock()
	r.schedErr = code
	r.latched |= nvc0.PFIFOIntrSchedError
	r.mu.Unlock()
}

// RunlistDone raises the runlist-done interrupt (RegRunlistIntr bit 28,
// PFIFO_INTR bit 30), which a driver waits on after a playlist update.
func (r *Reports) RunlistDone() {
	r.mu.Lock()
	r.runlist |= nvc0.RunlistIntrDone
	r.mu.Unlock()
}

// Dropped returns how many records were dropped on full queues.
func (r *Reports) Dropped() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.dropped
}

// Pending reports whether any record waits or any bit is latched.
func (r *Reports) Pending() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.intrLocked() != 0
}

// Clear drops every record and latched bit.
func (r *Reports) Clear() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.latched, r.chanErr, r.schedErr, r.runlist = 0, 0, 0, 0
	r.faults = [nvc0.NumFaultUnits][]Fault{}
	r.pbdma = [nvc0.NumPBDMAs][]PBDMAError{}
}

func (r *Reports) intrLocked() uint32 {
	v := r.latched
	if r.runlist != 0 {
		v |= nvc0.PFIFOIntrRunlist
	}
	for _, q := range r.faults {
		if len(q) > 0 {
			v |= nvc0.PFIFOIntrMMUFault
			break
		}
	}
	for _, q := range r.pbdma {
		if len(q) > 0 {
			v |= nvc0.PFIFOIntrPBDMA
			break
		}
	}
	return v
}

// Offsets returns every BAR0 offset the register file decodes.
func Offsets() []uint32 {
	offs := []uint32{nvc0.RegPFIFOIntr, nvc0.RegPFIFOIntrEn, nvc0.RegChanTableError, nvc0.RegSchedError,
		nvc0.RegFaultUnitMask, nvc0.RegPBDMAIntrSource, nvc0.RegRunlistIntr}
	for u := range nvc0.NumFaultUnits {
		offs = append(offs, nvc0.RegFaultInst(u), nvc0.RegFaultVALo(u), nvc0.RegFaultVAHi(u), nvc0.RegFaultType(u))
	}
	for p := range nvc0.NumPBDMAs {
		offs = append(offs, nvc0.RegPBDMAIntr(p), nvc0.RegPBDMAIntrEn(p), nvc0.RegPBDMAMethod(p), nvc0.RegPBDMAData(p), nvc0.RegPBDMAChan(p))
	}
	return offs
}

// Read returns the register at off; ok is false for an offset it does not
// decode.
func (r *Reports) Read(off uint32) (val uint32, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch off {
	case nvc0.RegPFIFOIntr:
		return r.intrLocked(), true
	case nvc0.RegPFIFOIntrEn:
		return r.intrEn, true
	case nvc0.RegChanTableError:
		return r.chanErr, true
	case nvc0.RegSchedError:
		return r.schedErr, true
	case nvc0.RegRunlistIntr:
		return r.runlist, true
	case nvc0.RegFaultUnitMask:
		var m uint32
		for u, q := range r.faults {
			if len(q) > 0 {
				m |= 1 << u
			}
		}
		return m, true
	case nvc0.RegPBDMAIntrSource:
		var m uint32
		for p, q := range r.pbdma {
			if len(q) > 0 {
				m |= 1 << p
			}
		}
		return m, true
	}
	if u, w, ok := faultField(off); ok {
		if len(r.faults[u]) == 0 {
			return 0, true
		}
		f := r.faults[u][0]
		return [4]uint32{f.Inst, f.VALo, f.VAHi, f.Type}[w], true
	}
	if p, reg, ok := pbdmaField(off); ok {
		if reg == nvc0.RegPBDMAIntrEn0 {
			return r.pbdmaEn[p], true
		}
		if len(r.pbdma[p]) == 0 {
			return 0, true
		}
		e := r.pbdma[p][0]
		switch reg {
		case nvc0.RegPBDMAIntr0:
			return e.Intr, true
		case nvc0.RegPBDMAMethod0:
			return e.Method, true
		case nvc0.RegPBDMAData0:
			return e.Data, true
		case nvc0.RegPBDMAChan0:
			return e.Chan, true
		}
	}
	return 0, false
}

// Write writes the register at off; ok is false for an offset it does not
// decode or a read-only one. PFIFO_INTR's latched bits are write-1-to-
// clear, its level bits follow their sources; a unit's bit written to
// 0x259C releases its record; INTR bits written back to a PBDMA clear them
// and, once none is left, release its error. nouveau overwrites a PBDMA's
// cached method with a NOP before the clear: that write is taken and
// ignored.
func (r *Reports) Write(off, v uint32) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch off {
	case nvc0.RegPFIFOIntr:
		r.latched &^= v
		return true
	case nvc0.RegPFIFOIntrEn:
		r.intrEn = v
		return true
	case nvc0.RegFaultUnitMask:
		for u := range r.faults {
			if v&(1<<u) != 0 && len(r.faults[u]) > 0 {
				r.faults[u] = r.faults[u][1:]
			}
		}
		return true
	case nvc0.RegPBDMAIntrSource:
		return true // follows the PBDMAs' INTR
	case nvc0.RegRunlistIntr:
		r.runlist &^= v
		return true
	}
	p, reg, ok := pbdmaField(off)
	if !ok {
		return false
	}
	switch reg {
	case nvc0.RegPBDMAIntrEn0:
		r.pbdmaEn[p] = v
	case nvc0.RegPBDMAMethod0:
	case nvc0.RegPBDMAIntr0:
		if q := r.pbdma[p]; len(q) > 0 {
			q[0].Intr &^= v
			if q[0].Intr == 0 {
				r.pbdma[p] = q[1:]
			}
		}
	default:
		return false
	}
	return true
}

// faultField decodes a fault record offset into unit and word.
func faultField(off uint32) (u, w int, ok bool) {
	if off < nvc0.RegFaultRecord0 || off >= nvc0.RegFaultRecord0+nvc0.NumFaultUnits*0x10 || off%4 != 0 {
		return 0, 0, false
	}
	rel := off - nvc0.RegFaultRecord0
	return int(rel / 0x10), int(rel%0x10) / 4, true
}

// pbdmaField decodes a PBDMA register offset into the PBDMA and the
// register's PBDMA-0 offset.
func pbdmaField(off uint32) (p int, reg uint32, ok bool) {
	for p := range nvc0.NumPBDMAs {
		base := uint32(p) * nvc0.PBDMAStride
		switch off - base {
		case nvc0.RegPBDMAIntr0, nvc0.RegPBDMAIntrEn0, nvc0.RegPBDMAMethod0, nvc0.RegPBDMAData0, nvc0.RegPBDMAChan0:
			if off >= base {
				return p, off - base, true
			}
		}
	}
	return 0, 0, false
}
