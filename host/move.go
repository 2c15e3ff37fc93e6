package host

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
)

// MoveResult is what a move did (POST /v1/vgpus/{id}/move).
type MoveResult struct {
	ID        int    `json:"id"`
	FromBoard string `json:"from_board"`
	FromSlot  int    `json:"from_slot"`
	ToBoard   string `json:"to_board"`
	ToSlot    int    `json:"to_slot"`
	// BytesCopied is the VRAM in use that was copied.
	BytesCopied uint64 `json:"bytes_copied"`
	// DowntimeNs is how long the guest was paused; CopyNs the part of it
	// spent copying VRAM.
	DowntimeNs int64 `json:"downtime_ns"`
	CopyNs     int64 `json:"copy_ns"`
}

// ErrMoveRefused is returned for a move the host will not try: no such
// board, a board that is not active, or a guest pinned elsewhere.
var ErrMoveRefused = errors.New("move refused")

// Move moves vGPU id to a free slot of the board called toBoard (its own
// board too: another slot). The board must be active (not cordoned or
// failed), and a guest pinned to a board stays there. Moves are recorded
// with the placement decisions.
func (h *Host) Move(ctx context.Context, id int, toBoard string) (MoveResult, error) {
	return h.move(ctx, id, toBoard, KindMove, "the operator")
}

// move is Move, recorded as a decision of kind, made by by (the operator,
// a drain, the load balancer and its reason).
func (h *Host) move(ctx context.Context, id int, toBoard, kind, by string) (MoveResult, error) {
	r := MoveResult{ID: id, ToBoard: toBoard}
	from, v := h.Lookup(id)
	if v == nil {
		return r, fmt.Errorf("move vGPU %d: %w", id, aggregator.ErrDetached)
	}
	r.FromBoard = from.Name
	to := h.Board(toBoard)
	if to == nil {
		return r, fmt.Errorf("move vGPU %d: no board %q: %w", id, toBoard, ErrMoveRefused)
	}
	if st := h.states()[to.Index]; st != StateActive {
		return r, fmt.Errorf("move vGPU %d: board %s is %s: %w", id, toBoard, st, ErrMoveRefused)
	}
	if pin := h.pinOf(v.Guest, v); pin != "" && pin != toBoard {
		return r, fmt.Errorf("move vGPU %d: the guest is pinned to board %q: %w", id, pin, ErrMoveRefused)
	}
	st, err := aggregator.Move(ctx, v, to.Agg)
	r.FromSlot, r.ToSlot = st.FromSlot, st.ToSlot
	r.BytesCopied, r.DowntimeNs, r.CopyNs = st.Bytes, int64(st.Downtime), int64(st.Copy)
	d := Decision{Time: time.Now(), Kind: kind, DomID: v.Guest.DomID, Name: v.Guest.Name, Board: toBoard,
		Reason: fmt.Sprintf("moved by %s from board %s slot %d to slot %d (%d KiB copied, paused %v)",
			by, from.Name, st.FromSlot, st.ToSlot, st.Bytes>>10, st.Downtime.Round(time.Microsecond))}
	if err != nil {
		d.Board, d.Reason = "", fmt.Sprintf("move of vGPU %d from board %s to %s by %s failed: %v", id, from.Name, toBoard, by, err)
	}
	h.record(d)
	return r, err
}

// serveMove answers POST /v1/vgpus/{id}/move?to=BOARD.
func (h *Host) serveMove(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.Atoi(r.PathValue("id"))
	if err != nil {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such vGPU"})
		return
	}
	to := r.URL.Query().Get("to")
	if to == "" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "name the target board: ?to=BOARD"})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), moveTimeout)
	defer cancel()
	res, err := h.Move(ctx, id, to)
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, res)
	case errors.Is(err, aggregator.ErrDetached):
		writeJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
	case errors.Is(err, aggregator.ErrMoveUnsupported):
		writeJSON(w, http.StatusNotImplemented, map[string]string{"error": err.Error()})
	case errors.Is(err, ErrMoveRefused), errors.Is(err, aggregator.ErrNoSlot), errors.Is(err, aggregator.ErrBoardLost):
		writeJSON(w, http.StatusConflict, map[string]string{"error": err.Error()})
	case errors.Is(err, context.DeadlineExceeded):
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
	default:
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
	}
}

// moveTimeout bounds a move's wait for the VM's work in flight; a move
// that times out there changes nothing. The watchdog, when set, ends any
// submission sooner.
const moveTimeout = 8 * time.Second // below the CLI's 10 s client timeout
