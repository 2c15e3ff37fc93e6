package nouveau

import (
	"github.com/gpuvm/gpuvm/gpu"
	"github.com/gpuvm/gpuvm/gpu/hwseq"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// kobj is a kernel object in VRAM (page directory, page table, RAMIN,
// playlist) that the driver writes with the CPU: through its BAR3 mapping
// once BAR3 is up, or through the PRAMIN window.
type kobj struct {
	addr, size uint64
	bar3       uint64
	inBAR3     bool
}

// newKobj allocates and zeroes a kernel object, mapping it into BAR3 when the
// driver writes kernel objects through BAR3 and BAR3 is up.
func (d *Device) newKobj(size, align uint64) (*kobj, error) {
	return d.newKobjZeroing(size, align, size)
}

// newKobjZeroing is newKobj zeroing only the first zero bytes.
func (d *Device) newKobjZeroing(size, align, zero uint64) (*kobj, error) {
	addr, err := d.AllocVRAM(size, align)
	if err != nil {
		return nil, err
	}
	o := &kobj{addr: addr, size: size}
	if d.opts.PageTables == ViaBAR3 && d.bar3 != nil {
		// A full BAR3 aperture (a vGPU's slice is small) leaves the object to
		// the PRAMIN window, as nouveau falls back when its BAR is exhausted.
		if va, err := d.bar3.va.Alloc(size, nvc0.PageSize); err == nil {
			if err := d.bar3.mapPages(va, addr, size, false); err != nil {
				d.bar3.va.Free(va)
				d.FreeVRAM(addr)
				return nil, err
			}
			o.bar3, o.inBAR3 = va, true
		}
	}
	d.zeroKobj(o, min(zero, size))
	return o, nil
}

// zeroKobj clears the first n bytes of o.
func (d *Device) zeroKobj(o *kobj, n uint64) { d.clearKobj(o, 0, n) }

// clearKobj clears n bytes of o from off: word by word, or in runs when
// the MMIO stores a run with one string instruction (gpu.Filler; on Xen
// one trap per run instead of one per word).
func (d *Device) clearKobj(o *kobj, off, n uint64) {
	f, ok := d.mmio.(gpu.Filler)
	switch {
	case !ok:
		for end := off + n; off < end; off += 4 {
			d.kwr32(o, off, 0)
		}
	case o.inBAR3:
		f.Fill32(nvc0.BAR3, o.bar3+off, 0, int(n/4))
	default:
		for end := off + n; off < end; {
			d.prMu.Lock()
			p := d.praminOffset(o.addr + off)
			run := min(end-off, nvc0.PRAMINBase+nvc0.PRAMINSize-p)
			f.Fill32(nvc0.BAR0, p, 0, int(run/4))
			d.prMu.Unlock()
			off += run
		}
	}
}

// freeKobj unmaps and frees a kernel object.
func (d *Device) freeKobj(o *kobj) error {
	if o == nil {
		return nil
	}
	if o.inBAR3 {
		if err := d.bar3.unmapPages(o.bar3, o.size); err != nil {
			return err
		}
		d.bar3.va.Free(o.bar3)
	}
	return d.FreeVRAM(o.addr)
}

func (d *Device) kwr32(o *kobj, off uint64, v uint32) {
	if o.inBAR3 {
		d.mmio.Write32(nvc0.BAR3, o.bar3+off, v)
		return
	}
	d.praminWrite32(o.addr+off, v)
}

func (d *Device) krd32(o *kobj, off uint64) uint32 {
	if o.inBAR3 {
		return d.mmio.Read32(nvc0.BAR3, o.bar3+off)
	}
	return d.praminRead32(o.addr + off)
}

func (d *Device) kwr64(o *kobj, off uint64, v uint64) {
	d.kwr32(o, off, uint32(v))
	d.kwr32(o, off+4, uint32(v>>32))
}

// praminOffset moves the PRAMIN window (64 KiB granular, 1 MiB wide) so that
// it covers addr, if it does not already, and returns addr's BAR0 offset.
// Callers hold prMu.
func (d *Device) praminOffset(addr uint64) uint64 {
	base := addr &^ (1<<nvc0.PRAMINWindowShift - 1)
	if off := addr - d.window; !d.windowSet || addr < d.window || off >= nvc0.PRAMINSize {
		d.wr(nvc0.RegPRAMINWindow, uint32(base>>nvc0.PRAMINWindowShift))
		d.window, d.windowSet = base, true
	}
	return nvc0.PRAMINBase + addr - d.window
}

func (d *Device) praminWrite32(addr uint64, v uint32) {
	d.prMu.Lock()
	d.mmio.Write32(nvc0.BAR0, d.praminOffset(addr), v)
	d.prMu.Unlock()
}

func (d *Device) praminRead32(addr uint64) uint32 {
	d.prMu.Lock()
	defer d.prMu.Unlock()
	return d.mmio.Read32(nvc0.BAR0, d.praminOffset(addr))
}

// flushTLB invalidates the GPU's cached translations of the address space
// whose page directory is at pd, as nouveau does after every page-table change.
func (d *Device) flushTLB(pd uint64, bar bool) error {
	d.flushMu.Lock()
	defer d.flushMu.Unlock()
	return hwseq.FlushTLB(d.mmio, pd, bar, d.opts.Timeout)
}
