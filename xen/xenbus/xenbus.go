// Package xenbus runs the split-driver handshake over xenstore, as Linux's
// xenbus does for every PV device: the toolstack creates the front end's
// and the back end's directories (CreateDevice), and the two ends, Front
// in the guest and Back in dom0, exchange the ring and the event channel
// through them while each switches through the states of io/xenbus.h:
//
//	toolstack  creates both directories (CreateDevice), states Initialising
//	back end   protocol-version, max-ring-page-order; state InitWait
//	front end  ring-ref (or ring-page-order, ring-ref0…), event-channel,
//	           protocol-version; state Initialised
//	back end   maps the ring, binds the port; state Connected
//	front end  state Connected
//	either     state Closing; the other follows; each ends Closed
//
// The device type in the paths (Device.Type) and the protocol version are
// the driver's; the grants and the event channel are package xen's.
// Everything read from xenstore is checked: numbers parse strictly and are
// range-checked, and the paths each side finds must be exactly the ones it
// expects for its peer.
package xenbus

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gpuvm/gpuvm/xen"
	"github.com/gpuvm/gpuvm/xen/xenstore"
)

// State is a split-driver state, io/xenbus.h's enum xenbus_state.
type State uint32

// The states.
const (
	StateUnknown       State = 0
	StateInitialising  State = 1
	StateInitWait      State = 2
	StateInitialised   State = 3
	StateConnected     State = 4
	StateClosing       State = 5
	StateClosed        State = 6
	StateReconfiguring State = 7
	StateReconfigured  State = 8
)

// String returns the state's name as io/xenbus.h spells it (without
// the XenbusState prefix).
func (s State) String() string {
	names := [...]string{"Unknown", "Initialising", "InitWait", "Initialised", "Connected",
		"Closing", "Closed", "Reconfiguring", "Reconfigured"}
	if int(s) < len(names) {
		return names[s]
	}
	return fmt.Sprintf("State(%d)", uint32(s))
}

// MaxRingPageOrder is the largest ring, in log2 pages, the handshake
// handles (Linux's XENBUS_MAX_RING_GRANT_ORDER): a back end offers it as
// max-ring-page-order, and a front end publishes at most 1<<MaxRingPageOrder
// grant references.
const MaxRingPageOrder = 4

// ErrPeerClosed is wrapped when the other end closes the device, or
// its directory disappears, while this end waits for it.
var ErrPeerClosed = errors.New("xenbus peer closed the device")

// Device names one device: its type, the two domains and the device id.
type Device struct {
	// Type is the device type in xenstore paths, e.g. "pvdrm" or "vbd":
	// letters, digits, '_' and '-'.
	Type       string
	FrontDomid uint16
	BackDomid  uint16
	DevID      uint32
}

// FrontendPath is /local/domain/<front>/device/<type>/<devid>.
func (d Device) FrontendPath() string {
	return fmt.Sprintf("/local/domain/%d/device/%s/%d", d.FrontDomid, d.Type, d.DevID)
}

// BackendPath is /local/domain/<back>/backend/<type>/<front>/<devid>.
func (d Device) BackendPath() string {
	return fmt.Sprintf("/local/domain/%d/backend/%s/%d/%d", d.BackDomid, d.Type, d.FrontDomid, d.DevID)
}

func (d Device) check() error {
	if d.FrontDomid >= xen.DomidFirstReserved || d.BackDomid >= xen.DomidFirstReserved {
		return fmt.Errorf("xenbus: domain ids %d and %d: want below %#x", d.FrontDomid, d.BackDomid, xen.DomidFirstReserved)
	}
	if d.Type == "" {
		return errors.New("xenbus: no device type")
	}
	for _, c := range []byte(d.Type) {
		if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '_' && c != '-' {
			return fmt.Errorf("xenbus: device type %q: want letters, digits, '_' and '-'", d.Type)
		}
	}
	return nil
}

