//go:build linux && (amd64 || arm64)

package pvdrm

// A xen front end across a save of its vGPU (docs/pvdrm.md §8, "A device across a save"). The
// back end parks the vGPU at a request boundary, saves it as a state
// image, marks its directory saved (xenbus.KeySaved) and lets go of the
// ring. The front end, seeing the ring's back-end liveness byte go with
// that mark, keeps its ring and GART heap where they are — requests made
// meanwhile wait on the ring — but lets go of what a save of the domain
// cannot carry: its event channel (after a restore Xen has none of the
// domain's ports, and Linux's evtchn device would trip on a stale one when
// the process closes it). It announces Initialising: the toolstack (gpuvm
// xl save) waits for that before it saves the domain.
//
// It resumes when a back end offers the device with xenbus.KeyResume:
// the one that restored the image, in this domain (a save that did not
// happen) or in the domain xl restore made of it (a new domid; the grants
// of the old one are gone with its grant table). It grants its ring, GART
// heap and heap directory again — new pages, filled with what the old
// ones held, mapped in their place, so every pointer into them stays
// valid — binds a new port, publishes them and waits for Connected. The
// back end checks the ring's indices against the image's before it
// serves.
//
// The copy onto the new pages is not atomic with respect to the
// application: a write it makes to a mapped buffer while the front end
// copies the heap may be lost. Requests are paused over it, and the ring
// is copied with the client's pushes held; gpuvm's guest writes a buffer
// only between its own requests, which wait from the moment the back end
// let go. (A kernel DRM driver makes this exact by faulting CPU mappings
// during a move; a front end in user space cannot.)

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gpuvm/gpuvm/xen"
	"github.com/gpuvm/gpuvm/xen/xenbus"
	"github.com/gpuvm/gpuvm/xen/xenstore"
)

// Notify kicks the back end; while the front end is saved (no port) it
// does nothing: the request waits on the ring, and the resume kicks the
// back end that restored the image.
func (x *XenFront) Notify() error {
	x.evMu.RLock()
	defer x.evMu.RUnlock()
	if x.suspended {
		return nil
	}
	return x.ev.Notify()
}

