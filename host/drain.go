package host

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
)

// DrainResult is what draining a board did (POST /v1/boards/{name}/drain).
type DrainResult struct {
	Board string `json:"board"`
	// Moved are the vGPUs moved off it, each with where it went.
	Moved []MoveResult `json:"moved"`
	// Left are the vGPUs still on it, each with why (a mode that cannot
	// move, a guest pinned to the board, no room elsewhere, a move that
	// failed).
	Left []DrainLeft `json:"left"`
}

// DrainLeft is a vGPU a drain could not move.
type DrainLeft struct {
	ID     int    `json:"id"`
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// Drain takes the board called name out of placement (cordoned) and moves
// every vGPU it can to the other boards, each to the one placement would
// choose for it now (least loaded that fits; a guest pinned to this board
// stays). What it could not move stays on the board, listed with the
// reason; the board stays cordoned either way, so running the drain again
// after freeing room elsewhere moves the rest. Moves run one at a time,
// each bounded by ctx.
func (h *Host) Drain(ctx context.Context, name string) (DrainResult, error) {
	r := DrainResult{Board: name, Moved: []MoveResult{}, Left: []DrainLeft{}}
	b := h.Board(name)
	if b == nil {
		return r, fmt.Errorf("drain: no board %q: %w", name, ErrMoveRefused)
	}
	if lost, why := b.Agg.Lost(); lost {
		return r, fmt.Errorf("drain: board %s failed (%s): its vGPUs were lost with it: %w", name, why, ErrMoveRefused)
	}
	if err := h.SetState(name, StateCordoned); err != nil {
		return r, fmt.Errorf("drain: %w", err)
	}
	h.log.Info("draining board", "board", name)
	vgpus := b.Agg.VGPUs()
	slices.SortFunc(vgpus, func(x, y *aggregator.VGPU) int { return x.ID - y.ID })
	for _, v := range vgpus {
		if err := ctx.Err(); err != nil {
			r.Left = append(r.Left, DrainLeft{ID: v.ID, Name: v.Guest.Name, Reason: "the drain was stopped: " + err.Error()})
			continue
		}
		to, d := h.placeElsewhere(v, b)
		if to == nil {
			r.Left = append(r.Left, DrainLeft{ID: v.ID, Name: v.Guest.Name, Reason: d.Reason})
			continue
		}
		mctx, cancel := context.WithTimeout(ctx, moveTimeout)
		res, err := h.move(mctx, v.ID, to.Name, KindMove, "a drain of board "+name)
		cancel()
		if err != nil {
			r.Left = append(r.Left, DrainLeft{ID: v.ID, Name: v.Guest.Name, Reason: err.Error()})
			continue
		}
		r.Moved = append(r.Moved, res)
	}
	h.log.Info("board drained", "board", name, "moved", len(r.Moved), "left", len(r.Left))
	return r, nil
}

// placeElsewhere chooses, as placement would, a board other than from for
// a vGPU already running (it is not recorded as a placement: the move is).
func (h *Host) placeElsewhere(v *aggregator.VGPU, from *Board) (*Board, Decision) {
	pin := h.pinOf(v.Guest, v)
	if pin == from.Name {
		return nil, Decision{Reason: fmt.Sprintf("the guest is pinned to board %s", pin)}
	}
	return h.choose(v.Guest, pin, from)
}

// serveDrain answers POST /v1/boards/{name}/drain.
func (h *Host) serveDrain(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), drainTimeout)
	defer cancel()
	res, err := h.Drain(ctx, r.PathValue("name"))
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, res)
	case errors.Is(err, ErrMoveRefused):
		writeJSON(w, http.StatusConflict, map[string]string{"error": err.Error()})
	default:
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
	}
}

// drainTimeout bounds a drain through the control API (each move has its
// own moveTimeout); the CLI waits as long.
const drainTimeout = 5 * time.Minute
