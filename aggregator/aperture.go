package aggregator

import (
	"encoding/binary"
	"time"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// noGuestPage marks an aperture page that maps no guest VRAM.
const noGuestPage = ^uint64(0)

// barShadow is the shadow of a guest's BAR1 or BAR3 page table in the VM's
// slice of the physical BAR page table: guest aperture page i is physical
// aperture page slice.Base/4K + i, with the guest's PTE translated.
type barShadow struct {
	v     *VGPU
	bar   int
	phys  *physBAR
	slice Region

	valid      bool
	guestRAMIN uint64
	guestPD    uint64
	guestPT    uint64     // guest VRAM address of the guest's small-page table for PDE 0
	ptes       []nvc0.PTE // current shadow entries
	guest      []uint64   // guest VRAM address each aperture page maps, or noGuestPage
}

func newBARShadow(v *VGPU, bar int, phys *physBAR, slice Region) *barShadow {
	n := slice.Size / nvc0.PageSize
	b := &barShadow{v: v, bar: bar, phys: phys, slice: slice, ptes: make([]nvc0.PTE, n), guest: make([]uint64, n)}
	for i := range b.guest {
		b.guest[i] = noGuestPage
	}
	return b
}

// setInst handles a guest write of its BAR instance register.
func (b *barShadow) setInst(val uint32) {
	b.valid = val&nvc0.BARInstValid != 0
	b.guestRAMIN = nvc0.InstDecode(val)
	b.rebuild()
}

// rebuild re-reads the guest's BAR address space and rewrites the changed
// entries of the physical slice, then flushes the physical BAR TLB.
func (b *barShadow) rebuild() {
	start := time.Now()
	v := b.v
	want := make([]nvc0.PTE, len(b.ptes))
	guest := make([]uint64, len(b.guest))
	for i := range guest {
		guest[i] = noGuestPage
	}
	b.guestPD, b.guestPT = noGuestPage, noGuestPage
	if b.valid {
		b.scanGuest(want, guest)
	}
	changed := false
	for i := range want {
		if want[i] == b.ptes[i] {
			continue
		}
		j := i
		for j < len(want) && want[j] != b.ptes[j] {
			j++
		}
		if err := v.agg.phys.setBARPTEs(b.phys, b.slice.Base+uint64(i)*nvc0.PageSize, want[i:j]); err != nil {
			v.log.Error("BAR shadow write", "bar", b.bar, "err", err)
			return
		}
		copy(b.ptes[i:j], want[i:j])
		changed = true
	}
	b.guest = guest
	v.barScans++
	v.barPTEs += uint64(len(want))
	if changed {
		if err := v.agg.phys.flush(b.phys.pd, true); err != nil {
			v.log.Error("BAR TLB flush", "bar", b.bar, "err", err)
		}
	}
	v.barShadowTime += time.Since(start)
	v.updateRemap()
}

// scanGuest reads the guest's BAR RAMIN, PDE 0 and small-page table and
// translates the entries that fall in the slice. Anything outside the
// guest's VRAM slice is dropped.
func (b *barShadow) scanGuest(want []nvc0.PTE, guest []uint64) {
	v := b.v
	read := func(g, n uint64) []byte {
		phys, ok := v.tr.VRAMAddr(g, n)
		if !ok {
			return nil
		}
		buf := make([]byte, n)
		if v.agg.gpu.ReadVRAM(buf, phys) != nil {
			return nil
		}
		return buf
	}
	ramin := read(b.guestRAMIN, nvc0.RAMINSize)
	if ramin == nil {
		return
	}
	b.guestPD = binary.LittleEndian.Uint64(ramin[nvc0.RAMINPageDir:])
	limit := binary.LittleEndian.Uint64(ramin[nvc0.RAMINAddrLimit:])
	pde := read(b.guestPD, nvc0.PDESize)
	if pde == nil {
		return
	}
	d := nvc0.DecodePDE(binary.LittleEndian.Uint32(pde), binary.LittleEndian.Uint32(pde[4:]))
	if !d.SmallPresent || d.SmallSys {
		return
	}
	n := uint64(len(want))
	if pages := (limit + 1) / nvc0.PageSize; limit != 0 && pages < n {
		n = pages
	}
	pt := read(d.SmallAddr, n*nvc0.PTESize)
	if pt == nil {
		return
	}
	b.guestPT = d.SmallAddr
	for i := range n {
		e := nvc0.DecodePTE(binary.LittleEndian.Uint32(pt[i*nvc0.PTESize:]), binary.LittleEndian.Uint32(pt[i*nvc0.PTESize+4:]))
		if !e.Present {
			continue
		}
		if s, ok := v.tr.PTE(e); ok {
			want[i] = s
			if !e.IsSystem() {
				guest[i] = e.Addr
			}
		}
	}
}

// clear unmaps the whole slice (vGPU teardown).
func (b *barShadow) clear() error {
	b.valid = false
	zero := make([]nvc0.PTE, len(b.ptes))
	if err := b.v.agg.phys.setBARPTEs(b.phys, b.slice.Base, zero); err != nil {
		return err
	}
	copy(b.ptes, zero)
	return b.v.agg.phys.flush(b.phys.pd, true)
}

// sensitive reports whether guest VRAM page g holds this BAR's own RAMIN,
// page directory or page table.
func (b *barShadow) sensitive(g uint64) bool {
	pg := g &^ (nvc0.PageSize - 1)
	in := func(base, size uint64) bool {
		return base != noGuestPage && pg+nvc0.PageSize > base && pg < base+size
	}
	return in(b.guestRAMIN, nvc0.RAMINSize) || in(b.guestPD, nvc0.PageDirSize) || in(b.guestPT, nvc0.SmallPTSize)
}

// apertureRead handles a trapped guest read of BAR1 or BAR3.
func (v *VGPU) apertureRead(bar int, off uint64) uint32 {
	b := v.barShadowOf(bar)
	if off >= b.slice.Size {
		v.deny("read", bar, off, 0)
		return 0
	}
	if ch, ok := v.doorbellChannel(bar, off); ok {
		return v.chans[ch].put // what the guest last rang, queued or not
	}
	return v.agg.gpu.Read32(bar, b.slice.Base+off)
}

// apertureWrite handles a trapped guest write of BAR1 or BAR3: shadows learn
// of writes to watched guest pages, the write reaches the physical aperture
// slice, and a GP_PUT write in the guest's poll area rings its channel.
func (v *VGPU) apertureWrite(bar int, off uint64, val uint32) {
	b := v.barShadowOf(bar)
	if off >= b.slice.Size {
		v.deny("write", bar, off, val)
		return
	}
	if ch, ok := v.doorbellChannel(bar, off); ok {
		// The guest's GP_PUT never reaches the user page: only the
		// dispatcher writes the physical GP_PUT, when the policy releases
		// the submission, so the GPU cannot run ahead of the scheduler.
		v.doorbell(ch, val)
		return
	}
	if g := b.guest[off/nvc0.PageSize]; g != noGuestPage {
		v.noteGuestWrite(g+off%nvc0.PageSize, 4)
	}
	v.agg.gpu.Write32(bar, b.slice.Base+off, val)
}

// doorbellChannel reports whether a BAR1 offset is the GP_PUT word of one of
// the guest's channels in its poll area.
func (v *VGPU) doorbellChannel(bar int, off uint64) (int, bool) {
	if bar != nvc0.BAR1 || !v.pollOn || off < v.pollBase {
		return 0, false
	}
	rel := off - v.pollBase
	ch := rel / nvc0.UserAreaSize
	if rel%nvc0.UserAreaSize != nvc0.UserGPPut || ch >= uint64(len(v.chans)) {
		return 0, false
	}
	return int(ch), true
}

func (v *VGPU) barShadowOf(bar int) *barShadow {
	if bar == nvc0.BAR1 {
		return v.bars[0]
	}
	return v.bars[1]
}
