//go:build linux && (amd64 || arm64)

package pvdrm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/gpuvm/gpuvm/ipc"
	"github.com/gpuvm/gpuvm/xen/xenbus"
	"github.com/gpuvm/gpuvm/xen/xenstore"
)

// Keys the back end publishes with Connected on the xen transport: what
// the local transport's Welcome carries.
const (
	xenKeyVGPU     = "vgpu"
	xenKeyVRAMSize = "vram-size"
	xenKeyChannels = "channels"
)

// xenPeerPoll is how often a front end looks at the back end's liveness
// byte; every xenStateLooks looks it reads the back end's state too.
const (
	xenPeerPoll   = 100 * time.Millisecond
	xenStateLooks = 10
)

// XenWelcomeKeys are the keys a back end publishes with Connected.
func XenWelcomeKeys(w ipc.Welcome) []xenbus.Extra {
	return []xenbus.Extra{{Key: xenKeyVGPU, Value: uint64(w.VGPU)}, {Key: xenKeyVRAMSize, Value: w.VRAMSize}, {Key: xenKeyChannels, Value: uint64(w.Channels)}}
}

// xenWelcomeKeys are the keys a front end reads with Connected, bounded.
func xenWelcomeKeys() []xenbus.ExtraKey {
	return []xenbus.ExtraKey{{Key: xenKeyVGPU, Lo: 0, Hi: 1 << 31}, {Key: xenKeyVRAMSize, Lo: 1, Hi: 1 << 40}, {Key: xenKeyChannels, Lo: 1, Hi: 1 << 16}}
}

// XenDialConfig configures a front end on the xen transport (in a guest).
type XenDialConfig struct {
	// DevID is the pvdrm device (the toolstack created it; 0 by default).
	DevID uint32
	// Mode is pvdrm or pvdrm-pooling: pooling is asked for in the latter.
	Mode string
	// GARTSize is the GART heap granted to the back end, bytes (whole
	// pages, at most MaxXenGARTPages of them).
	GARTSize uint64
	// RingPages is the ring's size in pages (default 1).
	RingPages int
	// DevDir is where the Xen devices are ("" is xen.DevDir).
	DevDir string
	// ResumeTimeout, when positive, lets the front end outlive a save of
	// its vGPU (gpuvm xl save, gpuvm vgpu save): it waits this long for a
	// back end that restores the image, here or in the domain xl restore
	// makes, and resumes on it (xen_resume.go); requests wait meanwhile.
	// 0: a save fails the front end, as its back end going does.
	ResumeTimeout time.Duration
	Logger        *slog.Logger
}

