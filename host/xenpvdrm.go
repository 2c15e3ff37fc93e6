package host

// pvdrm back ends for Xen domains (docs/pvdrm.md §8): the daemon plays the
// toolstack's part for its own device type (it creates the device's two
// xenstore directories), waits for the guest's front end, places the
// domain's vGPU on a board, maps the ring and the GART heap the guest
// granted, and serves the ring until the front end closes or goes, the
// vGPU is destroyed, or the domain goes. Then it waits for the next front
// end of the same domain (a guest process that opens the device again).

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"strconv"
	"time"
	"unsafe"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/pvdrm"
	"github.com/gpuvm/gpuvm/xen/xenbus"
	"github.com/gpuvm/gpuvm/xen/xenstore"
)

// XenPVDRMRequest asks for a Xen domain's pvdrm back end.
type XenPVDRMRequest struct {
	// Name is the domain's name (the vGPU's guest name).
	Name string `json:"name"`
	// DevID is the pvdrm device's id in the domain (default 0).
	DevID uint32 `json:"devid"`
}

// xenPVDRMService is one domain's running pvdrm back end. Its fields but
// stop are guarded by Host.mu.
type xenPVDRMService struct {
	ctx  context.Context // ended: the back end is stopping
	stop context.CancelFunc
	req  XenPVDRMRequest
	// attaching: a session is between its handshake and its vGPU's
	// attach (a handoff waits for it to end).
	attaching bool
	// session is the transport of the session serving now (nil between
	// sessions), which a handoff disowns if vgpu, the session's vGPU once
	// attached, was held for it.
	session *pvdrm.XenBack
	vgpu    *aggregator.VGPU
	// handedOff: the session's device was handed to a new process.
	handedOff bool
}

// How the back-end service paces itself.
const (
	// xenLook is how often a session looks at the front end's state and
	// liveness byte, and the service at the domain's.
	xenLook = 100 * time.Millisecond
	// xenRetry is the least time between two sessions of one device: a
	// front end that fails its handshake in a loop costs dom0 one attempt
	// per xenRetry.
	xenRetry = 500 * time.Millisecond
)

// ErrNoXen is returned when the daemon does not serve Xen domains.
var ErrNoXen = errors.New("this daemon does not serve Xen domains (start it with gpuvm serve --xen)")

// StartXenPVDRM starts the pvdrm back end of domain domid (mode pvdrm or
// pvdrm-pooling, from the settings registered for it): it runs until the
// domain goes, StopXenPVDRM, or the host closes. One per domain; the
// daemon runs at most four per vGPU slot.
func (h *Host) StartXenPVDRM(domid uint32, req XenPVDRMRequest) error {
	return h.startXenPVDRM(domid, req, false)
}

// startXenPVDRM is StartXenPVDRM; with resume, the device exists and its
// first session takes it over as a handoff left it (ResumeXenPVDRM).
func (h *Host) startXenPVDRM(domid uint32, req XenPVDRMRequest, resume bool) error {
	if !h.opts.Xen {
		return ErrNoXen
	}
	if domid == 0 || domid >= 0x7FF0 {
		return fmt.Errorf("domain %d: not a guest domain", domid)
	}
	s, ok := h.pendingSettings(domid)
	if !ok {
		return fmt.Errorf("domain %d: no vGPU settings registered (PUT /v1/domains/%d first)", domid, domid)
	}
	if feat, err := aggregator.FeaturesFor(s.Mode); err != nil || !feat.PVDRM {
		return fmt.Errorf("domain %d: mode %q is not a pvdrm mode", domid, s.Mode)
	}
	g := aggregator.Guest{DomID: domid, Name: req.Name, Mode: s.Mode}
	if g.Name == "" {
		g.Name = "domain-" + strconv.FormatUint(uint64(domid), 10)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return errors.New("the daemon is stopping")
	}
	if _, dup := h.xenPVDRM[domid]; dup {
		return fmt.Errorf("domain %d: its pvdrm back end runs already", domid)
	}
	if max := 4 * len(h.Layout().Slots); len(h.xenPVDRM) >= max {
		return fmt.Errorf("domain %d: %d pvdrm back ends run already (at most %d)", domid, len(h.xenPVDRM), max)
	}
	ctx, stop := context.WithCancel(h.bg)
	h.xenPVDRM[domid] = &xenPVDRMService{ctx: ctx, stop: stop, req: req}
	h.bgWait.Add(1)
	go func() {
		defer h.bgWait.Done()
		log := h.log.With("domid", domid, "name", g.Name, "part", "xen pvdrm")
		err := h.serveXenPVDRM(ctx, g, req.DevID, resume, log)
		log.Info("pvdrm back end ends", "reason", err)
		h.mu.Lock()
		delete(h.xenPVDRM, domid)
		delete(h.pending, domid) // its settings go with the domain's device
		h.mu.Unlock()
		stop()
	}()
	return nil
}

