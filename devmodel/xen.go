package devmodel

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/ipc"
	"github.com/gpuvm/gpuvm/xen/ioreq"
	"github.com/gpuvm/gpuvm/xen/privcmd"
)

// On Xen the guest's accesses to the vGPU reach the device model as ioreqs
// (package xen/ioreq): PCI config space accesses of the vGPU's function,
// and memory and port accesses inside the BARs the guest's firmware placed.
// XenRouter serves them: config space here (ConfigSpace), BAR accesses by
// forwarding to the aggregator over the IPC connection, as Device does for
// a VM process. When the guest moves a BAR or switches decoding, the
// router moves its claims with the hypervisor, so an address the BAR left
// reaches the device model no more.

// Backend is where BAR accesses go: the aggregator connection (*ipc.Client).
type Backend interface {
	Read32(bar int, off uint64) (uint32, error)
	Write32(bar int, off uint64, v uint32) error
}

// BackendFiller is a Backend that stores one value to many consecutive
// words in one step (*ipc.Client: one IPC round trip for a whole REP
// STOSL instead of one per word).
type BackendFiller interface {
	Fill32(bar int, off uint64, v uint32, n int) error
}

// Claimer moves the address ranges the hypervisor forwards (*ioreq.Server).
type Claimer interface {
	Claim(ioreq.Claim) error
	Release(ioreq.Claim) error
}

// ErrNotMine is wrapped for an access to no BAR of the device or to another
// PCI function.
var ErrNotMine = errors.New("not the vGPU's")

// XenRouter routes one domain's ioreqs for its vGPU.
type XenRouter struct {
	cfg     *ConfigSpace
	dev     privcmd.SBDF
	backend Backend
	log     *slog.Logger

	mu      sync.Mutex
	claimer Claimer
	claimed map[int]ioreq.Claim // BAR index → what is claimed for it
	// onPlace is told the placements after each change (OnPlacements).
	onPlace func([]BARPlacement)
}

// OnPlacements has f told where the BARs are after each change of their
// placement or decoding (the guest's firmware or driver writing the config
// space, PlaceBARs, PlaceAt), and once now. f runs in the ioreq handler:
// it must not wait on the guest.
func (r *XenRouter) OnPlacements(f func([]BARPlacement)) {
	r.mu.Lock()
	r.onPlace = f
	r.mu.Unlock()
	f(r.cfg.Placements())
}

// placed tells onPlace. Called with r.mu held.
func (r *XenRouter) placed() {
	if r.onPlace != nil {
		r.onPlace(r.cfg.Placements())
	}
}

// PlaceAt places the BARs exactly as ps says (the placements a saved
// domain's device model had: its guest's firmware programmed them before
// the save, and its kernel will not again), decoding on for the kinds of
// BAR ps has enabled. A placement must name one of the device's BARs with
// its size.
func (r *XenRouter) PlaceAt(ps []BARPlacement) error {
	var cmd uint32 = pciCommandMaster
	for _, p := range ps {
		var d *barDef
		for i := range r.cfg.bars {
			if r.cfg.bars[i].index == p.Index {
				d = &r.cfg.bars[i]
			}
		}
		switch {
		case d == nil:
			return fmt.Errorf("BAR%d: the device has no such BAR", p.Index)
		case d.size != p.Size || (d.flags&barIO != 0) != p.IO:
			return fmt.Errorf("BAR%d: %d bytes (io %v) saved, the device's is %d bytes (io %v)", p.Index, p.Size, p.IO, d.size, d.flags&barIO != 0)
		case p.Base%p.Size != 0 || (p.IO && p.Base+p.Size > 0x10000) || (!p.IO && d.flags&barMem64 == 0 && p.Base+p.Size > 1<<32):
			return fmt.Errorf("BAR%d at %#x: not a place for %d bytes", p.Index, p.Base, p.Size)
		}
		reg := pciBAR0 + 4*d.index
		if err := r.cfg.Write(reg, 4, uint32(p.Base)); err != nil {
			return err
		}
		if d.flags&barMem64 != 0 {
			if err := r.cfg.Write(reg+4, 4, uint32(p.Base>>32)); err != nil {
				return err
			}
		}
		switch {
		case p.Enabled && p.IO:
			cmd |= pciCommandIO
		case p.Enabled:
			cmd |= pciCommandMemory
		}
	}
	if err := r.cfg.Write(pciCommand, 2, cmd); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	err := r.syncClaims()
	r.placed()
	return err
}

