package nvc0

// PCI identity of the modelled board (a Quadro 6000, GF100GL).
const (
	PCIVendorNVIDIA     = 0x10DE
	PCIDeviceQuadro6000 = 0x06D8
	PCIClassDisplayVGA  = 0x030000
	// Boot0Value is what PMC_BOOT_0 reads on a GF100: chipset 0xC0, revision A3.
	Boot0Value = 0x0C0000A3
)

// BAR indices and sizes. BAR1 and BAR3 are 64-bit BARs on the real board, so
// their PCI indices are 1 and 3; the I/O BAR follows them.
const (
	BAR0 = 0 // control registers (MMIO)
	BAR1 = 1 // prefetchable VRAM aperture through the BAR1 channel's page table; holds the poll area
	BAR3 = 3 // VRAM aperture for the kernel driver through the BAR3 channel's page table
	BAR5 = 5 // small legacy I/O BAR (a stub: reads 0, writes ignored)

	BAR0Size = 32 << 20
	BAR1Size = 128 << 20
	BAR3Size = 16 << 20
	BAR5Size = 128
)

// Page sizes used by the MMU and by the apertures.
const (
	PageShift      = 12
	PageSize       = 1 << PageShift // small page, 4 KiB
	LargePageShift = 17
	LargePageSize  = 1 << LargePageShift // large page, 128 KiB
)

// BARSize returns the size of BAR bar of the device, or 0 if it has no such BAR.
func BARSize(bar int) uint64 {
	switch bar {
	case BAR0:
		return BAR0Size
	case BAR1:
		return BAR1Size
	case BAR3:
		return BAR3Size
	case BAR5:
		return BAR5Size
	}
	return 0
}

// ReadAllOnes is what a read from a device that is gone returns: a PCIe
// read the device does not complete (it fell off the bus, or, for a virtual
// GPU, its aggregator connection ended) completes as an Unsupported
// Request, which the root complex returns to the CPU as all-ones. Drivers
// test for it (Linux: PCI_POSSIBLE_ERROR, include/linux/pci.h).
const ReadAllOnes = 0xFFFFFFFF
