package nouveau

import (
	"fmt"
	"sync"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/hypercall"
	"github.com/gpuvm/gpuvm/internal/rangealloc"
)

// VM is a GPU address space: a page directory and small-page tables,
// created on demand, one per 128 MiB of virtual addresses in use. The driver
// writes them in VRAM (PVOff) or the aggregator holds them (PV modes).
type VM struct {
	d    *Device
	gen  uint64 // the device's generation it was made in (reset.go)
	pd   *kobj  // the page directory in VRAM (PVOff)
	pvPD uint32 // the aggregator's handle of the page directory (PV modes)
	mmu  vmMMU
	va   *rangealloc.Allocator
	mu   sync.Mutex
	pts  map[uint64]pageTable // page-directory index → small-page table
}

// pageTable is a small-page table: an object in VRAM (PVOff) or an
// aggregator handle (PV modes).
type pageTable struct {
	obj    *kobj
	handle uint32
}

// vmMMU builds a VM's page tables, chosen at NewVM: fvMMU writes them in
// VRAM as nouveau does, pvMMU (pv.go) has the aggregator write them.
// Callers hold vm.mu.
type vmMMU interface {
	// newTable creates the small-page table of page-directory entry pde and
	// links it in.
	newTable(pde uint64) (pageTable, error)
	// write sets count entries of pt from index idx: entry i to pte(i), or
	// clears them when pte is nil.
	write(pt pageTable, idx, count uint64, pte func(i uint64) nvc0.PTE) error
	// finish ends an update (the writes since the last finish) that failed
	// with err (nil: succeeded): it flushes the VM's TLB and returns err or
	// the flush's error. fvMMU does not flush after a failure (as the
	// driver always did); pvMMU still makes the calls it queued and the
	// VM_FLUSH unless a hypercall failed.
	finish(err error) error
	// close frees the tables and the page directory.
	close(pts map[uint64]pageTable) error
}

// vmBase and vmLimit bound the virtual addresses the driver hands out; below
// vmBase stays unmapped so that null-ish pointers fault.
const (
	vmBase  = 1 << 28
	vmLimit = nvc0.VASize
)

// NewVM creates an empty address space.
func (d *Device) NewVM() (*VM, error) {
	vm := &VM{d: d, gen: d.gen.Load(), va: rangealloc.New(vmBase, vmLimit-vmBase), pts: map[uint64]pageTable{}}
	var err error
	if d.pv != nil {
		vm.pvPD, err = d.pv.alloc(hypercall.KindPageDir)
		vm.mmu = &pvMMU{vm: vm}
	} else {
		vm.pd, err = d.newKobj(nvc0.PageDirSize, nvc0.PageSize)
		vm.mmu = fvMMU{vm}
	}
	if err != nil {
		return nil, fmt.Errorf("page directory: %w", err)
	}
	return vm, nil
}

// PageDir returns the VRAM address of the page directory, or 0 in PV modes
// (the aggregator holds it).
func (vm *VM) PageDir() uint64 {
	if vm.pd == nil {
		return 0
	}
	return vm.pd.addr
}

// PVPageDir returns the aggregator's handle of the page directory in the PV
// modes (0 otherwise), for tools and tests that issue hypercalls of their
// own against the VM.
func (vm *VM) PVPageDir() uint32 { return vm.pvPD }

// AllocVA reserves size bytes of virtual addresses.
func (vm *VM) AllocVA(size, align uint64) (uint64, error) {
	if align < nvc0.PageSize {
		align = nvc0.PageSize
	}
	va, err := vm.va.Alloc(pageRound(size), align)
	if err != nil {
		return 0, fmt.Errorf("GPU virtual addresses: %w", err)
	}
	return va, nil
}

// ReserveVA reserves size bytes of virtual addresses at va, which must be
// page-aligned and free (a restored buffer keeps the address its user
// holds). FreeVA releases them.
func (vm *VM) ReserveVA(va, size uint64) error {
	if va%nvc0.PageSize != 0 {
		return fmt.Errorf("GPU virtual address %#x: not page-aligned", va)
	}
	if err := vm.va.Reserve(va, pageRound(size)); err != nil {
		return fmt.Errorf("GPU virtual addresses at %#x: %w", va, err)
	}
	return nil
}

// FreeVA releases virtual addresses from AllocVA.
func (vm *VM) FreeVA(va uint64) error { return vm.va.Free(va) }

// MapVRAM maps size bytes of VRAM at phys to va.
func (vm *VM) MapVRAM(va, phys, size uint64) error {
	return vm.mapRange(va, size, func(off uint64) nvc0.PTE {
		return nvc0.PTE{Present: true, Addr: phys + off, Target: nvc0.TargetVRAM}
	})
}

