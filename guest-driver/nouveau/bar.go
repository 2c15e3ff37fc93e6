package nouveau

import (
	"fmt"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/internal/rangealloc"
)

// barSpace is the address space behind a BAR aperture (the "BAR1/BAR3
// channel"): its RAMIN, page directory and one small-page table, which covers
// the whole aperture (128 MiB ≥ the BAR sizes). In PV modes the aggregator
// holds them (ramin, pd and pt are nil) and maps pages by hypercall.
type barSpace struct {
	d     *Device
	bar   int
	ramin *kobj
	pd    *kobj
	pt    *kobj
	va    *rangealloc.Allocator
}

func (d *Device) newBARSpace(bar int, size uint64) (*barSpace, error) {
	b := &barSpace{d: d, bar: bar, va: rangealloc.New(0, size)}
	if d.pv != nil {
		return b, nil
	}
	var err error
	if b.ramin, err = d.newKobj(nvc0.RAMINSize, nvc0.PageSize); err != nil {
		return nil, fmt.Errorf("BAR%d RAMIN: %w", bar, err)
	}
	if b.pd, err = d.newKobj(nvc0.PageDirSize, nvc0.PageSize); err != nil {
		return nil, fmt.Errorf("BAR%d page directory: %w", bar, err)
	}
	if b.pt, err = d.newKobj(nvc0.SmallPTSize, nvc0.PageSize); err != nil {
		return nil, fmt.Errorf("BAR%d page table: %w", bar, err)
	}
	w0, w1 := nvc0.PDE{SmallPresent: true, SmallAddr: b.pt.addr}.Encode()
	d.kwr32(b.pd, 0, w0)
	d.kwr32(b.pd, 4, w1)
	d.kwr64(b.ramin, nvc0.RAMINPageDir, b.pd.addr)
	d.kwr64(b.ramin, nvc0.RAMINAddrLimit, size-1)
	return b, nil
}

// mapPages maps size bytes at aperture offset va to memory at phys (VRAM, or
// system memory when sys), then flushes the BAR's TLB.
func (b *barSpace) mapPages(va, phys, size uint64, sys bool) error {
	target := uint32(nvc0.TargetVRAM)
	if sys {
		target = nvc0.TargetSysSnooped
	}
	pte := func(off uint64) nvc0.PTE {
		return nvc0.PTE{Present: true, Addr: phys + off, Target: target, Volatile: sys}
	}
	if b.d.pv != nil {
		return b.d.pv.barMap(b.bar, va, size, pte)
	}
	for off := uint64(0); off < size; off += nvc0.PageSize {
		lo, hi := pte(off).Encode()
		idx := nvc0.SmallPTEIndex(va + off)
		b.d.kwr32(b.pt, idx*nvc0.PTESize, lo)
		b.d.kwr32(b.pt, idx*nvc0.PTESize+4, hi)
	}
	return b.d.flushTLB(b.pd.addr, true)
}

func (b *barSpace) unmapPages(va, size uint64) error {
	if b.d.pv != nil {
		return b.d.pv.barUnmap(b.bar, va, size)
	}
	for off := uint64(0); off < size; off += nvc0.PageSize {
		idx := nvc0.SmallPTEIndex(va + off)
		b.d.kwr32(b.pt, idx*nvc0.PTESize, 0)
		b.d.kwr32(b.pt, idx*nvc0.PTESize+4, 0)
	}
	return b.d.flushTLB(b.pd.addr, true)
}

// initBARs builds BAR3 through PRAMIN, then BAR1 through BAR3, then the poll
// area and the playlists, as nouveau's gf100 BAR and FIFO code does.
func (d *Device) initBARs() error {
	bar3, err := d.newBARSpace(nvc0.BAR3, d.opts.BAR3Size) // d.bar3 is nil: written through PRAMIN
	if err != nil {
		return err
	}
	if d.pv == nil { // in PV modes the aggregator binds the BARs' spaces
		d.wr(nvc0.RegBAR3Inst, nvc0.InstEncode(bar3.ramin.addr, nvc0.BARInstModeVM))
		if err := d.flushTLB(bar3.pd.addr, true); err != nil {
			return fmt.Errorf("BAR3: %w", err)
		}
	}
	d.bar3 = bar3

	bar1, err := d.newBARSpace(nvc0.BAR1, d.opts.BAR1Size)
	if err != nil {
		return err
	}
	if d.pv == nil {
		d.wr(nvc0.RegBAR1Inst, nvc0.InstEncode(bar1.ramin.addr, nvc0.BARInstModeVM))
		if err := d.flushTLB(bar1.pd.addr, true); err != nil {
			return fmt.Errorf("BAR1: %w", err)
		}
	}
	d.bar1 = bar1

	// The user areas (doorbell pages) of all channels, seen through BAR1 as the poll area.
	const userSize = nvc0.MaxChannels * nvc0.UserAreaSize
	ua, err := d.AllocVRAM(userSize, nvc0.PageSize)
	if err != nil {
		return fmt.Errorf("user area: %w", err)
	}
	d.userArea = &kobj{addr: ua, size: userSize}
	poll, err := bar1.va.Alloc(userSize, nvc0.PageSize)
	if err != nil {
		return fmt.Errorf("poll area: %w", err)
	}
	if err := bar1.mapPages(poll, ua, userSize, false); err != nil {
		return fmt.Errorf("poll area: %w", err)
	}
	d.pollBase = poll
	d.wr(nvc0.RegPollArea, nvc0.PollAreaEnable|uint32(poll>>nvc0.PageShift)&nvc0.PollAreaMask)

	for i := range d.playlist {
		if d.playlist[i], err = d.newKobj(nvc0.PageSize, nvc0.PageSize); err != nil {
			return fmt.Errorf("playlist: %w", err)
		}
	}
	return nil
}

// MapBAR1 maps size bytes of VRAM at vram into the BAR1 aperture and returns
// the aperture offset, for CPU access to device memory (small transfers).
func (d *Device) MapBAR1(vram, size uint64) (uint64, error) {
	size = pageRound(size)
	va, err := d.bar1.va.Alloc(size, nvc0.PageSize)
	if err != nil {
		return 0, fmt.Errorf("BAR1 aperture: %w", err)
	}
	if err := d.bar1.mapPages(va, vram, size, false); err != nil {
		d.bar1.va.Free(va)
		return 0, err
	}
	return va, nil
}

// UnmapBAR1 undoes MapBAR1.
func (d *Device) UnmapBAR1(va uint64) error {
	size, ok := d.bar1.va.SizeOf(va)
	if !ok {
		return fmt.Errorf("BAR1 unmap %#x: not mapped", va)
	}
	if err := d.bar1.unmapPages(va, size); err != nil {
		return err
	}
	return d.bar1.va.Free(va)
}

func pageRound(n uint64) uint64 { return (n + nvc0.PageSize - 1) &^ (nvc0.PageSize - 1) }
