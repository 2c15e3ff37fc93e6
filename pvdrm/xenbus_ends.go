package pvdrm

import (
	"context"
	"errors"
	"fmt"
)

// xenbusEnd is what both ends of a device's handshake share.
type xenbusEnd struct {
	xs        *Xenstore
	dev       XenDevice
	own, peer string // this end's and the other end's directories
}

// Device returns the device's domains and id.
func (e *xenbusEnd) Device() XenDevice { return e.dev }

// PeerState reads the other end's state (Unknown once its directory is
// gone).
func (e *xenbusEnd) PeerState(ctx context.Context) (XenbusState, error) {
	return readState(ctx, e.xs.root(), e.peer)
}

// WaitPeerClosing blocks until the other end is Closing or Closed, or its
// directory is gone, and returns that state; a back end runs it to learn
// that its front end is leaving.
func (e *xenbusEnd) WaitPeerClosing(ctx context.Context) (XenbusState, error) {
	return waitState(ctx, e.xs, e.peer, func(s XenbusState) (bool, error) {
		return s == XenbusStateClosing || s == XenbusStateClosed || s == XenbusStateUnknown, nil
	})
}

// Closed announces that this end released everything it shared (state
// Closed). A directory the toolstack already removed is not an error.
func (e *xenbusEnd) Closed(ctx context.Context) error {
	return e.announce(ctx, XenbusStateClosed)
}

// announce switches this end to s; a removed directory is not an error
// (there is no one left to tell).
func (e *xenbusEnd) announce(ctx context.Context, s XenbusState) error {
	if err := switchState(ctx, e.xs, e.own, s, nil); err != nil && !isNotExist(err) {
		return err
	}
	return nil
}

// peerClosedErr fails a wait for progress when the peer closes.
func (e *xenbusEnd) peerClosedErr(s XenbusState) error {
	switch s {
	case XenbusStateClosing, XenbusStateClosed, XenbusStateUnknown:
		return fmt.Errorf("xenbus: %s is %v: %w", e.peer, s, ErrXenbusPeerClosed)
	case XenbusStateReconfiguring, XenbusStateReconfigured:
		return fmt.Errorf("xenbus: %s is %v: pvdrm does not reconfigure", e.peer, s)
	}
	return nil
}

// XenbusFront runs the front end's (the guest's) side of the handshake.
type XenbusFront struct {
	xenbusEnd
	version  uint32 // agreed protocol version
	maxOrder int    // the back end's max-ring-page-order, capped at ours
}

// StartXenbusFront begins the front end's handshake for device devid of
// domain frontDomid. It finds the back end through its own directory's
// backend-id and backend keys (which must name exactly the layout's back
// end path), announces Initialising, waits for the back end to reach
// InitWait, and reads what the back end offers.
func StartXenbusFront(ctx context.Context, xs *Xenstore, frontDomid uint16, devid uint32) (*XenbusFront, error) {
	dev := XenDevice{FrontDomid: frontDomid, DevID: devid}
	if err := dev.check(); err != nil {
		return nil, err
	}
	own := dev.FrontendPath()
	back, err := readPeerDir(ctx, xs, own, "backend", anyDomid, func(id uint16) string {
		d := dev
		d.BackDomid = id
		return d.BackendPath()
	})
	if err != nil {
		return nil, err
	}
	dev.BackDomid = back
	f := &XenbusFront{xenbusEnd: xenbusEnd{xs: xs, dev: dev, own: own, peer: dev.BackendPath()}}
	if err := switchState(ctx, xs, own, XenbusStateInitialising, nil); err != nil {
		return nil, err
	}
	if _, err := waitState(ctx, xs, f.peer, func(s XenbusState) (bool, error) {
		return s == XenbusStateInitWait, nil // anything else: not (yet, or again) offering
	}); err != nil {
		return nil, err
	}
	v, err := readNumber(ctx, xs.root(), f.peer, "protocol-version", 1, 1<<32-1)
	if err != nil {
		return nil, err
	}
	f.version = uint32(min(v, Version))
	order, err := readNumber(ctx, xs.root(), f.peer, "max-ring-page-order", 0, 31)
	if isNotExist(err) {
		order, err = 0, nil
	}
	if err != nil {
		return nil, err
	}
	f.maxOrder = int(min(order, MaxRingPageOrder))
	return f, nil
}

// Version returns the protocol version agreed with the back end.
func (f *XenbusFront) Version() uint32 { return f.version }

// MaxRingPages returns the largest ring the back end accepts, in pages.
func (f *XenbusFront) MaxRingPages() int { return 1 << f.maxOrder }

// Publish writes the ring's grant references, its event channel port and
// the agreed protocol version, and switches the front end to Initialised,
// all in one transaction: the back end never sees Initialised without them.
func (f *XenbusFront) Publish(ctx context.Context, refs []uint32, port uint32) error {
	r := XenRing{Refs: refs, Port: port, Version: f.version}
	if err := r.check(); err != nil {
		return err
	}
	order, _ := ringPageOrder(len(refs))
	if order > f.maxOrder {
		return fmt.Errorf("xenbus: %d ring pages: the back end accepts at most %d", len(refs), f.MaxRingPages())
	}
	return switchState(ctx, f.xs, f.own, XenbusStateInitialised, func(tx XenstoreTx) error {
		w := func(key string, v uint64) error { return tx.Write(ctx, f.own+"/"+key, fmt.Sprint(v)) }
		var err error
		if order == 0 {
			err = errors.Join(w("ring-ref", uint64(refs[0])), rmIfThere(ctx, tx, f.own+"/ring-page-order"))
		} else {
			err = errors.Join(w("ring-page-order", uint64(order)), rmIfThere(ctx, tx, f.own+"/ring-ref"))
			for i, ref := range refs {
				err = errors.Join(err, w(fmt.Sprintf("ring-ref%d", i), uint64(ref)))
			}
		}
		return errors.Join(err, w("event-channel", uint64(port)), w("protocol-version", uint64(f.version)))
	})
}

