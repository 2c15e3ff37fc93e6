package vgpuimage

import "fmt"

// The pvdrm section (docs/protocol.md §13.3.7): a pvdrm vGPU's back end,
// in the terms its front end used — files, channels and GEM objects by
// the handles and GPU virtual addresses the front end holds, the GART
// offsets it mapped, the pooled buffers. The back-end driver's own
// structures (channel rings, page tables, instance blocks) are not in it:
// the restoring daemon opens a new driver and re-creates each object
// through the back end's own paths. The contents of VRAM objects are in
// VRAM page sections at the objects' saved addresses.

// Limits of the pvdrm section: the back end's own per-VM bounds
// (aggregator/pvdrm.go), which the restoring daemon applies again.
const (
	MaxPVDRMFiles     = 16
	MaxPVDRMObjects   = 4096
	MaxPVDRMPool      = 64
	MaxPVDRMPoolBytes = 256 << 20
)

// GEM domains of the pvdrm protocol (pvdrm.DomainVRAM, pvdrm.DomainGART).
const (
	DomainVRAM = 1
	DomainGART = 2
)

// PVDRM is a pvdrm back end's state.
type PVDRM struct {
	// Features are the features granted at HELLO.
	Features uint64
	// Ring is the ring index both ends stood at: every request before it
	// was consumed and answered.
	Ring uint32
	// NextFile is the last file id handed out.
	NextFile uint32
	// GARTSize is the guest's GART heap the objects were carved from.
	GARTSize uint64
	Files    []PVDRMFile // strictly increasing by id
	Pool     []PVDRMPooled
}

// PVDRMFile is one open DRM file.
type PVDRMFile struct {
	ID, NextChan, NextGEM uint32
	Chans                 []PVDRMChan // strictly increasing by handle
	GEMs                  []PVDRMGEM
}

// PVDRMChan is one channel of a file: its handle and the last fence it
// emitted, which the restored channel goes on from (the front end holds
// fences).
type PVDRMChan struct{ Handle, Fence uint32 }

// PVDRMGEM is one GEM object of a file.
type PVDRMGEM struct {
	Handle, Domain, Flags uint32
	Shared                bool
	Size, VA              uint64
	// Place is a VRAM object's address in the vGPU's VRAM (its contents
	// are the VRAM pages there) or a GART object's offset in the heap.
	Place uint64
}

// PVDRMPooled is a closed GART buffer the back end keeps for reuse.
type PVDRMPooled struct {
	Flags      uint32
	Size, GART uint64
}

const pvdrmGEMSize = 40

// maxPVDRMBody bounds the section's body.
const maxPVDRMBody = 24 + 4 + MaxPVDRMFiles*(16+4+8*MaxChannels) + MaxPVDRMObjects*pvdrmGEMSize + 4 + MaxPVDRMPool*24

// Objects is the number of GEM objects over all files.
func (p *PVDRM) Objects() int {
	n := 0
	for _, f := range p.Files {
		n += len(f.GEMs)
	}
	return n
}

func (p *PVDRM) check(id *Identity) error {
	if p.GARTSize == 0 || p.GARTSize > MaxRAM || p.GARTSize%PageSize != 0 {
		return fmt.Errorf("GART heap of %d bytes: want a multiple of %d up to %d: %w", p.GARTSize, PageSize, uint64(MaxRAM), ErrMalformed)
	}
	if len(p.Files) > MaxPVDRMFiles {
		return fmt.Errorf("%d files, at most %d: %w", len(p.Files), MaxPVDRMFiles, ErrMalformed)
	}
	if n := p.Objects(); n > MaxPVDRMObjects {
		return fmt.Errorf("%d GEM objects, at most %d: %w", n, MaxPVDRMObjects, ErrMalformed)
	}
	for i, f := range p.Files {
		if f.ID == 0 || (i > 0 && f.ID <= p.Files[i-1].ID) {
			return fmt.Errorf("file %d: id %d: ids must increase from 1: %w", i, f.ID, ErrMalformed)
		}
		if len(f.Chans) > MaxChannels {
			return fmt.Errorf("file %d: %d channels, at most %d: %w", f.ID, len(f.Chans), MaxChannels, ErrMalformed)
		}
		for j, c := range f.Chans {
			if c.Handle == 0 || (j > 0 && c.Handle <= f.Chans[j-1].Handle) {
				return fmt.Errorf("file %d: channel handle %d: handles must increase from 1: %w", f.ID, c.Handle, ErrMalformed)
			}
		}
		for j, g := range f.GEMs {
			if g.Handle == 0 || (j > 0 && g.Handle <= f.GEMs[j-1].Handle) {
				return fmt.Errorf("file %d: GEM handle %d: handles must increase from 1: %w", f.ID, g.Handle, ErrMalformed)
			}
			if err := checkObject(g.Domain, g.Size, g.Place, id.VRAM, p.GARTSize); err != nil {
				return fmt.Errorf("file %d: GEM %d: %w", f.ID, g.Handle, err)
			}
		}
	}
	if len(p.Pool) > MaxPVDRMPool {
		return fmt.Errorf("%d pooled buffers, at most %d: %w", len(p.Pool), MaxPVDRMPool, ErrMalformed)
	}
	var pooled uint64
	for i, b := range p.Pool {
		if err := checkObject(DomainGART, b.Size, b.GART, id.VRAM, p.GARTSize); err != nil {
			return fmt.Errorf("pooled buffer %d: %w", i, err)
		}
		if pooled += b.Size; pooled > MaxPVDRMPoolBytes {
			return fmt.Errorf("pooled buffers of more than %d bytes: %w", MaxPVDRMPoolBytes, ErrMalformed)
		}
	}
	return nil
}

