package devmodel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"strconv"
	"time"

	"github.com/gpuvm/gpuvm/ipc"
	"github.com/gpuvm/gpuvm/xen/ioreq"
	"github.com/gpuvm/gpuvm/xen/privcmd"
)

// XenConfig says which Xen domain a device model serves and how it reaches
// the aggregator.
type XenConfig struct {
	Socket  string // the aggregator's device-model socket
	DomID   uint32
	Name    string
	Mode    string
	RAMSize uint64 // the domain's guest-physical span the aggregator maps
	// Device is the vGPU's PCI function in the guest (e.g. 0000:00:05.0).
	Device privcmd.SBDF
	// PlaceMem, if not zero, places the BARs from this guest-physical
	// address up, and PlaceIO the I/O BAR at this port, as firmware would:
	// for guests whose firmware does not enumerate PCI (PVH). Zero leaves
	// placement to the guest's firmware (HVM: hvmloader).
	PlaceMem, PlaceIO uint64
	// Placements, if any, places the BARs exactly so (XenRouter.PlaceAt):
	// a restored domain's, as its device model had them at the save.
	Placements []BARPlacement
	// OnPlacements, if set, is told where the BARs are now and after each
	// change (XenRouter.OnPlacements): gpuvm xl records them for a save.
	OnPlacements func([]BARPlacement)
	// Resume sends a resuming Hello (docs/protocol.md §13.7): the vGPU
	// comes back from the state image waiting for the domain.
	Resume bool
	// ResumeTimeout, when positive, keeps the device model across a
	// handoff of the daemon (docs/protocol.md §15): after the handoff's
	// Bye it waits this long for the new process to welcome its resuming
	// Hello, the guest's accesses waiting meanwhile (xenresume.go). Zero:
	// the device model ends with the connection, and a daemon refuses to
	// hand off while it serves.
	ResumeTimeout time.Duration
	// XenDir holds privcmd and evtchn ("" = /dev/xen).
	XenDir string
	// Spin is how many times the aggregator connection polls for a reply
	// before it sleeps (ipc.DialOptions.Spin), but 0 means never spin: the
	// right choice in dom0, where a vCPU that spins holds a physical CPU
	// that the trapped guest vCPU, or the aggregator serving it, waits for
	// (Xen's credit scheduler gives it back only at the end of a time slice).
	Spin   int
	Logger *slog.Logger
	// OpenServer opens the domain's ioreq server with cfg (nil: ioreq.Open
	// on XenDir). Tests pass an in-memory hypervisor's.
	OpenServer func(cfg ioreq.Config) (IoreqServer, error)
}

// IoreqServer is a domain's ioreq server (*ioreq.Server).
type IoreqServer interface {
	Claimer
	Serve(ctx context.Context) error
	Stats() ioreq.Stats
	Close() error
}

// XenModel is the device model of one Xen domain's vGPU: the aggregator
// connection (whose guest RAM is the domain's own, ipc.RAMXen), the
// domain's ioreq server, and the router between them.
type XenModel struct {
	backend *xenBackend // the aggregator connection, resumed after a handoff
	welcome ipc.Welcome
	router  *XenRouter
	srv     IoreqServer
	log     *slog.Logger
}

