//go:build linux && (amd64 || arm64)

package pvdrm

// This file is the xen transport: the ring in pages the front end (the
// guest) grants to the back end (dom0), and one interdomain event channel
// for notifications both ways, set up by the xenbus handshake. The Xen
// devices, the xenstore client and the handshake are packages xen,
// xen/xenstore and xen/xenbus; this file adds what is pvdrm's: the device
// type, the protocol version, the ring's limits and the liveness bytes.
//
// The last 64 bytes of the ring memory are never slots (the header and a
// power-of-two count of slots leave them free for any page count; checked
// at set-up). The transport keeps two liveness bytes there, which the
// kernel clears when an end's process goes away without closing, and then
// kicks the other end (gntalloc and gntdev unmap notifications):
//
//	ring[len-1]  1 while the front end holds its grant
//	ring[len-2]  1 while the back end maps the ring

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/gpuvm/gpuvm/xen"
	"github.com/gpuvm/gpuvm/xen/xenbus"
	"github.com/gpuvm/gpuvm/xen/xenstore"
)

// XenDeviceType is pvdrm's device type in xenstore paths
// (/local/domain/<front>/device/pvdrm/<devid> and
// /local/domain/<back>/backend/pvdrm/<front>/<devid>).
const XenDeviceType = "pvdrm"

// Liveness bytes at the end of the ring memory (see above).
const (
	xenTail          = 64
	xenFrontAliveOff = 1 // from the end
	xenBackAliveOff  = 2
	// defaultXenCloseTimeout bounds how long Close waits for the other end.
	defaultXenCloseTimeout = 5 * time.Second
	// xenCleanupTimeout bounds the state switches of Close, which run on
	// a context of their own.
	xenCleanupTimeout = 5 * time.Second
)

var (
	_ Transport = (*XenFront)(nil)
	_ Transport = (*XenBack)(nil)
)

// checkXenRingTail makes sure the ring never reaches the liveness bytes.
func checkXenRingTail(mem []byte) error {
	if used := HeaderSize + int(Slots(len(mem)))*SlotSize; used > len(mem)-xenTail {
		return fmt.Errorf("pvdrm xen: a ring of %d bytes uses %d: no room for the liveness bytes", len(mem), used)
	}
	return nil
}

// peerAlive reads the liveness byte off bytes from the end of mem. The
// four last bytes are read at once, atomically (the kernel clears a byte
// of them in another domain).
func peerAlive(mem []byte, off int) bool {
	w := atomic.LoadUint32((*uint32)(unsafe.Pointer(&mem[len(mem)-4])))
	return byte(w>>(8*(4-off))) != 0 // little-endian: the last byte is the top one
}

// unmapNotifier is a ring mapping whose disappearance the kernel can
// announce (GrantedPages in the guest, GrantMapping in dom0).
type unmapNotifier interface {
	SetUnmapNotify(off int, action, port uint32) error
}

// armLiveness sets this end's liveness byte, off bytes from the end of the
// ring, and has the kernel clear it and kick port when this end's mapping
// goes (the process exits or closes the transport).
func armLiveness(mem []byte, ring unmapNotifier, off int, port uint32) error {
	mem[len(mem)-off] = 1
	return ring.SetUnmapNotify(len(mem)-off, xen.UnmapNotifyClearByte|xen.UnmapNotifySendEvent, port)
}

// xenEvents is an end's event channel: Notify kicks the other end, Wait
// blocks until it kicked, ctx is done (its error), or max passes (nil).
type xenEvents struct{ ev *xen.Evtchn }

// Notify kicks the other end.
func (e xenEvents) Notify() error { return e.ev.Notify() }

// Wait blocks until the other end kicked, ctx is done (its error), or max
// passes (nil).
func (e xenEvents) Wait(ctx context.Context, max time.Duration) error { return e.ev.Wait(ctx, max) }

// XenFrontConfig configures a front end.
type XenFrontConfig struct {
	// Xenstore is the connection to xenstore (required).
	Xenstore *xenstore.Client
	// Domid is this (the front end's) domain's id.
	Domid uint16
	// DevID is the device id: the toolstack created
	// /local/domain/<Domid>/device/pvdrm/<DevID>.
	DevID uint32
	// Pages is the ring size: a power of two up to MaxRingPages, and up
	// to what the back end accepts (0 means 1).
	Pages int
	// DevDir is where the Xen devices are ("" is xen.DevDir).
	DevDir string
	// CloseTimeout bounds how long Close waits for the back end to let go
	// of the ring (0 means 5 s).
	CloseTimeout time.Duration
	// GARTPages, if not 0, is the size of the GART heap the front end
	// grants the back end (pages of 4 KiB, at most MaxXenGARTPages).
	GARTPages int
	// Forge, for isolation tests, has the front end publish what a hostile
	// guest would: it may rewrite the GART directory pages (dir) and
	// returns the keys published with the ring in place of extra. The back
	// end must refuse whatever is wrong.
	Forge func(dir []byte, extra []xenbus.Extra) []xenbus.Extra
}

