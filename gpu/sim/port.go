package sim

import (
	"github.com/gpuvm/gpuvm/internal/buspipe"
)

// Port is one CPU's path to the board's BARs (a gpu.MMIO), timed as a bus
// times it (package buspipe): posted writes pipeline, reads wait behind
// the writes before them. The board's own Read32 and Write32 charge every
// access its full cost from the moment it starts instead, which adds the
// caller's per-call overhead between accesses on top of the bus time. A
// port carries no state shared with other actors, so one actor's accesses
// never delay another's (no timing channel through it). A Port is safe for
// concurrent use; its users share one pipeline, as the CPUs of one host
// share a link.
type Port struct {
	b    *Board
	pipe *buspipe.Pipe
}

// NewPort returns a new, idle port.
func (b *Board) NewPort() *Port { return &Port{b: b, pipe: buspipe.New()} }

// Read32 reads a 32-bit word (gpu.MMIO).
func (p *Port) Read32(bar int, off uint64) uint32 {
	b := p.b
	if !b.enter() {
		return 0
	}
	defer b.leave()
	now := p.pipe.Now()
	v := b.read32(bar, off)
	p.pipe.Read(now, b.timing.MMIOReadNs)
	return v
}

// Write32 writes a 32-bit word (gpu.MMIO).
func (p *Port) Write32(bar int, off uint64, v uint32) {
	b := p.b
	if !b.enter() {
		return
	}
	defer b.leave()
	now := p.pipe.Now()
	b.write32(bar, off, v)
	p.pipe.Write(now, b.timing.MMIOWriteNs)
}
