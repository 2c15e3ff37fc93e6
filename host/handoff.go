package host

import (
	"bufio"
	"cmp"
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
// survive it (aggregator.HandoffBlocker). Xen pvdrm back ends cross it
// (HandOffXenPVDRM).
func (h *Host) HandoffBlockers() []string {
	var out []string
	for _, v := range h.VGPUs() {
		if why := aggregator.HandoffBlocker(v); why != "" {
			out = append(out, why)
		}
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

// HandoffState is what of the host's own state crosses a handoff beside
// the vGPUs (docs/protocol.md §15.2): the settings a toolstack registered
// for domains (PUT /v1/domains/{domid}), and which boards are cordoned.
type HandoffState struct {
	Domains  []HandoffDomain `json:"domains,omitempty"`
	Cordoned []string        `json:"cordoned,omitempty"`
}

// HandoffDomain is one domain's registered settings: waiting at the host
// for placement (Board ""), or registered on a board, where the domain's
// vGPU is or is about to be.
type HandoffDomain struct {
	DomID    uint32                    `json:"domid"`
	Board    string                    `json:"board,omitempty"`
	Settings aggregator.DomainSettings `json:"settings"`
}

// HandoffState reads what of the host crosses a handoff.
func (h *Host) HandoffState() HandoffState {
	var s HandoffState
	for _, b := range h.boards {
		for d, ds := range b.Agg.DomainSettingsWaiting() {
			s.Domains = append(s.Domains, HandoffDomain{DomID: d, Board: b.Name, Settings: ds})
		}
	}
	h.mu.Lock()
	for d, ds := range h.pending {
		s.Domains = append(s.Domains, HandoffDomain{DomID: d, Settings: ds})
	}
	for _, b := range h.boards {
		// A board draining when the daemon hands off stays out of
		// placement; its drain does not go on.
		if b.state == StateCordoned {
			s.Cordoned = append(s.Cordoned, b.Name)
		}
	}
	h.mu.Unlock()
	slices.SortFunc(s.Domains, func(x, y HandoffDomain) int { return cmp.Compare(x.DomID, y.DomID) })
	return s
}

// ApplyHandoffState registers what the previous process handed over, each
// value checked as its own request would be (a board the configuration no
// longer has: the host's own wait, or nothing); it returns what it could
// not apply.
func (h *Host) ApplyHandoffState(s HandoffState) []error {
	var errs []error
	for _, d := range s.Domains {
		var err error
		if b := h.Board(d.Board); b != nil {
			err = b.Agg.SetDomainSettings(d.DomID, d.Settings)
		} else {
			_, err = h.SetDomainSettings(d.DomID, d.Settings)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("settings of domain %d: %w", d.DomID, err))
		}
	}
	for _, name := range s.Cordoned {
		if err := h.SetState(name, StateCordoned); err != nil {
			errs = append(errs, fmt.Errorf("cordon: %w", err))
		}
	}
	return errs
}
