package shadow

// Memory is physical VRAM as the aggregator sees it. Addresses are physical
// VRAM offsets. The aggregator implements it over the board's VRAM mapping;
// tests implement it over a byte slice. Reads and writes are done in bulk
// (a table or a run of changed entries per call).
type Memory interface {
	// ReadVRAM fills p from physical VRAM at addr.
	ReadVRAM(p []byte, addr uint64) error
	// WriteVRAM writes p to physical VRAM at addr.
	WriteVRAM(p []byte, addr uint64) error
}

// Allocator hands out ranges of the aggregator's reserved VRAM, where shadow
// page directories, shadow page tables and shadow RAMINs live. The aggregator
// passes an internal/rangealloc.Allocator, which has exactly these methods.
type Allocator interface {
	// Alloc returns the start of a free range of size bytes aligned to align.
	Alloc(size, align uint64) (uint64, error)
	// Free returns a range obtained from Alloc.
	Free(addr uint64) error
}
