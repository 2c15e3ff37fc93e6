package aggregator

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/gpuvm/gpuvm/gpu/errreport"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/hypercall"
	"github.com/gpuvm/gpuvm/internal/ratelog"
	"github.com/gpuvm/gpuvm/shadow"
)

// Guest is who a vGPU is for, as its device model introduced it.
type Guest struct {
	DomID uint32
	Name  string
	Mode  string
	// XenRAM: the guest's RAM is its Xen domain's own (ipc.RAMXen). No
	// call puts dom0's pages into such a guest's physical address space,
	// so its aperture accesses all trap and BAR remap is off whatever the
	// mode says (no remap table to keep, no slice handed out).
	XenRAM bool
	// PID is the device model's process as the kernel named it when it
	// connected (SO_PEERCRED; 0 when unknown): what to trace for its CPU
	// time.
	PID int32
	// Resume: the device model comes back after its vGPU was saved
	// (ipc.Hello.Resume): only a state image waiting for DomID may give
	// it a vGPU, never a fresh one its guest's driver does not know.
	Resume bool
	// ResumesHandoff: the device model comes back by itself after a
	// handoff's Bye (ipc.Hello.ResumesHandoff).
	ResumesHandoff bool
}

// vchan is the aggregator's view of one guest channel.
type vchan struct {
	inst    uint32          // guest's instance word (guest RAMIN address and flags)
	ctl     uint32          // guest's last control word
	sh      *shadow.Channel // nil until the guest names a valid instance
	enabled bool            // the guest enabled the channel and the aggregator accepted
	// running: the physical channel is enabled on the board. It is cleared
	// only by the stop path (stopChannel), so while it is set nothing the
	// shadow RAMIN names may change.
	running bool
	inList  bool   // on the physical playlist (guest-listed and running)
	listed  bool   // on the guest's playlist
	killed  bool   // stopped by the aggregator (watchdog): the guest sees a fault
	wedged  bool   // its stop did not complete: never reused
	put     uint32 // the guest's last GP_PUT
	polled  uint64 // shadow user area the physical poll area maps for this channel (0: none)
}

// VGPU is one VM's virtual GPU control block.
type VGPU struct {
	// Identity and placement: the id is fixed at attach; agg and Slot
	// change only when the vGPU moves (move.go), under mu and placeMu —
	// read them under either (where, without mu).
	agg  *Aggregator
	ID   int
	Slot Slot
	// placeMu guards agg and Slot for readers that do not hold mu.
	placeMu sync.RWMutex
	Guest   Guest
	feat    Features
	// profile names the vGPU profile that sized it ("": none).
	profile string
	log     *slog.Logger
	gripe   *ratelog.Limiter // bounds the log lines the guest can cause

	// The guest's RAM: its memfd mapped shared, registered with the board.
	ram      []byte
	unmapRAM func() error
	ramBase  uint64 // where the board sees it

	ctr counters

	// Eviction (evict.go): evicted mirrors image != nil for readers
	// without mu; active is the last guest activity and residentSince
	// when it last took a slot (Unix ns); restoreMu makes one restore per
	// vGPU at a time, taken before mu.
	evicted       atomic.Bool
	active        atomic.Int64
	residentSince atomic.Int64
	restoreMu     sync.Mutex
	// saveHold is a save of it held for its commit (save.go), nil: none.
	saveHold atomic.Pointer[SaveHold]
	// lostWhy is why the vGPU is a lost device (lost.go): its board fell
	// off the bus while it was resident. nil: it is not.
	lostWhy atomic.Pointer[string]
	// rehomeAt is when it last asked for another board (Unix ns).
	rehomeAt atomic.Int64
	// migration is its live migration under way (migrate.go), nil when
	// none: one at a time.
	migration atomic.Pointer[migration]

	// irq raises the VM's virtual interrupt (irq.go).
	irq vgpuIRQ
	// leftAccount is its scheduler account on the dispatcher it was last
	// taken off (a move or an eviction), whose totals the next one
	// carries on (dispatcher.addVM). Under mu.
	leftAccount *account
	// pvdrmWake wakes a pvdrm back end's CPU_PREP waiters when a
	// submission ends (registered with the dispatcher of whichever board
	// the vGPU is on: rewireEnded). Set once at attach, under mu.
	pvdrmWake func()
	// pvdrm is a pvdrm vGPU's back end, which a save quiesces and
	// captures (pvdrm_save.go). Set once at attach, under mu.
	pvdrm *PVDRMBackend

	// The VM's connection: hangup ends it with a reason (set once the
	// connection is up); gone is why the vGPU was destroyed, once it was.
	// Under hangMu.
	hangMu sync.Mutex
	hangup func(reason string)
	gone   string
	// connEnded is closed once the connection ended, its Bye written
	// (handoff.go waits for it; nil before it is served).
	connEnded chan struct{}

	// teardown runs once; a concurrent caller waits for it and gets its
	// result (the control API and the VM's own connection may both detach).
	down      sync.Once
	downClean bool
	downErr   error

	// mu serialises the VM's trapped accesses, the watchdog's stops and
	// the doorbell poller, and guards everything below.
	mu   sync.Mutex
	dead bool

	// Shadows: page tables, channels, BAR apertures, and the page tracker
	// behind them.
	shadows *shadow.Manager
	tr      *shadow.Translator
	bars    [2]*barShadow // BAR1, BAR3
	synced  map[*shadow.Space]bool
	stale   map[*shadow.Space]bool // lazy: flushed by the guest since their last scan
	remap   *remapTable
	remapAt uint64 // tracker generation (+1) the remap table was computed at (0: never)
	// remapStale: a BAR mapping or the poll area changed since.
	remapStale bool
	// image is the state of a parked (evicted) vGPU, which holds no slot
	// (evict.go); nil while it is resident.
	image *evictImage
	// homeSlot is the slot the vGPU was last evicted from: its restore
	// takes it if it is free.
	homeSlot int
	// remapOff: every remap entry stays 0 (trap) — a revoke of the device
	// model's mapping is outstanding (a move), or the device model did not
	// confirm its mapping and remap is off for good (remap_rebind.go).
	remapOff bool

	// Guest-visible register state.
	emu      map[uint32]uint32 // plain per-VM register storage
	window   uint64            // PRAMIN window base (guest VRAM address)
	windowOK bool              // the window names VRAM
	pollBase uint64            // guest BAR1 address of its poll area
	pollOn   bool
	chans    []vchan
	// verr is the guest's error-report register file: the board's reports
	// about its channels, translated (faults.go). It has its own lock.
	verr *errreport.Reports

	// wedged counts channels whose stop never completed.
	wedged int

	// PV modes: the hypercall window and its operations (hypercall.go).
	hc    *hypercalls
	hcOps map[hypercall.Op]hcHandler
}

