package aggregator

import (
	"github.com/gpuvm/gpuvm/gpu/errreport"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/shadow"
)

// barShadow is a guest's BAR1 or BAR3 address space shadowed into the VM's
// slice of the physical BAR page table (shadow.BARSpace, the same mirroring
// code as channel page tables): guest aperture page i is physical aperture
// page slice.Base/4K + i. It is rebuilt when the guest writes its BAR
// instance register or flushes its BAR TLB.
type barShadow struct {
	v     *VGPU
	bar   int
	phys  *physBAR
	slice Region
	sp    *shadow.BARSpace
}

func newBARShadow(v *VGPU, bar int, phys *physBAR, slice Region) *barShadow {
	dst := phys.pt + nvc0.SmallPTEIndex(slice.Base)*nvc0.PTESize
	return &barShadow{v: v, bar: bar, phys: phys, slice: slice,
		sp: v.shadows.NewBARSpace(dst, int(slice.Size/nvc0.PageSize))}
}

// setInst handles a guest write of its BAR instance register. Only the
// page-table mode (MODE set, instance block in VRAM) maps anything: the
// "VRAM direct" mode (MODE clear) would expose all of VRAM at the BAR's
// offsets, so for a guest it means the aperture is off.
func (b *barShadow) setInst(val uint32) {
	if b.v.feat.PV {
		// PV apertures are mapped by hypercalls only.
		b.v.ctr.denied.Add(1)
		b.v.gripeLog("BAR instance write refused: PV apertures are mapped by hypercalls", "bar", b.bar, "value", val)
		return
	}
	valid := val&nvc0.BARInstModeVM != 0 && nvc0.InstTarget(val) == nvc0.MemTargetVRAM
	if !valid && val != 0 {
		b.v.gripeLog("BAR instance refused: direct mode or not in VRAM", "bar", b.bar, "value", val)
	}
	b.sp.SetInstance(valid, nvc0.InstDecode(val))
	b.v.agg.faults.bindBAR(b.index(), b.v, b.slice.Base, b.slice.Size, val)
	b.rebuild()
}

// index is 0 for BAR1 and 1 for BAR3.
func (b *barShadow) index() int {
	if b.bar == nvc0.BAR1 {
		return 0
	}
	return 1
}

// rebuild re-reads the guest's BAR address space, rewrites the changed
// entries of the physical slice and flushes the physical BAR TLB.
func (b *barShadow) rebuild() {
	v := b.v
	st, err := b.sp.Sync()
	if st.Changed() {
		if ferr := v.agg.phys.flush(b.phys.pd, true); ferr != nil {
			v.log.Error("BAR TLB flush", "bar", b.bar, "err", ferr)
		}
	}
	if err != nil {
		v.gripeLog("BAR shadow", "bar", b.bar, "err", briefErr(err))
	}
	v.remapStale = true
	v.updateRemap()
}

// clear unmaps the whole slice (vGPU teardown).
func (b *barShadow) clear() error {
	st, err := b.sp.Clear()
	if st.Changed() {
		if ferr := b.v.agg.phys.flush(b.phys.pd, true); ferr != nil && err == nil {
			err = ferr
		}
	}
	return err
}

// apertureRead handles a trapped guest read of BAR1 or BAR3. Reads of a
// channel's GP_GET, DMA_GET(_HI) or reference in the poll area return the
// GPU's value (from the shadow user area), and of GP_PUT the guest's last
// doorbell. A page the guest's BAR maps nothing at faults in the guest's
// own register file and never reaches the board.
func (v *VGPU) apertureRead(bar int, off uint64) uint32 {
	b := v.barShadowOf(bar)
	if off >= b.slice.Size {
		v.deny("read", bar, off, 0)
		return 0
	}
	if ch, f, ok := v.pollWord(bar, off); ok {
		switch f {
		case fieldGPPut:
			return v.chans[ch].put
		case fieldGPGet, fieldGPUWritten:
			if val, ok := v.shadowUserWord(ch, off-v.pollBase-uint64(ch)*nvc0.UserAreaSize); ok {
				return val
			}
		}
	}
	if mapped, _ := b.sp.Access(int(off / nvc0.PageSize)); !mapped {
		b.fault(off, false, nvc0.FaultReasonPageNotPresent)
		return 0
	}
	return v.agg.gpu.Read32(bar, b.slice.Base+off)
}

// fault files a BAR fault of the guest's own access in its register file,
// as the board would report it (unit BAR1/BAR3, hub client BAR read or
// write, the guest's BAR instance and aperture offset).
func (b *barShadow) fault(off uint64, write bool, reason uint32) {
	unit, client := nvc0.FaultUnitBAR1, uint32(nvc0.FaultClientBARRead)
	if b.bar == nvc0.BAR3 {
		unit = nvc0.FaultUnitBAR3
	}
	typ := reason | nvc0.FaultTypeHub
	if write {
		client = nvc0.FaultClientBARWrite
		typ |= nvc0.FaultTypeWrite
	}
	inst := b.v.emu[nvc0.RegBAR1Inst]
	if b.bar == nvc0.BAR3 {
		inst = b.v.emu[nvc0.RegBAR3Inst]
	}
	b.v.deliverFault(unit, errreport.Fault{
		Inst: inst & (nvc0.ChanInstMask | 3<<nvc0.ChanInstTargetShift),
		VALo: uint32(off), VAHi: uint32(off >> 32),
		Type: typ | client<<nvc0.FaultTypeClientShift,
	})
}

// apertureWrite handles a trapped guest write of BAR1 or BAR3: the write
// reaches the physical aperture slice (so the guest's own memory holds what
// it wrote), the page tracker learns of writes to watched guest pages, and
// a GP_PUT write in the guest's poll area rings its channel.
func (v *VGPU) apertureWrite(bar int, off uint64, val uint32) {
	b := v.barShadowOf(bar)
	if off >= b.slice.Size {
		v.deny("write", bar, off, val)
		return
	}
	switch mapped, ro := b.sp.Access(int(off / nvc0.PageSize)); {
	case !mapped:
		b.fault(off, true, nvc0.FaultReasonPageNotPresent)
	case ro:
		b.fault(off, true, nvc0.FaultReasonReadOnly)
	default:
		v.agg.gpu.Write32(bar, b.slice.Base+off, val)
	}
	if ch, f, ok := v.pollWord(bar, off); ok && f == fieldGPPut {
		// The guest's GP_PUT never reaches the GPU's user area: only the
		// dispatcher writes that, when the policy releases the submission.
		v.doorbell(ch, val)
	}
	if g := b.sp.GuestPage(int(off / nvc0.PageSize)); g != shadow.NoGuestPage {
		v.noteGuestWrite(g+off%nvc0.PageSize, 4)
	}
}

func (v *VGPU) barShadowOf(bar int) *barShadow {
	if bar == nvc0.BAR1 {
		return v.bars[0]
	}
	return v.bars[1]
}