// rmIfThere removes a stale key of an earlier session.
func rmIfThere(ctx context.Context, tx XenstoreTx, path string) error {
	if err := tx.Rm(ctx, path); err != nil && !isNotExist(err) {
		return err
	}
	return nil
}

// WaitConnected waits for the back end to be Connected, then switches the
// front end to Connected. A back end that closes meanwhile fails it with
// ErrXenbusPeerClosed.
func (f *XenbusFront) WaitConnected(ctx context.Context) error {
	if _, err := waitState(ctx, f.xs, f.peer, func(s XenbusState) (bool, error) {
		return s == XenbusStateConnected, f.peerClosedErr(s)
	}); err != nil {
		return err
	}
	return switchState(ctx, f.xs, f.own, XenbusStateConnected, nil)
}

// Closing announces Closing and waits, within ctx, until the back end no
// longer uses the ring: it left Initialised and Connected (Linux back ends
// unmap before they switch to Closing) or its directory is gone. The caller
// then revokes its grants and unbinds its port whatever this returns, and
// calls Closed.
func (f *XenbusFront) Closing(ctx context.Context) error {
	if err := f.announce(ctx, XenbusStateClosing); err != nil {
		return err
	}
	_, err := waitState(ctx, f.xs, f.peer, func(s XenbusState) (bool, error) {
		return s != XenbusStateInitialised && s != XenbusStateConnected, nil
	})
	return err
}

// XenbusBack runs the back end's (dom0's) side of the handshake.
type XenbusBack struct {
	xenbusEnd
}

// StartXenbusBack begins the back end's handshake for a device: it checks
// its directory's frontend-id and frontend keys name exactly the device's
// front end, offers its protocol version and largest ring, and switches to
// InitWait.
func StartXenbusBack(ctx context.Context, xs *Xenstore, d XenDevice) (*XenbusBack, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	b := &XenbusBack{xenbusEnd{xs: xs, dev: d, own: d.BackendPath(), peer: d.FrontendPath()}}
	if _, err := readPeerDir(ctx, xs, b.own, "frontend", d.FrontDomid, func(uint16) string { return b.peer }); err != nil {
		return nil, err
	}
	err := switchState(ctx, xs, b.own, XenbusStateInitWait, func(tx XenstoreTx) error {
		return errors.Join(
			tx.Write(ctx, b.own+"/protocol-version", fmt.Sprint(Version)),
			tx.Write(ctx, b.own+"/max-ring-page-order", fmt.Sprint(MaxRingPageOrder)))
	})
	if err != nil {
		return nil, err
	}
	return b, nil
}

// WaitRing waits for the front end to publish its ring (state Initialised,
// or Connected) and reads it, checking every value. A front end that closes
// meanwhile fails it with ErrXenbusPeerClosed.
func (b *XenbusBack) WaitRing(ctx context.Context) (XenRing, error) {
	if _, err := waitState(ctx, b.xs, b.peer, func(s XenbusState) (bool, error) {
		if s == XenbusStateInitialised || s == XenbusStateConnected {
			return true, nil
		}
		if s == XenbusStateClosing || s >= XenbusStateReconfiguring {
			return false, b.peerClosedErr(s)
		}
		return false, nil // Unknown, Initialising, InitWait, Closed: not (yet) published
	}); err != nil {
		return XenRing{}, err
	}
	var r XenRing
	err := b.xs.Transaction(ctx, func(tx XenstoreTx) error { // one consistent snapshot
		r = XenRing{}
		v, err := readNumber(ctx, tx, b.peer, "protocol-version", 1, Version)
		if err != nil {
			return err
		}
		r.Version = uint32(v)
		order, err := readNumber(ctx, tx, b.peer, "ring-page-order", 0, MaxRingPageOrder)
		if isNotExist(err) {
			order, err = 0, nil
		}
		if err != nil {
			return err
		}
		for i := range 1 << order {
			key := "ring-ref"
			if order > 0 {
				key = fmt.Sprintf("ring-ref%d", i)
			}
			ref, err := readNumber(ctx, tx, b.peer, key, GrantRefFirst, 1<<32-1)
			if err != nil {
				return err
			}
			r.Refs = append(r.Refs, uint32(ref))
		}
		port, err := readNumber(ctx, tx, b.peer, "event-channel", 1, EvtchnPortMax)
		r.Port = uint32(port)
		return err
	})
	if err != nil {
		return XenRing{}, err
	}
	return r, nil
}

// Connect switches the back end to Connected, once it mapped the ring and
// bound the event channel.
func (b *XenbusBack) Connect(ctx context.Context) error {
	return switchState(ctx, b.xs, b.own, XenbusStateConnected, nil)
}

// Closing announces Closing. A back end unmaps the ring and unbinds its
// port first (the front end takes Closing to mean it may revoke its
// grants), then calls Closing and Closed.
func (b *XenbusBack) Closing(ctx context.Context) error {
	return b.announce(ctx, XenbusStateClosing)
}