// NewXenRouter returns the router of the vGPU at PCI function dev, whose
// BAR accesses go to backend.
func NewXenRouter(dev privcmd.SBDF, backend Backend, log *slog.Logger) *XenRouter {
	return NewXenRouterSpace(dev, NewConfigSpace(), backend, log)
}

// NewXenRouterSpace is NewXenRouter presenting the config space cs (e.g.
// one whose apertures are the vGPU's slices, NewConfigSpaceApertures).
func NewXenRouterSpace(dev privcmd.SBDF, cs *ConfigSpace, backend Backend, log *slog.Logger) *XenRouter {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &XenRouter{cfg: cs, dev: dev, backend: backend, log: log, claimed: map[int]ioreq.Claim{}}
}

// PlaceBARs places the BARs as a guest's firmware would, for guests that
// have none that enumerates PCI (PVH): the memory BARs from guest-physical
// address mem upwards, each aligned to its size, the I/O BAR at port io
// (0: left unplaced), decoding on. It returns the placements, which the
// guest must then be told (gpuvm guest --bars).
func (r *XenRouter) PlaceBARs(mem, io uint64) ([]BARPlacement, error) {
	next := mem
	for _, d := range r.cfg.bars {
		reg := pciBAR0 + 4*d.index
		if d.flags&barIO != 0 {
			if io == 0 {
				continue
			}
			if io%d.size != 0 || io+d.size > 0x10000 {
				return nil, fmt.Errorf("I/O BAR at port %#x: want a multiple of %d below 64 Ki", io, d.size)
			}
			if err := r.cfg.Write(reg, 4, uint32(io)); err != nil {
				return nil, err
			}
			continue
		}
		base := (next + d.size - 1) &^ (d.size - 1)
		if base < next || base+d.size < base || (d.flags&barMem64 == 0 && base+d.size > 1<<32) {
			return nil, fmt.Errorf("BAR%d of %d bytes does not fit above %#x", d.index, d.size, mem)
		}
		next = base + d.size
		if err := r.cfg.Write(reg, 4, uint32(base)); err != nil {
			return nil, err
		}
		if d.flags&barMem64 != 0 {
			if err := r.cfg.Write(reg+4, 4, uint32(base>>32)); err != nil {
				return nil, err
			}
		}
	}
	cmd := uint32(pciCommandMemory | pciCommandMaster)
	if io != 0 {
		cmd |= pciCommandIO
	}
	if err := r.cfg.Write(pciCommand, 2, cmd); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.syncClaims(); err != nil {
		return nil, err
	}
	r.placed()
	return r.cfg.Placements(), nil
}

// ConfigSpace returns the vGPU's config space.
func (r *XenRouter) ConfigSpace() *ConfigSpace { return r.cfg }

// Attach gives the router the server whose claims follow the BARs, and
// claims what the config space already places.
func (r *XenRouter) Attach(c Claimer) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.claimer = c
	return r.syncClaims()
}

// Handle serves one ioreq (an ioreq.Handler).
func (r *XenRouter) Handle(req ioreq.Request) (uint64, error) {
	switch req.Kind {
	case ioreq.KindPCIConfig:
		return r.config(req)
	case ioreq.KindMMIO, ioreq.KindPIO:
		bar, off, err := r.route(req)
		if err != nil {
			return 0, err
		}
		if req.Reps() == 1 {
			return r.access(bar, off, req)
		}
		if f, ok := r.backend.(BackendFiller); ok && r.fillable(bar, off, req) {
			return 0, f.Fill32(bar, off, uint32(req.Data), req.Reps())
		}
		// A string instruction (REP STOS): each repetition in turn, as
		// the device would see them; a read returns the last.
		var v uint64
		step := uint64(req.Size)
		for i := range uint64(req.Reps()) {
			o := off + i*step
			if req.Down {
				o = off - i*step
			}
			if v, err = r.access(bar, o, req); err != nil {
				return 0, err
			}
		}
		return v, nil
	}
	return 0, fmt.Errorf("%v access: %w", req.Kind, ErrNotMine)
}

// fillable says whether a string instruction is a fill the backend can
// take whole: 4-byte stores upwards into a memory BAR, aligned.
func (r *XenRouter) fillable(bar int, off uint64, req ioreq.Request) bool {
	return req.Kind == ioreq.KindMMIO && req.Write && req.Size == 4 && !req.Down &&
		bar != nvc0.BAR5 && off%4 == 0 && req.Reps() <= ipc.MaxFillCount
}

