//go:build linux && (amd64 || arm64)

// This file is the kernel's privcmd ioctl ABI (uapi xen/privcmd.h) and the
// dm_op structures of Xen's public hvm/dm_op.h that gpuvm issues through
// it. TestABI checks every size, offset and number here against the C
// headers. As in package xen, the build constraint lists the 64-bit
// architectures Xen runs on, where _IOC has the generic encoding and a
// u64 is 8-byte aligned in C and Go alike.

package privcmd

import (
	"unsafe"
)

// The generic _IOC encoding (include/uapi/asm-generic/ioctl.h); every
// privcmd ioctl is declared with direction _IOC_NONE.
const (
	iocTypeShift = 8
	iocSizeShift = 16
	iocDirShift  = 30
	iocNone      = 0
)

// mmapbatchV2 is struct privcmd_mmapbatch_v2: map num frames of domain dom
// (arr, xen_pfn_t each) at user address addr, one error code per frame in
// err (0 or a negative errno).
type mmapbatchV2 struct {
	Num  uint32
	Dom  uint16
	_    [2]byte
	Addr uint64
	Arr  unsafe.Pointer // const xen_pfn_t *
	Err  unsafe.Pointer // int *
}

// dmOpBuf is struct privcmd_dm_op_buf: one buffer of a dm_op.
type dmOpBuf struct {
	Uptr unsafe.Pointer
	Size uint64 // size_t
}

// dmOp is struct privcmd_dm_op: num buffers, the first a struct xen_dm_op.
type dmOp struct {
	Dom   uint16
	Num   uint16
	_     [4]byte
	Ubufs unsafe.Pointer // const struct privcmd_dm_op_buf *
}

// mmapResource is struct privcmd_mmap_resource: map num frames of resource
// type/id of domain dom, from frame idx on, at user address addr. With
// addr and num 0 the kernel writes the resource's size into num.
type mmapResource struct {
	Dom  uint16
	_    [2]byte
	Type uint32
	ID   uint32
	Idx  uint32
	Num  uint64
	Addr uint64
}

// privcmd ioctl numbers.
const (
	ioctlMmapbatchV2  = iocNone<<iocDirShift | unsafe.Sizeof(mmapbatchV2{})<<iocSizeShift | 'P'<<iocTypeShift | 4
	ioctlDMOp         = iocNone<<iocDirShift | unsafe.Sizeof(dmOp{})<<iocSizeShift | 'P'<<iocTypeShift | 5
	ioctlRestrict     = iocNone<<iocDirShift | unsafe.Sizeof(uint16(0))<<iocSizeShift | 'P'<<iocTypeShift | 6
	ioctlMmapResource = iocNone<<iocDirShift | unsafe.Sizeof(mmapResource{})<<iocSizeShift | 'P'<<iocTypeShift | 7
)

// xenDMOp is struct xen_dm_op: the operation and its arguments, a union
// whose largest members are 24 bytes and 8-byte aligned.
type xenDMOp struct {
	Op  uint32
	Pad uint32
	U   [3]uint64
}

// dm_op numbers (XEN_DMOP_*).
const (
	dmopCreateIoreqServer     = 1
	dmopGetIoreqServerInfo    = 2
	dmopMapIORangeToIoreqSrv  = 3
	dmopUnmapIORangeFromIoreq = 4
	dmopSetIoreqServerState   = 5
	dmopDestroyIoreqServer    = 6
	dmopSetMemType            = 12
	dmopNrVCPUs               = 20
)

// dmopNoGFNs is XEN_DMOP_no_gfns: get_ioreq_server_info must not put the
// ioreq pages into the guest's physical address space.
const dmopNoGFNs = 1

// createIoreqServer is struct xen_dm_op_create_ioreq_server.
type createIoreqServer struct {
	HandleBufioreq uint8    // IN: BufIoreq*
	Pad            [3]uint8 // 0
	ID             uint16   // OUT: the server id
}

// getIoreqServerInfo is struct xen_dm_op_get_ioreq_server_info.
type getIoreqServerInfo struct {
	ID           uint16 // IN
	Flags        uint16 // IN: dmopNoGFNs
	BufioreqPort uint32 // OUT: the buffered ring's event channel
	IoreqGFN     uint64 // OUT: only without dmopNoGFNs
	BufioreqGFN  uint64 // OUT: only without dmopNoGFNs
}

// ioreqServerRange is struct xen_dm_op_ioreq_server_range (map and unmap).
type ioreqServerRange struct {
	ID    uint16
	Pad   uint16
	Type  uint32 // RangeType
	Start uint64 // inclusive
	End   uint64 // inclusive
}

// setIoreqServerState is struct xen_dm_op_set_ioreq_server_state.
type setIoreqServerState struct {
	ID      uint16
	Enabled uint8
	Pad     uint8
}

// destroyIoreqServer is struct xen_dm_op_destroy_ioreq_server.
type destroyIoreqServer struct {
	ID  uint16
	Pad uint16
}

// setMemType is struct xen_dm_op_set_mem_type.
type setMemType struct {
	Nr       uint32 // pages
	MemType  uint16
	Pad      uint16
	FirstPFN uint64
}

// nrVCPUs is struct xen_dm_op_nr_vcpus.
type nrVCPUs struct {
	VCPUs uint32 // OUT
}

// dmOpArgs are the union members this package issues.
type dmOpArgs interface {
	createIoreqServer | getIoreqServerInfo | ioreqServerRange | setIoreqServerState |
		destroyIoreqServer | setMemType | nrVCPUs
}

// args returns op's union as a T.
func args[T dmOpArgs](op *xenDMOp) *T {
	return (*T)(unsafe.Pointer(&op.U))
}

// Invariants the casts in args rely on, checked when the package is
// built: a negative constant does not compile as a uintptr.
const (
	_ = unsafe.Sizeof(xenDMOp{}.U) - unsafe.Sizeof(getIoreqServerInfo{})
	_ = unsafe.Sizeof(xenDMOp{}.U) - unsafe.Sizeof(ioreqServerRange{})
	_ = unsafe.Sizeof(xenDMOp{}.U) - unsafe.Sizeof(setMemType{})
	_ = unsafe.Sizeof(xenDMOp{}.U) - unsafe.Sizeof(createIoreqServer{})
)
