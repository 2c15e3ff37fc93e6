package pvdrm

// This file is the split-driver handshake over xenstore, as Linux's xenbus
// runs it for every PV device:
//
//	toolstack  creates both directories (CreateXenDevice), states Initialising
//	back end   protocol-version, max-ring-page-order; state InitWait
//	front end  ring-ref (or ring-page-order, ring-ref0…), event-channel,
//	           protocol-version; state Initialised
//	back end   maps the ring, binds the port; state Connected
//	front end  state Connected
//	either     state Closing; the other follows; each ends Closed
//
// Everything read from xenstore is checked: numbers parse strictly and are
// range-checked, and the paths each side finds must be exactly the ones it
// expects for its peer.

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// XenbusState is a split-driver state, io/xenbus.h's enum xenbus_state.
type XenbusState uint32

// The states.
const (
	XenbusStateUnknown       XenbusState = 0
	XenbusStateInitialising  XenbusState = 1
	XenbusStateInitWait      XenbusState = 2
	XenbusStateInitialised   XenbusState = 3
	XenbusStateConnected     XenbusState = 4
	XenbusStateClosing       XenbusState = 5
	XenbusStateClosed        XenbusState = 6
	XenbusStateReconfiguring XenbusState = 7
	XenbusStateReconfigured  XenbusState = 8
)

// String returns the state's name as io/xenbus.h spells it (without
// the XenbusState prefix).
func (s XenbusState) String() string {
	names := [...]string{"Unknown", "Initialising", "InitWait", "Initialised", "Connected",
		"Closing", "Closed", "Reconfiguring", "Reconfigured"}
	if int(s) < len(names) {
		return names[s]
	}
	return fmt.Sprintf("XenbusState(%d)", uint32(s))
}

// Ranges of what xenstore holds (Xen's public headers).
const (
	// DomidFirstReserved is DOMID_FIRST_RESERVED: ordinary domains are
	// numbered below it.
	DomidFirstReserved = 0x7FF0
	// GrantRefFirst is GNTTAB_NR_RESERVED_ENTRIES: references below it are
	// the toolstack's (console, xenstore), never a driver's.
	GrantRefFirst = 8
	// EvtchnPortMax is the highest event channel port (FIFO ABI:
	// EVTCHN_FIFO_NR_CHANNELS - 1); port 0 is never valid.
	EvtchnPortMax = 1<<17 - 1
	// MaxRingPageOrder is the largest ring, in log2 pages, the back end
	// offers (MaxRingPages pages).
	MaxRingPageOrder = 4
)

// XenbusDeviceType is the device type in xenstore paths.
const XenbusDeviceType = "pvdrm"

// ErrXenbusPeerClosed is wrapped when the other end closes the device, or
// its directory disappears, while this end waits for it.
var ErrXenbusPeerClosed = errors.New("xenbus peer closed the device")

// XenDevice names one pvdrm device: the two domains and the device id.
type XenDevice struct {
	FrontDomid uint16
	BackDomid  uint16
	DevID      uint32
}

// FrontendPath is /local/domain/<front>/device/pvdrm/<devid>.
func (d XenDevice) FrontendPath() string {
	return fmt.Sprintf("/local/domain/%d/device/%s/%d", d.FrontDomid, XenbusDeviceType, d.DevID)
}

// BackendPath is /local/domain/<back>/backend/pvdrm/<front>/<devid>.
func (d XenDevice) BackendPath() string {
	return fmt.Sprintf("/local/domain/%d/backend/%s/%d/%d", d.BackDomid, XenbusDeviceType, d.FrontDomid, d.DevID)
}

func (d XenDevice) check() error {
	if d.FrontDomid >= DomidFirstReserved || d.BackDomid >= DomidFirstReserved {
		return fmt.Errorf("xenbus: domain ids %d and %d: want below %#x", d.FrontDomid, d.BackDomid, DomidFirstReserved)
	}
	return nil
}

