package aggregator

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/shadow"
)

// Guest is who a vGPU is for, as its device model introduced it.
type Guest struct {
	DomID uint32
	Name  string
	Mode  string
}

// vchan is the aggregator's view of one guest channel.
type vchan struct {
	inst    uint32          // guest's instance word (guest RAMIN address and flags)
	ctl     uint32          // guest's last control word
	sh      *shadow.Channel // nil until the guest names a valid instance
	enabled bool
	put     uint32 // the guest's last GP_PUT
	polled  uint64 // user page the physical poll area maps for this channel (0: none)
	listed  bool   // on the guest's playlist
}

// VGPU is one VM's virtual GPU control block.
type VGPU struct {
	agg   *Aggregator
	ID    int
	Slot  Slot
	Guest Guest
	feat  Features
	log   *slog.Logger

	ram     []byte // the guest's RAM (its memfd mapped shared)
	ramBase uint64 // where the board sees it

	ctr counters

	mu            sync.Mutex // serialises the VM's trapped accesses and all state below
	dead          bool
	shadows       *shadow.Manager
	tr            *shadow.Translator
	emu           map[uint32]uint32 // plain per-VM register storage
	window        uint64            // PRAMIN window base (guest VRAM address)
	bars          [2]*barShadow     // BAR1, BAR3
	pollBase      uint64            // guest BAR1 address of its poll area
	pollOn        bool
	chans         []vchan
	synced        map[*shadow.Space]bool // spaces scanned at least once
	stale         map[*shadow.Space]bool // lazy: flushed by the guest since their last scan
	fault         [4]uint32
	intr          uint32
	remap         *remapTable
	barScans      uint64
	barPTEs       uint64
	barShadowTime time.Duration
}

// attach builds the vGPU for a guest in slot, with its RAM from ramFile.
func (a *Aggregator) attach(slot Slot, g Guest, ramFile *os.File, ramSize uint64) (v *VGPU, err error) {
	feat, err := FeaturesFor(g.Mode)
	if err != nil {
		return nil, err
	}
	if a.opts.Quota != nil {
		// A quota narrows the slot: fewer channels, a smaller VRAM slice
		// (the guest is told the smaller size and can reach nothing beyond).
		if chans, vram := a.opts.Quota(g); chans > 0 || vram > 0 {
			if chans > 0 && chans < slot.Chans {
				slot.Chans = chans
			}
			if vram > 0 && vram < slot.VRAM.Size {
				slot.VRAM.Size = vram &^ (nvc0.LargePageSize - 1)
			}
		}
	}
	v = &VGPU{agg: a, ID: slot.Index, Slot: slot, Guest: g, feat: feat, emu: map[uint32]uint32{},
		synced: map[*shadow.Space]bool{}, stale: map[*shadow.Space]bool{},
		chans: make([]vchan, slot.Chans),
		log:   a.log.With("vgpu", slot.Index, "domid", g.DomID, "name", g.Name)}
	defer func() {
		if err != nil {
			err = errors.Join(err, v.release())
		}
	}()
	if v.ram, err = unix.Mmap(int(ramFile.Fd()), 0, int(ramSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return v, fmt.Errorf("map guest RAM: %w", err)
	}
	if v.ramBase, err = a.gpu.RegisterSystemMemory(v.ram); err != nil {
		v.ramBase = 0
		return v, fmt.Errorf("register guest RAM: %w", err)
	}
	if v.tr, err = shadow.NewTranslator(shadow.Layout{
		SliceBase: slot.VRAM.Base, SliceSize: slot.VRAM.Size,
		RAMBase: v.ramBase, RAMSize: ramSize,
		Reserved: []shadow.Range{{Base: a.layout.Reserved.Base, Size: a.layout.Reserved.Size}},
	}); err != nil {
		return v, err
	}
	if v.shadows, err = shadow.NewManager(shadow.Config{
		Memory: a.gpu, Allocator: reserveAllocator{a.phys}, Translator: v.tr,
		MaxShadowBytes: a.shadowBudget,
	}); err != nil {
		return v, err
	}
	v.bars[0] = newBARShadow(v, nvc0.BAR1, &a.phys.bar1, slot.BAR1)
	v.bars[1] = newBARShadow(v, nvc0.BAR3, &a.phys.bar3, slot.BAR3)
	if feat.Remap {
		if v.remap, err = newRemapTable(slot); err != nil {
			return v, err
		}
	}
	return v, nil
}

// Counters returns a snapshot of the vGPU's counters.
func (v *VGPU) Counters() Counters {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.shadows == nil {
		return Counters{}
	}
	return v.snapshot()
}

// Features returns the optimizations the vGPU runs with.
func (v *VGPU) Features() Features { return v.feat }

// teardown stops everything the VM had on the GPU and gives its slot back
// clean: channels killed and taken off the playlist, shadows freed, BAR
// slices unmapped, VRAM slice scrubbed, RAM unregistered.
func (v *VGPU) teardown() error {
	v.mu.Lock()
	if v.dead {
		v.mu.Unlock()
		return nil
	}
	v.dead = true
	var errs []error
	off := map[int]bool{}
	for i := range v.chans {
		c := &v.chans[i]
		if c.sh == nil && !c.enabled {
			continue
		}
		p := v.Slot.ChanBase + i
		errs = append(errs, v.agg.phys.kill(p), v.unmapPollPage(i))
		v.agg.gpu.Write32(nvc0.BAR0, uint64(nvc0.ChanCtl(p)), 0)
		v.agg.gpu.Write32(nvc0.BAR0, uint64(nvc0.ChanInst(p)), 0)
		off[p] = false
	}
	if len(off) > 0 {
		errs = append(errs, v.agg.phys.setActive(off))
	}
	for _, b := range v.bars {
		if b != nil {
			errs = append(errs, b.clear())
		}
	}
	v.mu.Unlock()
	errs = append(errs, v.release())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("tear down vGPU %d: %w", v.ID, err)
	}
	return nil
}

