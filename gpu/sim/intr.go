package sim

import (
	"github.com/gpuvm/gpuvm/gpu/errreport"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// Error reporting as a GF100 does it: MMU faults go to per-unit fault
// records, push-buffer and method errors to the PBDMA that fetched them,
// both announced in PFIFO_INTR (gpu/errreport holds the register file).

// maxQueued bounds the records queued per fault unit and per PBDMA. A
// channel stops at its first error and reports nothing more until it is
// enabled again, so with one slot per channel a queue overflows only if
// software re-enables channels without collecting their reports (the
// aggregator collects before it starts a channel); BAR faults come from
// the host driver's own accesses.
const maxQueued = nvc0.MaxChannels

// intrRegs adds the interrupt and error-report registers to t.
func (b *Board) intrRegs(t regTable) {
	s := b.intr
	for _, off := range errreport.Offsets() {
		t[off] = reg{
			read:  func() uint32 { v, _ := s.Read(off); return v },
			write: func(v uint32) { s.Write(off, v) },
		}
	}
}
