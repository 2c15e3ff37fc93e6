package aggregator

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/gpu"
	"github.com/gpuvm/gpuvm/gpu/hostmem"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
	"github.com/gpuvm/gpuvm/internal/rangealloc"
	"github.com/gpuvm/gpuvm/ipc"
	"github.com/gpuvm/gpuvm/pvdrm"
)

// The pvdrm back end (GPUvm thesis §4.1.4). A pvdrm guest has no GPU
// registers: its front end sends whole DRM operations over a ring, and the
// back end performs them with its own driver — nouveau, the host driver of
// this code base — on the VM's vGPU. That vGPU is the VM's slot like any
// other's: its channel and VRAM quota bound what the back end can create,
// its doorbells go through the dispatcher and the scheduling policy, and
// its teardown stops, frees and scrubs everything. The driver runs in the PV
// mode, so its page tables are aggregator-owned and nothing is scanned, and
// it reaches the vGPU by direct calls (no trap, no IPC).
//
// The vGPU's system memory is two memfds mapped back to back: a private
// part (the driver's channel rings, fence pages and hypercall pages, which
// the guest cannot reach) and the guest's GART heap (its RAM memfd from the
// handshake), from which GART buffers are carved and shared with the guest
// by GEM_MMAP.

// Back-end bounds, per VM.
const (
	pvdrmMaxFiles   = 16
	pvdrmMaxObjects = 4096      // GEM objects over all files
	pvdrmPoolMax    = 256 << 20 // bytes of closed buffers kept (pooling)
	pvdrmPoolCount  = 64        // buffers kept (pooling)
	pvdrmMaxWait    = 10 * time.Second
	// pvdrmFaultPoll is how often a blocked CPU_PREP wait checks its
	// channel for a fault anyway: a safety net, since a fault ends the
	// channel's submission and that wakes the wait (pvdrm_wait.go).
	pvdrmFaultPoll  = 50 * time.Millisecond
	pvdrmTimeout    = 3 * time.Second // the back-end driver's longest GPU wait
	pvdrmPrivBase   = 4 << 20         // private memory beyond the channel rings
	pvdrmPerChannel = 1<<20 + 3*nvc0.PageSize + 8<<10
)

// vgpuPort is the back-end driver's access to its vGPU: a direct call, the
// path of a host driver (no trap). Accesses the vGPU forwards to the board
// are charged by the board as any physical access is.
type vgpuPort struct{ v *VGPU }

// Port is v's BARs as a driver in the aggregator's own process reaches
// them (tests of other packages open a guest driver on it): every access
// is a trapped access of the vGPU; one that fails reads all ones, as a
// gone device does. It stays v's across moves and evictions.
func (v *VGPU) Port() gpu.MMIO { return vgpuPort{v} }

func (p vgpuPort) Read32(bar int, off uint64) uint32 {
	val, err := p.v.Read32(bar, off)
	if err != nil {
		return 0xFFFFFFFF
	}
	return val
}

func (p vgpuPort) Write32(bar int, off uint64, val uint32) { _ = p.v.Write32(bar, off, val) }

