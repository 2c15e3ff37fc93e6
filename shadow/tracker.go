package shadow

import (
	"slices"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// Kind says why a guest VRAM page is tracked.
type Kind uint8

// Tracked page kinds.
const (
	KindPageDirectory Kind = iota + 1 // a guest page directory (a channel or BAR address space)
	KindPageTable                     // a guest page table mirrored into a shadow
	KindRAMIN                         // a channel's instance block
	KindBARInstance                   // the instance block of the guest's BAR1 or BAR3 address space
	KindUserArea                      // a channel's user area (doorbell page)
)

// String names the kind.
func (k Kind) String() string {
	switch k {
	case KindPageDirectory:
		return "page directory"
	case KindPageTable:
		return "page table"
	case KindRAMIN:
		return "RAMIN"
	case KindBARInstance:
		return "BAR instance"
	case KindUserArea:
		return "user area"
	}
	return "unknown"
}

// Watcher is told about guest writes to the pages it watches.
type Watcher interface {
	// GuestWrite reports that the guest wrote [addr, addr+n) of its VRAM,
	// touching a page the watcher watches. It runs after the write reached
	// memory; a watcher that needs the value reads it back (once).
	GuestWrite(addr, n uint64)
	// Unseen reports that the watched page may have been written without
	// a trap (it was passed through to the guest until now).
	Unseen(page uint64)
}

type watch struct {
	w    Watcher
	kind Kind
}

// Tracker is the one place that knows which guest VRAM pages hold
// structures whose writes must be seen — RAMINs, page directories and page
// tables (of channels and of the guest's BAR1/BAR3), channel user areas —
// whichever aperture the write comes through (PRAMIN, BAR1, BAR3). It is
// the analogue of KVMGT's page_track: every trapped guest write to VRAM is
// reported to it (Write32), it forwards the write to the watchers of that
// page, and BAR remap asks it (Trapped) which pages must stay trapped. One
// Tracker serves one VM; like the rest of this package it is used from
// that VM's goroutine only.
type Tracker struct {
	pages map[uint64][]watch // guest page number -> watchers
	// trapUser says whether user areas must trap (doorbells by trap) or may
	// be passed through (doorbells polled by the aggregator).
	trapUser bool
	gen      uint64 // bumped whenever the set of trapped pages may have changed
}

// NewTracker returns an empty tracker. With trapUserAreas, pages holding a
// channel's user area stay trapped (a GP_PUT written there through any
// aperture is a doorbell the aggregator must see); without, the aggregator
// polls them and they may be passed through.
func NewTracker(trapUserAreas bool) *Tracker {
	return &Tracker{pages: map[uint64][]watch{}, trapUser: trapUserAreas}
}

// pagesOf returns the guest page numbers [first, last] of [addr, addr+size).
func pagesOf(addr, size uint64) (first, last uint64) {
	end := addr + size - 1
	if end < addr {
		end = ^uint64(0)
	}
	return addr >> nvc0.PageShift, end >> nvc0.PageShift
}

// Watch makes w a watcher of every page of [addr, addr+size) for the given
// reason. Watching a page twice with the same watcher and kind counts
// once per call: Unwatch must be called as many times.
func (t *Tracker) Watch(w Watcher, kind Kind, addr, size uint64) {
	if size == 0 {
		return
	}
	first, last := pagesOf(addr, size)
	for p := first; ; p++ {
		t.pages[p] = append(t.pages[p], watch{w, kind})
		if p == last {
			break
		}
	}
	t.gen++
}

// Unwatch undoes one Watch call with the same arguments.
func (t *Tracker) Unwatch(w Watcher, kind Kind, addr, size uint64) {
	if size == 0 {
		return
	}
	first, last := pagesOf(addr, size)
	for p := first; ; p++ {
		ws := t.pages[p]
		if i := slices.Index(ws, watch{w, kind}); i >= 0 {
			ws = slices.Delete(ws, i, i+1)
		}
		if len(ws) == 0 {
			delete(t.pages, p)
		} else {
			t.pages[p] = ws
		}
		if p == last {
			break
		}
	}
	t.gen++
}

// Write reports a trapped guest write of [addr, addr+n) of its VRAM
// (already in memory) to the watchers of the pages it touches, each
// watcher once, and reports whether any page was tracked.
func (t *Tracker) Write(addr, n uint64) bool {
	if n == 0 || len(t.pages) == 0 {
		return false
	}
	first, last := pagesOf(addr, n)
	// Collect first: a watcher may change the tracking while it runs (a
	// rewritten RAMIN rebinds its page directory).
	var hit []Watcher
	visit := func(p uint64) {
		for _, w := range t.pages[p] {
			if !slices.Contains(hit, w.w) {
				hit = append(hit, w.w)
			}
		}
	}
	if last-first >= uint64(len(t.pages)) {
		for p := range t.pages {
			if p >= first && p <= last {
				visit(p)
			}
		}
	} else {
		for p := first; ; p++ {
			visit(p)
			if p == last {
				break
			}
		}
	}
	for _, w := range hit {
		w.GuestWrite(addr, n)
	}
	return len(hit) > 0
}

// Unseen tells the watchers of page (a guest page number) that it may have
// been written without a trap.
func (t *Tracker) Unseen(page uint64) {
	for _, w := range slices.Clone(t.pages[page]) {
		w.w.Unseen(page)
	}
}

// Tracked reports whether the page holding guest address addr is tracked
// for any reason.
func (t *Tracker) Tracked(addr uint64) bool { return len(t.pages[addr>>nvc0.PageShift]) > 0 }

// Trapped reports whether the page holding guest address addr must stay
// trapped: it holds a RAMIN, a page directory or table, or (when user areas
// trap) a user area.
func (t *Tracker) Trapped(addr uint64) bool {
	for _, w := range t.pages[addr>>nvc0.PageShift] {
		if w.kind != KindUserArea || t.trapUser {
			return true
		}
	}
	return false
}

// Kinds returns why the page holding guest address addr is tracked (sorted,
// without repeats).
func (t *Tracker) Kinds(addr uint64) []Kind {
	var ks []Kind
	for _, w := range t.pages[addr>>nvc0.PageShift] {
		ks = append(ks, w.kind)
	}
	slices.Sort(ks)
	return slices.Compact(ks)
}

// Generation changes whenever the set of tracked pages may have changed; a
// BAR remap table computed at one generation is current until it changes.
func (t *Tracker) Generation() uint64 { return t.gen }

// Pages returns the number of tracked pages.
func (t *Tracker) Pages() int { return len(t.pages) }
