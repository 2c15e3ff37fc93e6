// Package devmodel is the per-VM device model: the virtual GPU as a guest
// sees it. It presents the PCI identity and configuration space of a Quadro
// 6000 and routes the guest's BAR accesses: trapped accesses travel to the GPU
// Access Aggregator over the IPC protocol (package ipc); with BAR remap, the
// aperture pages the aggregator passes through are plain memory — the VM's
// own VRAM slice mapped into this process — and never leave it.
//
// The same Device serves the benchmark harness's VM processes (the guest
// driver runs on it in-process) and `gpuvm devmodel`.
package devmodel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/gpu"
	"github.com/gpuvm/gpuvm/gpu/hostmem"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/internal/buspipe"
	"github.com/gpuvm/gpuvm/internal/spin"
	"github.com/gpuvm/gpuvm/ipc"
)

// Config says how to reach the aggregator and who the VM is.
type Config struct {
	Socket    string
	DomID     uint32
	Name      string
	Mode      string
	RAMSize   uint64
	Transport ipc.Transport // default shm
	// TrapCost is charged before every trapped access: the hypervisor's
	// share of a trap (VM exit, ioreq delivery to the device model, resume)
	// that a process-based harness without Xen does not pay. It is used
	// only with TrapCostSet (0 then charges nothing); otherwise the
	// aggregator's timing profile decides (ipc.ParamTrapNs).
	TrapCost    time.Duration
	TrapCostSet bool
	// PostedWrites makes trapped writes return as soon as they are queued
	// for the aggregator. By default a trapped write completes before the
	// guest goes on, as a Xen ioreq for an MMIO write keeps the vCPU
	// blocked until the device model completes it.
	PostedWrites bool
	// RemapNoAck is fault injection, for tests of the aggregator's
	// bound: the device model says it handles remap updates
	// (docs/protocol.md §6.7) but never answers one, and keeps its
	// mappings, as a misbehaving device model would. Never set it
	// otherwise: after a move its vGPU traps every aperture access.
	RemapNoAck bool
	// MapRemapped makes the device model behave as one that maps
	// remapped pages into its guest (docs/protocol.md §6.8; QEMU outside
	// Xen): a page's remap entry is read once, at its first
	// passed-through access, and then used until the aggregator revokes
	// it by name. It says so to the aggregator (REMAP_MAPPED). With
	// RemapNoAck it never acknowledges a revocation either, and keeps
	// its mappings.
	MapRemapped bool
	// ResumeTimeout, when positive, lets the device model survive a save
	// of its vGPU (docs/protocol.md §13.7): after a Bye saying the vGPU
	// was saved it keeps the guest's RAM and driver state, its guest's
	// accesses wait, and it comes back with a resuming Hello on
	// ResumeSockets (tried in turn; none: Socket) until a daemon where
	// the image was restored welcomes it, or ResumeTimeout passes (then
	// the device fails as after any other Bye). 0: a saved Bye ends it.
	// With PostedWrites it needs an aggregator that publishes how far it
	// ran the request ring (req_done, docs/protocol.md §6.9): the posted
	// writes it had not run when it parked the vGPU are repeated on the
	// restored one. Without it a saved Bye ends the device.
	ResumeTimeout time.Duration
	ResumeSockets []string
	Logger        *slog.Logger
}

// The guest driver finds the vGPU's interrupt line through its MMIO.
var _ gpu.Interrupter = (*Device)(nil)

