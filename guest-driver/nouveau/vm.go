package nouveau

import (
	"fmt"
	"sync"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/internal/rangealloc"
)

// VM is a GPU address space: a page directory and small-page tables in VRAM,
// created on demand, one per 128 MiB of virtual addresses in use.
type VM struct {
	d   *Device
	pd  *kobj
	va  *rangealloc.Allocator
	mu  sync.Mutex
	pts map[uint64]*kobj // page-directory index → small-page table
}

// vmBase and vmLimit bound the virtual addresses the driver hands out; below
// vmBase stays unmapped so that null-ish pointers fault.
const (
	vmBase  = 1 << 28
	vmLimit = nvc0.VASize
)

// NewVM creates an empty address space.
func (d *Device) NewVM() (*VM, error) {
	pd, err := d.newKobj(nvc0.PageDirSize, nvc0.PageSize)
	if err != nil {
		return nil, fmt.Errorf("page directory: %w", err)
	}
	return &VM{d: d, pd: pd, va: rangealloc.New(vmBase, vmLimit-vmBase), pts: map[uint64]*kobj{}}, nil
}

// PageDir returns the VRAM address of the page directory.
func (vm *VM) PageDir() uint64 { return vm.pd.addr }

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
	return vm.mapRange(va, size, func(uint64) nvc0.PTE { return nvc0.PTE{} })
}

// mapRange writes one PTE per page of [va, va+size) and then flushes the TLB,
// as nouveau does after every page-table update.
func (vm *VM) mapRange(va, size uint64, pte func(off uint64) nvc0.PTE) error {
	if va%nvc0.PageSize != 0 || va+size > vmLimit || va+size < va {
		return fmt.Errorf("map [%#x, +%#x): bad range", va, size)
	}
	vm.mu.Lock()
	defer vm.mu.Unlock()
	for off := uint64(0); off < size; off += nvc0.PageSize {
		pt, err := vm.pageTable(va + off)
		if err != nil {
			return err
		}
		lo, hi := pte(off).Encode()
		idx := nvc0.SmallPTEIndex(va + off)
		vm.d.kwr32(pt, idx*nvc0.PTESize, lo)
		vm.d.kwr32(pt, idx*nvc0.PTESize+4, hi)
	}
	return vm.d.flushTLB(vm.pd.addr, false)
}

// pageTable returns the small-page table covering va, creating it (and its PDE)
// on first use. Callers hold vm.mu.
func (vm *VM) pageTable(va uint64) (*kobj, error) {
	i := nvc0.PDEIndex(va)
	if pt, ok := vm.pts[i]; ok {
		return pt, nil
	}
	pt, err := vm.d.newKobj(nvc0.SmallPTSize, nvc0.PageSize)
	if err != nil {
		return nil, fmt.Errorf("page table: %w", err)
	}
	w0, w1 := nvc0.PDE{SmallPresent: true, SmallAddr: pt.addr}.Encode()
	vm.d.kwr32(vm.pd, i*nvc0.PDESize, w0)
	vm.d.kwr32(vm.pd, i*nvc0.PDESize+4, w1)
	vm.pts[i] = pt
	return pt, nil
}

// Close frees the page tables and the page directory. Channels using the VM
// must be closed first.
func (vm *VM) Close() error {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	var first error
	for i, pt := range vm.pts {
		vm.d.kwr32(vm.pd, i*nvc0.PDESize, 0)
		vm.d.kwr32(vm.pd, i*nvc0.PDESize+4, 0)
		if err := vm.d.freeKobj(pt); err != nil && first == nil {
			first = err
		}
	}
	vm.pts = nil
	if err := vm.d.flushTLB(vm.pd.addr, false); err != nil && first == nil {
		first = err
	}
	if err := vm.d.freeKobj(vm.pd); err != nil && first == nil {
		first = err
	}
	return first
}
