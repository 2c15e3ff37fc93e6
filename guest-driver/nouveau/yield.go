package nouveau

import (
	"fmt"
	"slices"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/hypercall"
)

// Cooperative yield (GLoop's scheduling points, docs/protocol.md §12.3
// YIELD_POINTS): a PV guest tells the aggregator's scheduler where it may
// run another VM between this channel's GPFIFO entries. The points name
// entries the driver has written but not yet submitted, so they are
// declared before the doorbell that submits them.

// CanYield reports whether the device can declare scheduling points (the
// PV modes: the hypercall that carries them).
func (d *Device) CanYield() bool { return d.pv != nil }

// SubmitFencedParts submits push buffers as consecutive GPFIFO entries, a
// semaphore release of the next fence sequence number after the last
// (returned), and one doorbell for all of it. With points, it first
// declares a scheduling point after every part but the last, so that the
// scheduler may run another VM between them (ErrNotSupported outside the
// PV modes). If the declaration fails the work is submitted all the same,
// without points, and the error says so.
func (c *Channel) SubmitFencedParts(parts [][]uint32, points bool) (uint32, error) {
	if len(parts) == 0 || len(parts) > gpfifoEntries/2 {
		return 0, fmt.Errorf("submit of %d parts: want 1..%d", len(parts), gpfifoEntries/2)
	}
	if points && c.d.pv == nil {
		return 0, fmt.Errorf("scheduling points: %w", ErrNotSupported)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	seq := c.seq + 1
	at := make([]uint32, 0, len(parts)-1)
	for i, p := range parts {
		words := p
		if i == len(parts)-1 {
			words = append(append([]uint32(nil), p...),
				nvc0.Incr(0, nvc0.MthdSemaphoreAddrHi, 4), uint32(c.fenceVA>>32), uint32(c.fenceVA), seq, nvc0.SemaphoreRelease)
		}
		idx := c.put
		if err := c.queueWordsLocked(words); err != nil {
			if i > 0 {
				c.unfenced = true
				c.ringLocked() // the parts queued are the guest's: let them run
			}
			return 0, err
		}
		if i < len(parts)-1 {
			at = append(at, idx)
		}
	}
	c.seq, c.unfenced = seq, false
	var err error
	if points {
		err = c.d.pv.yieldPoints(c.id, at)
	}
	c.ringLocked()
	if err != nil {
		return seq, fmt.Errorf("channel %d scheduling points: %w", c.id, err)
	}
	return seq, nil
}

// yieldPoints declares scheduling points after GPFIFO entries at of guest
// channel ch (at most hypercall.MaxYieldPoints a call).
func (p *pvClient) yieldPoints(ch int, at []uint32) error {
	b := p.batch(false)
	for len(at) > 0 {
		n := min(len(at), hypercall.MaxYieldPoints)
		if b.add(hypercall.Call{Op: hypercall.OpYieldPoints, Channel: uint32(ch), Count: uint32(n), Points: at[:n]}) != nil {
			break
		}
		at = at[n:]
	}
	_, err := b.done()
	return err
}

// SubmitSegmentsYield is SubmitSegments with a scheduling point declared
// after each segment whose points entry is true (ErrNotSupported outside
// the PV modes when any is). As there, the segments get one GPFIFO entry
// each, a fence follows them, and one doorbell rings for all of it; if the
// declaration fails the work is submitted all the same, without points.
func (c *Channel) SubmitSegmentsYield(segs []Segment, points []bool) (uint32, error) {
	if len(points) != len(segs) {
		return 0, fmt.Errorf("submit of %d segments with %d point flags", len(segs), len(points))
	}
	if !slices.Contains(points, true) {
		return c.SubmitSegments(segs)
	}
	if c.d.pv == nil {
		return 0, fmt.Errorf("scheduling points: %w", ErrNotSupported)
	}
	if err := checkSegments(segs); err != nil {
		return 0, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, ErrClosed
	}
	var at []uint32
	for i, s := range segs {
		if _, err := c.reserve(0); err != nil {
			if i > 0 {
				c.unfenced = true
				c.ringLocked()
			}
			return 0, err
		}
		if points[i] {
			at = append(at, c.put)
		}
		c.entryLocked(s.VA, s.Words, c.head, c.head)
	}
	seq := c.seq + 1
	if err := c.queueWordsLocked([]uint32{nvc0.Incr(0, nvc0.MthdSemaphoreAddrHi, 4), uint32(c.fenceVA >> 32), uint32(c.fenceVA), seq, nvc0.SemaphoreRelease}); err != nil {
		c.unfenced = true
		c.ringLocked() // the segments are queued: let them run
		return 0, err
	}
	c.seq, c.unfenced = seq, false
	err := c.d.pv.yieldPoints(c.id, at)
	c.ringLocked()
	if err != nil {
		return seq, fmt.Errorf("channel %d scheduling points: %w", c.id, err)
	}
	return seq, nil
}
