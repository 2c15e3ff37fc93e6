package aggregator

import "time"

// PauseKind names what paused a vGPU's guest.
type PauseKind string

// The pauses Options.OnPause reports.
const (
	PauseMove    PauseKind = "move"
	PauseEvict   PauseKind = "evict"
	PauseRestore PauseKind = "restore"
)

// Pause is one pause of a vGPU's guest: a move, an eviction or a restore,
// as Options.OnPause reports it (the benches' figures; operators have the
// same in the vGPU's log records).
type Pause struct {
	Kind PauseKind
	VGPU int
	// FromBoard and FromSlot are where the vGPU was, ToBoard and ToSlot
	// where it went; a slot of -1 is parked (an eviction's target, a
	// restore's source).
	FromBoard, ToBoard string
	FromSlot, ToSlot   int
	// Bytes is the VRAM copied.
	Bytes uint64
	// Took is how long the guest was paused: the vGPU's lock held (a
	// move's downtime); Copy the part of it spent copying VRAM (moves).
	Took, Copy time.Duration
}

// paused tells Options.OnPause of p.
func (a *Aggregator) paused(p Pause) {
	if f := a.opts.OnPause; f != nil {
		f(p)
	}
}