// StopXenPVDRM stops domain domid's pvdrm back end (its vGPU is torn down).
func (h *Host) StopXenPVDRM(domid uint32) bool {
	h.mu.Lock()
	s, ok := h.xenPVDRM[domid]
	h.mu.Unlock()
	if ok {
		s.stop()
	}
	return ok
}

// pendingSettings returns the settings registered for domid (they stay
// registered: each session of the domain's back end uses them).
func (h *Host) pendingSettings(domid uint32) (aggregator.DomainSettings, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.pending[domid]
	return s, ok
}

// serveXenPVDRM runs one domain's device until ctx ends or the domain
// goes. With resume the device exists, made by an earlier process of the
// daemon that handed it over, and is not made afresh.
func (h *Host) serveXenPVDRM(ctx context.Context, g aggregator.Guest, devID uint32, resume bool, log *slog.Logger) error {
	xs, err := xenstore.Open()
	if err != nil {
		return err
	}
	defer xs.Close()
	self, err := xenbus.SelfDomid(ctx, xs)
	if err != nil {
		return err
	}
	dev := pvdrmDevice(self, g.DomID, devID)
	switch _, err := xs.Read(ctx, dev.BackendPath()+"/state"); {
	case !resume || errors.Is(err, fs.ErrNotExist):
		if err := xenbus.CreateDevice(ctx, xs, dev); err != nil {
			return fmt.Errorf("create the pvdrm device: %w", err)
		}
		resume = false
	case err != nil:
		// Not made afresh under a front end that may be connected:
		// closed, so that it learns.
		return errors.Join(fmt.Errorf("the handed-over pvdrm device: %w", err), xenbus.CloseBack(ctx, xs, dev))
	}
	defer func() {
		if ch := h.xenHandingOff(); ch != nil {
			// The new process goes on with the device; if the exec
			// fails, it is this one's to remove.
			select {
			case <-ch:
			case <-h.bg.Done():
				return
			}
		}
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := xenbus.RemoveDevice(rctx, xs, dev); err != nil {
			log.Warn("remove the pvdrm device", "err", err)
		}
	}()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	errGone := errors.New("the domain is gone")
	go func() {
		key := fmt.Sprintf("/local/domain/%d/domid", g.DomID)
		for ctx.Err() == nil {
			if _, err := xs.Read(ctx, key); errors.Is(err, fs.ErrNotExist) {
				cancel(errGone)
				return
			}
			sleepCtx(ctx, xenLook)
		}
	}()
	if resume {
		log.Info("pvdrm device handed over by the previous daemon process; taking it over", "frontend", dev.FrontendPath())
	} else {
		log.Info("pvdrm device created; waiting for the guest's front end", "frontend", dev.FrontendPath())
	}
	for ctx.Err() == nil {
		// While the daemon hands itself over no session starts: the new
		// process runs it (or this one, if the handoff does not happen).
		if ch := h.xenHandingOff(); ch != nil {
			select {
			case <-ch:
			case <-ctx.Done():
				return context.Cause(ctx)
			}
			resume = true
		}
		start := time.Now()
		var err error
		if resume && xenDeviceSaved(ctx, xs, dev) {
			// Handed over (or a handoff called off) while its vGPU was
			// saved and no session served it: it waits for the image.
			resume, err = false, errXenSaved
		} else {
			err = h.xenPVDRMSession(ctx, xs, dev, g, resume, log)
		}
		if errors.Is(err, errXenHandedOff) {
			// Handed to a new process: the exec ends this one. If it
			// does not happen, this process takes the device over again.
			log.Info("pvdrm device handed over: waiting for the exec")
			resume = true
			continue
		}
		if resume && err != nil && ctx.Err() == nil {
			// Taken over as a handoff left it, and not served: the front
			// end, which sees no liveness byte go, is told in xenstore.
			log.Warn("pvdrm device handed over and not served: closing it", "err", err)
			if cerr := xenbus.CloseBack(ctx, xs, dev); cerr != nil {
				log.Warn("close the pvdrm device", "err", cerr)
			}
			err = nil
		}
		resume = false
		if errors.Is(err, errXenSaved) {
			// The front end waits for the image's restore: the next
			// session is the one that restores it (gpuvm vgpu restore,
			// or gpuvm xl save giving the domain its vGPU back after a
			// failed xl save); the domain going ends the wait.
			log.Info("pvdrm vGPU saved; the device waits for its image's restore")
			for ctx.Err() == nil && h.restoreBoard(g.DomID) == nil {
				if frontEndLeft(ctx, xs, dev) {
					// It did not wait (no resume timeout, or it passed):
					// the next front end starts afresh.
					log.Info("the saved pvdrm front end left; the device serves a fresh one")
					break
				}
				sleepCtx(ctx, xenLook)
			}
			continue
		}
		if err != nil && ctx.Err() == nil {
			log.Warn("pvdrm session failed", "err", err)
		}
		// The next session waits for a front end that starts afresh (a
		// crashed one leaves its keys and state behind).
		for ctx.Err() == nil {
			st, err := xs.Read(ctx, dev.FrontendPath()+"/state")
			if err != nil || (st != strconv.Itoa(int(xenbus.StateInitialised)) && st != strconv.Itoa(int(xenbus.StateConnected))) {
				break
			}
			sleepCtx(ctx, xenLook)
		}
		sleepCtx(ctx, xenRetry-time.Since(start))
	}
	return context.Cause(ctx)
}

