package sim

import "sync/atomic"

// numBARs is the number of PCI BAR indices (0..5).
const numBARs = 6

// Stats are the board's event counters since creation.
type Stats struct {
	// MMIOReads and MMIOWrites count accesses per BAR index.
	MMIOReads, MMIOWrites [numBARs]uint64
	// UnknownRegisters counts BAR0 accesses to offsets the board does not
	// decode (including unaligned and out-of-range offsets) and accesses to
	// BAR indices the board does not have.
	UnknownRegisters uint64
	// BARFaults counts BAR1/BAR3 accesses that did not translate.
	BARFaults uint64
	// TLBHits, TLBMisses and TLBFlushes count MMU translations and flushes.
	TLBHits, TLBMisses, TLBFlushes uint64
	// Doorbells counts GP_PUT writes through the poll area.
	Doorbells uint64
	// GPFIFOEntries counts push buffers executed.
	GPFIFOEntries uint64
	// ChannelFaults counts channels stopped by a fault.
	ChannelFaults uint64
	// Preempts counts completed channel preempts (RegPreempt).
	Preempts uint64
	// KernelsRun counts kernels that completed.
	KernelsRun uint64
	// CopiesRun counts completed copy-engine launches; BytesCopied their bytes.
	CopiesRun, BytesCopied uint64
}

type counters struct {
	reads, writes                  [numBARs]atomic.Uint64
	unknown, barFaults             atomic.Uint64
	tlbHits, tlbMisses, tlbFlushes atomic.Uint64
	doorbells, gpEntries           atomic.Uint64
	chanFaults, preempts           atomic.Uint64
	kernels, copies, bytesCopied   atomic.Uint64
}

// Stats returns a snapshot of the counters.
func (b *Board) Stats() Stats {
	c := &b.st
	var s Stats
	for i := range numBARs {
		s.MMIOReads[i] = c.reads[i].Load()
		s.MMIOWrites[i] = c.writes[i].Load()
	}
	s.UnknownRegisters = c.unknown.Load()
	s.BARFaults = c.barFaults.Load()
	s.TLBHits = c.tlbHits.Load()
	s.TLBMisses = c.tlbMisses.Load()
	s.TLBFlushes = c.tlbFlushes.Load()
	s.Doorbells = c.doorbells.Load()
	s.GPFIFOEntries = c.gpEntries.Load()
	s.ChannelFaults = c.chanFaults.Load()
	s.Preempts = c.preempts.Load()
	s.KernelsRun = c.kernels.Load()
	s.CopiesRun = c.copies.Load()
	s.BytesCopied = c.bytesCopied.Load()
	return s
}
