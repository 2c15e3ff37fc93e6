package host

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/vgpuimage"
)

// serveMigrateIn answers POST /v1/domains/{domid}/migrate-in on a host of
// several boards: the body is a live migration's stream (docs/protocol.md
// §14), read as hostile input bounded by the largest board's slot, and its
// image waits on the first board whose checks it passes, as a restored
// image does (RegisterRestore). 200 with an aggregator.MigrateInResult,
// 400 with the reason when it is refused (nothing registered), 503 when
// the daemon's image transfers are all under way.
func (h *Host) serveMigrateIn(w http.ResponseWriter, r *http.Request) {
	domid, err := strconv.ParseUint(r.PathValue("domid"), 10, 32)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "domain id: " + err.Error()})
		return
	}
	// An incoming stream holds up to a slot's VRAM: it is one of the
	// daemon's image transfers, as a restore is.
	done, ok := h.reg.TryImageTransfer()
	if !ok {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": aggregator.ErrTransfersBusy.Error()})
		return
	}
	defer done()
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(aggregator.MigrateInTimeout))
	var maxVRAM uint64
	for _, b := range h.boards {
		if s := b.Agg.Layout().Slots; len(s) > 0 {
			maxVRAM = max(maxVRAM, s[0].VRAM.Size)
		}
	}
	img, info, err := aggregator.ReadWholeStream(r.Body, func(r io.Reader) (*vgpuimage.Image, vgpuimage.StreamInfo, error) {
		img, info, err := vgpuimage.ReadStream(r, maxVRAM)
		if err != nil {
			err = fmt.Errorf("%w: %w", aggregator.ErrImageRefused, err)
		}
		return img, info, err
	})
	if err == nil {
		var ri aggregator.RestoreInfo
		if ri, err = h.holdImage(uint32(domid), img); err == nil {
			writeJSON(w, http.StatusOK, aggregator.MigrateInResult{Restore: ri, Bytes: info.Bytes, Records: info.Records})
			return
		}
	}
	writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
}
