package aggregator

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/gpuvm/gpuvm/pvdrm"
	"github.com/gpuvm/gpuvm/vgpuimage"
)

// Saving a pvdrm vGPU (issue 18): its back end stops serving between two
// requests and its CPU_PREP waiters answer, so every request the front end
// made is consumed and answered (a submission boundary on the ring); the
// eviction path then parks the vGPU, which ends its work in flight, and
// the image takes the back end's files, channels, GEM objects and pooled
// buffers in its front end's terms (vgpuimage.PVDRM) and the contents of
// its VRAM objects. The back-end driver's own structures are not saved: a
// restore opens a new driver and re-creates each object through the back
// end's own paths (pvdrm_restore.go). The back end serves nothing more
// until the save's hold ends: a commit destroys the vGPU (the back end
// then stops), an abort lets it go on here.

// pvdrmQuiet is a save's request that the serving goroutine stop between
// requests until released.
type pvdrmQuiet struct {
	release chan struct{}
	once    sync.Once
}

// hold parks the serving goroutine until q is released; it reports false
// if ctx ended first (Serve then returns).
func (q *pvdrmQuiet) hold(ctx context.Context) bool {
	select {
	case <-q.release:
		return true
	case <-ctx.Done():
		return false
	}
}

func (q *pvdrmQuiet) done() { q.once.Do(func() { close(q.release) }) }

// quiesce stops the back end's serving between two requests and waits for
// its CPU_PREP waiters to answer. The returned function lets it serve on.
// A back end not serving (stopped) is quiet already.
func (b *PVDRMBackend) quiesce(ctx context.Context) (func(), error) {
	q := &pvdrmQuiet{release: make(chan struct{})}
	select {
	case b.quiet <- q:
	case <-b.stopped:
	case <-ctx.Done():
		return nil, fmt.Errorf("pvdrm back end did not stop between requests: %w", ctx.Err())
	}
	b.waiters.Wait() // their fences pass with the work in flight, which runs on
	return q.done, nil
}

// capturePVDRM turns parked v's image m (its identity and account) into
// a pvdrm image: the back end's state and the contents of its VRAM
// objects, from the eviction's pages; the back-end driver's registers,
// channels and tables are left out. Called with the back end quiesced and
// v.mu held.
func (b *PVDRMBackend) capturePVDRM(m *vgpuimage.Image, pages []imagePage) error {
	b.closeMu.Lock()
	defer b.closeMu.Unlock()
	if b.closed {
		return ErrDetached
	}
	idx, ok := b.ring.Quiet()
	if !ok {
		return errors.New("pvdrm ring: a request is unanswered or the ring is broken")
	}
	m.Identity.PV, m.Identity.PVDRM = false, true
	m.Regs, m.PV, m.Pages = nil, nil, nil
	m.Chans = make([]vgpuimage.Chan, m.Identity.Channels)
	p := &vgpuimage.PVDRM{Features: b.features, Ring: idx, NextFile: b.nextFile, GARTSize: b.gartSize}
	var vram []vgpuimage.PVDRMGEM
	for _, id := range slices.Sorted(maps.Keys(b.files)) {
		f := b.files[id]
		pf := vgpuimage.PVDRMFile{ID: f.id, NextChan: f.nextChan, NextGEM: f.nextGEM}
		for _, h := range slices.Sorted(maps.Keys(f.chans)) {
			pf.Chans = append(pf.Chans, vgpuimage.PVDRMChan{Handle: h, Fence: f.chans[h].ch.Seq()})
		}
		for _, h := range slices.Sorted(maps.Keys(f.gems)) {
			g := f.gems[h]
			pg := vgpuimage.PVDRMGEM{Handle: h, Domain: g.domain, Flags: g.flags, Shared: g.shared, Size: g.size, VA: g.va, Place: g.gart}
			if g.domain == pvdrm.DomainVRAM {
				pg.Place = g.vram
				vram = append(vram, pg)
			}
			pf.GEMs = append(pf.GEMs, pg)
		}
		p.Files = append(p.Files, pf)
	}
	// Closed buffers still busy when the work ended are idle now: their
	// handles are gone, and nothing of them is saved.
	for _, g := range b.pool {
		p.Pool = append(p.Pool, vgpuimage.PVDRMPooled{Flags: g.flags, Size: g.size, GART: g.gart})
	}
	m.PVDRM = p
	slices.SortFunc(vram, func(x, y vgpuimage.PVDRMGEM) int { return cmp.Compare(x.Place, y.Place) })
	for _, g := range vram {
		for off := uint64(0); off < g.Size; off += vgpuimage.MaxPageSection {
			data := make([]byte, min(vgpuimage.MaxPageSection, g.Size-off))
			readPages(pages, g.Place+off, data)
			m.Pages = append(m.Pages, vgpuimage.Page{Off: g.Place + off, Data: data})
		}
	}
	return nil
}

// readPages copies what pages (an evicted slot's, sorted) hold at offset
// off into dst; VRAM in no page reads zero, as it does on the board.
func readPages(pages []imagePage, off uint64, dst []byte) {
	end := off + uint64(len(dst))
	for _, p := range pages {
		pend := p.off + uint64(len(p.data))
		if pend <= off || p.off >= end {
			continue
		}
		lo, hi := max(off, p.off), min(end, pend)
		copy(dst[lo-off:hi-off], p.data[lo-p.off:hi-p.off])
	}
}

// handoffTransport is a pvdrm transport that can cross a handoff of the
// daemon: the local one's front end resumes by itself after the saved Bye;
// the xen one's back end is disowned by this process and resumed by the
// next (host's Xen pvdrm service).
type handoffTransport interface{ ResumesHandoff() bool }

// resumesHandoff reports whether the back end's transport can cross a
// handoff of the daemon.
func (b *PVDRMBackend) resumesHandoff() bool {
	t, ok := b.t.(handoffTransport)
	return ok && t.ResumesHandoff()
}

// frontEndRedials reports whether the front end dials a daemon again
// after a saved Bye, wherever its state went: the local transport's does.
func (b *PVDRMBackend) frontEndRedials() bool {
	_, ok := b.t.(*pvdrm.Local)
	return ok
}

// saveFollower is a pvdrm transport whose front end outlives a save of
// the vGPU and waits for the back end that restores its image on this
// daemon (the xen one: the device is this daemon's; docs/pvdrm.md §8, "A device across a save").
type saveFollower interface{ FollowsSave() bool }

// frontEndFollowsSave reports whether the front end waits out a save of
// the vGPU for a restore on this daemon.
func (b *PVDRMBackend) frontEndFollowsSave() bool {
	t, ok := b.t.(saveFollower)
	return ok && t.FollowsSave()
}
