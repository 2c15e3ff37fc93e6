package gdev

import (
	"fmt"

	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
)

// yielder is an engine that can declare scheduling points between the
// entries of a submission (GLoop's cooperative yield).
type yielder interface {
	// canYield reports whether the engine's driver carries points.
	canYield() bool
	// submitYield queues each part as its own entry, with a scheduling
	// point after each but the last and a fence after the last, and
	// returns the fence.
	submitYield(parts [][]uint32, uses ...uint32) (uint32, error)
}

// SetYield turns cooperative yield on or off: with it on, LaunchRepeat
// submits each kernel launch as its own GPFIFO entry and declares a
// scheduling point after each but the last, so that the aggregator's
// scheduler may run another VM between the kernels instead of holding the
// GPU for the whole batch. Only drivers that can tell the scheduler (the
// PV modes) support it: elsewhere turning it on fails with
// nouveau.ErrNotSupported and changes nothing.
func (c *Context) SetYield(on bool) error {
	if on {
		if y, ok := c.eng.(yielder); !ok || !y.canYield() {
			return fmt.Errorf("cooperative yield: %w", nouveau.ErrNotSupported)
		}
	}
	c.yield = on
	return nil
}

func (e *nouveauEngine) canYield() bool { return e.dev.CanYield() }

func (e *nouveauEngine) submitYield(parts [][]uint32, _ ...uint32) (uint32, error) {
	return e.ch.SubmitFencedParts(parts, true)
}
