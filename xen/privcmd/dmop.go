//go:build linux && (amd64 || arm64)

package privcmd

import (
	"fmt"
)

// CreateIoreqServer creates an ioreq server for domain dom and returns its
// id (XEN_DMOP_create_ioreq_server). bufioreq is one of BufIoreq*; with
// BufIoreqOff every request is synchronous. The server receives nothing
// until it is enabled and has claimed ranges. At most 8 servers exist per
// domain.
func (h *Handle) CreateIoreqServer(dom uint16, bufioreq uint8) (ServerID, error) {
	if bufioreq > BufIoreqAtomic {
		return 0, fmt.Errorf("xen dm_op create_ioreq_server for domain %d: bufioreq mode %d: want 0..%d", dom, bufioreq, BufIoreqAtomic)
	}
	op := xenDMOp{Op: dmopCreateIoreqServer}
	args[createIoreqServer](&op).HandleBufioreq = bufioreq
	if err := h.dmop(dom, &op, "create_ioreq_server"); err != nil {
		return 0, err
	}
	return ServerID(args[createIoreqServer](&op).ID), nil
}

// IoreqServerInfo returns the event channel port of server id's buffered
// ring (0 without one) (XEN_DMOP_get_ioreq_server_info). It always passes
// XEN_DMOP_no_gfns: without it Xen puts the ioreq pages into the guest's
// physical address space, where the guest can write them. Map them with
// MapResource instead.
func (h *Handle) IoreqServerInfo(dom uint16, id ServerID) (bufioreqPort uint32, err error) {
	op := xenDMOp{Op: dmopGetIoreqServerInfo}
	a := args[getIoreqServerInfo](&op)
	a.ID, a.Flags = uint16(id), dmopNoGFNs
	if err := h.dmop(dom, &op, fmt.Sprintf("get_ioreq_server_info %d", id)); err != nil {
		return 0, err
	}
	return args[getIoreqServerInfo](&op).BufioreqPort, nil
}

// MapIORange has server id receive the accesses to [start, end]
// (inclusive) of type typ (XEN_DMOP_map_io_range_to_ioreq_server). For
// RangePCI the bounds are SBDFs. Xen passes a request to the server only
// if it falls entirely within one of its ranges.
func (h *Handle) MapIORange(dom uint16, id ServerID, typ RangeType, start, end uint64) error {
	return h.ioRange(dom, id, dmopMapIORangeToIoreqSrv, "map_io_range_to_ioreq_server", typ, start, end)
}

// UnmapIORange undoes a MapIORange of exactly [start, end]
// (XEN_DMOP_unmap_io_range_from_ioreq_server).
func (h *Handle) UnmapIORange(dom uint16, id ServerID, typ RangeType, start, end uint64) error {
	return h.ioRange(dom, id, dmopUnmapIORangeFromIoreq, "unmap_io_range_from_ioreq_server", typ, start, end)
}

// MapPCIDev has server id receive the config-space accesses of PCI
// function sbdf (libxendevicemodel's map_pcidev_to_ioreq_server: a
// RangePCI range of one SBDF).
func (h *Handle) MapPCIDev(dom uint16, id ServerID, sbdf SBDF) error {
	return h.MapIORange(dom, id, RangePCI, uint64(sbdf), uint64(sbdf))
}

// UnmapPCIDev undoes a MapPCIDev.
func (h *Handle) UnmapPCIDev(dom uint16, id ServerID, sbdf SBDF) error {
	return h.UnmapIORange(dom, id, RangePCI, uint64(sbdf), uint64(sbdf))
}

// ioRange issues a map or unmap of an I/O range.
func (h *Handle) ioRange(dom uint16, id ServerID, nr uint32, name string, typ RangeType, start, end uint64) error {
	what := fmt.Sprintf("%s %d %v [%#x, %#x]", name, id, typ, start, end)
	if err := CheckIORange(typ, start, end); err != nil {
		return fmt.Errorf("xen dm_op %s for domain %d: %w", name, dom, err)
	}
	op := xenDMOp{Op: nr}
	a := args[ioreqServerRange](&op)
	a.ID, a.Type, a.Start, a.End = uint16(id), uint32(typ), start, end
	return h.dmop(dom, &op, what)
}

// SetIoreqServerState enables or disables server id
// (XEN_DMOP_set_ioreq_server_state). Xen fills in the event channel ports
// of the ioreq page when the server is enabled.
func (h *Handle) SetIoreqServerState(dom uint16, id ServerID, enabled bool) error {
	op := xenDMOp{Op: dmopSetIoreqServerState}
	a := args[setIoreqServerState](&op)
	a.ID = uint16(id)
	if enabled {
		a.Enabled = 1
	}
	return h.dmop(dom, &op, fmt.Sprintf("set_ioreq_server_state %d enabled=%v", id, enabled))
}

// DestroyIoreqServer destroys server id and releases its ranges
// (XEN_DMOP_destroy_ioreq_server).
func (h *Handle) DestroyIoreqServer(dom uint16, id ServerID) error {
	op := xenDMOp{Op: dmopDestroyIoreqServer}
	args[destroyIoreqServer](&op).ID = uint16(id)
	return h.dmop(dom, &op, fmt.Sprintf("destroy_ioreq_server %d", id))
}

// MaxMemTypePages bounds one SetMemType.
const MaxMemTypePages = 1 << 20

// SetMemType sets the memory type of pages guest frames [firstPFN,
// firstPFN+pages) (XEN_DMOP_set_mem_type). Xen continues a long call
// itself; the kernel returns when it is done.
func (h *Handle) SetMemType(dom uint16, t MemType, firstPFN uint64, pages uint32) error {
	if pages < 1 || pages > MaxMemTypePages || firstPFN >= MaxFrame || firstPFN+uint64(pages) > MaxFrame {
		return fmt.Errorf("xen dm_op set_mem_type for domain %d: %d pages at pfn %#x: want 1..%d pages below pfn %#x", dom, pages, firstPFN, MaxMemTypePages, uint64(MaxFrame))
	}
	op := xenDMOp{Op: dmopSetMemType}
	a := args[setMemType](&op)
	a.Nr, a.MemType, a.FirstPFN = pages, uint16(t), firstPFN
	return h.dmop(dom, &op, fmt.Sprintf("set_mem_type %d pfn %#x+%d", t, firstPFN, pages))
}

// NrVCPUs returns how many vCPUs domain dom was created with
// (XEN_DMOP_nr_vcpus): the number of slots of its ioreq page in use.
func (h *Handle) NrVCPUs(dom uint16) (int, error) {
	op := xenDMOp{Op: dmopNrVCPUs}
	if err := h.dmop(dom, &op, "nr_vcpus"); err != nil {
		return 0, err
	}
	n := args[nrVCPUs](&op).VCPUs
	if n < 1 || n > MaxVCPUs {
		return 0, fmt.Errorf("xen dm_op nr_vcpus for domain %d: Xen says %d vCPUs, want 1..%d", dom, n, MaxVCPUs)
	}
	return int(n), nil
}