// XenFront is the front end (guest) of the xen transport. Notify and Wait
// may be called concurrently with each other, not with Close.
type XenFront struct {
	link *xenbus.Front
	gnt  *xen.Gntalloc
	ring *xen.GrantedPages
	gart *XenGART
	xenEvents
	closeTimeout time.Duration
	devDir       string
	pages        int
	// evMu guards ev, link and the save state (xen_resume.go): a save
	// closes the port under Notify and Wait, and the resume binds another.
	evMu      sync.RWMutex
	suspended bool          // saved: no port; requests wait on the ring
	resumed   chan struct{} // closed when the front end resumes
}

// NewXenFront opens the Xen devices, runs the front end's handshake, and
// returns once the back end is Connected: it grants the ring pages to the
// back end's domain, allocates an event channel port for it, publishes
// both, and arms the unmap notification that tells the back end if this
// process goes away. Without /dev/xen it fails at once, wrapping
// xen.ErrNoXen.
func NewXenFront(ctx context.Context, cfg XenFrontConfig) (*XenFront, error) {
	if cfg.Xenstore == nil {
		return nil, errors.New("pvdrm xen front: no xenstore connection")
	}
	if cfg.Pages == 0 {
		cfg.Pages = 1
	}
	if _, err := xenbus.RingPageOrder(cfg.Pages); err != nil || cfg.Pages > MaxRingPages {
		return nil, fmt.Errorf("pvdrm xen front: %d ring pages: want a power of two up to %d", cfg.Pages, MaxRingPages)
	}
	x := &XenFront{closeTimeout: cmp.Or(cfg.CloseTimeout, defaultXenCloseTimeout), devDir: cfg.DevDir, pages: cfg.Pages}
	var err error
	if x.gnt, err = xen.OpenGntalloc(cfg.DevDir); err != nil {
		return nil, err
	}
	if x.ev, err = xen.OpenEvtchn(cfg.DevDir); err != nil {
		return nil, errors.Join(err, x.release())
	}
	if err = x.connect(ctx, cfg); err != nil {
		err = fmt.Errorf("pvdrm xen front %d/%d: %w", cfg.Domid, cfg.DevID, err)
		return nil, errors.Join(err, x.Close())
	}
	return x, nil
}

func (x *XenFront) connect(ctx context.Context, cfg XenFrontConfig) error {
	var err error
	dev := xenbus.Device{Type: XenDeviceType, FrontDomid: cfg.Domid, DevID: cfg.DevID}
	if x.link, err = xenbus.StartFront(ctx, cfg.Xenstore, dev, Version); err != nil {
		return err
	}
	if err := x.ringFits(x.link); err != nil {
		return err
	}
	back := x.link.Device().BackDomid
	if x.ring, err = x.gnt.Share(back, cfg.Pages, true); err != nil {
		return err
	}
	if err := checkXenRingTail(x.ring.Mem()); err != nil {
		return err
	}
	var extra []xenbus.Extra
	if cfg.GARTPages > 0 {
		if x.gart, err = NewXenGART(x.gnt, back, cfg.GARTPages); err != nil {
			return err
		}
		extra = x.gart.Keys()
		if cfg.Forge != nil {
			extra = cfg.Forge(x.gart.dir.Mem(), extra)
		}
	}
	return x.offer(ctx, x.link, x.ev, extra)
}

// ringFits checks the ring's pages against what link's back end accepts.
func (x *XenFront) ringFits(link *xenbus.Front) error {
	if x.pages > link.MaxRingPages() {
		return fmt.Errorf("%d ring pages: the back end accepts at most %d", x.pages, link.MaxRingPages())
	}
	return nil
}

// offer is the end of the front end's handshake, at its start and at a
// resume (xen_resume.go): it binds ev for link's back end, arms this end's
// liveness byte on it, publishes the ring, ev's port and extra, and waits
// for Connected.
func (x *XenFront) offer(ctx context.Context, link *xenbus.Front, ev *xen.Evtchn, extra []xenbus.Extra) error {
	if err := ev.BindUnbound(link.Device().BackDomid); err != nil {
		return err
	}
	if err := armLiveness(x.ring.Mem(), x.ring, xenFrontAliveOff, ev.Port()); err != nil {
		return err
	}
	if err := link.Publish(ctx, x.ring.Refs(), ev.Port(), extra...); err != nil {
		return err
	}
	return link.WaitConnected(ctx)
}