// featuresFor is what a vGPU for g does on this daemon: its mode's
// features, doorbells polled if the daemon says so, and no remap for a Xen
// domain's RAM (nothing maps dom0's pages into a guest on Xen).
func (a *Aggregator) featuresFor(g Guest) (Features, error) {
	feat, err := FeaturesFor(g.Mode)
	if err != nil {
		return feat, err
	}
	feat.PollDoorbells = a.opts.PollDoorbells
	if g.XenRAM {
		feat.Remap = false
	}
	return feat, nil
}

// attach builds the vGPU for a guest in slot, with its RAM from ramFile.
func (a *Aggregator) attach(slot Slot, id int, g Guest, mapRAM func() ([]byte, func() error, error)) (v *VGPU, err error) {
	feat, err := a.featuresFor(g)
	if err != nil {
		return nil, err
	}
	// A quota narrows the slot: fewer channels, smaller VRAM and aperture
	// slices (the guest is told the smaller sizes and reaches nothing beyond).
	slot = a.quotaFor(g).narrow(slot, nvc0.LargePageSize, nvc0.PageSize)
	v = &VGPU{agg: a, ID: id, Slot: slot, Guest: g, feat: feat, profile: a.profileFor(g), emu: map[uint32]uint32{},
		windowOK: true, verr: errreport.New(max(virtualQueue, slot.Chans)),
		synced: map[*shadow.Space]bool{}, stale: map[*shadow.Space]bool{},
		chans: make([]vchan, slot.Chans),
		log:   a.log.With("vgpu", id, "board", a.opts.Board, "slot", slot.Index, "domid", g.DomID, "name", g.Name),
		gripe: ratelog.New(guestLogRate, guestLogBurst)}
	defer func() {
		if err != nil {
			err = errors.Join(err, v.release(true))
		}
	}()
	if v.ram, v.unmapRAM, err = mapRAM(); err != nil {
		v.ram = nil
		return v, fmt.Errorf("map guest RAM: %w", err)
	}
	ramSize := uint64(len(v.ram))
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
		TrapUserAreas:  !feat.PollDoorbells,
		UserAreaWrite:  v.userAreaWritten,
	}); err != nil {
		return v, err
	}
	v.bars[0] = newBARShadow(v, nvc0.BAR1, &a.phys.bar1, slot.BAR1)
	v.bars[1] = newBARShadow(v, nvc0.BAR3, &a.phys.bar3, slot.BAR3)
	if feat.PV {
		v.enablePV()
	}
	if feat.Remap {
		if v.remap, err = newRemapTable(slot); err != nil {
			return v, err
		}
	}
	return v, nil
}

