package host

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/pvdrm"
	"github.com/gpuvm/gpuvm/xen/xenbus"
	"github.com/gpuvm/gpuvm/xen/xenstore"
)

// Xen pvdrm back ends across a handoff of the daemon (docs/protocol.md
// §15.5). The device, its grants and the front end's event channel are
// the guest's and xenstore's, not the daemon's: a back-end process can
// let go of a Connected device without closing it — its unmap
// notification disarmed, no state switched — and the next one takes it
// over (pvdrm.XenBackConfig.Resume): it maps the ring and the GART heap
// again, binds the front end's port again, and restores the vGPU from
// the image the handoff carried. The front end sees a pause: its
// requests wait on the ring.

// errXenHandedOff ends a session whose device was handed to a new
// process of the daemon.
var errXenHandedOff = errors.New("the pvdrm device was handed to a new daemon process")

// XenPVDRMHandoff is one Xen pvdrm back end handed to a new daemon
// process: the new process starts it again over the existing device.
type XenPVDRMHandoff struct {
	DomID uint32          `json:"domid"`
	Req   XenPVDRMRequest `json:"request"`
}

// XenPVDRMBacks lists the Xen pvdrm back ends, for a new process of the
// daemon to take over (ResumeXenPVDRM).
func (h *Host) XenPVDRMBacks() []XenPVDRMHandoff {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []XenPVDRMHandoff
	for domid, s := range h.xenPVDRM {
		if s.ctx.Err() != nil {
			continue // stopping: not to be started again by the new process
		}
		out = append(out, XenPVDRMHandoff{DomID: domid, Req: s.req})
	}
	slices.SortFunc(out, func(a, b XenPVDRMHandoff) int { return cmp.Compare(a.DomID, b.DomID) })
	return out
}

// BeginXenPVDRMHandoff holds back new sessions of the Xen pvdrm back ends
// while the daemon hands itself to a new process: none starts a handshake
// or attaches a vGPU the handoff does not hold. XenPVDRMHandoffEnded
// lets them go on if the handoff does not happen.
func (h *Host) BeginXenPVDRMHandoff() {
	h.mu.Lock()
	if h.xenHandoff == nil {
		h.xenHandoff = make(chan struct{})
	}
	h.mu.Unlock()
	// A session past its handshake attaches its vGPU before the holds
	// begin, so that it is held (a bounded wait: an attach is short).
	for deadline := time.Now().Add(xenAttachWait); time.Now().Before(deadline) && h.xenAttaching(); {
		time.Sleep(5 * time.Millisecond)
	}
}

// xenAttachWait bounds BeginXenPVDRMHandoff's wait for sessions that are
// attaching their vGPU.
const xenAttachWait = 10 * time.Second

// xenAttaching reports whether a session is between its handshake and its
// vGPU's attach.
func (h *Host) xenAttaching() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range h.xenPVDRM {
		if s.attaching {
			return true
		}
	}
	return false
}

// HandOffXenPVDRM hands the Xen pvdrm devices whose vGPU is held (held
// says) to a new process of the daemon, just before the vGPUs are
// committed to it: each such session's transport is disowned — its
// mapping going tells the front end nothing, and its teardown switches no
// state — and no device is removed. A session whose vGPU is not held
// (attached as the handoff began) is left as it is: at the exec its
// front end sees its back end go, as at a crash, and the new process
// closes the device. Call BeginXenPVDRMHandoff first.
func (h *Host) HandOffXenPVDRM(held func(*aggregator.VGPU) bool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.xenHandoff == nil {
		h.xenHandoff = make(chan struct{})
	}
	var errs []error
	for domid, s := range h.xenPVDRM {
		// A stopped back end is not in the manifest (XenPVDRMBacks): its
		// device is not marked either; its front end sees it go.
		if s.session == nil || s.vgpu == nil || !held(s.vgpu) || s.ctx.Err() != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(h.bg, 5*time.Second) // each its own: xenstored may be slow
		err := s.session.Disown(ctx)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("domain %d's pvdrm device: %w", domid, err))
			continue
		}
		s.handedOff = true
	}
	return errors.Join(errs...)
}