// DialXen connects a front end to its back end in dom0 over the xen
// transport: the ring and the GART heap granted, the event channel, the
// xenbus handshake; the back end says with Connected what it granted (the
// Welcome's numbers). The guest's xenstore connection is opened here.
func DialXen(ctx context.Context, cfg XenDialConfig) (fe *FrontEnd, err error) {
	if cfg.GARTSize == 0 || cfg.GARTSize%pageSize != 0 || cfg.GARTSize/pageSize > MaxXenGARTPages {
		return nil, fmt.Errorf("pvdrm xen: GART heap of %d bytes: want whole pages, at most %d MiB", cfg.GARTSize, MaxXenGARTPages*pageSize>>20)
	}
	xs, err := xenstore.Open()
	if err != nil {
		return nil, fmt.Errorf("pvdrm xen: %w", err)
	}
	domid, err := xenbus.SelfDomid(ctx, xs)
	if err != nil {
		return nil, errors.Join(err, xs.Close())
	}
	x, err := NewXenFront(ctx, XenFrontConfig{Xenstore: xs, Domid: domid, DevID: cfg.DevID, Pages: max(cfg.RingPages, 1),
		DevDir: cfg.DevDir, GARTPages: int(cfg.GARTSize / pageSize)})
	if err != nil {
		return nil, errors.Join(err, xs.Close())
	}
	w, err := x.Xenbus().ReadPeer(ctx, xenWelcomeKeys()...)
	if err != nil {
		return nil, errors.Join(err, x.Close(), xs.Close())
	}
	fe = &FrontEnd{xs: xs, welcome: ipc.Welcome{VGPU: uint32(w[xenKeyVGPU]), VRAMSize: w[xenKeyVRAMSize], Channels: uint32(w[xenKeyChannels])}}
	var features uint64 = FeatureYield
	if cfg.Mode == "pvdrm-pooling" {
		features |= FeaturePooling
	}
	if fe.Client, err = Connect(ctx, x, features); err != nil {
		return nil, errors.Join(err, x.Close(), xs.Close())
	}
	fe.Shares = NewXenShares(x.GART())
	// The back end's mapping going (its vGPU destroyed, the daemon gone)
	// fails what waits, as the local transport's goodbye does; so does
	// the back end leaving Connected without its mapping going (a daemon
	// that took the device over from a handoff and cannot serve it closes
	// it so: docs/protocol.md §15.5), seen in xenstore: once connected,
	// Connected is the back end's only state that goes on. Its state not
	// readable twice running (a removed back-end directory reads EACCES
	// in a guest) is taken for gone too.
	//
	// A back end handed to a new daemon process says so (its handoff
	// mark, xenbus.KeyHandoff) until that process takes it over; a mark
	// that stays longer than it says fails what waits too: the new
	// process died, or could not start.
	log := func(msg string, args ...any) {
		if cfg.Logger != nil {
			cfg.Logger.Info(msg, args...)
		}
	}
	go func() {
		t := time.NewTicker(xenPeerPoll)
		defer t.Stop()
		var w xenBackWatch
		for tick := 1; ; tick++ {
			select {
			case <-fe.Client.done:
				return
			case <-t.C:
			}
			link := x.Xenbus()
			if x.PeerGone() {
				// Gone with its saved mark: the vGPU's state is in an
				// image, and a back end that restores it will offer the
				// device again.
				sctx, cancel := context.WithTimeout(context.Background(), xenPeerPoll*xenStateLooks)
				saved, err := link.PeerSaved(sctx)
				cancel()
				if err == nil && saved && cfg.ResumeTimeout > 0 {
					if err := fe.xenSaved(x, cfg.DevID, cfg.ResumeTimeout, log); err != nil {
						fe.Client.Abort(err)
						return
					}
					w = xenBackWatch{}
					continue
				}
				why := errors.New("pvdrm xen: the back end let go of the ring")
				if saved {
					why = errors.New("pvdrm xen: the back end saved the vGPU (this front end does not wait for a restore: no resume timeout)")
				}
				fe.Client.Abort(why)
				return
			}
			if tick%xenStateLooks != 0 {
				continue
			}
			var l xenBackLook
			sctx, cancel := context.WithTimeout(context.Background(), xenPeerPoll*xenStateLooks)
			l.state, l.stateErr = link.PeerState(sctx)
			if l.stateErr == nil {
				l.mark, l.handingOff, l.handoffErr = link.PeerHandoff(sctx)
			}
			l.timedOut = sctx.Err() != nil
			cancel()
			if err := w.look(l, time.Now()); err != nil {
				fe.Client.Abort(err)
				return
			}
		}
	}()
	return fe, nil
}

// xenBackLook is what one look at the back end's xenstore directory read.
type xenBackLook struct {
	state      xenbus.State
	stateErr   error
	mark       xenbus.HandoffMark
	handingOff bool // there is a mark
	handoffErr error
	timedOut   bool // the reads did not finish in time (xenstored busy)
}

// xenBackWatch judges a front end's looks at its back end: the back end
// must stay Connected (its state unreadable twice running is taken for
// gone: a removed back-end directory reads EACCES in a guest), and a
// handoff mark must go within the bound it names, counted from the first
// look that saw it.
type xenBackWatch struct {
	unread   int
	markSeen time.Time // the first look at the current mark; zero: none
	markID   string    // which mark that is
}

// look takes one look (made at now) and returns why the front end must
// fail, or nil.
func (w *xenBackWatch) look(l xenBackLook, now time.Time) error {
	err := l.stateErr
	what := "state"
	if err == nil && l.handoffErr != nil {
		err, what = l.handoffErr, "handoff mark"
	}
	switch {
	case err != nil && !l.timedOut:
		if w.unread++; w.unread >= 2 {
			return fmt.Errorf("pvdrm xen: the back end's %s cannot be read: %w", what, err)
		}
		return nil
	case err != nil:
		return nil // xenstored is slow: look again
	case l.state != xenbus.StateConnected:
		return fmt.Errorf("pvdrm xen: the back end left the device (%v)", l.state)
	}
	w.unread = 0
	if !l.handingOff {
		w.markSeen = time.Time{}
		return nil
	}
	if w.markSeen.IsZero() || l.mark.ID != w.markID {
		w.markSeen, w.markID = now, l.mark.ID // a mark written anew counts afresh
	}
	if now.Sub(w.markSeen) > l.mark.Within {
		return fmt.Errorf("pvdrm xen: the daemon handed the device to a new process and none took it over within %v", l.mark.Within)
	}
	return nil
}