// GART returns the GART heap granted to the back end (nil without one).
func (x *XenFront) GART() []byte {
	if x.gart == nil {
		return nil
	}
	return x.gart.Mem()
}

// Ring returns the shared ring memory: pages that start zeroed, which the
// caller initialises with NewFront before its first Notify.
func (x *XenFront) Ring() []byte {
	if x.ring == nil {
		return nil
	}
	return x.ring.Mem()
}

// PeerGone reports whether the back end's mapping of the ring went away
// (its process exited or closed the transport).
func (x *XenFront) PeerGone() bool { return x.ring == nil || !peerAlive(x.ring.Mem(), xenBackAliveOff) }

// Xenbus returns the front end's handshake, for its state and the back
// end's.
func (x *XenFront) Xenbus() *xenbus.Front {
	x.evMu.RLock()
	defer x.evMu.RUnlock()
	return x.link
}

// Close switches to Closing, waits (CloseTimeout at most) for the back end
// to stop using the ring unless it is gone already, revokes the grants,
// unbinds the port, and switches to Closed. It also undoes a failed
// NewXenFront.
func (x *XenFront) Close() error {
	var errs []error
	x.evMu.Lock()
	if x.suspended {
		// Saved, and closed before any resume: the back end let go
		// already, and the port is closed.
		x.suspended = false
		close(x.resumed)
	}
	x.evMu.Unlock()
	if x.link != nil {
		ctx, cancel := context.WithTimeout(context.Background(), x.closeTimeout)
		defer cancel()
		if x.ring != nil && !x.PeerGone() {
			if err := x.link.Closing(ctx); err != nil {
				errs = append(errs, fmt.Errorf("pvdrm xen front: the back end did not let go of the ring: %w", err))
			}
		} else {
			errs = append(errs, x.link.Announce(ctx, xenbus.StateClosing))
		}
	}
	errs = append(errs, x.release())
	if x.link != nil {
		ctx, cancel := context.WithTimeout(context.Background(), xenCleanupTimeout)
		defer cancel()
		errs = append(errs, x.link.Closed(ctx))
		x.link = nil
	}
	return errors.Join(errs...)
}

// release revokes the grants, unbinds the port and closes the devices.
func (x *XenFront) release() error {
	var errs []error
	if x.ring != nil {
		errs = append(errs, x.ring.Close())
		x.ring = nil
	}
	if x.ev != nil {
		errs = append(errs, x.ev.Close())
		x.ev = nil
	}
	if x.gnt != nil {
		errs = append(errs, x.gnt.Close())
		x.gnt = nil
	}
	return errors.Join(errs...)
}

// XenBackConfig configures a back end.
type XenBackConfig struct {
	// Xenstore is the connection to xenstore (required).
	Xenstore *xenstore.Client
	// Device names the device: its Type is XenDeviceType, and BackDomid
	// is this domain's id.
	Device xenbus.Device
	// DevDir is where the Xen devices are ("" is xen.DevDir).
	DevDir string
	// GART says the front end must publish a GART heap (MapGART maps it).
	GART bool
	// NoConnect leaves the switch to Connected to the caller (Connect),
	// which may first set the device up and say what it granted.
	NoConnect bool
	// Restore offers the device to a saved front end
	// (xenbus.StartBackResuming): the caller restores the state the save
	// took (docs/pvdrm.md §8, "A device across a save").
	Restore bool
	// Resume takes over a device an earlier back-end process left
	// Connected when it handed itself over (Disown): no state is
	// switched, the front end sees nothing; Resumed reports it. A device
	// not Connected gets the handshake as without Resume.
	Resume bool
}

// XenBack is the back end (dom0) of the xen transport. Notify and Wait
// may be called concurrently with each other, not with Close.
type XenBack struct {
	link *xenbus.Back
	gnt  *xen.Gntdev
	// mu guards ring and disowned: a handoff disowns the transport from
	// another goroutine than the session's, which may be closing it.
	mu   sync.Mutex
	ring *xen.GrantMapping
	xenEvents
	version uint32
	devDir  string
	front   uint16
	// resumed: the device was taken over Connected (XenBackConfig.Resume).
	resumed bool
	// disowned: the device is handed to another back-end process
	// (Disown), or its state saved (MarkSaved): Close releases this
	// process's mappings and port only.
	disowned  bool
	gartRef   uint32
	gartPages int
}

