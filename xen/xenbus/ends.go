package xenbus

import (
	"context"
	"errors"
	"fmt"

	"github.com/gpuvm/gpuvm/xen"
	"github.com/gpuvm/gpuvm/xen/xenstore"
)

// end is what both ends of a device's handshake share.
type end struct {
	xs        *xenstore.Client
	dev       Device
	own, peer string // this end's and the other end's directories
}

// Device returns the device: its type, domains and id.
func (e *end) Device() Device { return e.dev }

// PeerState reads the other end's state (Unknown once its directory is
// gone).
func (e *end) PeerState(ctx context.Context) (State, error) {
	return readState(ctx, e.xs, e.peer)
}

// WaitPeerClosing blocks until the other end is Closing or Closed, or its
// directory is gone, and returns that state; a back end runs it to learn
// that its front end is leaving.
func (e *end) WaitPeerClosing(ctx context.Context) (State, error) {
	return waitState(ctx, e.xs, e.peer, func(s State) (bool, error) {
		return s == StateClosing || s == StateClosed || s == StateUnknown, nil
	})
}

// Closed announces that this end released everything it shared (state
// Closed). A directory the toolstack already removed is not an error.
func (e *end) Closed(ctx context.Context) error {
	return e.Announce(ctx, StateClosed)
}

// Announce switches this end to state s without waiting for the other
// end, e.g. to Closing when the other end is gone already. A directory the
// toolstack already removed is not an error (there is no one left to
// tell).
func (e *end) Announce(ctx context.Context, s State) error {
	if err := switchState(ctx, e.xs, e.own, s, nil); err != nil && !isNotExist(err) {
		return err
	}
	return nil
}

// peerClosedErr fails a wait for progress when the peer closes.
func (e *end) peerClosedErr(s State) error {
	switch s {
	case StateClosing, StateClosed, StateUnknown:
		return fmt.Errorf("xenbus: %s is %v: %w", e.peer, s, ErrPeerClosed)
	case StateReconfiguring, StateReconfigured:
		return fmt.Errorf("xenbus: %s is %v: %s does not reconfigure", e.peer, s, e.dev.Type)
	}
	return nil
}

// Front runs the front end's (the guest's) side of the handshake.
type Front struct {
	end
	version  uint32 // agreed protocol version
	maxOrder int    // the back end's max-ring-page-order, capped at ours
}