// Wait blocks until the back end kicked, ctx is done (its error), or max
// passes (nil); while the front end is saved, until it resumes.
func (x *XenFront) Wait(ctx context.Context, max time.Duration) error {
	x.evMu.RLock()
	if !x.suspended {
		defer x.evMu.RUnlock()
		return x.ev.Wait(ctx, max)
	}
	resumed := x.resumed
	x.evMu.RUnlock()
	t := time.NewTimer(max)
	defer t.Stop()
	select {
	case <-resumed:
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// suspend lets go of the event channel after the back end saved the
// vGPU and let go of the ring: the ring's unmap notification is disarmed
// (it holds the port) and the port closed, then the front end announces
// Initialising (not published: the next back end waits for the ring
// again).
func (x *XenFront) suspend(ctx context.Context) error {
	x.evMu.Lock()
	if x.suspended || x.ring == nil || x.ev == nil {
		x.evMu.Unlock()
		return errors.New("pvdrm xen front: not connected")
	}
	x.suspended, x.resumed = true, make(chan struct{})
	mem := x.ring.Mem()
	err := x.ring.SetUnmapNotify(len(mem)-xenFrontAliveOff, 0, 0)
	err = errors.Join(err, x.ev.Close())
	x.ev = nil
	link := x.link
	x.evMu.Unlock()
	if err != nil {
		return fmt.Errorf("pvdrm xen front: letting go of the event channel: %w", err)
	}
	return link.Announce(ctx, xenbus.StateInitialising)
}

// resume grants the ring and the GART heap again to link's back end (a
// resuming one, past its InitWait), binds a new port, publishes them and
// waits for Connected. hold runs the ring's copy with the client's pushes
// held.
func (x *XenFront) resume(ctx context.Context, link *xenbus.Front, hold func(func() error) error) error {
	if err := x.ringFits(link); err != nil {
		return err
	}
	back := link.Device().BackDomid
	err := hold(func() error {
		ring, err := x.gnt.Regrant(x.ring, back)
		if err == nil {
			x.ring = ring
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("the ring: %w", err)
	}
	var extra []xenbus.Extra
	if x.gart != nil {
		if err := x.gart.regrant(x.gnt, back); err != nil {
			return fmt.Errorf("the GART heap: %w", err)
		}
		extra = x.gart.Keys()
	}
	ev, err := xen.OpenEvtchn(x.devDir)
	if err != nil {
		return err
	}
	if err := x.offer(ctx, link, ev, extra); err != nil {
		// The notification may hold the port: disarmed before it closes.
		return errors.Join(err, x.ring.SetUnmapNotify(len(x.ring.Mem())-xenFrontAliveOff, 0, 0), ev.Close())
	}
	x.evMu.Lock()
	x.ev, x.link, x.suspended = ev, link, false
	close(x.resumed)
	x.evMu.Unlock()
	return x.Notify() // requests made meanwhile wait on the ring
}

// regrant grants the heap's pages and its directory again to domain back,
// in place (xen.Gntalloc.Regrant), and writes the new references into the
// directory.
func (g *XenGART) regrant(gnt *xen.Gntalloc, back uint16) error {
	refs := make([]uint32, 0, g.pages)
	for i, c := range g.chunks {
		n, err := gnt.Regrant(c, back)
		if err != nil {
			return fmt.Errorf("chunk %d: %w", i, err)
		}
		g.chunks[i] = n
		refs = append(refs, n.Refs()...)
	}
	dir, err := gnt.Regrant(g.dir, back)
	if err != nil {
		return fmt.Errorf("directory: %w", err)
	}
	g.dir = dir
	return encodeGARTDir(dir.Mem(), dir.Refs(), refs)
}

// xenResumeLook is how long one look for a resuming back end may take
// (its handshake's start included).
const xenResumeLook = 2 * time.Second

// xenSaved follows a save of the vGPU: the front end lets go of its port
// (suspend), then looks for a back end that offers the device to resume —
// in this domain, or in the one xl restore made of it, whose id it reads
// each time — until timeout, and resumes on it. Requests wait meanwhile.
func (fe *FrontEnd) xenSaved(x *XenFront, devID uint32, timeout time.Duration, log func(string, ...any)) error {
	start := time.Now()
	sctx, cancel := context.WithTimeout(context.Background(), xenCleanupTimeout)
	err := x.suspend(sctx)
	cancel()
	if err != nil {
		return err
	}
	log("pvdrm front end: the back end saved the vGPU; the front end let go of its port and waits for a restore", "timeout", timeout)
	deadline := start.Add(timeout)
	for {
		select {
		case <-fe.Client.done:
			return errors.New("pvdrm xen: the front end closed while its vGPU was saved")
		case <-time.After(xenPeerPoll):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pvdrm xen: the vGPU was saved and no back end restored it within %v", timeout)
		}
		ctx, cancel := context.WithTimeout(context.Background(), xenResumeLook)
		link, err := findResumingBack(ctx, fe.xs, devID)
		cancel()
		if err != nil {
			continue // not (yet) offered: the domain is being saved or restored
		}
		ctx, cancel = context.WithDeadline(context.Background(), deadline)
		err = x.resume(ctx, link, fe.Client.holdPushes)
		if err == nil {
			err = fe.xenWelcomeAgain(ctx, link)
		}
		cancel()
		if err != nil {
			return fmt.Errorf("pvdrm xen: resuming on the restored vGPU: %w", err)
		}
		log("pvdrm front end: resumed on the restored vGPU", "domid", link.Device().FrontDomid, "vgpu", fe.Welcome().VGPU, "pause", time.Since(start))
		return nil
	}
}

// findResumingBack starts the front end's handshake on device devID of
// this domain (its id read afresh: a restore changes it) and returns it
// once the back end offers the device to resume a save. A back end that
// offers a fresh device is an error: it does not hold the saved state.
func findResumingBack(ctx context.Context, xs *xenstore.Client, devID uint32) (*xenbus.Front, error) {
	domid, err := xenbus.SelfDomid(ctx, xs)
	if err != nil {
		return nil, err
	}
	link, err := xenbus.StartFront(ctx, xs, xenbus.Device{Type: XenDeviceType, FrontDomid: domid, DevID: devID}, Version)
	if err != nil {
		return nil, err
	}
	if ok, err := link.PeerResumes(ctx); err != nil || !ok {
		return nil, errors.Join(errors.New("the back end offers a fresh device, not the saved vGPU"), err)
	}
	return link, nil
}

// xenWelcomeAgain reads what the resumed back end granted: the vGPU must
// be the guest's (VRAM size, channels); its id may differ.
func (fe *FrontEnd) xenWelcomeAgain(ctx context.Context, link *xenbus.Front) error {
	w, err := link.ReadPeer(ctx, xenWelcomeKeys()...)
	if err != nil {
		return err
	}
	fe.mu.Lock()
	defer fe.mu.Unlock()
	if w[xenKeyVRAMSize] != fe.welcome.VRAMSize || uint32(w[xenKeyChannels]) != fe.welcome.Channels {
		return fmt.Errorf("resumed on a vGPU of %d bytes of VRAM and %d channels, the guest's has %d and %d",
			w[xenKeyVRAMSize], w[xenKeyChannels], fe.welcome.VRAMSize, fe.welcome.Channels)
	}
	fe.welcome.VGPU = uint32(w[xenKeyVGPU])
	return nil
}