// NewXenBack opens the Xen devices, runs the back end's handshake and
// returns once it switched to Connected (with NoConnect, just before): it
// waits for the front end to publish its ring, maps the granted pages,
// binds the front end's port, and arms the unmap notification that tells
// the front end if this process goes away. Everything read from xenstore
// is checked. Without /dev/xen it fails at once, wrapping xen.ErrNoXen.
func NewXenBack(ctx context.Context, cfg XenBackConfig) (*XenBack, error) {
	if cfg.Xenstore == nil {
		return nil, errors.New("pvdrm xen back: no xenstore connection")
	}
	if cfg.Device.Type != XenDeviceType {
		return nil, fmt.Errorf("pvdrm xen back: device type %q, want %q", cfg.Device.Type, XenDeviceType)
	}
	x := &XenBack{}
	var err error
	if x.gnt, err = xen.OpenGntdev(cfg.DevDir); err != nil {
		return nil, err
	}
	if x.ev, err = xen.OpenEvtchn(cfg.DevDir); err != nil {
		return nil, errors.Join(err, x.release())
	}
	if err = x.connect(ctx, cfg); err != nil {
		err = fmt.Errorf("pvdrm xen back %d/%d/%d: %w", cfg.Device.BackDomid, cfg.Device.FrontDomid, cfg.Device.DevID, err)
		return nil, errors.Join(err, x.Close())
	}
	return x, nil
}

func (x *XenBack) connect(ctx context.Context, cfg XenBackConfig) error {
	var err error
	if cfg.Resume {
		x.link, err = xenbus.ResumeBack(ctx, cfg.Xenstore, cfg.Device, Version)
		x.resumed = err == nil
		if errors.Is(err, xenbus.ErrNotConnected) {
			err = nil
		}
		if err != nil {
			return err
		}
	}
	start := xenbus.StartBack
	if cfg.Restore {
		start = xenbus.StartBackResuming
	}
	if x.link == nil {
		if x.link, err = start(ctx, cfg.Xenstore, cfg.Device, Version); err != nil {
			return err
		}
	}
	var keys []xenbus.ExtraKey
	if cfg.GART {
		keys = XenGARTKeys()
	}
	r, err := x.link.WaitRing(ctx, keys...)
	if err != nil {
		return err
	}
	x.version = r.Version
	front := cfg.Device.FrontDomid
	x.front, x.devDir = front, cfg.DevDir
	if cfg.GART {
		x.gartRef, x.gartPages = uint32(r.Extra[xenKeyGARTRef]), int(r.Extra[xenKeyGARTPages])
	}
	if x.ring, err = x.gnt.Map(front, r.Refs, true); err != nil {
		return err
	}
	mem := x.ring.Mem()
	if err := checkXenRingTail(mem); err != nil {
		return err
	}
	if err := x.ev.BindInterdomain(front, r.Port); err != nil {
		return err
	}
	if err := armLiveness(mem, x.ring, xenBackAliveOff, x.ev.Port()); err != nil {
		return err
	}
	// Served here now, resumed or not (a device handed over before its
	// handshake ended gets the handshake): the front end stops counting
	// (xenbus.KeyHandoff).
	if err := x.link.ClearHandoff(ctx); err != nil {
		return err
	}
	if cfg.NoConnect || x.resumed {
		return nil
	}
	return x.link.Connect(ctx)
}

// Resumed reports whether the device was taken over Connected
// (XenBackConfig.Resume): its front end goes on from where the earlier
// back end left it, and Connect must not be called.
func (x *XenBack) Resumed() bool { return x.resumed }

// ResumesHandoff reports that a daemon handing itself to a new process can
// hand this back end over (Disown; the new process resumes it).
func (x *XenBack) ResumesHandoff() bool { return true }

// Disown prepares the device for a new back-end process of the daemon: the
// unmap notification is disarmed, so that this process's mapping going —
// Close, or the exec — does not tell the front end its back end went, and
// Close then releases this process's mappings and port without switching
// any state. The front end waits, its requests on the ring, for the new
// process (XenBackConfig.Resume), which binds its port again: Xen left it
// unbound to dom0 when this process's end closed.
func (x *XenBack) Disown(ctx context.Context) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.ring == nil {
		return errors.New("pvdrm xen back: no ring to hand over (the device was closed)")
	}
	// The mark first: once the notification is disarmed, it is the front
	// end's only word that the takeover failed (it stays longer than
	// XenHandoffTakeover). A Disown that fails leaves the device armed
	// and unmarked, as if it had not been called.
	if err := x.link.MarkHandoff(ctx, XenHandoffTakeover); err != nil {
		return err
	}
	if err := x.ring.SetUnmapNotify(len(x.ring.Mem())-xenBackAliveOff, 0, 0); err != nil {
		return errors.Join(err, x.link.ClearHandoff(ctx))
	}
	x.disowned = true
	return nil
}

