package aggregator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/sched"
)

// Options configure an Aggregator.
type Options struct {
	Partition config.PartitionConfig
	MaxVMs    int
	Channels  int           // the board's channel count
	Timeout   time.Duration // longest physical register wait; default 5 s
	// BusReadNs and BusWriteNs are the physical cost of one BAR access, which
	// device models charge for passed-through (remapped) pages: remap removes
	// the trap, not the bus transaction. 0 for a real board, where the bus
	// charges itself.
	BusReadNs, BusWriteNs int64
	// TrapNs is the hypervisor's share of one trapped guest access in the
	// timing profile (sim.Timing.TrapNs), passed to device models to charge.
	TrapNs int64
	// Timing names the board's timing profile, told to device models
	// (ipc.ParamTiming) so that what they report names it ("": not told).
	Timing string
	// Policy schedules the VMs' submissions (nil: FIFO). The aggregator
	// owns it from New on.
	Policy sched.Policy
	// Watchdog kills a channel whose submission runs longer (0: never).
	Watchdog time.Duration
	// Weight returns a guest's scheduling weight (nil: 1 for everyone).
	Weight func(Guest) int
	// Mode returns the mode the operator configured for a guest ("": the
	// device model chooses). A device model that asks for another mode is
	// refused, with both modes in the reason.
	Mode func(Guest) string
	// Quota returns how a guest's slot is narrowed (nil, or zeros: the
	// whole slot).
	Quota func(Guest) Quota
	// Profiles are the vGPU profiles a toolstack may name in a domain's
	// settings (DomainSettings.Profile), listed by GET /v1/types.
	Profiles []Profile
	// ProfileOf names the profile a guest's configuration gave it, for
	// reports ("": none; nil: never).
	ProfileOf func(Guest) string
	// SLO gives guests queue-wait objectives and tunes SLA feedback
	// (slo.go).
	SLO SLOOptions
	// PollDoorbells makes the aggregator find doorbells by polling the
	// guests' user areas every PollInterval (GPUvm's "sidecore", thesis
	// §4.4) instead of trapping GP_PUT writes; the user-area pages may then
	// be passed through with BAR remap. Default: trapped doorbells.
	PollDoorbells bool
	PollInterval  time.Duration // default 50 µs
	// DomainRAM maps the memory of a Xen domain whose device model offers
	// it (ipc.RAMXen: a guest on real Xen, whose RAM no memfd holds):
	// guest-physical address a at byte a of the result, size bytes, and how
	// to unmap it. Nil refuses such device models: the daemon is not
	// running on Xen (gpuvm serve --xen sets it).
	DomainRAM func(domid uint32, size uint64) ([]byte, func() error, error)
	// HealthInterval is how often the board's identity is read to find a
	// board that stopped answering (0: DefaultHealthInterval; negative:
	// never). OnLost, if set, is told once when it is found lost (health.go).
	HealthInterval time.Duration
	OnLost         func(reason string)
	// OnPause, if set, is told of every completed move (by the board the
	// vGPU left), eviction and restore (by the board it is restored on)
	// of its vGPUs, with what each cost the guest (pause.go). Called
	// outside every lock; it must not block.
	OnPause func(Pause)
	// Registry hands out vGPU ids and holds guest identities; boards of one
	// daemon share one (nil: this aggregator's own).
	Registry *Registry
	// Board is the board's index among the daemon's boards and BoardName
	// its configured name, shown with each vGPU ("": none given).
	Board     int
	BoardName string
	// Overcommit lets the board hold vGPUs whose VRAM sums to this many
	// times its slots' VRAM (0 or 1: no overcommit); the vGPUs beyond its
	// slots take turns, parked by eviction (evict.go). EvictIdle is how
	// long a vGPU has no work before it may be evicted (0:
	// DefaultEvictIdle); RestoreWait bounds how long a parked vGPU's guest
	// (or an attach) waits for a slot (0: DefaultRestoreWait).
	// MinResidency is how long a busy vGPU keeps its slot before a waiting
	// one may take it (0: DefaultMinResidency).
	Overcommit   float64
	EvictIdle    time.Duration
	RestoreWait  time.Duration
	MinResidency time.Duration
	Logger       *slog.Logger
}

