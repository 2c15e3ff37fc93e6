package aggregator

import (
	"context"
	"errors"
	"fmt"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/pvdrm"
)

// GEM buffers of the pvdrm back end: VRAM from the VM's slice (through the
// back-end driver's allocator, so the VRAM quota bounds it) or pages of the
// guest's GART heap; each mapped in its file's address space only.

func (b *PVDRMBackend) opGEMNew(_ context.Context, f *pvFile, r pvdrm.Request) (map[string]uint64, int32) {
	g, h, status := b.newGEM(f, r.Args["size"], uint32(r.Args["domain"]), uint32(r.Args["flags"]), nil)
	if status != 0 {
		return nil, status
	}
	return map[string]uint64{"handle": uint64(h), "gpu_va": g.va, "size": g.size}, 0
}

// gemPlace is where a restored GEM object goes (pvdrm_restore.go): the
// handle, GPU virtual address and GART offset its front end holds.
type gemPlace struct {
	handle uint32
	va     uint64
	gart   uint64
	shared bool
}

// newGEM creates a GEM object in f — GEM_NEW's path, with its checks and
// bounds — and returns it with its handle. at, when set, is where a
// restored object must go: its handle, address and (GART) offset, each
// refused (EINVAL) if not free.
func (b *PVDRMBackend) newGEM(f *pvFile, size uint64, domain, flags uint32, at *gemPlace) (*gemObject, uint32, int32) {
	if size == 0 || size > b.vramSize+b.gartSize || flags&^pvdrm.GEMMappable != 0 {
		return nil, 0, -pvdrm.EINVAL
	}
	size = (size + nvc0.PageSize - 1) &^ (nvc0.PageSize - 1)
	if b.objects >= pvdrmMaxObjects {
		return nil, 0, -pvdrm.ENOSPC
	}
	if at != nil && (at.handle == 0 || f.gems[at.handle] != nil) {
		return nil, 0, -pvdrm.EINVAL
	}
	g := &gemObject{domain: domain, flags: flags, size: size}
	var err error
	switch domain {
	case pvdrm.DomainVRAM:
		if flags&pvdrm.GEMMappable != 0 {
			return nil, 0, -pvdrm.EINVAL // the guest has no BAR to map VRAM through
		}
		if g.vram, err = b.dev.AllocVRAM(size, nvc0.PageSize); err != nil {
			return nil, 0, -pvdrm.ENOMEM // the VM's VRAM quota
		}
	case pvdrm.DomainGART:
		switch {
		case at != nil:
			if err = b.gart.Reserve(at.gart, size); err != nil {
				return nil, 0, -pvdrm.EINVAL
			}
			g.gart, g.shared = at.gart, at.shared
		default:
			if hit := b.fromPool(size, flags); hit != nil {
				g = hit
				b.v.ctr.pvdrmPoolHits.Add(1)
			} else if g.gart, err = b.allocGART(size); err != nil {
				return nil, 0, -pvdrm.ENOMEM
			}
		}
	default:
		return nil, 0, -pvdrm.EINVAL
	}
	var va *uint64
	if at != nil {
		va = &at.va
	}
	if err = b.mapGEM(f, g, va); err != nil {
		b.v.gripeLog("pvdrm GEM map", "err", err)
		b.freeBacking(g)
		if at != nil {
			return nil, 0, -pvdrm.EINVAL
		}
		return nil, 0, -pvdrm.ENOMEM
	}
	h := uint32(0)
	if at != nil {
		h = at.handle
	} else {
		f.nextGEM++
		for f.nextGEM == 0 || f.gems[f.nextGEM] != nil {
			f.nextGEM++
		}
		h = f.nextGEM
	}
	f.gems[h] = g
	b.objects++
	return g, h, 0
}

// allocGART carves size bytes from the GART heap, dropping pooled buffers
// if the heap is full.
func (b *PVDRMBackend) allocGART(size uint64) (uint64, error) {
	for {
		off, err := b.gart.Alloc(size, nvc0.PageSize)
		if err == nil || len(b.pool) == 0 {
			return off, err
		}
		b.evictPooled()
	}
}

// mapGEM maps g in f's address space: at *at if set (a restored object's
// address, which must be free), else wherever there is room.
func (b *PVDRMBackend) mapGEM(f *pvFile, g *gemObject, at *uint64) error {
	var va uint64
	var err error
	if at != nil {
		va, err = *at, f.vm.ReserveVA(*at, g.size)
	} else {
		va, err = f.vm.AllocVA(g.size, nvc0.PageSize)
	}
	if err != nil {
		return err
	}
	if g.domain == pvdrm.DomainVRAM {
		err = f.vm.MapVRAM(va, g.vram, g.size)
	} else {
		err = f.vm.MapHost(va, b.gartOff+g.gart, g.size)
	}
	if err != nil {
		return errors.Join(err, f.vm.FreeVA(va))
	}
	g.va = va
	return nil
}

