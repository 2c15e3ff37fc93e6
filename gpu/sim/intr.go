package sim

import (
	"github.com/gpuvm/gpuvm/gpu/errreport"
)

// Error reporting as a GF100 does it: MMU faults go to per-unit fault
// records, push-buffer and method errors to the PBDMA that fetched them,
// both announced in PFIFO_INTR (gpu/errreport holds the register file).

// maxQueued bounds the records queued per fault unit and per PBDMA.
const maxQueued = 64

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
