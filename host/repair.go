package host

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/gpuvm/gpuvm/aggregator"
)

// Bringing a failed board back (docs/design.md, "Losing a board"). Once
// the GPU that fell off the bus answers again — reseated, power-cycled,
// rescanned; on the simulated board, RepairBus (`gpuvm board repair NAME`,
// fault injection) — the operator reinitialises it (`gpuvm board reinit
// NAME`): its aggregator builds its own structures afresh, renews every
// slot, and the board returns to placement in the state it had (active,
// or cordoned if the operator cordoned it). Its lost devices come back on
// it with their resets.

// Reinit brings the failed board called name back into service
// (aggregator.Reinit).
func (h *Host) Reinit(name string) error {
	b := h.Board(name)
	if b == nil {
		return fmt.Errorf("no board %q", name)
	}
	if err := b.Agg.Reinit(); err != nil {
		return err
	}
	h.mu.Lock()
	s := b.state
	h.mu.Unlock()
	h.log.Info("board back in service", "board", name, "state", s)
	return nil
}

// serveReinit answers POST /v1/boards/{name}/reinit: 200 once the board is
// back, 404 for no such board, 409 for a board that was not lost, 503 for
// one that still does not answer (or whose vGPUs are still being taken
// off).
func (h *Host) serveReinit(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if h.Board(name) == nil {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such board"})
		return
	}
	err := h.Reinit(name)
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, map[string]string{"board": name, "reinit": "back in service"})
	case errors.Is(err, aggregator.ErrBoardAnswers):
		writeJSON(w, http.StatusConflict, map[string]string{"error": err.Error()})
	default:
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
	}
}

// serveRepair answers POST /v1/boards/{name}/repair, the fault injection
// that puts a simulated board that fell off the bus back on it (with
// Options.FaultInjection only).
func (h *Host) serveRepair(w http.ResponseWriter, r *http.Request) {
	b := h.faultTarget(w, r, func(b *Board) bool { return b.RepairBus != nil })
	if b == nil {
		return
	}
	if err := b.RepairBus(); err != nil {
		writeJSON(w, http.StatusConflict, map[string]string{"error": err.Error()})
		return
	}
	h.log.Warn("fault injection: board back on the bus (gpuvm board reinit puts it back in service)", "board", b.Name)
	writeJSON(w, http.StatusOK, map[string]string{"board": b.Name, "injected": "back on the bus"})
}

// faultTarget returns the board a fault-injection request names, or
// answers the request with why not (no such board, fault injection off,
// the board has none: has reports whether it has this one) and returns
// nil.
func (h *Host) faultTarget(w http.ResponseWriter, r *http.Request, has func(*Board) bool) *Board {
	b := h.Board(r.PathValue("name"))
	switch {
	case b == nil:
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such board"})
	case !h.opts.FaultInjection:
		writeJSON(w, http.StatusForbidden, map[string]string{"error": "fault injection is off (gpuvm serve --fault-injection turns it on, for tests)"})
	case !has(b):
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "board " + b.Name + " has no fault injection"})
	default:
		return b
	}
	return nil
}