// ErrDuplicate is returned when a guest claims the domid or name of a VM
// that has a vGPU already.
var ErrDuplicate = errors.New("already has a vGPU")

// ErrNoSlot is returned when every VM slot is taken.
var ErrNoSlot = errors.New("every vGPU slot is in use")

// Aggregator owns the physical GPU and the vGPUs.
type Aggregator struct {
	gpu          HostGPU
	layout       Layout
	phys         *physical
	log          *slog.Logger
	shadowBudget uint64
	regs         regTable
	opts         Options
	disp         *dispatcher
	faults       *physFaults
	fecs         map[uint32]fecsClass // FECS command table (context.go)
	health       health
	reg          *Registry
	stop         context.CancelFunc
	stopped      chan struct{}

	mu     sync.Mutex
	vgpus  []*VGPU          // by slot; nil = free
	broken map[int]string   // slots out of service (a channel that would not stop), with the reason
	kept   map[int]keptSlot // slots whose VRAM a handed-off vGPU left in place (keep.go)
	// domains holds settings a toolstack registered for domains whose
	// device models have not connected yet (domains.go).
	domains map[uint32]DomainSettings
	// parked holds the vGPUs evicted from the board, by id: attached, with
	// no slot (evict.go).
	parked map[int]*VGPU
	// restores holds state images waiting for their domains' device
	// models (restore.go).
	restores map[uint32]*pendingRestore
	// rehome chooses another board for a parked vGPU of this board when
	// the board is lost (SetRehome; nil: none).
	rehome func(*VGPU) *Aggregator
}

// New takes ownership of the physical GPU: it partitions it and brings up the
// aggregator's own BAR tables, poll area and playlists.
func New(g HostGPU, opts Options) (*Aggregator, error) {
	if opts.Timeout == 0 {
		opts.Timeout = 5 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Registry == nil {
		opts.Registry = NewRegistry()
	}
	layout, err := NewLayout(opts.Partition, opts.MaxVMs, g.VRAMSize(), opts.Channels)
	if err != nil {
		return nil, err
	}
	phys, err := newPhysical(g, layout, opts.Timeout)
	if err != nil {
		return nil, fmt.Errorf("aggregator: %w", err)
	}
	// Each VM may hold an equal share of what the aggregator's own
	// structures leave of the reserve.
	budget := phys.reserve.FreeBytes() / uint64(opts.MaxVMs)
	if opts.Policy == nil {
		if opts.Policy, err = sched.New("fifo", sched.Defaults()); err != nil {
			return nil, err
		}
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = 50 * time.Microsecond
	}
	a := &Aggregator{gpu: g, layout: layout, phys: phys, log: opts.Logger, shadowBudget: budget, reg: opts.Registry,
		regs: newRegTable(), opts: opts, vgpus: make([]*VGPU, len(layout.Slots)), broken: map[int]string{}, kept: map[int]keptSlot{}, domains: map[uint32]DomainSettings{}, parked: map[int]*VGPU{},
		restores: map[uint32]*pendingRestore{}, stopped: make(chan struct{})}
	a.faults = newPhysFaults(g, opts.Logger)
	a.fecs = fecsCommands()
	a.disp = newDispatcher(a, opts.Policy, opts.Watchdog)
	ctx, cancel := context.WithCancel(context.Background())
	a.stop = cancel
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		a.disp.run(ctx)
	}()
	if opts.HealthInterval == 0 {
		opts.HealthInterval = DefaultHealthInterval
	}
	boot0 := g.Read32(nvc0.BAR0, nvc0.RegBoot0)
	a.health.boot0 = boot0 // the identity Reinit looks for
	if opts.HealthInterval > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.healthLoop(ctx, opts.HealthInterval, boot0)
		}()
	}
	if opts.PollDoorbells {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.pollLoop(ctx, opts.PollInterval)
		}()
	}
	go func() {
		wg.Wait()
		close(a.stopped)
	}()
	return a, nil
}