// config serves a config space access of the vGPU's function; a BAR or
// command write then moves the claims.
func (r *XenRouter) config(req ioreq.Request) (uint64, error) {
	if req.Device != r.dev {
		return 0, fmt.Errorf("config access to %v: %w", req.Device, ErrNotMine)
	}
	if req.Addr >= pciConfigSize { // extended config space: none
		return 0, fmt.Errorf("config access at %#x: beyond the 256-byte header", req.Addr)
	}
	if !req.Write {
		v, err := r.cfg.Read(int(req.Addr), req.Size)
		return uint64(v), err
	}
	if err := r.cfg.Write(int(req.Addr), req.Size, uint32(req.Data)); err != nil {
		return 0, err
	}
	if req.Addr < pciBAR0+6*4 && req.Addr+uint64(req.Size) > pciCommand {
		r.mu.Lock()
		defer r.mu.Unlock()
		err := r.syncClaims()
		r.placed()
		return 0, err
	}
	return 0, nil
}

// syncClaims claims each enabled BAR where it is now and releases what a
// moved or disabled BAR left. Called with r.mu held.
func (r *XenRouter) syncClaims() error {
	if r.claimer == nil {
		return nil
	}
	var errs []error
	for _, p := range r.cfg.Placements() {
		want := ioreq.MMIO(p.Base, p.Size)
		if p.IO {
			want = ioreq.Ports(p.Base, p.Size)
		}
		old, had := r.claimed[p.Index]
		if had && (!p.Enabled || old != want) {
			errs = append(errs, r.claimer.Release(old))
			delete(r.claimed, p.Index)
		}
		if p.Enabled && (!had || old != want) {
			if err := r.claimer.Claim(want); err != nil {
				errs = append(errs, fmt.Errorf("BAR%d at %#x: %w", p.Index, p.Base, err))
				continue
			}
			r.claimed[p.Index] = want
			r.log.Debug("BAR placed", "bar", p.Index, "base", fmt.Sprintf("%#x", p.Base), "size", p.Size, "io", p.IO)
		}
	}
	return errors.Join(errs...)
}

// route finds the BAR an access falls in, from what is claimed now.
func (r *XenRouter) route(req ioreq.Request) (int, uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for bar, c := range r.claimed {
		if (c.Kind == ioreq.KindPIO) != (req.Kind == ioreq.KindPIO) {
			continue
		}
		if lo, n := req.Span(); lo >= c.Base && lo+n <= c.Base+c.Size && lo+n > lo {
			return bar, req.Addr - c.Base, nil
		}
	}
	return 0, 0, fmt.Errorf("%v access at %#x: %w", req.Kind, req.Addr, ErrNotMine)
}

// access turns one access of 1, 2, 4 or 8 bytes into the 32-bit accesses
// the IPC protocol carries: 8 bytes as two (low word first), 1 and 2 bytes
// as a read of the word they are in (and, for a write, a write of the
// word with those bytes replaced: GPU drivers write registers whole, and
// the apertures are memory).
func (r *XenRouter) access(bar int, off uint64, req ioreq.Request) (uint64, error) {
	if bar == nvc0.BAR5 && req.Kind != ioreq.KindPIO {
		return 0, fmt.Errorf("memory access to the I/O BAR: %w", ErrNotMine)
	}
	switch req.Size {
	case 4:
		if off%4 != 0 {
			return 0, fmt.Errorf("unaligned 4-byte access at BAR%d %#x", bar, off)
		}
		if req.Write {
			return 0, r.backend.Write32(bar, off, uint32(req.Data))
		}
		v, err := r.backend.Read32(bar, off)
		return uint64(v), err
	case 8:
		if off%8 != 0 {
			return 0, fmt.Errorf("unaligned 8-byte access at BAR%d %#x", bar, off)
		}
		if req.Write {
			return 0, errors.Join(r.backend.Write32(bar, off, uint32(req.Data)), r.backend.Write32(bar, off+4, uint32(req.Data>>32)))
		}
		lo, err := r.backend.Read32(bar, off)
		if err != nil {
			return 0, err
		}
		hi, err := r.backend.Read32(bar, off+4)
		return uint64(hi)<<32 | uint64(lo), err
	case 1, 2:
		word, shift := off&^3, 8*(off&3)
		if off&3+uint64(req.Size) > 4 {
			return 0, fmt.Errorf("%d-byte access at BAR%d %#x crosses a word", req.Size, bar, off)
		}
		v, err := r.backend.Read32(bar, word)
		if err != nil {
			return 0, err
		}
		mask := uint32(req.Mask()) << shift
		if !req.Write {
			return uint64((v & mask) >> shift), nil
		}
		return 0, r.backend.Write32(bar, word, v&^mask|uint32(req.Data)<<shift&mask)
	}
	return 0, fmt.Errorf("%d-byte access: unsupported", req.Size)
}