// CreateDevice does for a device what the toolstack (libxl) does
// for every PV device: in one transaction it creates the front end's
// directory (owned by the front domain, readable by the back end) and the
// back end's (owned by the back domain, readable by the front end), each
// naming the other, both in state Initialising. It runs in dom0.
func CreateDevice(ctx context.Context, xs *xenstore.Client, d Device) error {
	if err := d.check(); err != nil {
		return err
	}
	fp, bp := d.FrontendPath(), d.BackendPath()
	init := fmt.Sprint(uint32(StateInitialising))
	err := xs.Transaction(ctx, func(tx xenstore.Tx) error {
		for _, s := range []struct {
			dir   string
			perms []xenstore.Perm
			keys  [][2]string
		}{
			{fp, []xenstore.Perm{{Domid: d.FrontDomid, Access: 'n'}, {Domid: d.BackDomid, Access: 'r'}}, [][2]string{
				{"backend", bp}, {"backend-id", fmt.Sprint(d.BackDomid)}, {"state", init}}},
			{bp, []xenstore.Perm{{Domid: d.BackDomid, Access: 'n'}, {Domid: d.FrontDomid, Access: 'r'}}, [][2]string{
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
		return fmt.Errorf("xenbus: create %s device %d: %w", d.Type, d.DevID, err)
	}
	return nil
}

// RemoveDevice removes both directories of a device (the toolstack's
// unplug, once both ends are Closed).
func RemoveDevice(ctx context.Context, xs *xenstore.Client, d Device) error {
	if err := d.check(); err != nil {
		return err
	}
	return xs.Transaction(ctx, func(tx xenstore.Tx) error {
		for _, p := range []string{d.FrontendPath(), d.BackendPath()} {
			if err := tx.Rm(ctx, p); err != nil && !isNotExist(err) {
				return fmt.Errorf("xenbus: remove device: %w", err)
			}
		}
		return nil
	})
}

// isNotExist reports whether err is xenstore's ENOENT: the node is not
// there.
func isNotExist(err error) bool {
	var xe *xenstore.Error
	return errors.As(err, &xe) && xe.Errno == "ENOENT"
}

// SelfDomid reads this domain's id from xenstore: the domid key of its
// home directory, read by a relative path.
func SelfDomid(ctx context.Context, xs *xenstore.Client) (uint16, error) {
	v, err := readNumber(ctx, xs, "domid", "", 0, xen.DomidFirstReserved-1)
	return uint16(v), err
}

// reader reads a node: a *xenstore.Client, or a xenstore.Tx.
type reader interface {
	Read(ctx context.Context, path string) (string, error)
}

// readNumber reads dir/key (dir alone if key is "") as a strict decimal
// in lo..hi.
func readNumber(ctx context.Context, tx reader, dir, key string, lo, hi uint64) (uint64, error) {
	p := dir + "/" + key
	if key == "" {
		p = dir
	}
	s, err := tx.Read(ctx, p)
	if err != nil {
		return 0, fmt.Errorf("xenbus: %w", err)
	}
	v, err := xenstore.ParseUint(s, hi)
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
func readState(ctx context.Context, tx reader, dir string) (State, error) {
	v, err := readNumber(ctx, tx, dir, "state", 0, uint64(StateReconfigured))
	if isNotExist(err) {
		return StateUnknown, nil
	}
	return State(v), err
}

// switchState sets dir/state in a transaction that first checks the node
// is there, so a device the toolstack removed is not recreated (Linux's
// xenbus_switch_state). extra runs in the same transaction first.
func switchState(ctx context.Context, xs *xenstore.Client, dir string, s State, extra func(xenstore.Tx) error) error {
	err := xs.Transaction(ctx, func(tx xenstore.Tx) error {
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
func waitState(ctx context.Context, xs *xenstore.Client, dir string, decide func(State) (bool, error)) (State, error) {
	w, err := xs.Watch(ctx, dir+"/state")
	if err != nil {
		return 0, fmt.Errorf("xenbus: watch %s: %w", dir, err)
	}
	defer stopWatch(ctx, w)
	for {
		s, err := readState(ctx, xs, dir)
		if err != nil {
			return 0, err
		}
		if ok, err := decide(s); ok || err != nil {
			return s, err
		}
		select {
		case _, open := <-w.Events():
			if !open {
				return 0, fmt.Errorf("xenbus: watching %s: %w", dir, closedErr(xs))
			}
		case <-ctx.Done():
			return 0, fmt.Errorf("xenbus: waiting for %s (state %v): %w", dir, s, ctx.Err())
		}
	}
}

// stopWatch removes a watch, best effort, even after ctx is done.
func stopWatch(ctx context.Context, w *xenstore.Watch) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	_ = w.Stop(ctx) // a failure leaves a watch whose events are dropped
}

// cleanupTimeout bounds the xenstore requests of a cleanup that runs
// after its context is done (removing a watch).
const cleanupTimeout = 5 * time.Second

// closedErr is why a watch channel closed: the connection's end.
func closedErr(xs *xenstore.Client) error {
	if err := xs.Err(); err != nil {
		return err
	}
	return xenstore.ErrClosed
}

// readPeerDir reads the peer's directory and id from this end's directory
// (backend/backend-id or frontend/frontend-id) and checks both are exactly
// what the device's layout says.
func readPeerDir(ctx context.Context, xs *xenstore.Client, own, role string, wantID uint16, wantDir func(uint16) string) (uint16, error) {
	id, err := readNumber(ctx, xs, own, role+"-id", 0, xen.DomidFirstReserved-1)
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

// Ring is what a front end publishes about its ring.
type Ring struct {
	// Refs are the grant references of the ring pages, in order: a power
	// of two of them, at most 1<<MaxRingPageOrder.
	Refs []uint32
	// Port is the event channel port the front end allocated for the back
	// end to bind.
	Port uint32
	// Version is the protocol version the two ends agreed on.
	Version uint32
	// Extra holds the device's own keys the back end asked for, by name.
	Extra map[string]uint64
}

// Extra is a device-specific number a front end publishes with its ring
// (for example where a buffer heap's grant directory starts).
type Extra struct {
	Key   string
	Value uint64
}

// ExtraKey is a device-specific number the back end reads with the ring;
// the front end must have published it, within [Lo, Hi].
type ExtraKey struct {
	Key    string
	Lo, Hi uint64
}

// checkExtraKey refuses a key name the handshake itself uses or one that
// is not a plain xenstore node name (lower-case letters, digits, '-').
func checkExtraKey(key string) error {
	switch {
	case key == "", len(key) > 64:
		return fmt.Errorf("xenbus: extra key %q: want 1..64 characters", key)
	case key == "event-channel", key == "protocol-version", key == "state", key == "backend", key == "backend-id",
		key == "frontend", key == "frontend-id", key == "online", key == "max-ring-page-order",
		key == "ring-page-order", strings.HasPrefix(key, "ring-ref"), key == KeyHandoff, key == KeyHandoffID:
		return fmt.Errorf("xenbus: extra key %q is the handshake's own", key)
	}
	for _, c := range key {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return fmt.Errorf("xenbus: extra key %q: only a-z, 0-9 and '-'", key)
		}
	}
	return nil
}

// RingPageOrder returns log2(n) for a power of two n of at most
// 1<<MaxRingPageOrder ring pages, and an error for any other n.
func RingPageOrder(n int) (int, error) {
	for order := 0; order <= MaxRingPageOrder; order++ {
		if n == 1<<order {
			return order, nil
		}
	}
	return 0, fmt.Errorf("xenbus: %d ring pages: want a power of two up to %d", n, 1<<MaxRingPageOrder)
}

// check checks a ring against the limits and the highest protocol
// version this end speaks.
func (r Ring) check(maxVersion uint32) error {
	if _, err := RingPageOrder(len(r.Refs)); err != nil {
		return err
	}
	for _, ref := range r.Refs {
		if ref < xen.GrantRefFirst {
			return fmt.Errorf("xenbus: grant reference %d is reserved", ref)
		}
	}
	if r.Port == 0 || r.Port > xen.EvtchnPortMax {
		return fmt.Errorf("xenbus: event channel port %d out of range 1..%d", r.Port, xen.EvtchnPortMax)
	}
	if r.Version == 0 || r.Version > maxVersion {
		return fmt.Errorf("xenbus: protocol version %d: want 1..%d", r.Version, maxVersion)
	}
	return nil
}