// checkObject checks an object of size bytes at place in its domain: VRAM
// of vram bytes or a GART heap of gart bytes.
func checkObject(domain uint32, size, place, vram, gart uint64) error {
	limit := gart
	switch domain {
	case DomainVRAM:
		limit = vram
	case DomainGART:
	default:
		return fmt.Errorf("domain %d: %w", domain, ErrMalformed)
	}
	switch {
	case size == 0 || size%PageSize != 0:
		return fmt.Errorf("%d bytes: want a multiple of %d: %w", size, PageSize, ErrMalformed)
	case place%PageSize != 0 || place >= limit || limit-place < size:
		return fmt.Errorf("[%#x, +%#x) outside its domain's %#x bytes: %w", place, size, limit, ErrMalformed)
	}
	return nil
}

func pvdrmBody(p *PVDRM) []byte {
	var b buf
	b.u64(p.Features)
	b.u32(p.Ring)
	b.u32(p.NextFile)
	b.u64(p.GARTSize)
	b.u32(uint32(len(p.Files)))
	for _, f := range p.Files {
		b.u32(f.ID)
		b.u32(f.NextChan)
		b.u32(f.NextGEM)
		b.u32(uint32(len(f.Chans)))
		for _, c := range f.Chans {
			b.u32(c.Handle)
			b.u32(c.Fence)
		}
		b.u32(uint32(len(f.GEMs)))
		for _, g := range f.GEMs {
			b.u32(g.Handle)
			b.u32(g.Domain)
			b.u32(g.Flags)
			var shared uint32
			if g.Shared {
				shared = 1
			}
			b.u32(shared)
			b.u64(g.Size)
			b.u64(g.VA)
			b.u64(g.Place)
		}
	}
	b.u32(uint32(len(p.Pool)))
	for _, x := range p.Pool {
		b.u32(x.Flags)
		b.u32(0)
		b.u64(x.Size)
		b.u64(x.GART)
	}
	return b
}

func (c *cursor) pvdrm() *PVDRM {
	p := &PVDRM{Features: c.u64(), Ring: c.u32(), NextFile: c.u32(), GARTSize: c.u64()}
	n := c.count(16)
	for range n {
		f := PVDRMFile{ID: c.u32(), NextChan: c.u32(), NextGEM: c.u32()}
		chans := c.count(8)
		for range chans {
			f.Chans = append(f.Chans, PVDRMChan{Handle: c.u32(), Fence: c.u32()})
		}
		gems := c.count(pvdrmGEMSize)
		for range gems {
			g := PVDRMGEM{Handle: c.u32(), Domain: c.u32(), Flags: c.u32()}
			shared := c.u32()
			g.Size, g.VA, g.Place = c.u64(), c.u64(), c.u64()
			if c.err == nil && shared > 1 {
				c.err = fmt.Errorf("file %d: GEM %d: shared flag %d: %w", f.ID, g.Handle, shared, ErrMalformed)
			}
			g.Shared = shared == 1
			f.GEMs = append(f.GEMs, g)
		}
		if c.err != nil {
			return p
		}
		p.Files = append(p.Files, f)
	}
	n = c.count(24)
	for range n {
		x := PVDRMPooled{Flags: c.u32()}
		if pad := c.u32(); c.err == nil && pad != 0 {
			c.err = fmt.Errorf("pooled buffer %d: padding not zero: %w", len(p.Pool), ErrMalformed)
		}
		x.Size, x.GART = c.u64(), c.u64()
		p.Pool = append(p.Pool, x)
	}
	return p
}