// CreateXenDevice does for a pvdrm device what the toolstack (libxl) does
// for every PV device: in one transaction it creates the front end's
// directory (owned by the front domain, readable by the back end) and the
// back end's (owned by the back domain, readable by the front end), each
// naming the other, both in state Initialising. It runs in dom0.
func CreateXenDevice(ctx context.Context, xs *Xenstore, d XenDevice) error {
	if err := d.check(); err != nil {
		return err
	}
	fp, bp := d.FrontendPath(), d.BackendPath()
	init := fmt.Sprint(uint32(XenbusStateInitialising))
	err := xs.Transaction(ctx, func(tx XenstoreTx) error {
		for _, s := range []struct {
			dir   string
			perms []XenstorePerm
			keys  [][2]string
		}{
			{fp, []XenstorePerm{{d.FrontDomid, 'n'}, {d.BackDomid, 'r'}}, [][2]string{
				{"backend", bp}, {"backend-id", fmt.Sprint(d.BackDomid)}, {"state", init}}},
			{bp, []XenstorePerm{{d.BackDomid, 'n'}, {d.FrontDomid, 'r'}}, [][2]string{
				{"frontend", fp}, {"frontend-id", fmt.Sprint(d.FrontDomid)}, {"online", "1"}, {"state", init}}},
		} {
			if err := tx.Rm(ctx, s.dir); err != nil && !isNotExist(err) {
				return err
			}
			if err := tx.Mkdir(ctx, s.dir); err != nil {
				return err
			}
			if err := tx.SetPerms(ctx, s.dir, s.perms...); err != nil {
				return err
			}
			for _, kv := range s.keys { // new nodes inherit the directory's permissions
				if err := tx.Write(ctx, s.dir+"/"+kv[0], kv[1]); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("xenbus: create %s device %d: %w", XenbusDeviceType, d.DevID, err)
	}
	return nil
}

// RemoveXenDevice removes both directories of a device (the toolstack's
// unplug, once both ends are Closed).
func RemoveXenDevice(ctx context.Context, xs *Xenstore, d XenDevice) error {
	return xs.Transaction(ctx, func(tx XenstoreTx) error {
		for _, p := range []string{d.FrontendPath(), d.BackendPath()} {
			if err := tx.Rm(ctx, p); err != nil && !isNotExist(err) {
				return fmt.Errorf("xenbus: remove device: %w", err)
			}
		}
		return nil
	})
}

func isNotExist(err error) bool {
	var xe *XenstoreError
	return errors.As(err, &xe) && xe.Errno == "ENOENT"
}

// SelfDomid reads this domain's id from xenstore: the domid key of its
// home directory, read by a relative path.
func SelfDomid(ctx context.Context, xs *Xenstore) (uint16, error) {
	v, err := readNumber(ctx, xs.root(), "domid", "", 0, DomidFirstReserved-1)
	return uint16(v), err
}

// readNumber reads dir/key (dir alone if key is "") as a strict decimal
// in lo..hi.
func readNumber(ctx context.Context, tx XenstoreTx, dir, key string, lo, hi uint64) (uint64, error) {
	p := dir + "/" + key
	if key == "" {
		p = dir
	}
	s, err := tx.Read(ctx, p)
	if err != nil {
		return 0, fmt.Errorf("xenbus: %w", err)
	}
	v, err := parseXsUint(s, hi)
	if err == nil && v < lo {
		err = fmt.Errorf("%d is below %d", v, lo)
	}
	if err != nil {
		return 0, fmt.Errorf("xenbus: %s: %w", p, err)
	}
	return v, nil
}

// readState reads dir/state. A missing node reads as Unknown, as Linux's
// xenbus_read_driver_state has it (the directory is gone).
func readState(ctx context.Context, tx XenstoreTx, dir string) (XenbusState, error) {
	v, err := readNumber(ctx, tx, dir, "state", 0, uint64(XenbusStateReconfigured))
	if isNotExist(err) {
		return XenbusStateUnknown, nil
	}
	return XenbusState(v), err
}

// switchState sets dir/state in a transaction that first checks the node
// is there, so a device the toolstack removed is not recreated (Linux's
// xenbus_switch_state). extra runs in the same transaction first.
func switchState(ctx context.Context, xs *Xenstore, dir string, s XenbusState, extra func(XenstoreTx) error) error {
	err := xs.Transaction(ctx, func(tx XenstoreTx) error {
		if _, err := tx.Read(ctx, dir+"/state"); err != nil {
			return err
		}
		if extra != nil {
			if err := extra(tx); err != nil {
				return err
			}
		}
		return tx.Write(ctx, dir+"/state", fmt.Sprint(uint32(s)))
	})
	if err != nil {
		return fmt.Errorf("xenbus: %s: switch to %v: %w", dir, s, err)
	}
	return nil
}

// waitState watches dir/state and re-reads it on every event until decide
// accepts it (true) or refuses it (an error); ctx bounds the wait.
func waitState(ctx context.Context, xs *Xenstore, dir string, decide func(XenbusState) (bool, error)) (XenbusState, error) {
	w, err := xs.Watch(ctx, dir+"/state")
	if err != nil {
		return 0, fmt.Errorf("xenbus: watch %s: %w", dir, err)
	}
	defer stopWatch(ctx, w)
	for {
		s, err := readState(ctx, xs.root(), dir)
		if err != nil {
			return 0, err
		}
		if ok, err := decide(s); ok || err != nil {
			return s, err
		}
		select {
		case _, open := <-w.Events():
			if !open {
				return 0, fmt.Errorf("xenbus: watching %s: %w", dir, xs.closedErr())
			}
		case <-ctx.Done():
			return 0, fmt.Errorf("xenbus: waiting for %s (state %v): %w", dir, s, ctx.Err())
		}
	}
}

// stopWatch removes a watch, best effort, even after ctx is done.
func stopWatch(ctx context.Context, w *XenstoreWatch) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), xenbusCleanupTimeout)
	defer cancel()
	_ = w.Stop(ctx) // a failure leaves a watch whose events are dropped
}

