package pvdrm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/gpuvm/gpuvm/gpu/hostmem"
	"github.com/gpuvm/gpuvm/ipc"
	"github.com/gpuvm/gpuvm/xen/xenstore"
)

// FrontEnd is a pvdrm guest's connection to an aggregator on this machine
// (the local transport): the device-model socket carries the handshake —
// the guest's GART heap as its RAM, the ring memfd and eventfds as extra
// files — and, afterwards, only generic calls (counters); the ring carries
// the DRM operations.
type FrontEnd struct {
	// Client sends DRM operations.
	Client *Client
	// Shares maps the buffers GEM_MMAP shares.
	Shares FrontShares

	mu  sync.Mutex  // guards ctl, ctlEnd and welcome, which a resume replaces
	ctl *ipc.Client // nil on the xen transport
	// ctlEnd is closed once ctl is replaced by a resume or the front end
	// gave up resuming (then ctl stays).
	ctlEnd  chan struct{}
	welcome ipc.Welcome
	cfg     DialConfig
	closing chan struct{} // closed by Close: a resume stops
	once    sync.Once
	gart    *hostmem.RAM
	xs      *xenstore.Client // the xen transport's, closed last
}

// FrontShares are a front end's shares: LocalShares or XenShares.
type FrontShares interface {
	Shares
	// Mappings returns how many shares were taken.
	Mappings() uint64
	// Close releases what the shares keep.
	Close() error
}

// ErrNoControl is returned for what only the local transport's
// device-model connection carries (counters, its round trip).
var ErrNoControl = errors.New("pvdrm: no device-model connection on the xen transport")

// DialConfig names the guest and sizes its GART heap.
type DialConfig struct {
	Socket   string
	DomID    uint32
	Name     string
	Mode     string // pvdrm or pvdrm-pooling
	GARTSize uint64 // the guest memory buffers shared with it come from
	// RingPages is the ring's size in pages (default 1: 16 requests).
	RingPages int
	Logger    *slog.Logger
	// ResumeTimeout, when positive, lets the front end outlive a save of
	// its vGPU (frontend_resume.go): on the saved Bye it dials again with
	// a resuming Hello until a daemon restores the image or this long has
	// passed. Zero: a saved Bye ends it as any Bye does.
	ResumeTimeout time.Duration
	// ResumeSockets are the sockets a resume tries in turn (default:
	// Socket).
	ResumeSockets []string
}

// DialLocal connects a front end to the aggregator listening on cfg.Socket
// and says HELLO, asking for pooling in mode pvdrm-pooling.
func DialLocal(ctx context.Context, cfg DialConfig) (fe *FrontEnd, err error) {
	fe = &FrontEnd{cfg: cfg, closing: make(chan struct{}), ctlEnd: make(chan struct{})}
	defer func() {
		if err != nil {
			err = errors.Join(err, fe.Close())
			fe = nil
		}
	}()
	if fe.gart, err = hostmem.New(fmt.Sprintf("gpuvm-dom%d-gart", cfg.DomID), cfg.GARTSize); err != nil {
		return fe, err
	}
	gartFile, err := fe.gart.File()
	if err != nil {
		return fe, err
	}
	defer gartFile.Close()
	local, err := NewLocalFront(max(cfg.RingPages, MinRingPages))
	if err != nil {
		return fe, err
	}
	hello := ipc.Hello{DomID: cfg.DomID, Name: cfg.Name, Mode: cfg.Mode, RAMSize: fe.gart.Size(), Transport: ipc.TransportShm}
	var extra []*os.File
	fe.ctl, fe.welcome, extra, err = ipc.Dial(ctx, cfg.Socket, hello, gartFile, local.Files(), &ipc.DialOptions{Logger: cfg.Logger})
	for _, f := range extra {
		f.Close()
	}
	if err != nil {
		return fe, errors.Join(fmt.Errorf("pvdrm front end: %w", err), local.Close())
	}
	var features uint64 = FeatureYield // PUSHBUF may then carry scheduling points
	if cfg.Mode == "pvdrm-pooling" {
		features |= FeaturePooling
	}
	if fe.Client, err = Connect(ctx, local, features); err != nil {
		return fe, err
	}
	fe.Shares = NewLocalShares(fe.gart.Fd(), fe.gart.Size(), fe.Client.Features&FeaturePooling != 0)
	if fe.ctl.Done() != nil {
		// The aggregator says goodbye on the device-model socket (the
		// vGPU was destroyed or saved, or the daemon stops): fail what
		// waits, or resume.
		go fe.watch(local)
	}
	return fe, nil
}

