package privcmd

import (
	"fmt"
	"strconv"
	"strings"
)

// ServerID is an ioreq server's id within its domain (ioservid_t).
type ServerID uint16

// RangeType is the kind of I/O range an ioreq server claims
// (XEN_DMOP_IO_RANGE_*).
type RangeType uint32

// The range types of XEN_DMOP_map_io_range_to_ioreq_server.
const (
	// RangePort is XEN_DMOP_IO_RANGE_PORT: x86 I/O ports.
	RangePort RangeType = 0
	// RangeMemory is XEN_DMOP_IO_RANGE_MEMORY: guest-physical MMIO.
	RangeMemory RangeType = 1
	// RangePCI is XEN_DMOP_IO_RANGE_PCI: PCI config space of the devices
	// whose SBDF lies in the range.
	RangePCI RangeType = 2
)

// String names the range type.
func (t RangeType) String() string {
	switch t {
	case RangePort:
		return "port"
	case RangeMemory:
		return "memory"
	case RangePCI:
		return "pci"
	}
	return "range type " + strconv.FormatUint(uint64(t), 10)
}

// CheckIORange refuses a range Xen would refuse or misread: an unknown
// type, end before start, ports beyond 0xffff, SBDFs beyond 32 bits.
func CheckIORange(typ RangeType, start, end uint64) error {
	switch {
	case typ > RangePCI:
		return fmt.Errorf("%v: unknown", typ)
	case end < start:
		return fmt.Errorf("%v range [%#x, %#x]: end before start", typ, start, end)
	case typ == RangePort && end > 0xffff:
		return fmt.Errorf("port range [%#x, %#x]: ports are 0..0xffff", start, end)
	case typ == RangePCI && end > 0xffffffff:
		return fmt.Errorf("pci range [%#x, %#x]: an SBDF is 32 bits", start, end)
	}
	return nil
}

// MaxVCPUs bounds the vCPU count NrVCPUs accepts from Xen: one ioreq page
// holds 128 ioreq_t (HVM_MAX_VCPUS is 128 too).
const MaxVCPUs = 128

// Buffered-ioreq handling of a new ioreq server (HVM_IOREQSRV_BUFIOREQ_*,
// xen/hvm/hvm_op.h).
const (
	// BufIoreqOff is HVM_IOREQSRV_BUFIOREQ_OFF: no buffered ring, every
	// request is synchronous. gpuvm uses this.
	BufIoreqOff = 0
	// BufIoreqLegacy is HVM_IOREQSRV_BUFIOREQ_LEGACY.
	BufIoreqLegacy = 1
	// BufIoreqAtomic is HVM_IOREQSRV_BUFIOREQ_ATOMIC.
	BufIoreqAtomic = 2
)

// MemType is an HVM memory type (hvmmem_type_t, xen/hvm/hvm_op.h), for
// SetMemType.
type MemType uint16

// The memory types of the current interface version.
const (
	// MemRAMRW is HVMMEM_ram_rw: ordinary guest RAM.
	MemRAMRW MemType = 0
	// MemRAMRO is HVMMEM_ram_ro: writes are discarded.
	MemRAMRO MemType = 1
	// MemMMIODM is HVMMEM_mmio_dm: reads and writes go to the device model.
	MemMMIODM MemType = 2
	// MemIoreqServer is HVMMEM_ioreq_server: writes go to the ioreq server
	// that claimed the type (XEN_DMOP_map_mem_type_to_ioreq_server).
	MemIoreqServer MemType = 4
)

// Resource types and frame indices of XENMEM_acquire_resource
// (xen/memory.h), for MapResource.
const (
	// ResourceIoreqServer is XENMEM_resource_ioreq_server; the id is the
	// ioreq server's.
	ResourceIoreqServer = 0
	// ResourceGrantTable is XENMEM_resource_grant_table.
	ResourceGrantTable = 1
	// FrameBufIoreq is XENMEM_resource_ioreq_server_frame_bufioreq: the
	// buffered ring (only if the server has one).
	FrameBufIoreq = 0
	// FrameIoreq0 is XENMEM_resource_ioreq_server_frame_ioreq(0): the
	// synchronous ioreq page, one ioreq_t per vCPU.
	FrameIoreq0 = 1
)

// SBDF names a PCI function as XEN_DMOP_PCI_SBDF encodes it: segment in
// bits 31..16, bus 15..8, device 7..3, function 2..0. An ioreq for
// IOREQ_TYPE_PCI_CONFIG carries it in bits 63..32 of its address.
type SBDF uint32

// MakeSBDF returns the SBDF of segment seg, bus, device dev (0..31) and
// function fn (0..7).
func MakeSBDF(seg uint16, bus, dev, fn uint8) (SBDF, error) {
	if dev > 31 || fn > 7 {
		return 0, fmt.Errorf("pci %04x:%02x:%02x.%x: device is 0..1f and function 0..7", seg, bus, dev, fn)
	}
	return SBDF(uint32(seg)<<16 | uint32(bus)<<8 | uint32(dev)<<3 | uint32(fn)), nil
}

// ParseSBDF reads "ssss:bb:dd.f" or "bb:dd.f" (hexadecimal, segment 0
// when absent), as lspci and xl print PCI addresses.
func ParseSBDF(s string) (SBDF, error) {
	parts := strings.Split(s, ":")
	seg := "0"
	switch len(parts) {
	case 2:
	case 3:
		seg, parts = parts[0], parts[1:]
	default:
		return 0, fmt.Errorf("pci address %q: want [segment:]bus:device.function", s)
	}
	dev, fn, ok := strings.Cut(parts[1], ".")
	if !ok {
		return 0, fmt.Errorf("pci address %q: want [segment:]bus:device.function", s)
	}
	var v [4]uint64
	for i, f := range []struct {
		s    string
		bits int
	}{{seg, 16}, {parts[0], 8}, {dev, 5}, {fn, 3}} {
		n, err := strconv.ParseUint(f.s, 16, f.bits)
		if err != nil || f.s == "" || len(f.s) > 4 {
			return 0, fmt.Errorf("pci address %q: bad field %q", s, f.s)
		}
		v[i] = n
	}
	return MakeSBDF(uint16(v[0]), uint8(v[1]), uint8(v[2]), uint8(v[3]))
}

// Segment returns the PCI segment.
func (s SBDF) Segment() uint16 { return uint16(s >> 16) }

// Bus returns the bus number.
func (s SBDF) Bus() uint8 { return uint8(s >> 8) }

// Device returns the device number (0..31).
func (s SBDF) Device() uint8 { return uint8(s>>3) & 0x1f }

// Function returns the function number (0..7).
func (s SBDF) Function() uint8 { return uint8(s) & 7 }

// String formats the address as lspci does: "ssss:bb:dd.f".
func (s SBDF) String() string {
	return fmt.Sprintf("%04x:%02x:%02x.%x", s.Segment(), s.Bus(), s.Device(), s.Function())
}