// StartXen attaches a vGPU to the domain and opens its ioreq server. The
// domain should be paused (xl create -p) until it returns: an access to a
// range nobody claims yet is dropped by Xen.
func StartXen(ctx context.Context, cfg XenConfig) (m *XenModel, err error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg.Logger = log
	hello := ipc.Hello{DomID: cfg.DomID, Name: cfg.Name, Mode: cfg.Mode, RAMSize: cfg.RAMSize,
		Transport: ipc.TransportShm, RAMSource: ipc.RAMXen, Resume: cfg.Resume, ResumesHandoff: cfg.ResumeTimeout > 0}
	spin := cfg.Spin
	if spin == 0 {
		spin = -1
	}
	client, w, extra, err := ipc.Dial(ctx, cfg.Socket, hello, nil, nil, &ipc.DialOptions{Spin: spin, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("device model of domain %d: %w", cfg.DomID, err)
	}
	// The remap table and slice, if the mode has remap: Xen has no call
	// that puts dom0's pages into an HVM guest's physical address space,
	// so on Xen every aperture access traps (docs/design.md).
	for _, f := range extra {
		f.Close()
	}
	hello.Resume = false // a resume after a handoff sets it again
	m = &XenModel{backend: &xenBackend{cfg: cfg, hello: hello, was: w, closing: make(chan struct{})}, welcome: w, log: log}
	m.backend.cur.Store(client)
	defer func() {
		if err != nil {
			err = errors.Join(err, m.Close())
		}
	}()
	bar1, err := aperture(w, ipc.ParamBAR1Size)
	if err != nil {
		return nil, err
	}
	bar3, err := aperture(w, ipc.ParamBAR3Size)
	if err != nil {
		return nil, err
	}
	cs, err := NewConfigSpaceApertures(bar1, bar3)
	if err != nil {
		return nil, err
	}
	cs.SetFLR(m.backend.reset) // the guest's function-level reset
	m.router = NewXenRouterSpace(cfg.Device, cs, m.backend, log)
	open := cfg.OpenServer
	if open == nil {
		open = func(c ioreq.Config) (IoreqServer, error) {
			dir := cfg.XenDir
			if dir == "" {
				dir = "/dev/xen"
			}
			return ioreq.Open(dir, uint16(cfg.DomID), c)
		}
	}
	if m.srv, err = open(ioreq.Config{Handler: m.router.Handle, Claims: []ioreq.Claim{ioreq.PCIDevice(cfg.Device)}, Logger: log}); err != nil {
		return nil, fmt.Errorf("device model of domain %d: %w", cfg.DomID, err)
	}
	if err := m.router.Attach(m.srv); err != nil {
		return nil, err
	}
	switch {
	case len(cfg.Placements) > 0:
		if err := m.router.PlaceAt(cfg.Placements); err != nil {
			return nil, fmt.Errorf("placing the BARs of domain %d as saved: %w", cfg.DomID, err)
		}
	case cfg.PlaceMem != 0:
		if _, err := m.router.PlaceBARs(cfg.PlaceMem, cfg.PlaceIO); err != nil {
			return nil, fmt.Errorf("placing the BARs of domain %d: %w", cfg.DomID, err)
		}
	}
	if cfg.OnPlacements != nil {
		m.router.OnPlacements(cfg.OnPlacements)
	}
	return m, nil
}

// aperture reads a Welcome's aperture size and rounds it down to a power
// of two, as a PCI BAR's size must be.
func aperture(w ipc.Welcome, key string) (uint64, error) {
	s, ok := w.Params[key]
	if !ok {
		return 0, nil // the whole BAR
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("welcome %s=%q: not a size", key, s)
	}
	return 1 << (63 - bits.LeadingZeros64(n)), nil
}

// Serve serves the domain's ioreqs until ctx ends, the ioreq server fails
// (the domain is gone), or the aggregator ends the connection (the vGPU
// was destroyed, or saved) and no resume follows (ResumeTimeout: a
// handoff's Bye). It says which.
//
// Virtual interrupts are not delivered to a Xen guest yet: the aggregator
// raises them on this connection too (m.client.InterruptsOffered), and
// their delivery would be a goroutine here looping on m.client.WaitIRQ
// and injecting an MSI for each change of the count (XEN_DMOP_inject_msi
// with the address and data the guest programmed into an MSI capability
// the config space would have to offer; or INTx by
// XEN_DMOP_set_pci_intx_level, deasserted when the guest acknowledges).
// Until then the guest's driver polls (docs/design.md, "Virtual
// interrupts").
func (m *XenModel) Serve(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		for {
			c := m.backend.client()
			select {
			case <-c.Done():
				// A handoff's Bye: resume now, not at the guest's next
				// access (the new process's image waits a bounded time).
				if m.backend.resumeAfter(c, c.Err()) {
					continue
				}
				err := c.Err()
				if rerr := m.backend.err(); rerr != nil {
					err = fmt.Errorf("%w: %w", errResumeFailed, rerr)
				}
				cancel(fmt.Errorf("the aggregator ended the vGPU: %w", err))
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	err := m.srv.Serve(ctx)
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return err
}

// Welcome returns the aggregator's Welcome.
func (m *XenModel) Welcome() ipc.Welcome { return m.welcome }

// Placements returns where the vGPU's BARs are now.
func (m *XenModel) Placements() []BARPlacement { return m.router.ConfigSpace().Placements() }

// Stats returns the ioreq server's counters.
func (m *XenModel) Stats() ioreq.Stats { return m.srv.Stats() }

// Resumes is how many times the device model resumed after a handoff.
func (m *XenModel) Resumes() int { return int(m.backend.resumes.Load()) }

// Close destroys the ioreq server and ends the aggregator connection,
// which tears the vGPU down.
func (m *XenModel) Close() error {
	var errs []error
	m.backend.close()
	if m.srv != nil {
		errs = append(errs, m.srv.Close())
	}
	errs = append(errs, m.backend.client().Close())
	return errors.Join(errs...)
}
