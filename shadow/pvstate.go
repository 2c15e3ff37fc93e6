package shadow

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
)

// Carrying PV page tables to another slice (a move or an eviction of a PV
// vGPU). PV tables live in the aggregator's reserve, not in the VM's slice,
// so copying the slice does not carry them; and their entries are physical
// addresses of the old slice and the old RAM registration. PVExport
// describes the PV objects in the guest's own terms — handles, kinds, the
// guest entries each table was given, links and bindings — and PVImport
// builds them again in a new Manager through the very calls a guest's
// hypercalls make, so every entry is translated (and checked) against the
// new layout as if the guest had written it.

// PVState is a Manager's PV objects in guest terms.
type PVState struct {
	// Next is the last handle handed out: new handles after the import
	// continue from it, as they would have.
	Next uint32
	// Objects are the live handles, in handle order.
	Objects []PVObjectState
	// Bindings maps a guest instance-block address to the page-directory
	// handle bound to it (SET_PGD).
	Bindings map[uint64]uint32
}

// PVObjectState is one PV handle.
type PVObjectState struct {
	Handle uint32
	Kind   PVKind
	// Entries are a table's guest entries (nvc0 PTE words, lo | hi<<32;
	// 0: not present), one per table entry. Nil for a page directory.
	Entries []uint64
	// In is the page directory a table is linked into (0: none), at
	// entry PDE.
	In  uint32
	PDE int
}

// PVExport returns m's PV objects in guest terms. It fails if an installed
// entry does not map the VM's memory (it always does: PVWrite translated
// it).
func (m *Manager) PVExport() (*PVState, error) {
	p := m.pv
	if p == nil {
		return nil, ErrPVInval
	}
	st := &PVState{Next: p.next, Bindings: make(map[uint64]uint32, len(p.bind))}
	for ramin, pd := range p.bind {
		st.Bindings[ramin] = pd
	}
	handleOf := make(map[*Space]uint32)
	for h, o := range p.objs {
		if o.space != nil {
			handleOf[o.space] = h
		}
	}
	for h, o := range p.objs {
		obj := PVObjectState{Handle: h, Kind: o.kind}
		if o.tab != nil {
			obj.Entries = make([]uint64, len(o.tab.cur))
			for i, w := range o.tab.cur {
				g, ok := m.tr.guestWord(w)
				if !ok {
					return nil, fmt.Errorf("PV export: table %d entry %d (%#x) maps nothing of the VM: %w", h, i, w, ErrPVFault)
				}
				obj.Entries[i] = g
			}
			// A table left linked into a directory whose handle was freed
			// (a channel still held it) is unlinked: the guest can no
			// longer name that directory.
			if in, ok := handleOf[o.in]; ok && o.in != nil {
				obj.In, obj.PDE = in, o.pde
			}
		}
		st.Objects = append(st.Objects, obj)
	}
	slices.SortFunc(st.Objects, func(a, b PVObjectState) int { return cmp.Compare(a.Handle, b.Handle) })
	return st, nil
}

// PVImport builds the objects of st in m, which serves PV and holds no PV
// object yet: each handle allocated again, each table's entries written
// (translated against m's layout), each table linked, each binding made.
// On error m may hold part of st; the caller closes m.
func (m *Manager) PVImport(st *PVState) error {
	p := m.pv
	if p == nil {
		return ErrPVInval
	}
	if len(p.objs) != 0 {
		return fmt.Errorf("PV import into a manager with %d objects: %w", len(p.objs), ErrPVBusy)
	}
	if len(st.Objects) > p.limits.Objects || len(st.Bindings) > p.limits.Bindings {
		return fmt.Errorf("PV import: %d objects, %d bindings: %w", len(st.Objects), len(st.Bindings), ErrPVLimit)
	}
	type link struct {
		pd  uint32
		pde int
	}
	links := map[link][2]uint32{}
	for _, o := range st.Objects {
		if o.Handle == 0 {
			return fmt.Errorf("PV import: handle 0: %w", ErrPVHandle)
		}
		if _, dup := p.objs[o.Handle]; dup {
			return fmt.Errorf("PV import: handle %d twice: %w", o.Handle, ErrPVHandle)
		}
		p.next = o.Handle - 1
		h, err := m.PVAlloc(o.Kind)
		if err != nil {
			return fmt.Errorf("PV import: handle %d: %w", o.Handle, err)
		}
		if h != o.Handle {
			return fmt.Errorf("PV import: handle %d came back as %d: %w", o.Handle, h, ErrPVHandle)
		}
		if o.Kind == PVPageDir {
			continue
		}
		if n, _, _ := m.PVTableEntries(h); len(o.Entries) != n {
			return fmt.Errorf("PV import: table %d has %d entries, want %d: %w", h, len(o.Entries), n, ErrPVRange)
		}
		if slices.ContainsFunc(o.Entries, func(w uint64) bool { return w != 0 }) {
			if _, err := m.PVWrite(h, 0, o.Entries); err != nil {
				return fmt.Errorf("PV import: table %d: %w", h, err)
			}
		}
		if o.In != 0 {
			l := link{o.In, o.PDE}
			pair := links[l]
			k := 0
			if o.Kind == PVLargeTable {
				k = 1
			}
			if pair[k] != 0 {
				return fmt.Errorf("PV import: entry %d of directory %d linked twice: %w", o.PDE, o.In, ErrPVBusy)
			}
			pair[k] = h
			links[l] = pair
		}
	}
	p.next = st.Next
	for l, pair := range links {
		if l.pde < 0 || uint64(l.pde) > uint64(^uint32(0)) {
			return fmt.Errorf("PV import: entry %d: %w", l.pde, ErrPVRange)
		}
		if err := m.PVMapPGT(l.pd, uint32(l.pde), pair[0], pair[1]); err != nil {
			return fmt.Errorf("PV import: link into directory %d entry %d: %w", l.pd, l.pde, err)
		}
	}
	var errs []error
	for ramin, pd := range st.Bindings {
		if err := m.PVBind(ramin, pd); err != nil {
			errs = append(errs, fmt.Errorf("PV import: bind %#x: %w", ramin, err))
		}
	}
	return errors.Join(errs...)
}

// PVExport returns the guest entries (nvc0 PTE words; 0: unmapped) of a PV
// aperture's pages, for PVSet on another slice.
func (b *BARSpace) PVExport() ([]uint64, error) {
	if !b.pv {
		return nil, ErrPVInval
	}
	out := make([]uint64, len(b.t.cur))
	for i, w := range b.t.cur {
		g, ok := b.tr.guestWord(w)
		if !ok {
			return nil, fmt.Errorf("PV aperture export: page %d (%#x) maps nothing of the VM: %w", i, w, ErrPVFault)
		}
		out[i] = g
	}
	return out, nil
}