// Guest-caused log lines (refused writes, scans over budget, ...) are
// limited per VM: a burst, then a steady trickle; the next line that goes
// out says how many were held back. Every refusal is still counted.
const (
	guestLogRate  = 2 // lines per second
	guestLogBurst = 10
)

// gripeLog logs a line caused by the guest's behaviour, rate-limited.
func (v *VGPU) gripeLog(msg string, args ...any) {
	ok, held := v.gripe.Allow()
	if !ok {
		return
	}
	if held > 0 {
		args = append(args, "suppressed", held)
	}
	v.log.Warn(msg, args...)
}

// Counters returns a snapshot of the vGPU's counters.
func (v *VGPU) Counters() Counters {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.agg == nil { // a slot held for a vGPU being built or moved
		return Counters{}
	}
	return v.snapshot()
}

// Features returns the optimizations the vGPU runs with.
func (v *VGPU) Features() Features { return v.feat }

// reclaim frees the shadow memory that scans and closes retired, after
// flushing the TLB of every shadow page directory that may still name it.
// Called with v.mu held at the end of each operation that can retire.
func (v *VGPU) reclaim() {
	if v.shadows == nil || v.shadows.Retired() == 0 {
		return
	}
	p := v.agg.phys
	if err := v.shadows.Reclaim(func(pd uint64) error { return p.flush(pd, false) }); err != nil {
		v.log.Error("reclaim shadow memory", "err", err)
	}
	// A closed space retired its memory: forget it here too, or a guest
	// that creates and drops address spaces in a loop grows these maps.
	for s := range v.synced {
		if s.Closed() {
			delete(v.synced, s)
		}
	}
	for s := range v.stale {
		if s.Closed() {
			delete(v.stale, s)
		}
	}
}

// teardown stops everything the VM had on the GPU and gives its slot back
// clean. Every physical channel of the slot is stopped, whatever the
// aggregator believes about it; only then are its shadows freed (after a
// TLB flush of each shadow page directory), its BAR slices unmapped, its
// VRAM renewed and its RAM unregistered. If a stop never completes the slot
// is taken out of service: nothing the wedged channel may still use is
// freed or handed to a new tenant. It reports whether the slot is clean.
func (v *VGPU) teardown() (clean bool, err error) {
	v.down.Do(func() { v.downClean, v.downErr = v.tearDown() })
	return v.downClean, v.downErr
}

// onHangup registers how to end the VM's connection; if the vGPU was
// destroyed already, it is called at once.
func (v *VGPU) onHangup(f func(reason string)) {
	v.hangMu.Lock()
	gone := v.gone
	if gone == "" {
		v.hangup = f
	}
	v.hangMu.Unlock()
	if gone != "" {
		f(gone)
	}
}

// hangUp records why the vGPU goes away and ends the VM's connection with
// that reason (the device model gets it in a Bye).
func (v *VGPU) hangUp(reason string) {
	v.hangMu.Lock()
	if v.gone == "" {
		v.gone = reason
	}
	f := v.hangup
	v.hangMu.Unlock()
	if f != nil {
		f(reason)
	}
}