// xenPVDRMSession serves one front end: handshake, placement, attach,
// the ring, teardown.
func (h *Host) xenPVDRMSession(ctx context.Context, xs *xenstore.Client, dev xenbus.Device, g aggregator.Guest, resume bool, log *slog.Logger) (err error) {
	// An image waiting for the domain (gpuvm xl restore, or a save that
	// did not happen) is its saved front end's: the device is offered to
	// resume, and only that image gives it its vGPU.
	restore := !resume && h.restoreBoard(g.DomID) != nil
	x, err := pvdrm.NewXenBack(ctx, pvdrm.XenBackConfig{Xenstore: xs, Device: dev, DevDir: h.opts.XenDevDir, GART: true, NoConnect: true, Resume: resume, Restore: restore})
	if err != nil {
		return err
	}
	if !h.xenSessionStarts(g.DomID, x) {
		// A handoff began meanwhile: the new process runs the handshake
		// on (the device's states are left as they are).
		return errors.Join(errXenHandedOff, x.Disown(ctx), x.Close())
	}
	defer func() {
		if h.xenSessionEnds(g.DomID) {
			err = errXenHandedOff
		}
	}()
	b, d := h.Place(g)
	if r := h.restoreBoard(g.DomID); r != nil && (x.Resumed() || restore) {
		b = r // the image handed over, or saved, waits there
	}
	if b == nil {
		return errors.Join(fmt.Errorf("no board: %s", d.Reason), x.Close())
	}
	if s, ok := h.pendingSettings(g.DomID); ok {
		if err := b.Agg.SetDomainSettings(g.DomID, s); err != nil {
			return errors.Join(err, x.Close())
		}
	}
	var gart *pvdrm.XenGARTMapping
	mapGART := func(at unsafe.Pointer) (func() error, error) {
		m, err := x.MapGART(at)
		if err != nil {
			return nil, err
		}
		gart = m
		return m.Close, nil
	}
	var be *aggregator.PVDRMBackend
	if x.Resumed() || restore {
		// The front end goes on from where the previous process, or
		// the save, left it: only the image can give it its vGPU.
		be, err = b.Agg.AttachPVDRMRestoredMapped(g, x.GARTSize(), mapGART, x)
	} else {
		be, err = b.Agg.AttachPVDRMMapped(g, x.GARTSize(), mapGART, x)
	}
	if err != nil {
		return errors.Join(err, x.Close())
	}
	h.xenSessionAttached(g.DomID, be.VGPU())
	w := be.Welcome()
	switch {
	case x.Resumed():
		log.Info("pvdrm device taken over from the previous daemon process", "vgpu", w.VGPU, "board", b.Name)
	case restore:
		log.Info("pvdrm vGPU restored for the saved front end", "vgpu", w.VGPU, "board", b.Name)
	}
	if !x.Resumed() {
		if err := x.Connect(ctx, pvdrm.XenWelcomeKeys(w)...); err != nil {
			return errors.Join(err, be.Close())
		}
	}
	// Grant mappings: the ring's (one, of its pages) and the GART heap's.
	log.Info("pvdrm front end connected", "vgpu", w.VGPU, "board", b.Name, "gart_bytes", x.GARTSize(), "grant_maps", 1+gart.Maps)
	sctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	be.OnDestroy(func(reason string) { stop(errors.New(reason)) })
	go func() {
		for sctx.Err() == nil {
			sleepCtx(sctx, xenLook)
			if x.PeerGone() {
				stop(errors.New("the front end's grant went away"))
				return
			}
			if st, err := x.Xenbus().PeerState(sctx); err == nil && st != xenbus.StateConnected && st != xenbus.StateInitialised {
				stop(fmt.Errorf("the front end is %v", st))
				return
			}
		}
	}()
	serr := be.Serve(sctx)
	// Saved to an image, not handed to a new process of the daemon (whose
	// Bye is a saved one too, and whose transport is disowned): a nil
	// cause is Serve ending by itself (the front end broke the ring).
	cause := context.Cause(sctx)
	saved := cause != nil && cause.Error() == aggregator.SaveReason && !x.Disowned()
	if saved {
		// The vGPU went to a state image (gpuvm xl save, gpuvm vgpu
		// save): the front end keeps its ring and waits for the back end
		// that restores it, told so before the ring goes.
		mctx, cancel := context.WithTimeout(context.Background(), xenCleanupWait)
		if err := x.MarkSaved(mctx); err != nil {
			log.Warn("mark the pvdrm device saved: its front end fails", "err", err)
			saved = false
		}
		cancel()
	}
	cerr := be.Close() // detaches the vGPU, unmaps the heap and the ring, closes the device's session
	log.Info("pvdrm front end gone", "vgpu", w.VGPU, "reason", context.Cause(sctx), "serve", serr,
		"grant_maps", 1+gart.Maps, "grant_unmaps", 1+gart.Unmaps)
	if saved && cerr == nil {
		return errXenSaved
	}
	return cerr
}

