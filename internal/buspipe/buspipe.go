// Package buspipe times one CPU's accesses to a device across a bus as the
// bus does: posted writes pipeline, so a run of writes costs the write
// cost each in throughput and the CPU stalls only while the previous write
// is still in flight; a read waits behind the writes issued before it (PCIe
// ordering) and then for its own round trip.
//
// Charging each access its full cost from the moment it starts instead
// adds the caller's own per-call overhead between accesses on top of the
// bus time: measured on the simulated board with its Fermi profile, 366 ns
// per 32-bit write issued one by one against 252 ns per word written in
// bulk. A driver writing page tables word by word then paid for the
// simulator, not for the bus, while the aggregator's bulk writes did not.
package buspipe

import (
	"sync/atomic"
	"time"

	"github.com/gpuvm/gpuvm/internal/spin"
)

// Pipe is one actor's bus pipeline. The zero value is not ready: use New.
// A Pipe is safe for concurrent use; its users share one pipeline.
type Pipe struct {
	t0 time.Time
	// busy is when the accesses issued so far are done, in nanoseconds
	// since t0 (monotonic).
	busy atomic.Int64
}

// New returns an idle pipe.
func New() *Pipe { return &Pipe{t0: time.Now()} }

// Now returns the pipe's clock: nanoseconds since it was created.
func (p *Pipe) Now() int64 { return time.Since(p.t0).Nanoseconds() }

// Reserve books cost nanoseconds of the bus for an access issued at now
// (the pipe's clock), after the accesses booked before it, and returns when
// the booking starts.
func (p *Pipe) Reserve(now, cost int64) int64 {
	for {
		busy := p.busy.Load()
		start := max(now, busy)
		if p.busy.CompareAndSwap(busy, start+cost) {
			return start
		}
	}
}

// Write charges a posted write issued at now: it returns once the write
// before it has left the pipeline.
func (p *Pipe) Write(now, cost int64) {
	if cost <= 0 {
		return
	}
	spin.Until(p.t0.Add(time.Duration(p.Reserve(now, cost))))
}

// Read charges a read issued at now: it returns when the read's round
// trip, after every write before it, is done.
func (p *Pipe) Read(now, cost int64) {
	if cost <= 0 {
		return
	}
	spin.Until(p.t0.Add(time.Duration(p.Reserve(now, cost) + cost)))
}