func (v *VGPU) tearDown() (clean bool, err error) {
	v.mu.Lock()
	v.dead = true
	v.agg.disp.removeVM(v)
	if v.image != nil {
		// Parked: nothing of it is on the board (evict.go); its image
		// is zeroed, its host resources go.
		v.dropImage()
		v.mu.Unlock()
		if err := v.release(false); err != nil {
			return true, fmt.Errorf("tear down parked vGPU %d: %w", v.ID, err)
		}
		return true, nil
	}
	var errs []error
	full := v.agg.layout.Slots[v.Slot.Index] // all of the slot, whatever the quota
	chans := make([]int, full.Chans)
	for i := range chans {
		chans[i] = full.ChanBase + i
	}
	wedged, serr := v.agg.phys.stop(chans...)
	if serr != nil {
		errs = append(errs, fmt.Errorf("stop channels: %w", serr))
	}
	// Deliver what the stopped channels reported, then drop their routes:
	// no report reaches the slot's next tenant.
	v.agg.faults.collect()
	for _, p := range chans {
		v.agg.faults.unbind(p)
		v.agg.gpu.Write32(nvc0.BAR0, uint64(nvc0.ChanInst(p)), 0)
		v.agg.gpu.Write32(nvc0.BAR0, uint64(nvc0.ChanCtl(p)), 0)
	}
	for i := range v.chans {
		v.chans[i].running, v.chans[i].inList = false, false
		errs = append(errs, v.unmapPollPage(i))
	}
	v.agg.disp.dropVM(v) // nothing of the VM is in flight any more
	for _, b := range v.bars {
		if b != nil {
			errs = append(errs, b.clear())
		}
	}
	v.agg.faults.unbindBARs(v)
	clean = len(wedged) == 0
	v.wedged += len(wedged)
	v.mu.Unlock()
	errs = append(errs, v.release(clean))
	if err := errors.Join(errs...); err != nil {
		return clean, fmt.Errorf("tear down vGPU %d: %w", v.ID, err)
	}
	return clean, nil
}

// release frees host-side resources and scrubs the slot. With clean false
// (a channel could not be stopped) the shadows and the slot's VRAM are
// left as they are: the wedged channel may still use them.
func (v *VGPU) release(clean bool) error {
	var errs []error
	if clean {
		for i := range v.chans {
			if c := &v.chans[i]; c.sh != nil {
				errs = append(errs, c.sh.Close())
				c.sh = nil
			}
		}
		if v.shadows != nil {
			errs = append(errs, v.shadows.Close())
			v.reclaim()
		}
		errs = append(errs, v.agg.cleanSlot(v.agg.layout.Slots[v.Slot.Index].VRAM)) // all of the slot, whatever the quota was
	}
	// Counters (under v.mu) reads the remap table of a vGPU that is gone:
	// take it away under the lock, then unmap it.
	v.mu.Lock()
	r := v.remap
	v.remap = nil
	v.mu.Unlock()
	if r != nil {
		errs = append(errs, r.close())
	}
	if v.ramBase != 0 {
		// Waits for any page the GPU is moving; a channel that still names
		// the RAM faults from now on.
		errs = append(errs, v.agg.gpu.UnregisterSystemMemory(v.ramBase))
		v.ramBase = 0
	}
	if v.ram != nil {
		errs = append(errs, v.unmapRAM())
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

// where returns the aggregator v lives on and its slot, for callers that do
// not hold v.mu (a move changes them).
func (v *VGPU) where() (*Aggregator, Slot) {
	v.placeMu.RLock()
	defer v.placeMu.RUnlock()
	return v.agg, v.Slot
}

// setPlace moves v to slot of a. Called with v.mu held.
func (v *VGPU) setPlace(a *Aggregator, slot Slot) {
	v.placeMu.Lock()
	v.agg, v.Slot = a, slot
	v.log = a.log.With("vgpu", v.ID, "board", a.opts.Board, "slot", slot.Index, "domid", v.Guest.DomID, "name", v.Guest.Name)
	v.placeMu.Unlock()
}

// dropPhysicalState is what a reset and a move both do once v's channels
// (the physical ones in chans) are stopped: deliver what they reported and
// drop their routes and instance words, unmap the poll pages and BAR
// slices, set every remap entry back to trap, and close the channels'
// shadows (their memory retired, freed by the caller's reclaim), the BAR
// spaces' scan totals carried into the counters. Called with v.mu held.
func (v *VGPU) dropPhysicalState(a *Aggregator, chans []int) []error {
	a.faults.collect()
	for _, p := range chans {
		a.faults.unbind(p)
		a.gpu.Write32(nvc0.BAR0, uint64(nvc0.ChanInst(p)), 0)
		a.gpu.Write32(nvc0.BAR0, uint64(nvc0.ChanCtl(p)), 0)
	}
	var errs []error
	for i := range v.chans {
		errs = append(errs, v.unmapPollPage(i))
	}
	for _, b := range v.bars {
		errs = append(errs, b.clear())
	}
	a.faults.unbindBARs(v)
	if r := v.remap; r != nil {
		for i := range r.entries {
			r.set(i, 0) // every aperture access traps
		}
	}
	for _, b := range v.bars {
		v.ctr.carried.add(b.sp.Totals())
	}
	for i := range v.chans {
		if c := &v.chans[i]; c.sh != nil {
			errs = append(errs, c.sh.Close())
			c.sh = nil
		}
	}
	return errs
}
