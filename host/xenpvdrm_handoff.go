package host

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/gpuvm/gpuvm/pvdrm"
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
		out = append(out, XenPVDRMHandoff{DomID: domid, Req: s.req})
	}
	slices.SortFunc(out, func(a, b XenPVDRMHandoff) int { return cmp.Compare(a.DomID, b.DomID) })
	return out
}

// HandOffXenPVDRM hands every Xen pvdrm back end to a new process of the
// daemon, just before the vGPUs are committed to it: each serving
// session's transport is disowned (its end going tells the front end
// nothing, and its teardown switches no state), no new session starts,
// and no device is removed. Until XenPVDRMHandoffFailed, the back ends
// wait for the exec.
func (h *Host) HandOffXenPVDRM() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.xenHandoff == nil {
		h.xenHandoff = make(chan struct{})
	}
	var errs []error
	for domid, s := range h.xenPVDRM {
		if s.session == nil {
			continue
		}
		if err := s.session.Disown(); err != nil {
			errs = append(errs, fmt.Errorf("domain %d's pvdrm device: %w", domid, err))
			continue
		}
		s.handedOff = true
	}
	return errors.Join(errs...)
}

// XenPVDRMHandoffFailed ends a handoff whose exec failed: each back end
// whose device was handed over takes it over again in this process, as
// the new process would have.
func (h *Host) XenPVDRMHandoffFailed() {
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
func (h *Host) ResumeXenPVDRM(backs []XenPVDRMHandoff) []error {
	var errs []error
	for _, b := range backs {
		if err := h.startXenPVDRM(b.DomID, b.Req, true); err != nil {
			errs = append(errs, fmt.Errorf("domain %d's pvdrm back end: %w", b.DomID, err))
		}
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
	s.session, s.handedOff = x, false
	return true
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
	s.session, s.handedOff = nil, false
	return handed
}