// xenDeviceSaved reports whether dev's back-end directory carries the
// saved mark (xenbus.KeySaved): its vGPU was saved and no session has
// served it since.
func xenDeviceSaved(ctx context.Context, xs *xenstore.Client, dev xenbus.Device) bool {
	_, err := xs.Read(ctx, dev.BackendPath()+"/"+xenbus.KeySaved)
	return err == nil
}

// frontEndLeft reports whether dev's front end is Closing or Closed.
func frontEndLeft(ctx context.Context, xs *xenstore.Client, dev xenbus.Device) bool {
	st, err := xs.Read(ctx, dev.FrontendPath()+"/state")
	return err == nil && (st == strconv.Itoa(int(xenbus.StateClosing)) || st == strconv.Itoa(int(xenbus.StateClosed)))
}

// errXenSaved ends a session whose vGPU was saved: the device waits for
// the image's restore (its front end too).
var errXenSaved = errors.New("the pvdrm vGPU was saved to a state image")

// xenCleanupWait bounds the xenstore writes of a session's end.
const xenCleanupWait = 5 * time.Second

// pvdrmDevice is domain domid's pvdrm device devID, backed by domain self.
func pvdrmDevice(self uint16, domid, devID uint32) xenbus.Device {
	return xenbus.Device{Type: pvdrm.XenDeviceType, FrontDomid: uint16(domid), BackDomid: self, DevID: devID}
}

// sleepCtx sleeps d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
