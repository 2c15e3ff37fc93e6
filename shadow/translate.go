package shadow

import (
	"errors"
	"fmt"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// Range is the address range [Base, Base+Size).
type Range struct {
	Base, Size uint64
}

// End returns Base+Size.
func (r Range) End() uint64 { return r.Base + r.Size }

// overlaps reports whether r and o share an address.
func (r Range) overlaps(o Range) bool {
	return r.Size > 0 && o.Size > 0 && r.Base < o.End() && o.Base < r.End()
}

// Layout is where a VM's memory lies in the machine.
type Layout struct {
	// SliceBase and SliceSize place the VM's VRAM slice in physical VRAM.
	// The guest sees VRAM [0, SliceSize).
	SliceBase, SliceSize uint64
	// RAMBase and RAMSize place the VM's RAM in machine memory: guest-physical
	// [0, RAMSize) is machine [RAMBase, RAMBase+RAMSize). RAMSize may be 0 (no
	// system-memory mappings are then allowed).
	RAMBase, RAMSize uint64
	// Reserved lists physical VRAM ranges no VM may reach (the aggregator's
	// shadow structures). The translator never produces them by construction;
	// NewTranslator checks that none overlaps the slice.
	Reserved []Range
}

// ErrLayout is wrapped by the errors NewTranslator returns.
var ErrLayout = errors.New("invalid VM memory layout")

// maxPhysAddr is the end of the physical address space a PTE can encode.
func maxPhysAddr() uint64 {
	return nvc0.DecodePTE(^uint32(0), 0).Addr + nvc0.PageSize
}

// Translator maps a VM's guest addresses to physical ones. It is immutable
// and safe for concurrent use.
type Translator struct {
	l Layout
}

// NewTranslator validates a layout: the slice and the RAM must be non-empty
// (RAM may be empty), page aligned, encodable in a PTE, and the slice must not
// overlap a reserved range.
func NewTranslator(l Layout) (*Translator, error) {
	limit := maxPhysAddr()
	check := func(what string, base, size uint64, allowEmpty bool) error {
		switch {
		case size == 0 && !allowEmpty:
			return fmt.Errorf("%w: %s is empty", ErrLayout, what)
		case base%nvc0.PageSize != 0 || size%nvc0.PageSize != 0:
			return fmt.Errorf("%w: %s [%#x +%#x) is not page aligned", ErrLayout, what, base, size)
		case base > limit || size > limit-base:
			return fmt.Errorf("%w: %s [%#x +%#x) is beyond the %#x a PTE can address", ErrLayout, what, base, size, limit)
		}
		return nil
	}
	if err := check("VRAM slice", l.SliceBase, l.SliceSize, false); err != nil {
		return nil, err
	}
	if err := check("RAM", l.RAMBase, l.RAMSize, true); err != nil {
		return nil, err
	}
	slice := Range{l.SliceBase, l.SliceSize}
	for _, r := range l.Reserved {
		if r.Base+r.Size < r.Base {
			return nil, fmt.Errorf("%w: reserved range [%#x +%#x) overflows", ErrLayout, r.Base, r.Size)
		}
		if slice.overlaps(r) {
			return nil, fmt.Errorf("%w: VRAM slice [%#x, %#x) overlaps reserved [%#x, %#x)",
				ErrLayout, slice.Base, slice.End(), r.Base, r.End())
		}
	}
	l.Reserved = append([]Range(nil), l.Reserved...)
	return &Translator{l: l}, nil
}

// Layout returns the layout the translator was built with.
func (t *Translator) Layout() Layout {
	l := t.l
	l.Reserved = append([]Range(nil), t.l.Reserved...)
	return l
}

// within reports whether [addr, addr+size) lies inside [0, limit).
func within(addr, size, limit uint64) bool {
	return size > 0 && addr < limit && size <= limit-addr
}

// VRAMAddr translates the guest VRAM range [guestAddr, guestAddr+size) into
// physical VRAM; ok is false unless the whole range (size > 0) lies inside
// the VM's slice. Use it for every guest VRAM address the aggregator
// forwards: RAMIN, user areas, playlists, page directories.
func (t *Translator) VRAMAddr(guestAddr, size uint64) (phys uint64, ok bool) {
	if !within(guestAddr, size, t.l.SliceSize) {
		return 0, false
	}
	return t.l.SliceBase + guestAddr, true
}

// GuestVRAMAddr is the inverse of VRAMAddr: the guest address of physical
// VRAM address phys, if it lies in the slice.
func (t *Translator) GuestVRAMAddr(phys uint64) (guestAddr uint64, ok bool) {
	if phys < t.l.SliceBase || phys-t.l.SliceBase >= t.l.SliceSize {
		return 0, false
	}
	return phys - t.l.SliceBase, true
}

// RAMAddr translates the guest-physical system-memory range [gpa, gpa+size)
// into machine memory; ok is false unless it lies entirely inside the VM's RAM.
func (t *Translator) RAMAddr(gpa, size uint64) (machine uint64, ok bool) {
	if !within(gpa, size, t.l.RAMSize) {
		return 0, false
	}
	return t.l.RAMBase + gpa, true
}

// PTE translates a guest small-page (4 KiB) PTE into its shadow. A
// non-present guest PTE yields the zero (non-present) PTE and ok true. A
// present PTE whose page is not entirely inside the VM's slice (VRAM target)
// or RAM (system target), or whose target encoding is unknown, is dropped:
// the result is not present and ok is false. Read-only, volatile and kind are
// preserved; the privileged bit is cleared (see the package comment).
func (t *Translator) PTE(guest nvc0.PTE) (shadow nvc0.PTE, ok bool) {
	return t.translate(guest, nvc0.PageSize)
}

// LargePTE is PTE for a large-page (128 KiB) PTE: the whole large page must
// be inside the VM's memory, and the page must be large-page aligned both as
// the guest wrote it and once translated.
func (t *Translator) LargePTE(guest nvc0.PTE) (shadow nvc0.PTE, ok bool) {
	return t.translate(guest, nvc0.LargePageSize)
}

func (t *Translator) translate(g nvc0.PTE, pageSize uint64) (nvc0.PTE, bool) {
	if !g.Present {
		return nvc0.PTE{}, true
	}
	if g.Addr%pageSize != 0 {
		return nvc0.PTE{}, false
	}
	var addr uint64
	var ok bool
	switch {
	case g.Target == nvc0.TargetVRAM:
		addr, ok = t.VRAMAddr(g.Addr, pageSize)
	case g.IsSystem():
		addr, ok = t.RAMAddr(g.Addr, pageSize)
	}
	if !ok || addr%pageSize != 0 {
		return nvc0.PTE{}, false
	}
	return nvc0.PTE{
		Present:  true,
		ReadOnly: g.ReadOnly,
		Addr:     addr,
		Target:   g.Target,
		Volatile: g.Volatile,
		Kind:     g.Kind,
	}, true
}

// GuestPTE is the inverse of PTE and LargePTE: the guest entry (as the
// guest would write it, less the privileged bit, which translation clears)
// that a shadow entry shadow was translated from. A non-present entry
// yields the zero entry; ok is false if shadow maps neither the slice nor
// the RAM. A move uses it to carry entries the aggregator wrote for the
// guest (PV tables) to another slice: GuestPTE by the old translator, then
// PTE by the new one.
func (t *Translator) GuestPTE(shadow nvc0.PTE) (guest nvc0.PTE, ok bool) {
	if !shadow.Present {
		return nvc0.PTE{}, true
	}
	g := shadow
	switch {
	case shadow.Target == nvc0.TargetVRAM:
		g.Addr, ok = t.GuestVRAMAddr(shadow.Addr)
	case shadow.IsSystem():
		ok = shadow.Addr >= t.l.RAMBase && shadow.Addr-t.l.RAMBase < t.l.RAMSize
		g.Addr = shadow.Addr - t.l.RAMBase
	}
	if !ok {
		return nvc0.PTE{}, false
	}
	return g, true
}

// guestWord is GuestPTE on an entry word (lo | hi<<32).
func (t *Translator) guestWord(w uint64) (uint64, bool) {
	g, ok := t.GuestPTE(nvc0.DecodePTE(uint32(w), uint32(w>>32)))
	if !ok {
		return 0, false
	}
	lo, hi := g.Encode()
	return uint64(lo) | uint64(hi)<<32, true
}
