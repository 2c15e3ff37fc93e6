package host

import (
	"fmt"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
)

// Restarting a lost board's vGPUs from their eviction images. A vGPU
// parked by eviction keeps its whole state in the daemon's memory, not on
// its board; when the board falls off the bus it is not lost with it: it
// is handed to the board placement chooses among the others (as for a
// drain: active, with room, the guest's pin respected) and restored there
// on its guest's next access — its guest sees a longer pause. The vGPUs
// resident on the lost board are lost devices (aggregator/health.go).

// rehomer returns the choice of another board for a parked vGPU of lost,
// recorded with the placement decisions.
func (h *Host) rehomer(lost *Board) func(*aggregator.VGPU) *aggregator.Aggregator {
	return func(v *aggregator.VGPU) *aggregator.Aggregator {
		to, d := h.placeElsewhere(v, lost)
		d.Time, d.Kind, d.DomID, d.Name = time.Now(), KindRestart, v.Guest.DomID, v.Guest.Name
		if to == nil {
			d.Board = ""
			d.Reason = fmt.Sprintf("vGPU %d of lost board %s not restarted: %s", v.ID, lost.Name, d.Reason)
			h.record(d)
			return nil
		}
		d.Board = to.Name
		d.Reason = fmt.Sprintf("parked vGPU %d of lost board %s restarts from its eviction image: %s", v.ID, lost.Name, d.Reason)
		if isLost, _ := v.Lost(); isLost {
			d.Reason = fmt.Sprintf("lost vGPU %d of board %s is reset here: %s", v.ID, lost.Name, d.Reason)
		}
		h.record(d)
		return to.Agg
	}
}