// MapHost maps size bytes of DMA memory at bus address bus to va.
func (vm *VM) MapHost(va, bus, size uint64) error {
	return vm.mapRange(va, size, func(off uint64) nvc0.PTE {
		return nvc0.PTE{Present: true, Addr: bus + off, Target: nvc0.TargetSysSnooped, Volatile: true}
	})
}

// Unmap clears the PTEs of [va, va+size).
func (vm *VM) Unmap(va, size uint64) error {
	return vm.mapRange(va, size, nil)
}

// mapRange sets the PTEs of [va, va+size), page off to pte(off) (pte nil:
// clears them), one page table's run of them at a time, and then flushes
// the TLB, as nouveau does after every page-table update.
func (vm *VM) mapRange(va, size uint64, pte func(off uint64) nvc0.PTE) error {
	if va%nvc0.PageSize != 0 || va+size > vmLimit || va+size < va {
		return fmt.Errorf("map [%#x, +%#x): bad range", va, size)
	}
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if !vm.d.current(vm.gen) {
		return fmt.Errorf("map [%#x, +%#x): %w", va, size, ErrDeviceReset)
	}
	return vm.mmu.finish(vm.writeRange(va, size, pte))
}

// writeRange is mapRange's writes. Callers hold vm.mu.
func (vm *VM) writeRange(va, size uint64, pte func(off uint64) nvc0.PTE) error {
	for off := uint64(0); off < size; {
		pt, err := vm.pageTable(va + off)
		if err != nil {
			return err
		}
		idx := nvc0.SmallPTEIndex(va + off)
		n := min(pages(size-off), nvc0.SmallPTECount-idx)
		var run func(i uint64) nvc0.PTE
		if pte != nil {
			first := off
			run = func(i uint64) nvc0.PTE { return pte(first + i*nvc0.PageSize) }
		}
		if err := vm.mmu.write(pt, idx, n, run); err != nil {
			return err
		}
		off += n * nvc0.PageSize
	}
	return nil
}

// pageTable returns the small-page table covering va, creating it (and its PDE)
// on first use. Callers hold vm.mu.
func (vm *VM) pageTable(va uint64) (pageTable, error) {
	i := nvc0.PDEIndex(va)
	if pt, ok := vm.pts[i]; ok {
		return pt, nil
	}
	pt, err := vm.mmu.newTable(i)
	if err != nil {
		return pageTable{}, fmt.Errorf("page table: %w", err)
	}
	vm.pts[i] = pt
	return pt, nil
}

// Close frees the page tables and the page directory. Channels using the VM
// must be closed first.
func (vm *VM) Close() error {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if vm.d.orphaned(vm.gen) {
		vm.pts = nil // the reset took its tables with it
		return nil
	}
	err := vm.mmu.close(vm.pts)
	vm.pts = nil
	return err
}

// fvMMU writes a VM's page tables in VRAM (kernel objects, written through
// BAR3 or PRAMIN), as nouveau does.
type fvMMU struct{ vm *VM }

func (m fvMMU) newTable(pde uint64) (pageTable, error) {
	d := m.vm.d
	pt, err := d.newKobj(nvc0.SmallPTSize, nvc0.PageSize)
	if err != nil {
		return pageTable{}, err
	}
	w0, w1 := nvc0.PDE{SmallPresent: true, SmallAddr: pt.addr}.Encode()
	d.kwr32(m.vm.pd, pde*nvc0.PDESize, w0)
	d.kwr32(m.vm.pd, pde*nvc0.PDESize+4, w1)
	return pageTable{obj: pt}, nil
}

func (m fvMMU) write(pt pageTable, idx, count uint64, pte func(i uint64) nvc0.PTE) error {
	if pte == nil {
		m.vm.d.clearKobj(pt.obj, idx*nvc0.PTESize, count*nvc0.PTESize)
		return nil
	}
	for i := range count {
		var lo, hi uint32
		if pte != nil {
			lo, hi = pte(i).Encode()
		}
		m.vm.d.kwr32(pt.obj, (idx+i)*nvc0.PTESize, lo)
		m.vm.d.kwr32(pt.obj, (idx+i)*nvc0.PTESize+4, hi)
	}
	return nil
}

func (m fvMMU) finish(err error) error {
	if err != nil {
		return err
	}
	return m.vm.d.flushTLB(m.vm.pd.addr, false)
}

func (m fvMMU) close(pts map[uint64]pageTable) error {
	d := m.vm.d
	var first error
	for i, pt := range pts {
		d.kwr32(m.vm.pd, i*nvc0.PDESize, 0)
		d.kwr32(m.vm.pd, i*nvc0.PDESize+4, 0)
		if err := d.freeKobj(pt.obj); err != nil && first == nil {
			first = err
		}
	}
	if err := d.flushTLB(m.vm.pd.addr, false); err != nil && first == nil {
		first = err
	}
	if err := d.freeKobj(m.vm.pd); err != nil && first == nil {
		first = err
	}
	return first
}