// Device is a VM's virtual GPU: its guest RAM, its connection to the
// aggregator, and (with remap) its mapped aperture pages.
type Device struct {
	// cur is the connection to the aggregator; a resume after a save
	// replaces it (resume.go).
	cur    atomic.Pointer[ipc.Client]
	cfg    Config
	ram    *hostmem.RAM
	pci    *ConfigSpace
	infoMu sync.Mutex
	// welcome is the last Welcome (guarded by infoMu).
	welcome ipc.Welcome
	// resumeMu makes one resume at a time; resumeFail is why the last
	// one failed (then the device stays failed).
	resumeMu   sync.Mutex
	resumeFail atomic.Pointer[resumeFailure]
	resumes    atomic.Uint32

	bar1Size, bar3Size uint64
	// remapMu excludes the aggregator's remap updates (rebind) from
	// passed-through accesses: an access holds it shared from reading its
	// table entry until its load or store is done, a remap update holds it
	// exclusively while it unmaps and maps. remapOn says, without the lock,
	// whether a table is mapped at all.
	remapMu           sync.RWMutex
	remapOn           atomic.Bool
	remap             []byte // the aggregator's remap table (read-only), nil without remap
	slice             []byte // the VM's VRAM slice, with remap
	bar1Pages         uint64
	busRead, busWrite time.Duration     // charged per passed-through access
	bus               *buspipe.Pipe     // times passed-through accesses as a bus does
	trapCost          atomic.Int64      // charged per trapped access, ns
	posted            bool              // trapped writes are posted
	unqueued          []ipc.PostedWrite // posted writes a resume could not queue (resume.go; resumeMu)
	log               *slog.Logger
	closing           chan struct{} // closed by Close (RemapNoAck's handler waits for it)
	gmap              guestMap      // with MapRemapped (guestmap.go)
}