// Welcome returns what the aggregator granted (vGPU id, VRAM quota,
// channels, timing profile).
func (fe *FrontEnd) Welcome() ipc.Welcome {
	fe.mu.Lock()
	defer fe.mu.Unlock()
	return fe.welcome
}

// control returns the device-model connection (nil on the xen transport).
func (fe *FrontEnd) control() *ipc.Client {
	fe.mu.Lock()
	defer fe.mu.Unlock()
	return fe.ctl
}

// Counters reads the vGPU's counters by name (the device-model socket's
// counters call).
func (fe *FrontEnd) Counters(names []string) (c map[string]uint64, err error) {
	err = fe.controlCall(func(ctl *ipc.Client) (err error) {
		c, err = ctl.Counters(names)
		return err
	})
	return c, err
}

// controlCall runs f on the device-model connection. A call that met the
// saved Bye of a connection the front end resumes from (a save, a
// migration, a handoff of the daemon) runs again on the resumed one, as
// a device model repeats an access that got no answer.
func (fe *FrontEnd) controlCall(f func(*ipc.Client) error) error {
	for {
		fe.mu.Lock()
		ctl, ended := fe.ctl, fe.ctlEnd
		fe.mu.Unlock()
		if ctl == nil {
			return ErrNoControl
		}
		err := f(ctl)
		if err == nil || fe.cfg.ResumeTimeout <= 0 || !ipc.IsSavedBye(err) {
			return err
		}
		select {
		case <-ended:
		case <-fe.closing:
			return err
		}
		if fe.control() == ctl {
			return err // the resume failed: the client says why
		}
	}
}

// RoundTrips measures, n times each, a request's round trip on the pvdrm
// ring (GETPARAM on file, which must be open) and a call's round trip on
// the device-model connection's shared-memory rings (the path every
// trapped MMIO access of the other modes takes); it returns their means
// (mmio 0 on the xen transport, which has no such connection).
func (fe *FrontEnd) RoundTrips(ctx context.Context, file uint32, n int) (ring, mmio time.Duration, err error) {
	start := time.Now()
	for range n {
		if _, err := fe.Client.Do(ctx, Request{Op: OpGetParam, File: file, Args: map[string]uint64{"param": ParamChipset}}); err != nil {
			return 0, 0, err
		}
	}
	ring = time.Since(start) / time.Duration(n)
	if fe.control() == nil {
		return ring, 0, nil
	}
	start = time.Now()
	for range n {
		err := fe.controlCall(func(ctl *ipc.Client) error {
			_, err := ctl.Call(ipc.OpCounters, 1<<32) // an unknown group: refused at once
			return err
		})
		if err != nil {
			return 0, 0, err
		}
	}
	return ring, time.Since(start) / time.Duration(n), nil
}

// Close disconnects (the aggregator tears the vGPU down) and frees the
// GART heap.
func (fe *FrontEnd) Close() error {
	if fe.closing != nil {
		fe.once.Do(func() { close(fe.closing) })
	}
	var errs []error
	if fe.Client != nil {
		errs = append(errs, fe.Client.Close())
	}
	if fe.Shares != nil {
		errs = append(errs, fe.Shares.Close())
	}
	if ctl := fe.control(); ctl != nil {
		errs = append(errs, ctl.Close())
	}
	if fe.gart != nil {
		errs = append(errs, fe.gart.Close())
	}
	if fe.xs != nil {
		errs = append(errs, fe.xs.Close())
	}
	return errors.Join(errs...)
}