// Layout returns how the board is partitioned.
func (a *Aggregator) Layout() Layout { return a.layout }

// Attach gives a guest a vGPU in the first free slot. ramFile is the guest's
// RAM (a sealed memfd of ramSize bytes). A guest whose domid or name has a
// vGPU already (or one still being torn down) is refused: one live vGPU per
// domain.
func (a *Aggregator) Attach(g Guest, ramFile *os.File, ramSize uint64) (*VGPU, error) {
	return a.attachWith(g, func() ([]byte, func() error, error) {
		ram, err := unix.Mmap(int(ramFile.Fd()), 0, int(ramSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			return nil, nil, err
		}
		return ram, func() error { return unix.Munmap(ram) }, nil
	})
}

// attachWith is Attach with the guest RAM mapped by mapRAM, which returns
// the mapping and how to unmap it.
func (a *Aggregator) attachWith(g Guest, mapRAM func() ([]byte, func() error, error)) (*VGPU, error) {
	if lost, why := a.Lost(); lost {
		return nil, fmt.Errorf("attach %s (domid %d): %w: %s", g.Name, g.DomID, ErrBoardLost, why)
	}
	// A pvdrm vGPU is restored by its back end (pvdrm_restore.go), over
	// a fresh vGPU: its image is no vGPU image to park and rebuild.
	if a.restorePending(g.DomID) && !config.Mode(g.Mode).IsPVDRM() {
		return a.attachRestored(g, mapRAM) // restore.go
	}
	if g.Resume {
		return nil, NoImageError(g.DomID)
	}
	id, err := a.reg.claim(g)
	if err != nil {
		return nil, fmt.Errorf("attach %s (domid %d): %w", g.Name, g.DomID, err)
	}
	var want Slot // what the guest's quota leaves of a slot (overcommit's measure)
	if a.opts.Overcommit > 1 && len(a.layout.Slots) > 0 {
		want = a.quotaFor(g).narrow(a.layout.Slots[0], nvc0.LargePageSize, nvc0.PageSize)
	}
	a.mu.Lock()
	slot := -1
	for i, v := range a.vgpus {
		if v == nil && a.slotFree(i) {
			slot = i
			break
		}
	}
	if slot < 0 && a.opts.Overcommit > 1 && len(a.layout.Slots) > 0 {
		// Overcommitted: take a slot another vGPU is evicted from, if
		// the board's VRAM may be committed that far (evict.go).
		fits := a.overcommitFits(want.VRAM.Size)
		a.mu.Unlock()
		if fits {
			to, err := a.roomFor(context.Background(), &VGPU{ID: id, Slot: a.layout.Slots[0], Guest: g}, -1)
			if err != nil {
				a.reg.release(id)
				return nil, fmt.Errorf("attach %s (domid %d): overcommitted board: %w", g.Name, g.DomID, err)
			}
			slot = to.Index
		}
		a.mu.Lock()
	}
	if slot < 0 {
		a.mu.Unlock()
		a.reg.release(id)
		return nil, fmt.Errorf("attach %s (domid %d): %w", g.Name, g.DomID, ErrNoSlot)
	}
	a.vgpus[slot] = &VGPU{ID: id, Slot: a.layout.Slots[slot], Guest: g} // hold the slot while building
	a.mu.Unlock()
	weight := a.weightFor(g)
	v, err := a.attach(a.layout.Slots[slot], id, g, mapRAM)
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil {
		a.vgpus[slot] = nil
		a.reg.release(id)
		return nil, fmt.Errorf("attach %s (domid %d): %w", g.Name, g.DomID, err)
	}
	if err := a.disp.addVM(v, weight); err != nil {
		a.vgpus[slot] = nil
		_, terr := v.teardown()
		a.reg.release(id)
		return nil, errors.Join(fmt.Errorf("attach %s: scheduler: %w", g.Name, err), terr)
	}
	if a.health.lost.Load() {
		// The board was lost while this vGPU was built: loseBoard did not
		// see it, so it goes here.
		a.vgpus[slot] = nil
		_, terr := v.teardown()
		a.reg.release(id)
		return nil, errors.Join(fmt.Errorf("attach %s (domid %d): %w", g.Name, g.DomID, ErrBoardLost), terr)
	}
	a.vgpus[slot] = v
	v.touch()
	v.residentSince.Store(time.Now().UnixNano())
	v.log.Info("vGPU attached", "mode", g.Mode, "vram_mib", v.Slot.VRAM.Size>>20, "channels", v.Slot.Chans)
	return v, nil
}

// Detach tears a vGPU down (every channel of the slot stopped, shadows
// freed, VRAM scrubbed, RAM unregistered) and frees its slot — or, if a
// channel would not stop, takes the slot out of service with the reason.
// The slot stays held until the teardown is over. Detach is idempotent.
func (a *Aggregator) Detach(v *VGPU) error {
	clean, err := v.teardown()
	// A vGPU torn down moves no more: it is on the board it was torn down
	// on, which is a's unless it moved (move.go).
	if cur, _ := v.where(); cur != nil && cur != a {
		a = cur
	}
	a.mu.Lock()
	held := false
	if slot := v.Slot.Index; slot >= 0 && a.vgpus[slot] == v {
		held = true
		a.vgpus[slot] = nil
		if !clean {
			a.broken[slot] = fmt.Sprintf("a channel of %s (domid %d) did not stop: %v", v.Guest.Name, v.Guest.DomID, err)
			v.log.Error("slot out of service", "reason", a.broken[slot])
		}
	} else if a.parked[v.ID] == v {
		held = true
		delete(a.parked, v.ID)
	}
	if held {
		v.log.Info("vGPU detached", "err", err)
		delete(a.domains, v.Guest.DomID) // the settings were this vGPU's
		a.reg.release(v.ID)
	}
	a.mu.Unlock()
	return err
}

// Destroy tears a vGPU down on the operator's behalf (the control API):
// the VM's device model is told at once — its connection ends with a Bye
// carrying reason, so the VM sees its GPU gone instead of finding out from
// failing accesses — and then the vGPU is detached as Detach does.
func (a *Aggregator) Destroy(v *VGPU, reason string) error {
	v.log.Info("vGPU destroyed", "reason", reason)
	v.hangUp(reason)
	return a.Detach(v)
}

// OutOfService returns the slots taken out of service, with the reasons.
func (a *Aggregator) OutOfService() map[int]string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := map[int]string{}
	for k, r := range a.broken {
		out[k] = r
	}
	return out
}

// VGPUs returns the attached vGPUs: those in its slots (also while a move
// or an eviction pauses them; not a slot held for a vGPU being built or
// moved here) and those parked on it.
func (a *Aggregator) VGPUs() []*VGPU {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []*VGPU
	for _, v := range a.vgpus {
		if v == nil {
			continue
		}
		if cur, _ := v.where(); cur != nil && a.parked[v.ID] != v {
			out = append(out, v)
		}
	}
	for _, v := range a.parked {
		out = append(out, v)
	}
	return out
}

// Close detaches every vGPU and stops the dispatcher.
func (a *Aggregator) Close() error {
	var errs []error
	for _, v := range a.VGPUs() {
		errs = append(errs, a.Detach(v))
	}
	a.mu.Lock()
	for d := range a.restores {
		a.dropRestoreLocked(d)
	}
	a.mu.Unlock()
	a.stop()
	<-a.stopped
	a.disp.stops.Wait()
	return errors.Join(errs...)
}
