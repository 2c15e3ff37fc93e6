package host

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/ipc"
	"github.com/gpuvm/gpuvm/vgpuimage"
)

// serveRestore answers POST /v1/domains/{domid}/restore on a host of
// several boards: the image is decoded as it arrives (bounded as the
// largest board bounds it), checked, and registered on the first board
// whose slots it fits; the domain's device model is then placed on that
// board. 400 with the reason when it is refused (nothing registered), 503
// when the daemon's image transfers are all under way.
func (h *Host) serveRestore(w http.ResponseWriter, r *http.Request) {
	domid, err := strconv.ParseUint(r.PathValue("domid"), 10, 32)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "domain id: " + err.Error()})
		return
	}
	done, ok := h.reg.TryImageTransfer()
	if !ok {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": aggregator.ErrTransfersBusy.Error()})
		return
	}
	defer done()
	var limit int64
	for _, b := range h.boards {
		limit = max(limit, b.Agg.MaxImageBytes())
	}
	info, err := h.RegisterRestore(uint32(domid), aggregator.StallReader(w, http.MaxBytesReader(w, r.Body, limit)))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, info)
}

// RegisterRestore decodes an image from r and registers it for domain
// domid on the first board whose checks it passes, replacing any image
// already waiting for the domain on any board — only once the new one is
// known to be taken, so a refused image never drops a good one.
// Registrations are one at a time, so a domain's image waits on one board
// at most. The image is decoded once, as it arrives: dom0 holds it once.
func (h *Host) RegisterRestore(domid uint32, r io.Reader) (aggregator.RestoreInfo, error) {
	img, err := vgpuimage.Decode(r)
	if err != nil {
		return aggregator.RestoreInfo{}, fmt.Errorf("%w: %w", aggregator.ErrImageRefused, err)
	}
	return h.holdImage(domid, img)
}

// RegisterImage registers img, decoded already, for domain domid as
// RegisterRestore does. It takes img.
func (h *Host) RegisterImage(domid uint32, img *vgpuimage.Image) (aggregator.RestoreInfo, error) {
	return h.holdImage(domid, img)
}

// holdImage holds img for domid on the first board whose checks it
// passes, replacing an image waiting for the domain on any board only once
// it is taken (gpuvm vgpu restore, or an incoming migration). It takes img.
func (h *Host) holdImage(domid uint32, img *vgpuimage.Image) (aggregator.RestoreInfo, error) {
	var target *Board
	var errs []error
	for _, b := range h.boards {
		if err := b.Agg.CheckImage(domid, img); err != nil {
			errs = append(errs, fmt.Errorf("board %s: %w", b.Name, err))
			continue
		}
		target = b
		break
	}
	if target == nil {
		img.Scrub()
		return aggregator.RestoreInfo{}, errors.Join(errs...)
	}
	h.restoreMu.Lock()
	defer h.restoreMu.Unlock()
	for _, b := range h.boards {
		if b != target {
			b.Agg.ForgetRestore(domid)
		}
	}
	info, err := target.Agg.RegisterImage(domid, img)
	if err != nil {
		return info, fmt.Errorf("board %s: %w", target.Name, err)
	}
	return info, nil
}

// restoreBoard is the board an image for domid waits on (nil: none).
func (h *Host) restoreBoard(domid uint32) *Board {
	for _, b := range h.boards {
		if b.Agg.HasRestore(domid) {
			return b
		}
	}
	return nil
}

// refuseResume refuses p, a resuming device model (ipc.Hello.Resume),
// when no board holds an image for its domain, before placement could
// choose a board for it: its reason tells the device model to try again
// (docs/protocol.md §13.7). It reports whether it refused.
func (h *Host) refuseResume(p *ipc.Pending) bool {
	domid := p.Hello().DomID
	if h.restoreBoard(domid) != nil {
		return false
	}
	err := aggregator.NoImageError(domid)
	h.log.Info("resuming device model refused", "domid", domid, "reason", err)
	_ = p.Reject(err.Error())
	return true
}