func (b *PVDRMBackend) opGEMInfo(_ context.Context, f *pvFile, r pvdrm.Request) (map[string]uint64, int32) {
	g := f.gems[uint32(r.Args["handle"])]
	if g == nil {
		return nil, -pvdrm.ENOENT
	}
	return map[string]uint64{"domain": uint64(g.domain), "gpu_va": g.va, "size": g.size}, 0
}

// opGEMClose drops a handle. A buffer the GPU may still use is freed once
// the file's work in flight is done (a zombie), as DRM keeps a busy buffer
// until its fences signal.
func (b *PVDRMBackend) opGEMClose(_ context.Context, f *pvFile, r pvdrm.Request) (map[string]uint64, int32) {
	h := uint32(r.Args["handle"])
	g := f.gems[h]
	if g == nil {
		return nil, -pvdrm.ENOENT
	}
	delete(f.gems, h)
	// A kernel reaches buffers through pointers in its parameters, which
	// no PUSHBUF lists: the file's work still in flight may use any of
	// its buffers, so a closed one waits for all of it.
	for _, c := range f.chans {
		if c.last != 0 {
			if g.busy == nil {
				g.busy = map[*pvChan]uint32{}
			}
			g.busy[c] = c.last
		}
	}
	if !g.idle() {
		f.zombies = append(f.zombies, g)
		return nil, 0
	}
	if err := b.release(f, g); err != nil {
		b.v.gripeLog("pvdrm GEM close", "err", err)
		return nil, -pvdrm.EIO
	}
	return nil, 0
}

// opGEMMmap shares a GART buffer's pages with the guest: on the local
// transport the pages are a range of the guest's own GART memfd, named by
// offset; a buffer shared once (a pooled one too) is not shared again.
func (b *PVDRMBackend) opGEMMmap(_ context.Context, f *pvFile, r pvdrm.Request) (map[string]uint64, int32) {
	h := uint32(r.Args["handle"])
	g := f.gems[h]
	if g == nil {
		return nil, -pvdrm.ENOENT
	}
	if g.domain != pvdrm.DomainGART || g.flags&pvdrm.GEMMappable == 0 {
		return nil, -pvdrm.EINVAL
	}
	if !g.shared {
		g.shared = true
		b.v.ctr.pvdrmShares.Add(1)
	}
	return map[string]uint64{"share": uint64(h), "pages": g.size / nvc0.PageSize, "offset": g.gart}, 0
}

// release unmaps a buffer from f's address space (the GPU is done with
// it) and frees or pools its backing.
func (b *PVDRMBackend) release(f *pvFile, g *gemObject) error {
	b.objects--
	err := errors.Join(f.vm.Unmap(g.va, g.size), f.vm.FreeVA(g.va))
	g.va, g.busy = 0, nil
	if err != nil {
		return fmt.Errorf("unmap buffer: %w", err)
	}
	if b.features&pvdrm.FeaturePooling != 0 && g.domain == pvdrm.DomainGART && g.flags&pvdrm.GEMMappable != 0 && g.shared {
		b.pool = append(b.pool, g)
		b.poolSize += g.size
		for len(b.pool) > pvdrmPoolCount || b.poolSize > pvdrmPoolMax {
			b.evictPooled()
		}
		return nil
	}
	b.freeBacking(g)
	return nil
}

// freeBacking returns a buffer's VRAM or GART pages.
func (b *PVDRMBackend) freeBacking(g *gemObject) {
	if g.domain == pvdrm.DomainVRAM {
		_ = b.dev.FreeVRAM(g.vram)
		return
	}
	_ = b.gart.Free(g.gart)
}

// fromPool takes a pooled buffer of exactly size bytes and flags, if one
// is kept. Pools are per VM: a buffer never moves to another VM.
func (b *PVDRMBackend) fromPool(size uint64, flags uint32) *gemObject {
	for i, g := range b.pool {
		if g.size == size && g.flags == flags {
			b.pool = append(b.pool[:i], b.pool[i+1:]...)
			b.poolSize -= g.size
			return g
		}
	}
	return nil
}

// evictPooled frees the oldest pooled buffer.
func (b *PVDRMBackend) evictPooled() {
	g := b.pool[0]
	b.pool = b.pool[1:]
	b.poolSize -= g.size
	b.freeBacking(g)
}

// reapZombies frees closed buffers the GPU is done with.
func (b *PVDRMBackend) reapZombies() {
	for _, f := range b.files {
		keep := f.zombies[:0]
		for _, g := range f.zombies {
			if !g.idle() {
				keep = append(keep, g)
			} else if err := b.release(f, g); err != nil {
				b.v.gripeLog("pvdrm GEM free", "err", err)
			}
		}
		f.zombies = keep
	}
}