// Connect creates the guest RAM, connects to the aggregator and maps what
// it passes back.
func Connect(ctx context.Context, cfg Config) (d *Device, err error) {
	if cfg.Transport == 0 {
		cfg.Transport = ipc.TransportShm
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	d = &Device{cfg: cfg, pci: NewConfigSpace(), posted: cfg.PostedWrites, bus: buspipe.New(), log: cfg.Logger,
		closing: make(chan struct{})}
	d.trapCost.Store(int64(cfg.TrapCost))
	defer func() {
		if err != nil {
			err = errors.Join(err, d.Close())
		}
	}()
	if d.ram, err = hostmem.New(fmt.Sprintf("gpuvm-dom%d-ram", cfg.DomID), cfg.RAMSize); err != nil {
		return d, err
	}
	client, w, extra, err := d.dial(ctx, cfg.Socket, false)
	if err != nil {
		return d, fmt.Errorf("device model: %w", err)
	}
	defer closeFiles(extra)
	d.cur.Store(client)
	if cfg.PostedWrites && cfg.ResumeTimeout > 0 && !client.ReplaysPosted() {
		d.log.Warn("device model: posted writes and a daemon that does not say which it ran (req_done; or the socket transport): a save of the vGPU will end the device model",
			"domid", cfg.DomID)
	}
	d.pci.SetFLR(d.resetFunction) // the guest's function-level reset
	d.welcome = w
	d.bar1Size, d.bar3Size = pageParam(w, ipc.ParamBAR1Size, nvc0.BAR1Size), pageParam(w, ipc.ParamBAR3Size, nvc0.BAR3Size)
	return d, d.adopt(client, w, extra)
}

// dial sends the Hello (a resuming one with resume) with the guest RAM.
func (d *Device) dial(ctx context.Context, socket string, resume bool) (*ipc.Client, ipc.Welcome, []*os.File, error) {
	ramFile, err := d.ram.File()
	if err != nil {
		return nil, ipc.Welcome{}, nil, err
	}
	defer ramFile.Close()
	cfg := &d.cfg
	hello := ipc.Hello{DomID: cfg.DomID, Name: cfg.Name, Mode: cfg.Mode, RAMSize: d.ram.Size(), Transport: cfg.Transport, Resume: resume}
	return ipc.Dial(ctx, socket, hello, ramFile, nil, &ipc.DialOptions{Logger: cfg.Logger})
}

// adopt sets the device up on a new connection: the trap cost its
// Welcome gives, and with remap the table and slice it passes (extra,
// which the caller closes) and the handler of the aggregator's remap
// updates.
func (d *Device) adopt(client *ipc.Client, w ipc.Welcome, extra []*os.File) error {
	// A new connection (a resume) knows nothing of the old one's guest
	// mappings: drop them (§6.8).
	d.gmap.unmapAll()
	if !d.cfg.TrapCostSet {
		d.trapCost.Store(int64(param(w, ipc.ParamTrapNs, 0, uint64(time.Second))))
	}
	if w.Params[ipc.ParamRemap] != "1" {
		return nil
	}
	d.remapMu.Lock()
	err := d.mapRemap(w, extra)
	d.remapOn.Store(err == nil)
	d.remapMu.Unlock()
	if err != nil {
		return err
	}
	// The aggregator takes the mappings away, and hands new ones, when
	// it moves the vGPU (docs/protocol.md §6.7). Without this (the
	// socket transport) a moved vGPU traps every aperture access.
	if d.cfg.RemapNoAck {
		client.HandleRemap(func([]*os.File) error {
			<-d.closing
			return errors.New("device model closing")
		})
	} else {
		client.HandleRemap(d.rebind)
	}
	if !d.cfg.MapRemapped {
		return nil
	}
	revoke := d.revoke
	if d.cfg.RemapNoAck {
		revoke = func([]uint32) error {
			<-d.closing
			return errors.New("device model closing")
		}
	}
	if !client.HandleRemapRevoke(revoke) {
		return errors.New("device model: the aggregator does not revoke remapped pages by name (REMAP_MAPPED)")
	}
	return nil
}

// conn is the current connection to the aggregator.
func (d *Device) conn() *ipc.Client { return d.cur.Load() }

func closeFiles(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

// rebind carries out a remap update of the aggregator (docs/protocol.md
// §6.7), on the ipc client's socket reader. Taking remapMu exclusively
// stops new passed-through accesses (they wait, then find no table and
// trap) and waits for those under way, which hold it shared only from
// reading their table entry to completing their load or store; trapped
// accesses never hold it, so this never waits for the aggregator, which
// may be holding them until it has the acknowledgement. Then the old table
// and slice are unmapped and, with files, the new ones mapped. An error
// means only that the new ones could not be: every aperture access traps.
func (d *Device) rebind(files []*os.File) error {
	d.remapMu.Lock()
	defer d.remapMu.Unlock()
	d.remapOn.Store(false)
	d.gmap.unmapAll()
	if err := d.unmapRemap(); err != nil {
		// The slices are gone from the access path even so.
		d.log.Warn("device model: unmapping the old remap files", "err", err)
	}
	if len(files) == 0 {
		return nil
	}
	if err := d.mapRemap(d.Welcome(), files); err != nil {
		return err
	}
	d.remapOn.Store(true)
	return nil
}

// unmapRemap unmaps the remap table and the slice. Called with remapMu
// held exclusively (or by Close, when nothing else runs).
func (d *Device) unmapRemap() error {
	var errs []error
	if d.remap != nil {
		errs = append(errs, unix.Munmap(d.remap))
		d.remap = nil
	}
	if d.slice != nil {
		errs = append(errs, unix.Munmap(d.slice))
		d.slice = nil
	}
	return errors.Join(errs...)
}

// pageParam reads a size parameter of w: a positive page multiple up to
// max (the default).
func pageParam(w ipc.Welcome, key string, max uint64) uint64 {
	v, err := strconv.ParseUint(w.Params[key], 10, 64)
	if err != nil || v == 0 || v > max || v%nvc0.PageSize != 0 {
		return max
	}
	return v
}

// param reads a numeric parameter of w bounded by max, def when absent or
// bad.
func param(w ipc.Welcome, key string, def, max uint64) uint64 {
	v, err := strconv.ParseUint(w.Params[key], 10, 64)
	if err != nil || v > max {
		return def
	}
	return v
}

// mapRemap maps the remap table (read-only) and the VRAM slice w's
// connection passed; on error it leaves neither mapped. Called with
// remapMu held exclusively.
func (d *Device) mapRemap(w ipc.Welcome, files []*os.File) (err error) {
	defer func() {
		if err != nil {
			_ = d.unmapRemap()
		}
	}()
	if len(files) != 2 {
		return fmt.Errorf("device model: remap wants 2 files, got %d", len(files))
	}
	size := func(f *os.File) (int, error) {
		st, err := f.Stat()
		if err != nil {
			return 0, err
		}
		return int(st.Size()), nil
	}
	n, err := size(files[0])
	if err != nil {
		return err
	}
	if d.remap, err = unix.Mmap(int(files[0].Fd()), 0, n, unix.PROT_READ, unix.MAP_SHARED); err != nil {
		return fmt.Errorf("map remap table: %w", err)
	}
	if n, err = size(files[1]); err != nil {
		return err
	}
	if d.slice, err = unix.Mmap(int(files[1].Fd()), 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return fmt.Errorf("map VRAM slice: %w", err)
	}
	d.bar1Pages = d.bar1Size / nvc0.PageSize
	d.busRead = time.Duration(param(w, ipc.ParamMMIOReadNs, 0, 1<<20))
	d.busWrite = time.Duration(param(w, ipc.ParamMMIOWriteNs, 0, 1<<20))
	if uint64(len(d.remap)) < (d.bar1Pages+d.bar3Size/nvc0.PageSize)*8 {
		return fmt.Errorf("remap table of %d bytes too small", len(d.remap))
	}
	return nil
}

// remapped returns a pointer to the word behind a passed-through aperture
// offset, or nil if the access must trap. Called with remapMu held (shared
// is enough); the pointer is valid while it is held.
func (d *Device) remapped(bar int, off uint64) *uint32 {
	if d.remap == nil {
		return nil
	}
	var idx uint64
	switch bar {
	case nvc0.BAR1:
		if off >= d.bar1Size {
			return nil
		}
		idx = off / nvc0.PageSize
	case nvc0.BAR3:
		if off >= d.bar3Size {
			return nil
		}
		idx = d.bar1Pages + off/nvc0.PageSize
	default:
		return nil
	}
	read := func() uint64 { return atomic.LoadUint64((*uint64)(unsafe.Pointer(&d.remap[idx*8]))) }
	var e uint64
	if d.cfg.MapRemapped {
		e = d.gmap.lookup(idx, read)
	} else {
		e = read()
	}
	if e == 0 {
		return nil
	}
	pos := e&^(nvc0.PageSize-1) + off%nvc0.PageSize
	if pos+4 > uint64(len(d.slice)) || off%4 != 0 {
		return nil
	}
	return (*uint32)(unsafe.Pointer(&d.slice[pos]))
}

// aperture reports whether an access may be passed through: BAR1 or BAR3,
// with remap tables mapped.
func (d *Device) aperture(bar int) bool {
	return (bar == nvc0.BAR1 || bar == nvc0.BAR3) && d.remapOn.Load()
}

// passRead reads a passed-through aperture word, if the access may be
// passed through. The bus cost is taken under remapMu with the table it
// belongs to: a rebind rewrites it.
func (d *Device) passRead(bar int, off uint64) (uint32, bool) {
	if !d.aperture(bar) {
		return 0, false
	}
	d.remapMu.RLock()
	p := d.remapped(bar, off)
	if p == nil {
		d.remapMu.RUnlock()
		return 0, false
	}
	// The bus cost, as the native driver's port pays it (buspipe).
	now, cost := d.bus.Now(), d.busRead
	v := atomic.LoadUint32(p)
	d.remapMu.RUnlock()
	d.bus.Read(now, int64(cost))
	return v, true
}

// passWrite writes a passed-through aperture word, if the access may be
// passed through.
func (d *Device) passWrite(bar int, off uint64, v uint32) bool {
	if !d.aperture(bar) {
		return false
	}
	d.remapMu.RLock()
	p := d.remapped(bar, off)
	if p == nil {
		d.remapMu.RUnlock()
		return false
	}
	now, cost := d.bus.Now(), d.busWrite
	atomic.StoreUint32(p, v)
	d.remapMu.RUnlock()
	d.bus.Write(now, int64(cost))
	return true
}

// Read32 is a guest read of a BAR (gpu.MMIO). A dead connection reads
// all-ones; one ended by a save waits for the resume (resume.go) and
// reads from the restored vGPU.
func (d *Device) Read32(bar int, off uint64) uint32 {
	if v, ok := d.passRead(bar, off); ok {
		return v
	}
	spin.For(time.Duration(d.trapCost.Load()))
	c := d.conn()
	for {
		v, err := c.Read32(bar, off)
		if err == nil {
			return v
		}
		var ok bool
		if c, ok = d.resumeAfter(c, err); !ok {
			return 0xFFFFFFFF
		}
		if v, ok := d.passRead(bar, off); ok {
			return v
		}
	}
}

// Write32 is a guest write of a BAR (gpu.MMIO).
func (d *Device) Write32(bar int, off uint64, v uint32) {
	if d.passWrite(bar, off, v) {
		return
	}
	spin.For(time.Duration(d.trapCost.Load()))
	c := d.conn()
	for {
		var err error
		if d.posted {
			err = c.Write32(bar, off, v) // queued; a failure is sticky: Err reports it
		} else {
			err = c.Write32Sync(bar, off, v)
		}
		if err == nil {
			return
		}
		var ok bool
		if c, ok = d.resumeAfter(c, err); !ok || d.passWrite(bar, off, v) {
			return
		}
	}
}

// IRQCount returns the vGPU's interrupt count and whether the aggregator
// raises interrupts for it (gpu.Interrupter; ipc feature IRQ, shm
// transport only). The device model delivers the interrupt to the guest
// driver running in this process by letting it sleep on the count.
func (d *Device) IRQCount() (uint32, bool) {
	c := d.conn()
	if !c.InterruptsOffered() {
		return 0, false
	}
	return c.IRQCount(), true
}

// WaitIRQ sleeps until the vGPU's interrupt count differs from seen or
// timeout passed (gpu.Interrupter). It fails once the connection ended;
// after a save it returns, once resumed, the restored vGPU's count (a
// new connection's: the caller looks again at what it waits for).
func (d *Device) WaitIRQ(seen uint32, timeout time.Duration) (uint32, error) {
	c := d.conn()
	n, err := c.WaitIRQ(seen, timeout)
	if err == nil {
		return n, nil
	}
	if c, ok := d.resumeAfter(c, err); ok {
		return c.IRQCount(), nil
	}
	return n, fmt.Errorf("device model: interrupt: %w", d.errOr(err))
}

// TrapCost returns what the device model charges per trapped access.
func (d *Device) TrapCost() time.Duration { return time.Duration(d.trapCost.Load()) }

// PostedWrites reports whether trapped writes are posted.
func (d *Device) PostedWrites() bool { return d.posted }

// Err reports why the device stopped working, or nil: also nil after a
// save while the device waits to resume (its guest's next access does).
func (d *Device) Err() error {
	c := d.conn()
	err := c.Err()
	if err == nil {
		return nil
	}
	if f := d.resumeFail.Load(); f != nil {
		return f.err
	}
	if d.resumable(c, err) {
		return nil
	}
	return err
}

// RAM is the guest's RAM (DMA memory at guest-physical address 0).
func (d *Device) RAM() *hostmem.RAM { return d.ram }

// BARSizes are the usable BAR1 and BAR3 aperture sizes.
func (d *Device) BARSizes() (bar1, bar3 uint64) { return d.bar1Size, d.bar3Size }

// Welcome is what the aggregator said when it accepted the VM (after a
// resume, the restoring daemon's Welcome).
func (d *Device) Welcome() ipc.Welcome {
	d.infoMu.Lock()
	defer d.infoMu.Unlock()
	return d.welcome
}

// ConfigSpace is the device's PCI configuration space.
func (d *Device) ConfigSpace() *ConfigSpace { return d.pci }

// Counters asks the aggregator for the vGPU's counters (names are the
// aggregator's CounterNames, in order).
func (d *Device) Counters(names []string) (map[string]uint64, error) {
	c := d.conn()
	for {
		m, err := c.Counters(names)
		if err == nil {
			return m, nil
		}
		var ok bool
		if c, ok = d.resumeAfter(c, err); !ok {
			return nil, d.errOr(err)
		}
	}
}

// Close disconnects (the aggregator then tears the vGPU down) and frees the RAM.
func (d *Device) Close() error {
	var errs []error
	select {
	case <-d.closing:
	default:
		close(d.closing)
	}
	// A resume under way gives up (closing); none starts after.
	d.resumeMu.Lock()
	c := d.cur.Load()
	d.resumeMu.Unlock()
	if c != nil {
		errs = append(errs, c.Close())
	}
	// The client's socket reader, which runs rebind, has stopped.
	d.remapMu.Lock()
	d.remapOn.Store(false)
	errs = append(errs, d.unmapRemap())
	d.remapMu.Unlock()
	if d.ram != nil {
		errs = append(errs, d.ram.Close())
	}
	return errors.Join(errs...)
}
