// Package gpu holds what every side of gpuvm shares about a GPU device: the
// 32-bit BAR access interface that the guest driver, the device model and the
// aggregator all speak. The hardware ABI is in gpu/nvc0, the simulated board in
// gpu/sim.
package gpu

// MMIO is 32-bit access to a GPU's PCI BARs. Offsets are bytes from the start of
// the BAR and must be 4-byte aligned. Like real MMIO it cannot fail: an access the
// device does not decode reads as the device chooses (the simulated board reads
// 0) and a dead device reads all-ones; a transport that can fail (IPC to an
// aggregator) reports its sticky error separately.
type MMIO interface {
	Read32(bar int, off uint64) uint32
	Write32(bar int, off uint64, v uint32)
}

// Filler is an MMIO that can store one value into n consecutive 32-bit
// words of a BAR with one string instruction (REP STOSD), as a driver
// clearing an object through an aperture does. Under Xen that is one trap
// for up to 4096 words instead of one per word. Drivers use it when the
// MMIO offers it; the result is the same as n Write32 calls.
type Filler interface {
	Fill32(bar int, off uint64, v uint32, n int)
}
