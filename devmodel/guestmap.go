package devmodel

import (
	"errors"
	"fmt"
	"sync"
)

// guestMap emulates a device model that maps remapped pages into its
// guest (Config.MapRemapped; QEMU outside Xen does it with RAM-device
// subregions of the BAR): an aperture page's remap-table entry is read
// once, at the page's first passed-through access, and later accesses use
// what it said without reading the table — as a guest's accesses through
// a mapping never reach the device model — until the aggregator revokes
// the entry by name (docs/protocol.md §6.8) or takes every mapping away
// (§6.7).
type guestMap struct {
	mu    sync.Mutex
	pages map[uint64]uint64 // table index -> the entry it was mapped with
}

// lookup returns the entry idx was mapped with, or reads it with read and
// maps it if it is non-zero.
func (g *guestMap) lookup(idx uint64, read func() uint64) uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	if e, ok := g.pages[idx]; ok {
		return e
	}
	e := read()
	if e != 0 {
		if g.pages == nil {
			g.pages = make(map[uint64]uint64)
		}
		g.pages[idx] = e
	}
	return e
}

// unmapAll drops every mapping (a RemapUpdate).
func (g *guestMap) unmapAll() {
	g.mu.Lock()
	defer g.mu.Unlock()
	clear(g.pages)
}

// revoke carries out a RemapRevoke (§6.8) on the ipc client's socket
// reader: taking remapMu exclusively waits for the passed-through accesses
// under way (trapped ones never hold it), then the named pages are
// unmapped; the client acknowledges when it returns.
func (d *Device) revoke(idx []uint32) error {
	d.remapMu.Lock()
	defer d.remapMu.Unlock()
	n := uint64(len(d.remap) / 8)
	var errs []error
	d.gmap.mu.Lock()
	defer d.gmap.mu.Unlock()
	for _, x := range idx {
		if uint64(x) >= n && d.remap != nil {
			errs = append(errs, fmt.Errorf("entry %d past the %d-entry remap table", x, n))
			continue
		}
		delete(d.gmap.pages, uint64(x))
	}
	return errors.Join(errs...)
}