// AttachPVDRM gives a pvdrm guest a vGPU: its RAM memfd (the GART heap of
// gartSize bytes) is mapped after a private region the back end keeps, the
// vGPU is built over both, and the back-end driver is opened on it. The
// back end serves the ring of t once Serve runs.
func (a *Aggregator) AttachPVDRM(g Guest, gart *os.File, gartSize uint64, t pvdrm.Transport) (*PVDRMBackend, error) {
	return a.AttachPVDRMMapped(g, gartSize, func(at unsafe.Pointer) (func() error, error) {
		if _, err := unix.MmapPtr(int(gart.Fd()), 0, at, uintptr(gartSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_FIXED); err != nil {
			return nil, err
		}
		return func() error { return nil }, nil // the range's release unmaps it
	}, t)
}

// GARTMapper maps a pvdrm guest's GART heap at address at (MAP_FIXED into
// a range the aggregator reserved for it) and returns how to end that
// mapping; the aggregator calls it before it releases the range. The local
// transport maps the guest's memfd; the xen transport the pages the guest
// granted (pvdrm.XenBack.MapGART).
type GARTMapper func(at unsafe.Pointer) (unmap func() error, err error)

// AttachPVDRMMapped is AttachPVDRM with the GART heap (gartSize bytes)
// mapped by mapGART.
func (a *Aggregator) AttachPVDRMMapped(g Guest, gartSize uint64, mapGART GARTMapper, t pvdrm.Transport) (*PVDRMBackend, error) {
	feat, err := FeaturesFor(g.Mode)
	if err != nil {
		return nil, err
	}
	if !feat.PVDRM {
		return nil, fmt.Errorf("attach %s: mode %q is not a pvdrm mode", g.Name, g.Mode)
	}
	chans := a.layout.Slots[0].Chans
	privSize := uint64(pvdrmPrivBase + chans*pvdrmPerChannel)
	privSize = (privSize + nvc0.LargePageSize - 1) &^ (nvc0.LargePageSize - 1)
	priv, err := hostmem.New("gpuvm-pvdrm-private", privSize)
	if err != nil {
		return nil, fmt.Errorf("attach %s: %w", g.Name, err)
	}
	v, err := a.attachWith(g, func() ([]byte, func() error, error) {
		return mapBackToBack(priv.Fd(), privSize, gartSize, mapGART)
	})
	if err != nil {
		return nil, errors.Join(err, priv.Close())
	}
	// The driver names its memory as a guest does: by offset in the vGPU's
	// RAM (guest-physical), which the vGPU validates and translates.
	priv.SetBusBase(0)
	b := &PVDRMBackend{v: v, t: t, codec: pvdrm.NewCodec(), priv: priv, pooling: feat.Pooling, ops: pvdrmOps(),
		vramSize: v.Slot.VRAM.Size, chans: v.Slot.Chans,
		gartOff: privSize, gartSize: gartSize, gart: rangealloc.New(0, gartSize), files: map[uint32]*pvFile{}, stopped: make(chan struct{}), faultPoll: pvdrmFaultPoll,
		quiet: make(chan *pvdrmQuiet)}
	fail := func(err error) (*PVDRMBackend, error) {
		return nil, errors.Join(fmt.Errorf("attach %s: %w", g.Name, err), a.Detach(v), priv.Close())
	}
	// The dispatcher wakes the CPU_PREP waiters when a submission of the
	// VM ends. Registered under v.mu unless the vGPU is torn down already
	// (Destroy), so its teardown's dropVM is still to come and forgets it.
	v.mu.Lock()
	if !v.dead {
		v.pvdrmWake = b.wake.broadcast
		v.pvdrm = b
		a.disp.onEnded(v, v.pvdrmWake)
	}
	v.mu.Unlock()
	if b.ring, err = pvdrm.NewBack(t.Ring()); err != nil {
		return fail(err)
	}
	if b.dev, err = nouveau.Open(vgpuPort{v}, priv, nouveau.Options{
		BAR1Size: v.Slot.BAR1.Size, BAR3Size: v.Slot.BAR3.Size, PV: nouveau.PVMulticall,
		Timeout: pvdrmTimeout, Logger: v.log.With("part", "pvdrm back end"),
	}); err != nil {
		return fail(fmt.Errorf("back-end driver: %w", err))
	}
	return b, nil
}

// mapBackToBack maps the private memfd first (size1 bytes) and the GART
// heap (size2 bytes, by mapGART) right after it, as one contiguous region.
func mapBackToBack(first int, size1, size2 uint64, mapGART GARTMapper) ([]byte, func() error, error) {
	total := uintptr(size1 + size2)
	base, err := unix.MmapPtr(-1, 0, nil, total, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, nil, fmt.Errorf("reserve %d bytes: %w", total, err)
	}
	release := func() error { return unix.MunmapPtr(base, total) }
	if _, err := unix.MmapPtr(first, 0, base, uintptr(size1), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_FIXED); err != nil {
		return nil, nil, errors.Join(fmt.Errorf("map private memory: %w", err), release())
	}
	unmapGART, err := mapGART(unsafe.Add(base, size1))
	if err != nil {
		return nil, nil, errors.Join(fmt.Errorf("map GART heap: %w", err), release())
	}
	unmap := func() error { return errors.Join(unmapGART(), release()) }
	return unsafe.Slice((*byte)(base), total), unmap, nil
}

// PVDRMBackend is the dom0 side of one pvdrm VM: its ring, its back-end
// driver on the VM's vGPU, and the files and buffers the guest made.
type PVDRMBackend struct {
	v       *VGPU
	t       pvdrm.Transport
	ring    *pvdrm.Back
	codec   *pvdrm.Codec
	dev     *nouveau.Device
	priv    *hostmem.RAM
	pooling bool

	// vramSize and chans are the vGPU's slot sizes, which the guest was
	// told and which stay its own wherever a move takes the vGPU (read
	// here, not through v.Slot, which a move rewrites).
	vramSize uint64
	chans    int

	gart     *rangealloc.Allocator // offsets in the guest's GART heap
	gartOff  uint64                // where the heap starts in the vGPU's RAM
	gartSize uint64

	ops map[pvdrm.Op]pvdrmOp

	// Owned by the serving goroutine.
	hello    bool
	features uint64
	files    map[uint32]*pvFile
	nextFile uint32
	objects  int
	pool     []*gemObject
	poolSize uint64

	// afterCopy, when set (tests), runs after each request was copied off
	// the ring and before it is decoded.
	afterCopy func()
	// wake is broadcast when something a CPU_PREP waiter waits for may
	// have happened: a submission of the VM ended, a channel was freed.
	wake pvdrmWake
	// faultPoll is how often a CPU_PREP waiter checks its channel for a
	// fault without being woken (pvdrmFaultPoll; tests lengthen it).
	faultPoll time.Duration
	// waitChecks counts the passes CPU_PREP waiters made over their fences:
	// tests read it to see that a wait blocks rather than polls.
	waitChecks atomic.Uint64

	// quiet takes a save's request to stop serving between requests
	// (pvdrm_save.go).
	quiet chan *pvdrmQuiet

	rmu     sync.Mutex // serialises responses (waiters answer too) and Next's look at them
	waiters sync.WaitGroup
	stopped chan struct{}
	closeMu sync.Mutex
	closed  bool
}

// VGPU returns the back end's vGPU.
func (b *PVDRMBackend) VGPU() *VGPU { return b.v }

// Welcome returns what the back end grants its guest: the vGPU's id, VRAM
// quota and channels (the local transport sends it on the device-model
// socket, the xen transport in xenstore).
func (b *PVDRMBackend) Welcome() ipc.Welcome {
	return ipc.Welcome{VGPU: uint32(b.v.ID), VRAMSize: b.vramSize, Channels: uint32(b.chans)}
}

// OnDestroy calls f (once) when the vGPU is destroyed from outside (the
// control API, a lost board) or at once if it is gone already: the caller
// then stops Serve.
func (b *PVDRMBackend) OnDestroy(f func(reason string)) { b.v.onHangup(f) }

// Serve reads and answers requests until ctx is done or the front end
// breaks the protocol; then it stops the VM's work and returns. The caller
// detaches the vGPU afterwards (Close).
func (b *PVDRMBackend) Serve(ctx context.Context) error {
	defer close(b.stopped)
	ctx, cancel := context.WithCancel(ctx)
	// On the way out the waiters are stopped, then waited for: a back end
	// that stops (its front end broke the ring, or its vGPU was destroyed)
	// answers nothing more.
	defer b.waiters.Wait()
	defer cancel()
	var slot [pvdrm.SlotSize]byte
	for {
		select {
		case q := <-b.quiet:
			if !q.hold(ctx) {
				return nil
			}
		default:
		}
		b.rmu.Lock() // Next checks the response index waiters advance
		ok, err := b.ring.Next(slot[:])
		b.rmu.Unlock()
		if err != nil {
			b.v.gripeLog("pvdrm front end broke the ring protocol: disconnecting it", "err", err)
			return fmt.Errorf("pvdrm: %w", err)
		}
		if ok && b.v.detached() {
			return fmt.Errorf("pvdrm: %w", ErrDetached) // destroyed (control API): nothing left to drive
		}
		if ok {
			b.v.ctr.pvdrmRequests.Add(1)
			if b.afterCopy != nil {
				b.afterCopy()
			}
			b.handle(ctx, slot[:])
			continue
		}
		b.reapZombies()
		if b.v.detached() {
			return fmt.Errorf("pvdrm: %w", ErrDetached) // destroyed (control API): nothing left to drive
		}
		if pvdrm.Spin(pvdrm.DefaultSpin, b.ring.Pending) || b.ring.FinalCheck() {
			continue
		}
		if err := b.t.Wait(ctx, 50*time.Millisecond); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("pvdrm: %w", err)
		}
	}
}