// xenbusCleanupTimeout bounds the xenstore requests of a cleanup that runs
// after its context is done.
const xenbusCleanupTimeout = 5 * time.Second

// closedErr is why a watch channel closed: the connection's end.
func (c *Xenstore) closedErr() error {
	if err := c.Err(); err != nil {
		return err
	}
	return ErrXenstoreClosed
}

// readPeerDir reads the peer's directory and id from this end's directory
// (backend/backend-id or frontend/frontend-id) and checks both are exactly
// what the device's layout says.
func readPeerDir(ctx context.Context, xs *Xenstore, own, role string, wantID uint16, wantDir func(uint16) string) (uint16, error) {
	id, err := readNumber(ctx, xs.root(), own, role+"-id", 0, DomidFirstReserved-1)
	if err != nil {
		return 0, err
	}
	if wantID != anyDomid && uint16(id) != wantID {
		return 0, fmt.Errorf("xenbus: %s/%s-id is %d, want %d", own, role, id, wantID)
	}
	dir, err := xs.Read(ctx, own+"/"+role)
	if err != nil {
		return 0, fmt.Errorf("xenbus: %w", err)
	}
	if want := wantDir(uint16(id)); dir != want {
		return 0, fmt.Errorf("xenbus: %s/%s is %q, want %q", own, role, dir, want)
	}
	return uint16(id), nil
}

// anyDomid is an impossible domid: readPeerDir accepts any id in range.
const anyDomid = 0xFFFF

// XenRing is what a front end publishes about its ring.
type XenRing struct {
	// Refs are the grant references of the ring pages, in order: a power
	// of two of them, at most 1<<MaxRingPageOrder.
	Refs []uint32
	// Port is the event channel port the front end allocated for the back
	// end to bind.
	Port uint32
	// Version is the protocol version the two ends agreed on.
	Version uint32
}

// ringPageOrder returns log2(n) for a power of two n within the limit.
func ringPageOrder(n int) (int, error) {
	for order := 0; order <= MaxRingPageOrder; order++ {
		if n == 1<<order {
			return order, nil
		}
	}
	return 0, fmt.Errorf("xenbus: %d ring pages: want a power of two up to %d", n, 1<<MaxRingPageOrder)
}

func (r XenRing) check() error {
	if _, err := ringPageOrder(len(r.Refs)); err != nil {
		return err
	}
	for _, ref := range r.Refs {
		if ref < GrantRefFirst {
			return fmt.Errorf("xenbus: grant reference %d is reserved", ref)
		}
	}
	if r.Port == 0 || r.Port > EvtchnPortMax {
		return fmt.Errorf("xenbus: event channel port %d out of range 1..%d", r.Port, EvtchnPortMax)
	}
	if r.Version == 0 || r.Version > Version {
		return fmt.Errorf("xenbus: protocol version %d: want 1..%d", r.Version, Version)
	}
	return nil
}
