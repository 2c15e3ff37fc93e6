//go:build linux && (amd64 || arm64)

package ioreq

import (
	"errors"
	"fmt"

	"github.com/gpuvm/gpuvm/xen"
	"github.com/gpuvm/gpuvm/xen/privcmd"
)

// Open creates an ioreq server for domain dom on Xen, through the devices
// in dir ("" is xen.DevDir), and returns it ready to Serve:
//
//  1. open privcmd and restrict it to dom; ask Xen for dom's vCPU count;
//  2. create a synchronous ioreq server (no buffered ring);
//  3. map its ioreq page with MMAP_RESOURCE (never into guest memory);
//  4. enable it, which makes Xen write each vCPU's event channel port
//     into the page, and bind a /dev/xen/evtchn channel to each;
//  5. claim cfg.Claims, so no request is routed to the server before it
//     listens on every vCPU's channel.
//
// The guest should be paused meanwhile (xl create -p): an access to a
// range nobody claimed yet is dropped by Xen. Close destroys the server.
func Open(dir string, dom uint16, cfg Config) (*Server, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	h, err := privcmd.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("ioreq server for domain %d: %w", dom, err)
	}
	ctl := &xenControl{h: h, dom: dom}
	fail := func(err error) (*Server, error) {
		return nil, errors.Join(fmt.Errorf("ioreq server for domain %d: %w", dom, err), ctl.close())
	}
	if err := h.Restrict(dom); err != nil {
		return fail(err)
	}
	vcpus, err := h.NrVCPUs(dom)
	if err != nil {
		return fail(err)
	}
	if ctl.id, err = h.CreateIoreqServer(dom, privcmd.BufIoreqOff); err != nil {
		return fail(err)
	}
	ctl.created = true
	if ctl.page, err = h.MapResource(dom, privcmd.ResourceIoreqServer, uint32(ctl.id), privcmd.FrameIoreq0, 1); err != nil {
		return fail(fmt.Errorf("map the ioreq page of server %d: %w", ctl.id, err))
	}
	page, err := NewPage(ctl.page.Bytes(), vcpus)
	if err != nil {
		return fail(err)
	}
	if err := h.SetIoreqServerState(dom, ctl.id, true); err != nil {
		return fail(err)
	}
	ctl.enabled = true
	notifiers := make([]Notifier, 0, vcpus)
	closeNotifiers := func() error {
		var errs []error
		for _, n := range notifiers {
			errs = append(errs, n.Close())
		}
		return errors.Join(errs...)
	}
	for v := range vcpus {
		port, err := page.Port(v)
		if err != nil {
			return fail(errors.Join(err, closeNotifiers()))
		}
		e, err := xen.OpenEvtchn(dir)
		if err != nil {
			return fail(errors.Join(err, closeNotifiers()))
		}
		if err := e.BindInterdomain(dom, port); err != nil {
			return fail(errors.Join(fmt.Errorf("vCPU %d: %w", v, err), e.Close(), closeNotifiers()))
		}
		notifiers = append(notifiers, e)
	}
	s, err := newServer(page, notifiers, cfg, ctl)
	if err != nil {
		return fail(errors.Join(err, closeNotifiers()))
	}
	if err := s.claimAll(cfg.Claims); err != nil {
		return nil, errors.Join(fmt.Errorf("ioreq server for domain %d: %w", dom, err), s.Close())
	}
	s.log.Info("ioreq server up", "domain", dom, "server", ctl.id, "vcpus", vcpus, "claims", len(cfg.Claims))
	return s, nil
}

// An event channel is what wakes a vCPU's goroutine on Xen.
var _ Notifier = (*xen.Evtchn)(nil)

// xenControl is a server's side of Xen: the privcmd handle restricted to
// the domain, the server id, and the ioreq page's mapping.
type xenControl struct {
	h                *privcmd.Handle
	dom              uint16
	id               privcmd.ServerID
	created, enabled bool
	page             *privcmd.Mapping
}

// claim claims c's range from Xen.
func (c *xenControl) claim(cl Claim) error {
	t, start, end := cl.xenRange()
	return c.h.MapIORange(c.dom, c.id, t, start, end)
}

// release gives c's range back.
func (c *xenControl) release(cl Claim) error {
	t, start, end := cl.xenRange()
	return c.h.UnmapIORange(c.dom, c.id, t, start, end)
}

// close disables and destroys the server (which releases its ranges),
// unmaps its page and closes privcmd, as far as each was set up.
func (c *xenControl) close() error {
	var errs []error
	if c.enabled {
		errs = append(errs, c.h.SetIoreqServerState(c.dom, c.id, false))
		c.enabled = false
	}
	if c.created {
		errs = append(errs, c.h.DestroyIoreqServer(c.dom, c.id))
		c.created = false
	}
	if c.page != nil {
		errs = append(errs, c.page.Close())
		c.page = nil
	}
	errs = append(errs, c.h.Close())
	return errors.Join(errs...)
}
