package nvc0

// PCI identity of the modelled board (a Quadro 6000, GF100GL).
const (
	PCIVendorNVIDIA     = 0x10DE
	PCIDeviceQuadro6000 = 0x06D8
	PCIClassDisplayVGA  = 0x030000
	// PCIRevision is the board's PCI revision ID (config space offset
	// 0x08): the chip's stepping, A3, as lspci shows a Quadro 6000
	// ("GF100GL [Quadro 6000] (rev a3)") and as PMC_BOOT_0 reports it.
	PCIRevision = RevisionA3
)

// The modelled chip and PMC_BOOT_0 (RegBoot0), as nouveau decodes it in
// nvkm_device_ctor (nvkm/engine/device/base.c): chipset = (boot0 &
// 0x1ff00000) >> 20, chiprev = boot0 & 0xff, and the architecture from
// chipset & 0x1f0 (0x0c0 and 0x0d0 are NV_C0, Fermi).
const (
	Boot0ChipsetShift = 20
	Boot0ChipsetMask  = 0x1FF // after the shift
	Boot0RevisionMask = 0xFF

	// ChipsetFamilyMask selects a chipset's family (nouveau: chipset & 0x1f0).
	ChipsetFamilyMask = 0x1F0
	// ChipsetFamilyGF100 (GF100..GF116, chipsets 0xc0-0xcf) and
	// ChipsetFamilyGF119 (GF117, GF119: 0xd7, 0xd9) are the Fermi families.
	ChipsetFamilyGF100 = 0x0C0
	ChipsetFamilyGF119 = 0x0D0

	// ChipsetGF100 is the modelled chip (Quadro 6000, GTX 480), stepping
	// RevisionA3.
	ChipsetGF100 = 0x0C0
	RevisionA3   = 0xA3
	// Boot0DeviceShift: PMC_BOOT_0 bits 19:15 repeat the low 5 bits of the
	// PCI device id on G92…GF119 (envytools rnndb/bus/pmc.xml ID.DEVICE_ID):
	// a GTX 480 (0x06C0) reads 0x0c0000a3, a Quadro 6000 (0x06D8) 0x0c0c00a3
	// (GPUvm's own device model, gxen nvc0.h NVC0_REG0).
	Boot0DeviceShift = 15
	Boot0DeviceMask  = 0x1F
	// Boot0Value is what PMC_BOOT_0 reads on the modelled board.
	Boot0Value = ChipsetGF100<<Boot0ChipsetShift | (PCIDeviceQuadro6000&Boot0DeviceMask)<<Boot0DeviceShift | RevisionA3
)

// Boot0Chipset returns the chipset field of a PMC_BOOT_0 value.
func Boot0Chipset(boot0 uint32) uint32 { return boot0 >> Boot0ChipsetShift & Boot0ChipsetMask }

// Boot0Revision returns the chip revision (stepping) field of a PMC_BOOT_0 value.
func Boot0Revision(boot0 uint32) uint32 { return boot0 & Boot0RevisionMask }

// IsFermi reports whether chipset is a Fermi (nouveau's NV_C0 card type).
func IsFermi(chipset uint32) bool {
	f := chipset & ChipsetFamilyMask
	return f == ChipsetFamilyGF100 || f == ChipsetFamilyGF119
}

// BAR indices and sizes. BAR1 and BAR3 are 64-bit BARs on the real board, so
// their PCI indices are 1 and 3; the I/O BAR follows them.
const (
	BAR0 = 0 // control registers (MMIO)
	BAR1 = 1 // prefetchable VRAM aperture through the BAR1 channel's page table; holds the poll area
	BAR3 = 3 // VRAM aperture for the kernel driver through the BAR3 channel's page table
	BAR5 = 5 // small legacy I/O BAR (a stub: reads 0, writes ignored)

	BAR0Size = 32 << 20
	BAR1Size = 128 << 20
	BAR3Size = 64 << 20 // a Quadro 6000: lspci in GPUvm's gxen nvc0.c ("Region 3: … [size=64M]")
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

// The PCI Express capability of the modelled board's config space (PCI
// Express Base Specification, §7.5.3; Linux names the same registers in
// include/uapi/linux/pci_regs.h). It is what lets a guest reset its vGPU
// alone: Device Capabilities says the function supports a function-level
// reset (FLR), and setting Initiate Function Level Reset in Device Control
// starts one (docs/design.md, "Resetting a vGPU").
const (
	PCIStatusCapList = 0x10 // Status register (0x06): a capability list is present
	PCICapPtr        = 0x34 // offset of the first capability
	PCICapIDExp      = 0x10 // capability ID of PCI Express

	// PCIExpCapOffset is where the modelled board's PCI Express capability
	// sits: the model's choice (its power-management and MSI capabilities
	// are not modelled, so it is the only one).
	PCIExpCapOffset = 0x78
	PCIExpCapSize   = 0x3C // a version 2 capability

	// Register offsets inside the capability.
	PCIExpFlags  = 0x02 // PCI Express Capabilities register (16 bits)
	PCIExpDevCap = 0x04 // Device Capabilities (32 bits)
	PCIExpDevCtl = 0x08 // Device Control (16 bits)
	PCIExpDevSta = 0x0A // Device Status (16 bits)
	PCIExpLnkCap = 0x0C // Link Capabilities (32 bits)
	PCIExpLnkSta = 0x12 // Link Status (16 bits)

	PCIExpFlagsVersion2     = 0x0002 // capability version 2
	PCIExpFlagsTypeEndpoint = 0x0000 // device/port type (bits 7:4): PCI Express Endpoint
	// PCIExpDevCapFLR (bit 28): the function supports function-level reset.
	PCIExpDevCapFLR = 1 << 28
	// PCIExpDevCtlFLR (bit 15): Initiate Function Level Reset; writing 1
	// starts one, and the bit always reads 0.
	PCIExpDevCtlFLR = 1 << 15
	// PCIExpDevCtlDefault is Device Control after reset: Enable Relaxed
	// Ordering (bit 4), Enable No Snoop (bit 11), Max_Read_Request_Size
	// 512 bytes (bits 14:12 = 010b).
	PCIExpDevCtlDefault = 0x2810
	// PCIExpLinkGen1x16 is the link the board reports (capabilities and
	// status): 2.5 GT/s (speed code 1), 16 lanes (width in bits 9:4).
	PCIExpLinkGen1x16 = 1 | 16<<4
)
