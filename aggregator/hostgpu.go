package aggregator

import "github.com/gpuvm/gpuvm/gpu"

// HostGPU is the physical GPU as the aggregator drives it. The simulated
// board (gpu/sim.Board) implements it; a real board is reached through its
// PCI resource files in the same shape.
type HostGPU interface {
	gpu.MMIO
	// VRAMSize is the board's VRAM size.
	VRAMSize() uint64
	// ReadVRAM and WriteVRAM are host-side bulk VRAM access (the aggregator's
	// own structures, the guests' PRAMIN window, shadow scans).
	ReadVRAM(p []byte, off uint64) error
	WriteVRAM(p []byte, off uint64) error
	// ScrubVRAM zeroes VRAM (a departed VM's slice).
	ScrubVRAM(off, n uint64) error
	// RegisterSystemMemory makes a VM's RAM reachable by the GPU's DMA and
	// returns its machine (bus) address; UnregisterSystemMemory undoes it.
	RegisterSystemMemory(mem []byte) (uint64, error)
	UnregisterSystemMemory(base uint64) error
}