// respond publishes a response and kicks the front end if it asked.
func (b *PVDRMBackend) respond(rsp pvdrm.Response) {
	if rsp.Status != 0 {
		b.v.ctr.pvdrmRejected.Add(1)
	}
	var slot [pvdrm.SlotSize]byte
	b.codec.EncodeResponse(slot[:], rsp)
	b.rmu.Lock()
	kick := b.ring.Respond(slot[:])
	b.rmu.Unlock()
	if kick {
		b.v.ctr.pvdrmNotify.Add(1)
		if err := b.t.Notify(); err != nil {
			b.v.gripeLog("pvdrm notify", "err", err)
		}
	}
}

// Close ends the back end after Serve returned: the vGPU is detached —
// every channel of its slot stopped, whatever the driver believed, its
// VRAM scrubbed and its RAM unregistered — as an FV VM's is; the back-end
// driver is dropped with it. Then the private memory and the transport go.
func (b *PVDRMBackend) Close() error {
	b.closeMu.Lock()
	defer b.closeMu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	b.files, b.pool = nil, nil
	a, _ := b.v.where() // a move may have taken it to another board
	err := errors.Join(a.Detach(b.v), b.priv.Close(), b.t.Close())
	if err != nil {
		return fmt.Errorf("pvdrm back end of %s: %w", b.v.Guest.Name, err)
	}
	return nil
}
