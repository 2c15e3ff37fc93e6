package aggregator

import (
	"slices"
	"time"

	"github.com/gpuvm/gpuvm/hypercall"
	"github.com/gpuvm/gpuvm/sched"
)

// Cooperative yield (GLoop, thesis ch. 5): a PV guest declares scheduling
// points — "another VM may run after GPFIFO entry i" — with the
// YIELD_POINTS hypercall before it rings the doorbell that submits those
// entries (docs/protocol.md §12.3). When the dispatcher releases a
// submission that holds a point, it writes GP_PUT only up to the entry
// after it and queues the remainder as a new submission, which the policy
// schedules and charges like any other; the GPU still runs each part
// without preemption. dom0 never reads a push buffer: the points are the
// guest's word, and all a false one does is let other VMs run sooner.

// yieldMaxPoints bounds the points one channel may hold at once (and so
// what a flooding guest makes the dispatcher keep: 4 KiB a channel). A
// declaration past it fails whole with ErrNoMem.
const yieldMaxPoints = 1024

// yieldPoints are one guest channel's declared, not yet released points.
type yieldPoints struct {
	v       *VGPU
	entries uint32   // the GPFIFO size they were declared against
	at      []uint32 // entry indices, sorted, distinct
}

// hcYieldPoints validates a YIELD_POINTS call against the channel's state
// (under v.mu, which also guards the channel's put) and records its points.
// Nothing is recorded unless every point is valid.
func hcYieldPoints(v *VGPU, c *hypercall.Call) (uint32, hypercall.Code) {
	if c.Count == 0 || c.Channel >= uint32(len(v.chans)) {
		return 0, hypercall.ErrRange
	}
	ch := &v.chans[c.Channel]
	if !ch.running || ch.sh == nil {
		return 0, hypercall.ErrInval
	}
	entries := ch.sh.GPFIFOEntries()
	put := ch.put
	get, ok := v.shadowGPGet(int(c.Channel))
	if !ok || put >= entries {
		return 0, hypercall.ErrInval
	}
	get %= entries
	// Free slots: from put up to the one before get (a ring of n entries
	// holds at most n-1 submitted ones).
	free := entries - 1 - (put-get+entries)%entries
	prev := int64(-1)
	for _, p := range c.Points {
		if p >= entries {
			return 0, hypercall.ErrRange
		}
		d := (p - put + entries) % entries
		if d >= free {
			return 0, hypercall.ErrRange // already submitted, or past the ring
		}
		if int64(d) <= prev {
			return 0, hypercall.ErrInval // not in ring order
		}
		prev = int64(d)
	}
	if !v.agg.disp.declarePoints(v, int(c.Channel), entries, c.Points) {
		return 0, hypercall.ErrNoMem
	}
	return c.Count, hypercall.OK
}

// declarePoints records validated points of guest channel ch; it reports
// false, recording nothing, when they would take the channel past
// yieldMaxPoints.
func (d *dispatcher) declarePoints(v *VGPU, ch int, entries uint32, points []uint32) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	k := chanKey{v.ID, ch}
	m := d.points[k]
	if m == nil || m.v != v || m.entries != entries {
		m = &yieldPoints{v: v, entries: entries}
	}
	add := 0
	for _, p := range points {
		if _, found := slices.BinarySearch(m.at, p); !found {
			add++
		}
	}
	if len(m.at)+add > yieldMaxPoints {
		return false
	}
	for _, p := range points {
		if i, found := slices.BinarySearch(m.at, p); !found {
			m.at = slices.Insert(m.at, i, p)
		}
	}
	if d.points == nil {
		d.points = map[chanKey]*yieldPoints{}
	}
	d.points[k] = m
	return true
}

// dropPoints forgets guest channel ch's points (it stopped). Called with
// d.mu held.
func (d *dispatcher) dropPoints(v *VGPU, ch int) {
	k := chanKey{v.ID, ch}
	if m := d.points[k]; m != nil && m.v == v {
		delete(d.points, k)
	}
}

// dropVMPoints forgets every point of a departing VM. Called with d.mu held.
func (d *dispatcher) dropVMPoints(v *VGPU) {
	for k, m := range d.points {
		if m.v == v {
			delete(d.points, k)
		}
	}
}

// pointsHeld returns how many points guest channel ch of v holds.
func (d *dispatcher) pointsHeld(v *VGPU, ch int) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if m := d.points[chanKey{v.ID, ch}]; m != nil && m.v == v {
		return len(m.at)
	}
	return 0
}

// cut shortens s, being released from GP_GET s.start, to end after its
// first scheduling point, consuming the point, and returns the remainder
// (nil when s holds no point before its last entry). Called with d.mu held.
func (d *dispatcher) cut(s *submission) *submission {
	k := chanKey{s.v.ID, s.ch}
	m := d.points[k]
	if m == nil || m.v != s.v {
		return nil
	}
	if m.entries != s.entries {
		delete(d.points, k) // declared against a ring the channel no longer has
		return nil
	}
	n := (s.put - s.start + s.entries) % s.entries // entries released
	first, at := n, -1
	for i, p := range m.at {
		if dist := (p - s.start + s.entries) % s.entries; dist < first {
			first, at = dist, i
		}
	}
	if at < 0 {
		return nil
	}
	m.at = slices.Delete(m.at, at, at+1)
	if len(m.at) == 0 {
		delete(d.points, k)
	}
	if first+1 == n {
		return nil // a point after the last entry: the submission ends there anyway
	}
	rest := &submission{v: s.v, ch: s.ch, phys: s.phys, put: s.put, entries: s.entries,
		shadowUser: s.shadowUser, guestUser: s.guestUser}
	s.put = (s.start + first + 1) % s.entries
	return rest
}

// requeue queues the remainder of a cut submission released at now: for
// the policy a new submission of the VM, which it schedules and charges
// like any other. Called with d.mu held, from release.
func (d *dispatcher) requeue(rest *submission, now time.Duration) {
	id := rest.v.ID
	rest.queued = now
	d.queues[id] = append(d.queues[id], rest)
	d.nqueued++
	d.pending[chanKey{id, rest.ch}] = rest
	d.stats.Splits++
	if err := d.policy.Submitted(sched.VMID(id), now); err != nil {
		d.log.Error("scheduler", "err", err)
	}
}
