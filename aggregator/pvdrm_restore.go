package aggregator

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/pvdrm"
	"github.com/gpuvm/gpuvm/vgpuimage"
)

// Restoring a pvdrm vGPU from a state image (issue 18). Its front end
// comes back with a resuming Hello (the same ring, GART heap and handles
// it had); it gets a new vGPU with a new back-end driver, and the image's
// files, GEM objects, channels and pooled buffers are re-created through
// the back end's own paths — OPEN's, GEM_NEW's and CHANNEL_ALLOC's, with
// their bounds: the VM's file and object counts, its VRAM and channel
// quotas — each at the handle, GPU virtual address and GART offset its
// front end holds, which must be free and inside the new VM's address
// space and heap. The contents of VRAM objects are copied into the
// objects' new VRAM, and no page of the image lands anywhere else. The
// ring goes on at the index both ends stood at. A refused image leaves
// nothing attached.

// AttachPVDRMRestored is AttachPVDRM for a resuming front end: the
// vGPU's back end is the one the image waiting for g's domain describes.
// With no image waiting it fails with NoImageError.
func (a *Aggregator) AttachPVDRMRestored(g Guest, gart *os.File, gartSize uint64, t pvdrm.Transport) (*PVDRMBackend, error) {
	return a.AttachPVDRMRestoredMapped(g, gartSize, func(at unsafe.Pointer) (func() error, error) {
		if _, err := unix.MmapPtr(int(gart.Fd()), 0, at, uintptr(gartSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_FIXED); err != nil {
			return nil, err
		}
		return func() error { return nil }, nil // the range's release unmaps it
	}, t)
}

// AttachPVDRMRestoredMapped is AttachPVDRMRestored with the GART heap
// mapped by mapGART. The image is taken only once the back end is
// attached (the guest admitted: its mode and name the image's, room on
// the board); from then on it is consumed, whatever happens.
func (a *Aggregator) AttachPVDRMRestoredMapped(g Guest, gartSize uint64, mapGART GARTMapper, t pvdrm.Transport) (*PVDRMBackend, error) {
	fail := func(err error) error {
		return fmt.Errorf("restore %s (domid %d) from a state image: %w", g.Name, g.DomID, err)
	}
	a.mu.Lock()
	p, ok := a.restores[g.DomID]
	var want vgpuimage.Identity
	if ok {
		want = p.img.Identity
	}
	a.mu.Unlock()
	switch {
	case !ok:
		return nil, NoImageError(g.DomID)
	case g.Mode != want.Mode:
		return nil, fail(fmt.Errorf("%w: the front end asks for mode %s, the image is of a mode %s vGPU", ErrImageRefused, g.Mode, want.Mode))
	case g.Name != want.Name:
		return nil, fail(fmt.Errorf("%w: the front end is for guest %q, the image is of guest %q", ErrImageRefused, g.Name, want.Name))
	}
	b, err := a.AttachPVDRMMapped(g, gartSize, mapGART, t)
	if err != nil {
		return nil, fail(err)
	}
	img, kept := a.takeRestore(g.DomID)
	if kept >= 0 { // RegisterKept takes no pvdrm image; never left kept
		a.releaseKept(kept, g.DomID)
	}
	if img == nil {
		return nil, errors.Join(fail(fmt.Errorf("the image waiting for the domain was taken meanwhile: %w", ErrNoSlot)), b.abandon())
	}
	defer img.Scrub()
	if err := b.restoreState(img); err != nil {
		return nil, errors.Join(fail(fmt.Errorf("%w: %w", ErrImageRefused, err)), b.abandon())
	}
	b.v.log.Info("pvdrm vGPU restored from a state image", "mode", g.Mode, "files", len(b.files), "objects", b.objects,
		"pooled", len(b.pool), "bytes", img.Bytes(), "saved_domid", img.Identity.DomID)
	return b, nil
}

// abandon undoes an attach whose restore failed: the vGPU is detached —
// every object the restore made goes with it, its VRAM scrubbed — and the
// private memory freed. The transport stays the caller's.
func (b *PVDRMBackend) abandon() error {
	b.closeMu.Lock()
	defer b.closeMu.Unlock()
	b.closed = true
	b.files, b.pool = nil, nil
	a, _ := b.v.where()
	return errors.Join(a.Detach(b.v), b.priv.Close())
}

// restoreState re-creates img's back-end state on b, freshly attached
// and not yet serving.
func (b *PVDRMBackend) restoreState(img *vgpuimage.Image) error {
	p := img.PVDRM
	if p == nil || !img.Identity.PVDRM {
		return errors.New("the image has no pvdrm section")
	}
	if p.GARTSize > b.gartSize {
		return fmt.Errorf("the front end offers a GART heap of %d bytes, the image's was %d", b.gartSize, p.GARTSize)
	}
	offer := uint64(pvdrm.FeatureYield)
	if b.pooling {
		offer |= pvdrm.FeaturePooling
	}
	if p.Features&^offer != 0 {
		return fmt.Errorf("features %#x: this back end offers %#x", p.Features, offer)
	}
	if err := b.ring.Resume(p.Ring); err != nil {
		return err
	}
	b.hello, b.features = true, p.Features
	var vram []movedGEM
	for _, pf := range p.Files {
		f, status := b.openFile(pf.ID)
		if status != 0 {
			return fmt.Errorf("file %d: refused by OPEN's checks (status %d)", pf.ID, status)
		}
		for _, pg := range pf.GEMs {
			g, _, status := b.newGEM(f, pg.Size, pg.Domain, pg.Flags, &gemPlace{handle: pg.Handle, va: pg.VA, gart: pg.Place, shared: pg.Shared})
			if status != 0 {
				return fmt.Errorf("file %d: GEM %d (%d bytes in domain %d at %#x): refused by GEM_NEW's checks (status %d)",
					pf.ID, pg.Handle, pg.Size, pg.Domain, pg.VA, status)
			}
			if g.domain == pvdrm.DomainVRAM {
				vram = append(vram, movedGEM{from: pg.Place, to: g.vram, size: g.size})
			}
		}
		f.nextGEM = pf.NextGEM
		for _, pc := range pf.Chans {
			h, status := b.newChannel(f, pc.Handle)
			if status != 0 {
				return fmt.Errorf("file %d: channel %d: refused by CHANNEL_ALLOC's checks (status %d)", pf.ID, pc.Handle, status)
			}
			if err := f.chans[h].ch.ResumeFences(pc.Fence); err != nil {
				return fmt.Errorf("file %d: channel %d: %w", pf.ID, pc.Handle, err)
			}
		}
		f.nextChan = pf.NextChan
	}
	b.nextFile = p.NextFile
	for i, x := range p.Pool {
		if err := b.restorePooled(x); err != nil {
			return fmt.Errorf("pooled buffer %d: %w", i, err)
		}
	}
	return b.importVRAM(img.Pages, vram)
}

// restorePooled keeps a pooled buffer of the image, under the pool's own
// bounds and only of the kind release pools.
func (b *PVDRMBackend) restorePooled(x vgpuimage.PVDRMPooled) error {
	switch {
	case b.features&pvdrm.FeaturePooling == 0:
		return errors.New("a pooled buffer without the pooling feature")
	case x.Flags != pvdrm.GEMMappable:
		return fmt.Errorf("flags %#x: only mappable buffers are pooled", x.Flags)
	case len(b.pool) >= pvdrmPoolCount || b.poolSize+x.Size > pvdrmPoolMax:
		return fmt.Errorf("the pool keeps at most %d buffers of %d bytes", pvdrmPoolCount, pvdrmPoolMax)
	}
	if err := b.gart.Reserve(x.GART, x.Size); err != nil {
		return fmt.Errorf("GART heap at %#x: %w", x.GART, err)
	}
	b.pool = append(b.pool, &gemObject{domain: pvdrm.DomainGART, flags: x.Flags, size: x.Size, gart: x.GART, shared: true})
	b.poolSize += x.Size
	return nil
}

// movedGEM is a restored VRAM object: where the image had it, where it is
// now.
type movedGEM struct{ from, to, size uint64 }

// importVRAM copies the image's VRAM pages into the restored objects'
// VRAM: every byte of a page must lie in an object as the image placed it
// (a page may span objects placed back to back: a migration stream joins
// the ranges in use), and lands where that object is now.
func (b *PVDRMBackend) importVRAM(pages []vgpuimage.Page, objs []movedGEM) error {
	v := b.v
	v.mu.Lock()
	defer v.mu.Unlock()
	a, slot := v.where()
	in, ok := a.gpu.(VRAMMover)
	if v.dead || v.image != nil || !ok {
		return errors.New("the vGPU is not resident on a board that copies VRAM")
	}
	for _, p := range pages {
		end := p.Off + uint64(len(p.Data))
		for pos := p.Off; pos < end; {
			var o *movedGEM
			for i := range objs {
				if pos >= objs[i].from && pos-objs[i].from < objs[i].size {
					o = &objs[i]
					break
				}
			}
			if o == nil {
				return fmt.Errorf("VRAM page [%#x, +%#x): byte %#x is in no VRAM object of the image", p.Off, len(p.Data), pos)
			}
			n := min(end, o.from+o.size) - pos
			dst := o.to + (pos - o.from)
			if dst >= slot.VRAM.Size || slot.VRAM.Size-dst < n {
				return fmt.Errorf("VRAM page [%#x, +%#x) lands outside the slot", pos, n)
			}
			if err := in.ImportVRAM(p.Data[pos-p.Off:pos-p.Off+n], slot.VRAM.Base+dst); err != nil {
				return fmt.Errorf("copying VRAM in: %w", err)
			}
			pos += n
		}
	}
	return nil
}
