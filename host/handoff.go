package host

import (
	"bufio"
	"fmt"
	"io"
	"slices"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/vgpuimage"
)

// Handing the host's vGPUs to a new daemon process (docs/protocol.md
// §15): what may not be handed over, and each image's way back onto the
// board it left.

// HandoffBlockers names what keeps the daemon from handing its vGPUs to a
// new process (none: it may): vGPUs whose state or device model cannot
// survive it (aggregator.HandoffBlocker) and Xen pvdrm back ends, whose
// state is this process's.
func (h *Host) HandoffBlockers() []string {
	var out []string
	for _, v := range h.VGPUs() {
		if why := aggregator.HandoffBlocker(v); why != "" {
			out = append(out, why)
		}
	}
	h.mu.Lock()
	var doms []uint32
	for d := range h.xenPVDRM {
		doms = append(doms, d)
	}
	h.mu.Unlock()
	slices.Sort(doms)
	for _, d := range doms {
		out = append(out, fmt.Sprintf("the Xen pvdrm back end of domid %d runs in this process", d))
	}
	return out
}

// RegisterHandoff registers the image read from image, a vGPU of domain
// domid handed over by the previous daemon process from the board called
// board, on that board if it takes it — decoded straight from image and
// checked as any restore's — and else as RegisterRestore places it (a
// board renamed or resized by the new configuration). kept ≥ 0 is the slot
// of that board that keeps the vGPU's VRAM, which the image does not carry
// (aggregator.RegisterKept): only that board and slot can take it.
func (h *Host) RegisterHandoff(domid uint32, board string, image io.ReadSeeker, kept int) (aggregator.RestoreInfo, error) {
	if kept >= 0 {
		b := h.Board(board)
		if b == nil {
			return aggregator.RestoreInfo{}, fmt.Errorf("board %s, which keeps its VRAM, is gone", board)
		}
		img, err := vgpuimage.Decode(bufio.NewReaderSize(image, 1<<20))
		if err != nil {
			return aggregator.RestoreInfo{}, fmt.Errorf("%w: %w", aggregator.ErrImageRefused, err)
		}
		h.restoreMu.Lock()
		defer h.restoreMu.Unlock()
		for _, o := range h.boards {
			if o != b {
				o.Agg.ForgetRestore(domid)
			}
		}
		return b.Agg.RegisterKept(domid, img, kept)
	}
	if b := h.Board(board); b != nil {
		h.restoreMu.Lock()
		info, err := b.Agg.RegisterRestore(domid, bufio.NewReaderSize(image, 1<<20))
		h.restoreMu.Unlock()
		if err == nil {
			return info, nil
		}
		h.log.Warn("handed-over image refused by its board; trying the others", "domid", domid, "board", board, "err", err)
	}
	if _, err := image.Seek(0, io.SeekStart); err != nil {
		return aggregator.RestoreInfo{}, err
	}
	var limit int64
	for _, b := range h.boards {
		limit = max(limit, b.Agg.MaxImageBytes())
	}
	return h.RegisterRestore(domid, bufio.NewReaderSize(io.LimitReader(image, limit), 1<<20))
}