// release frees host-side resources and scrubs the slot.
func (v *VGPU) release() error {
	var errs []error
	for i := range v.chans {
		if c := &v.chans[i]; c.sh != nil {
			errs = append(errs, c.sh.Close())
			c.sh = nil
		}
	}
	if v.shadows != nil {
		errs = append(errs, v.shadows.Close())
	}
	if v.remap != nil {
		errs = append(errs, v.remap.close())
	}
	errs = append(errs, v.agg.cleanSlot(v.agg.layout.Slots[v.ID].VRAM)) // all of the slot, whatever the quota was
	if v.ramBase != 0 {
		errs = append(errs, v.agg.gpu.UnregisterSystemMemory(v.ramBase))
		v.ramBase = 0
	}
	if v.ram != nil {
		errs = append(errs, unix.Munmap(v.ram))
		v.ram = nil
	}
	return errors.Join(errs...)
}

// SegmentRenewer is implemented by host GPUs that can give a VRAM slice
// fresh backing, revoking every other process's mapping of the old one
// (the simulated board). BAR remap hands a VM's slice to its device model,
// so a slot is renewed, not merely scrubbed, before its next tenant.
type SegmentRenewer interface {
	RenewVRAMSegment(base, size uint64) error
}

// cleanSlot zeroes a departed VM's slice and, where the host GPU can,
// revokes any outside mapping of it.
func (a *Aggregator) cleanSlot(r Region) error {
	if sr, ok := a.gpu.(SegmentRenewer); ok {
		if err := sr.RenewVRAMSegment(r.Base, r.Size); err == nil {
			return nil
		}
	}
	return a.gpu.ScrubVRAM(r.Base, r.Size)
}

// reserveAllocator hands shadow structures reserved VRAM; freed memory is
// scrubbed, so new shadow tables start zeroed.
type reserveAllocator struct{ p *physical }

func (r reserveAllocator) Alloc(size, align uint64) (uint64, error) {
	return r.p.reserve.Alloc(size, align)
}
func (r reserveAllocator) Free(addr uint64) error { return r.p.free(addr) }