// MarkSaved says, before the back end lets go of the ring, that its
// state was saved (the vGPU's image taken): its front end, seeing the
// ring's back-end liveness byte go, keeps its ring and waits for a back
// end that restores the image (xenbus.KeySaved). Close then releases this
// process's mappings and port without switching any state.
func (x *XenBack) MarkSaved(ctx context.Context) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if err := x.link.MarkSaved(ctx); err != nil {
		return err
	}
	x.disowned = true
	return nil
}

// Disowned reports whether the device was handed to another back-end
// process (Disown) or its state saved (MarkSaved).
func (x *XenBack) Disowned() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.disowned
}

// FollowsSave reports that the front end outlives a save of the state
// this back end serves, waiting for a back end that restores it (on this
// daemon: the device is its).
func (x *XenBack) FollowsSave() bool { return true }

// XenHandoffTakeover is how long a front end whose back end was handed to
// a new daemon process (Disown) waits for that process to take the device
// over before it fails (xenbus.KeyHandoff).
const XenHandoffTakeover = 2 * time.Minute

// Connect switches to Connected (after NewXenBack with NoConnect),
// publishing extra for the front end to read.
func (x *XenBack) Connect(ctx context.Context, extra ...xenbus.Extra) error {
	return x.link.Connect(ctx, extra...)
}

// GARTSize returns the size in bytes of the GART heap the front end
// published (0 without one).
func (x *XenBack) GARTSize() uint64 { return uint64(x.gartPages) * xen.PageSize }

// MapGART maps the front end's GART heap at address at, which must have
// room for GARTSize bytes (the caller reserved it). The caller owns the
// mapping: it closes it before it releases the range.
func (x *XenBack) MapGART(at unsafe.Pointer) (*XenGARTMapping, error) {
	if x.gartPages == 0 {
		return nil, errors.New("pvdrm xen back: the front end published no GART heap")
	}
	gnt, err := xen.OpenGntdev(x.devDir) // its own: the mapping may outlive the ring's
	if err != nil {
		return nil, err
	}
	m, err := MapXenGART(gnt, x.front, x.gartRef, x.gartPages, at)
	if err != nil {
		return nil, errors.Join(err, gnt.Close())
	}
	m.gnt = gnt
	return m, nil
}

// Ring returns the shared ring memory (the front end's pages, mapped).
func (x *XenBack) Ring() []byte {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.ring == nil {
		return nil
	}
	return x.ring.Mem()
}

// PeerGone reports whether the front end's grant went away (its process
// exited or closed the transport): its unmap notification cleared the
// byte, and kicked this end.
func (x *XenBack) PeerGone() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.ring == nil || !peerAlive(x.ring.Mem(), xenFrontAliveOff)
}

// Version returns the protocol version the front end chose.
func (x *XenBack) Version() uint32 { return x.version }

// Xenbus returns the back end's handshake, e.g. to WaitPeerClosing.
func (x *XenBack) Xenbus() *xenbus.Back { return x.link }

// Close unmaps the ring (the front end is notified), unbinds the port, and
// switches to Closing and then Closed; after Disown it only unmaps and
// unbinds.
func (x *XenBack) Close() error {
	errs := []error{x.release()}
	x.mu.Lock()
	disowned := x.disowned
	x.mu.Unlock()
	if x.link != nil && !disowned {
		ctx, cancel := context.WithTimeout(context.Background(), xenCleanupTimeout)
		defer cancel()
		errs = append(errs, x.link.Closing(ctx), x.link.Closed(ctx))
		x.link = nil
	}
	return errors.Join(errs...)
}

func (x *XenBack) release() error {
	var errs []error
	x.mu.Lock()
	if x.ring != nil {
		errs = append(errs, x.ring.Close())
		x.ring = nil
	}
	x.mu.Unlock()
	if x.ev != nil {
		errs = append(errs, x.ev.Close())
		x.ev = nil
	}
	if x.gnt != nil {
		errs = append(errs, x.gnt.Close())
		x.gnt = nil
	}
	return errors.Join(errs...)
}