// StartFront begins the front end's handshake for device d.DevID of type
// d.Type in domain d.FrontDomid; version is the highest protocol version
// the front end speaks. d.BackDomid is not used: the front end finds the
// back end through its own directory's backend-id and backend keys (which
// must name exactly the layout's back end path). It announces
// Initialising, waits for the back end to reach InitWait, and reads what
// the back end offers.
func StartFront(ctx context.Context, xs *xenstore.Client, d Device, version uint32) (*Front, error) {
	dev := Device{Type: d.Type, FrontDomid: d.FrontDomid, DevID: d.DevID}
	if err := dev.check(); err != nil {
		return nil, err
	}
	if version == 0 {
		return nil, errors.New("xenbus: protocol version 0")
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
	f := &Front{end: end{xs: xs, dev: dev, own: own, peer: dev.BackendPath()}}
	if err := switchState(ctx, xs, own, StateInitialising, nil); err != nil {
		return nil, err
	}
	if _, err := waitState(ctx, xs, f.peer, func(s State) (bool, error) {
		return s == StateInitWait, nil // anything else: not (yet, or again) offering
	}); err != nil {
		return nil, err
	}
	v, err := readNumber(ctx, xs, f.peer, "protocol-version", 1, 1<<32-1)
	if err != nil {
		return nil, err
	}
	f.version = uint32(min(v, uint64(version)))
	order, err := readNumber(ctx, xs, f.peer, "max-ring-page-order", 0, 31)
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
func (f *Front) Version() uint32 { return f.version }

// MaxRingPages returns the largest ring the back end accepts, in pages.
func (f *Front) MaxRingPages() int { return 1 << f.maxOrder }

// Publish writes the ring's grant references, its event channel port, the
// agreed protocol version and the device's extra keys, and switches the
// front end to Initialised, all in one transaction: the back end never sees
// Initialised without them.
func (f *Front) Publish(ctx context.Context, refs []uint32, port uint32, extra ...Extra) error {
	r := Ring{Refs: refs, Port: port, Version: f.version}
	if err := r.check(f.version); err != nil {
		return err
	}
	for _, e := range extra {
		if err := checkExtraKey(e.Key); err != nil {
			return err
		}
	}
	order, _ := RingPageOrder(len(refs))
	if order > f.maxOrder {
		return fmt.Errorf("xenbus: %d ring pages: the back end accepts at most %d", len(refs), f.MaxRingPages())
	}
	return switchState(ctx, f.xs, f.own, StateInitialised, func(tx xenstore.Tx) error {
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
		for _, e := range extra {
			err = errors.Join(err, w(e.Key, e.Value))
		}
		return errors.Join(err, w("event-channel", uint64(port)), w("protocol-version", uint64(f.version)))
	})
}

// rmIfThere removes a stale key of an earlier session.
func rmIfThere(ctx context.Context, tx xenstore.Tx, path string) error {
	if err := tx.Rm(ctx, path); err != nil && !isNotExist(err) {
		return err
	}
	return nil
}

// WaitConnected waits for the back end to be Connected, then switches the
// front end to Connected. A back end that closes meanwhile fails it with
// ErrPeerClosed.
func (f *Front) WaitConnected(ctx context.Context) error {
	if _, err := waitState(ctx, f.xs, f.peer, func(s State) (bool, error) {
		return s == StateConnected, f.peerClosedErr(s)
	}); err != nil {
		return err
	}
	return switchState(ctx, f.xs, f.own, StateConnected, nil)
}

// ReadPeer reads device-specific numbers the back end published with
// Connected (Back.Connect's extra keys), each checked against its bounds.
func (f *Front) ReadPeer(ctx context.Context, keys ...ExtraKey) (map[string]uint64, error) {
	return readExtra(ctx, f.xs, f.peer, keys)
}

// readExtra reads keys of dir in one transaction.
func readExtra(ctx context.Context, xs *xenstore.Client, dir string, keys []ExtraKey) (map[string]uint64, error) {
	for _, k := range keys {
		if err := checkExtraKey(k.Key); err != nil {
			return nil, err
		}
	}
	out := map[string]uint64{}
	err := xs.Transaction(ctx, func(tx xenstore.Tx) error {
		clear(out)
		for _, k := range keys {
			v, err := readNumber(ctx, tx, dir, k.Key, k.Lo, k.Hi)
			if err != nil {
				return err
			}
			out[k.Key] = v
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Closing announces Closing and waits, within ctx, until the back end no
// longer uses the ring: it left Initialised and Connected (Linux back ends
// unmap before they switch to Closing) or its directory is gone. The caller
// then revokes its grants and unbinds its port whatever this returns, and
// calls Closed.
func (f *Front) Closing(ctx context.Context) error {
	if err := f.Announce(ctx, StateClosing); err != nil {
		return err
	}
	_, err := waitState(ctx, f.xs, f.peer, func(s State) (bool, error) {
		return s != StateInitialised && s != StateConnected, nil
	})
	return err
}

// Back runs the back end's (dom0's) side of the handshake.
type Back struct {
	end
	version uint32 // the highest protocol version this end speaks
}

// StartBack begins the back end's handshake for device d; version is the
// highest protocol version the back end speaks. It checks its directory's
// frontend-id and frontend keys name exactly the device's front end,
// offers version and the largest ring (MaxRingPageOrder), clears a saved
// mark an earlier back end left (KeySaved), and switches to InitWait.
func StartBack(ctx context.Context, xs *xenstore.Client, d Device, version uint32) (*Back, error) {
	return startBack(ctx, xs, d, version, false)
}

// StartBackResuming is StartBack for a back end that restores a saved
// state: it offers the device with KeyResume, which a saved front end
// waits for (saved.go).
func StartBackResuming(ctx context.Context, xs *xenstore.Client, d Device, version uint32) (*Back, error) {
	return startBack(ctx, xs, d, version, true)
}

func startBack(ctx context.Context, xs *xenstore.Client, d Device, version uint32, resume bool) (*Back, error) {
	b, err := newBack(ctx, xs, d, version)
	if err != nil {
		return nil, err
	}
	err = switchState(ctx, xs, b.own, StateInitWait, func(tx xenstore.Tx) error {
		var res error
		if resume {
			res = tx.Write(ctx, b.own+"/"+KeyResume, "1")
		} else {
			res = rmIfThere(ctx, tx, b.own+"/"+KeyResume)
		}
		return errors.Join(
			tx.Write(ctx, b.own+"/protocol-version", fmt.Sprint(version)),
			tx.Write(ctx, b.own+"/max-ring-page-order", fmt.Sprint(MaxRingPageOrder)),
			rmIfThere(ctx, tx, b.own+"/"+KeySaved), res)
	})
	if err != nil {
		return nil, err
	}
	return b, nil
}

func newBack(ctx context.Context, xs *xenstore.Client, d Device, version uint32) (*Back, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	if version == 0 {
		return nil, errors.New("xenbus: protocol version 0")
	}
	b := &Back{end: end{xs: xs, dev: d, own: d.BackendPath(), peer: d.FrontendPath()}, version: version}
	if _, err := readPeerDir(ctx, xs, b.own, "frontend", d.FrontDomid, func(uint16) string { return b.peer }); err != nil {
		return nil, err
	}
	return b, nil
}

// ErrNotConnected is returned by ResumeBack for a device whose back end is
// not Connected: there is no connection to take over, and the caller runs
// the handshake (StartBack).
var ErrNotConnected = errors.New("xenbus: the back end is not connected")

// ResumeBack takes over the back end of device d, Connected by an earlier
// back-end process that let go of it without closing it (a daemon that
// handed itself to a new process): it checks the directory's frontend-id
// and frontend keys as StartBack does, that the back end is Connected and
// the front end Initialised or Connected (else ErrNotConnected), and
// switches no state, so the front end sees nothing. WaitRing then reads
// the ring the front end published.
func ResumeBack(ctx context.Context, xs *xenstore.Client, d Device, version uint32) (*Back, error) {
	b, err := newBack(ctx, xs, d, version)
	if err != nil {
		return nil, err
	}
	st, err := readState(ctx, xs, b.own)
	if err != nil {
		return nil, err
	}
	if st != StateConnected {
		return nil, fmt.Errorf("%s is %v: %w", b.own, st, ErrNotConnected)
	}
	// The front end must still be on its side of the connection: one
	// that left meanwhile (Closing, Closed, or starting afresh) waits for
	// the handshake, which StartBack gives it.
	if fs, err := b.PeerState(ctx); err != nil {
		return nil, err
	} else if fs != StateInitialised && fs != StateConnected {
		return nil, fmt.Errorf("%s is %v: %w", b.peer, fs, ErrNotConnected)
	}
	return b, nil
}

// CloseBack switches the back end of device d to Closing and then Closed
// without a Back: a back-end process that cannot serve a device an
// earlier one left Connected tells its front end so. A directory already
// removed is not an error.
func CloseBack(ctx context.Context, xs *xenstore.Client, d Device) error {
	if err := d.check(); err != nil {
		return err
	}
	e := &end{xs: xs, dev: d, own: d.BackendPath(), peer: d.FrontendPath()}
	return errors.Join(e.Announce(ctx, StateClosing), e.Announce(ctx, StateClosed))
}

// WaitRing waits for the front end to publish its ring (state Initialised,
// or Connected) and reads it and the device's extra keys (into Ring.Extra),
// checking every value. A front end that closes meanwhile fails it with
// ErrPeerClosed.
func (b *Back) WaitRing(ctx context.Context, keys ...ExtraKey) (Ring, error) {
	for _, k := range keys {
		if err := checkExtraKey(k.Key); err != nil {
			return Ring{}, err
		}
	}
	if _, err := waitState(ctx, b.xs, b.peer, func(s State) (bool, error) {
		if s == StateInitialised || s == StateConnected {
			return true, nil
		}
		if s == StateClosing || s >= StateReconfiguring {
			return false, b.peerClosedErr(s)
		}
		return false, nil // Unknown, Initialising, InitWait, Closed: not (yet) published
	}); err != nil {
		return Ring{}, err
	}
	var r Ring
	err := b.xs.Transaction(ctx, func(tx xenstore.Tx) error { // one consistent snapshot
		r = Ring{}
		v, err := readNumber(ctx, tx, b.peer, "protocol-version", 1, uint64(b.version))
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
			ref, err := readNumber(ctx, tx, b.peer, key, xen.GrantRefFirst, 1<<32-1)
			if err != nil {
				return err
			}
			r.Refs = append(r.Refs, uint32(ref))
		}
		port, err := readNumber(ctx, tx, b.peer, "event-channel", 1, xen.EvtchnPortMax)
		if err != nil {
			return err
		}
		r.Port = uint32(port)
		for _, k := range keys {
			v, err := readNumber(ctx, tx, b.peer, k.Key, k.Lo, k.Hi)
			if err != nil {
				return err
			}
			if r.Extra == nil {
				r.Extra = map[string]uint64{}
			}
			r.Extra[k.Key] = v
		}
		return nil
	})
	if err != nil {
		return Ring{}, err
	}
	return r, nil
}

// Connect switches the back end to Connected, once it mapped the ring and
// bound the event channel, and publishes the device's extra keys in the
// same transaction (the front end reads them with ReadPeer).
func (b *Back) Connect(ctx context.Context, extra ...Extra) error {
	for _, e := range extra {
		if err := checkExtraKey(e.Key); err != nil {
			return err
		}
	}
	return switchState(ctx, b.xs, b.own, StateConnected, func(tx xenstore.Tx) error {
		var err error
		for _, e := range extra {
			err = errors.Join(err, tx.Write(ctx, b.own+"/"+e.Key, fmt.Sprint(e.Value)))
		}
		return err
	})
}

// Closing announces Closing. A back end unmaps the ring and unbinds its
// port first (the front end takes Closing to mean it may revoke its
// grants), then calls Closing and Closed.
func (b *Back) Closing(ctx context.Context) error {
	return b.Announce(ctx, StateClosing)
}