// XenPVDRMHandoffEnded ends a handoff that did not happen (called off, or
// its exec failed): sessions start again, and each back end whose device
// was handed over takes it over again in this process, as the new
// process would have.
func (h *Host) XenPVDRMHandoffEnded() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.xenHandoff != nil {
		close(h.xenHandoff)
		h.xenHandoff = nil
	}
}

// ResumeXenPVDRM starts the Xen pvdrm back ends a previous process of the
// daemon handed over: each takes its device over as that process left
// it. The domains' settings must be registered first (ApplyHandoffState).
// A back end that cannot start has its device closed (AbandonXenPVDRM).
func (h *Host) ResumeXenPVDRM(backs []XenPVDRMHandoff) []error {
	var errs, lost []error
	for _, b := range backs {
		if err := h.startXenPVDRM(b.DomID, b.Req, true); err != nil {
			errs = append(errs, fmt.Errorf("domain %d's pvdrm back end: %w", b.DomID, err))
			lost = append(lost, h.AbandonXenPVDRM([]XenPVDRMHandoff{b})...)
		}
	}
	return append(errs, lost...)
}

// AbandonXenPVDRM closes the Xen pvdrm devices a previous process of the
// daemon handed over and this one does not serve (it cannot start their
// back ends, or the handoff's manifest was unusable): each back end is
// switched to Closing and Closed, which its front end sees in xenstore
// (its back end's liveness byte, disarmed by the handoff, says nothing).
// The device is left for its front end to read (a removed back-end
// directory reads EACCES in a guest, not gone): the domain's next pvdrm
// back end makes it afresh.
func (h *Host) AbandonXenPVDRM(backs []XenPVDRMHandoff) []error {
	if len(backs) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(h.bg, 10*time.Second)
	defer cancel()
	xs, err := xenstore.Open()
	if err != nil {
		return []error{fmt.Errorf("close the handed-over pvdrm devices: %w", err)}
	}
	defer xs.Close()
	self, err := xenbus.SelfDomid(ctx, xs)
	if err != nil {
		return []error{fmt.Errorf("close the handed-over pvdrm devices: %w", err)}
	}
	var errs []error
	for _, b := range backs {
		dev := pvdrmDevice(self, b.DomID, b.Req.DevID)
		if err := xenbus.CloseBack(ctx, xs, dev); err != nil {
			errs = append(errs, fmt.Errorf("close domain %d's pvdrm device: %w", b.DomID, err))
			continue
		}
		h.log.Warn("handoff: a handed-over pvdrm device is closed: its guest's front end fails", "domid", b.DomID, "devid", b.Req.DevID)
	}
	return errs
}

// xenHandingOff is the open handoff's channel (nil: none).
func (h *Host) xenHandingOff() chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.xenHandoff
}

// xenSessionStarts records x as domain domid's serving session; it
// reports false, recording nothing, while a handoff is under way.
func (h *Host) xenSessionStarts(domid uint32, x *pvdrm.XenBack) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.xenPVDRM[domid]
	if h.xenHandoff != nil || s == nil {
		return false
	}
	s.session, s.vgpu, s.handedOff, s.attaching = x, nil, false, true
	return true
}

// xenSessionAttached records domain domid's session's vGPU.
func (h *Host) xenSessionAttached(domid uint32, v *aggregator.VGPU) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s := h.xenPVDRM[domid]; s != nil {
		s.vgpu, s.attaching = v, false
	}
}

// xenSessionEnds forgets domain domid's session and reports whether its
// device was handed over.
func (h *Host) xenSessionEnds(domid uint32) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.xenPVDRM[domid]
	if s == nil {
		return false
	}
	handed := s.handedOff
	s.session, s.vgpu, s.handedOff, s.attaching = nil, nil, false, false
	return handed
}
