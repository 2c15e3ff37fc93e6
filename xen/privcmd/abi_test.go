//go:build linux && (amd64 || arm64)

package privcmd

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"unsafe"

	"github.com/gpuvm/gpuvm/internal/cprobe"
)

// TestABI checks every size, offset, ioctl number and constant of this
// package against the C headers, compiled by gcc: the privcmd ioctls from
// libxen-dev's xen/sys/privcmd.h (Xen's copy of the kernel's uapi header,
// which TestKernelHeaderAgrees compares with linux-libc-dev's), the dm_op
// structures from xen/hvm/dm_op.h, the memory types from xen/hvm/hvm_op.h
// and the resource numbers from xen/memory.h.
func TestABI(t *testing.T) {
	c := cprobe.Run(t, "libxen-dev", []string{"xen/xen.h", "xen/sys/privcmd.h", "xen/hvm/hvm_op.h", "xen/hvm/dm_op.h", "xen/memory.h"},
		"#define __XEN_TOOLS__ 1\n#include <linux/ioctl.h>\n", `
	SZ(privcmd_mmapbatch_v2);
	FIELD(privcmd_mmapbatch_v2, num); FIELD(privcmd_mmapbatch_v2, dom); FIELD(privcmd_mmapbatch_v2, addr);
	FIELD(privcmd_mmapbatch_v2, arr); FIELD(privcmd_mmapbatch_v2, err);
	P("sizeof xen_pfn_t", sizeof(xen_pfn_t));
	SZ(privcmd_dm_op_buf); FIELD(privcmd_dm_op_buf, uptr); FIELD(privcmd_dm_op_buf, size);
	SZ(privcmd_dm_op); FIELD(privcmd_dm_op, dom); FIELD(privcmd_dm_op, num); FIELD(privcmd_dm_op, ubufs);
	SZ(privcmd_mmap_resource);
	FIELD(privcmd_mmap_resource, dom); FIELD(privcmd_mmap_resource, type); FIELD(privcmd_mmap_resource, id);
	FIELD(privcmd_mmap_resource, idx); FIELD(privcmd_mmap_resource, num); FIELD(privcmd_mmap_resource, addr);
	P("IOCTL_PRIVCMD_MMAPBATCH_V2", IOCTL_PRIVCMD_MMAPBATCH_V2);
	P("IOCTL_PRIVCMD_DM_OP", IOCTL_PRIVCMD_DM_OP);
	P("IOCTL_PRIVCMD_RESTRICT", IOCTL_PRIVCMD_RESTRICT);
	P("IOCTL_PRIVCMD_MMAP_RESOURCE", IOCTL_PRIVCMD_MMAP_RESOURCE);

	SZ(xen_dm_op); FIELD(xen_dm_op, op); FIELD(xen_dm_op, pad); FIELD(xen_dm_op, u);
	SZ(xen_dm_op_create_ioreq_server);
	FIELD(xen_dm_op_create_ioreq_server, handle_bufioreq); FIELD(xen_dm_op_create_ioreq_server, pad);
	FIELD(xen_dm_op_create_ioreq_server, id);
	SZ(xen_dm_op_get_ioreq_server_info);
	FIELD(xen_dm_op_get_ioreq_server_info, id); FIELD(xen_dm_op_get_ioreq_server_info, flags);
	FIELD(xen_dm_op_get_ioreq_server_info, bufioreq_port); FIELD(xen_dm_op_get_ioreq_server_info, ioreq_gfn);
	FIELD(xen_dm_op_get_ioreq_server_info, bufioreq_gfn);
	SZ(xen_dm_op_ioreq_server_range);
	FIELD(xen_dm_op_ioreq_server_range, id); FIELD(xen_dm_op_ioreq_server_range, pad);
	FIELD(xen_dm_op_ioreq_server_range, type); FIELD(xen_dm_op_ioreq_server_range, start);
	FIELD(xen_dm_op_ioreq_server_range, end);
	SZ(xen_dm_op_set_ioreq_server_state);
	FIELD(xen_dm_op_set_ioreq_server_state, id); FIELD(xen_dm_op_set_ioreq_server_state, enabled);
	FIELD(xen_dm_op_set_ioreq_server_state, pad);
	SZ(xen_dm_op_destroy_ioreq_server);
	FIELD(xen_dm_op_destroy_ioreq_server, id); FIELD(xen_dm_op_destroy_ioreq_server, pad);
	SZ(xen_dm_op_set_mem_type);
	FIELD(xen_dm_op_set_mem_type, nr); FIELD(xen_dm_op_set_mem_type, mem_type);
	FIELD(xen_dm_op_set_mem_type, pad); FIELD(xen_dm_op_set_mem_type, first_pfn);
	SZ(xen_dm_op_nr_vcpus); FIELD(xen_dm_op_nr_vcpus, vcpus);
	P("XEN_DMOP_create_ioreq_server", XEN_DMOP_create_ioreq_server);
	P("XEN_DMOP_get_ioreq_server_info", XEN_DMOP_get_ioreq_server_info);
	P("XEN_DMOP_map_io_range_to_ioreq_server", XEN_DMOP_map_io_range_to_ioreq_server);
	P("XEN_DMOP_unmap_io_range_from_ioreq_server", XEN_DMOP_unmap_io_range_from_ioreq_server);
	P("XEN_DMOP_set_ioreq_server_state", XEN_DMOP_set_ioreq_server_state);
	P("XEN_DMOP_destroy_ioreq_server", XEN_DMOP_destroy_ioreq_server);
	P("XEN_DMOP_set_mem_type", XEN_DMOP_set_mem_type);
	P("XEN_DMOP_nr_vcpus", XEN_DMOP_nr_vcpus);
	P("XEN_DMOP_no_gfns", XEN_DMOP_no_gfns);
	P("XEN_DMOP_IO_RANGE_PORT", XEN_DMOP_IO_RANGE_PORT);
	P("XEN_DMOP_IO_RANGE_MEMORY", XEN_DMOP_IO_RANGE_MEMORY);
	P("XEN_DMOP_IO_RANGE_PCI", XEN_DMOP_IO_RANGE_PCI);
	P("XEN_DMOP_PCI_SBDF(0x1234,0xab,0x1f,7)", XEN_DMOP_PCI_SBDF(0x1234, 0xab, 0x1f, 7));
	P("XEN_DMOP_PCI_SBDF(0,0,5,0)", XEN_DMOP_PCI_SBDF(0, 0, 5, 0));
	P("sizeof ioservid_t", sizeof(ioservid_t));
	P("HVM_IOREQSRV_BUFIOREQ_OFF", HVM_IOREQSRV_BUFIOREQ_OFF);
	P("HVM_IOREQSRV_BUFIOREQ_LEGACY", HVM_IOREQSRV_BUFIOREQ_LEGACY);
	P("HVM_IOREQSRV_BUFIOREQ_ATOMIC", HVM_IOREQSRV_BUFIOREQ_ATOMIC);
	P("HVMMEM_ram_rw", HVMMEM_ram_rw); P("HVMMEM_ram_ro", HVMMEM_ram_ro);
	P("HVMMEM_mmio_dm", HVMMEM_mmio_dm); P("HVMMEM_ioreq_server", HVMMEM_ioreq_server);
	P("XENMEM_resource_ioreq_server", XENMEM_resource_ioreq_server);
	P("XENMEM_resource_grant_table", XENMEM_resource_grant_table);
	P("XENMEM_resource_ioreq_server_frame_bufioreq", XENMEM_resource_ioreq_server_frame_bufioreq);
	P("XENMEM_resource_ioreq_server_frame_ioreq(0)", XENMEM_resource_ioreq_server_frame_ioreq(0));
	P("DOMID_FIRST_RESERVED", DOMID_FIRST_RESERVED);`)

	g := cprobe.Layout{}
	var mb mmapbatchV2
	g.Size("privcmd_mmapbatch_v2", unsafe.Sizeof(mb))
	g.Field("privcmd_mmapbatch_v2", "num", unsafe.Sizeof(mb.Num), unsafe.Offsetof(mb.Num))
	g.Field("privcmd_mmapbatch_v2", "dom", unsafe.Sizeof(mb.Dom), unsafe.Offsetof(mb.Dom))
	g.Field("privcmd_mmapbatch_v2", "addr", unsafe.Sizeof(mb.Addr), unsafe.Offsetof(mb.Addr))
	g.Field("privcmd_mmapbatch_v2", "arr", unsafe.Sizeof(mb.Arr), unsafe.Offsetof(mb.Arr))
	g.Field("privcmd_mmapbatch_v2", "err", unsafe.Sizeof(mb.Err), unsafe.Offsetof(mb.Err))
	g["sizeof xen_pfn_t"] = int64(unsafe.Sizeof(uint64(0))) // the gfns slice's element
	var db dmOpBuf
	g.Size("privcmd_dm_op_buf", unsafe.Sizeof(db))
	g.Field("privcmd_dm_op_buf", "uptr", unsafe.Sizeof(db.Uptr), unsafe.Offsetof(db.Uptr))
	g.Field("privcmd_dm_op_buf", "size", unsafe.Sizeof(db.Size), unsafe.Offsetof(db.Size))
	var do dmOp
	g.Size("privcmd_dm_op", unsafe.Sizeof(do))
	g.Field("privcmd_dm_op", "dom", unsafe.Sizeof(do.Dom), unsafe.Offsetof(do.Dom))
	g.Field("privcmd_dm_op", "num", unsafe.Sizeof(do.Num), unsafe.Offsetof(do.Num))
	g.Field("privcmd_dm_op", "ubufs", unsafe.Sizeof(do.Ubufs), unsafe.Offsetof(do.Ubufs))
	var mr mmapResource
	g.Size("privcmd_mmap_resource", unsafe.Sizeof(mr))
	g.Field("privcmd_mmap_resource", "dom", unsafe.Sizeof(mr.Dom), unsafe.Offsetof(mr.Dom))
	g.Field("privcmd_mmap_resource", "type", unsafe.Sizeof(mr.Type), unsafe.Offsetof(mr.Type))
	g.Field("privcmd_mmap_resource", "id", unsafe.Sizeof(mr.ID), unsafe.Offsetof(mr.ID))
	g.Field("privcmd_mmap_resource", "idx", unsafe.Sizeof(mr.Idx), unsafe.Offsetof(mr.Idx))
	g.Field("privcmd_mmap_resource", "num", unsafe.Sizeof(mr.Num), unsafe.Offsetof(mr.Num))
	g.Field("privcmd_mmap_resource", "addr", unsafe.Sizeof(mr.Addr), unsafe.Offsetof(mr.Addr))
	g["IOCTL_PRIVCMD_MMAPBATCH_V2"] = int64(ioctlMmapbatchV2)
	g["IOCTL_PRIVCMD_DM_OP"] = int64(ioctlDMOp)
	g["IOCTL_PRIVCMD_RESTRICT"] = int64(ioctlRestrict)
	g["IOCTL_PRIVCMD_MMAP_RESOURCE"] = int64(ioctlMmapResource)

	var op xenDMOp
	g.Size("xen_dm_op", unsafe.Sizeof(op))
	g.Field("xen_dm_op", "op", unsafe.Sizeof(op.Op), unsafe.Offsetof(op.Op))
	g.Field("xen_dm_op", "pad", unsafe.Sizeof(op.Pad), unsafe.Offsetof(op.Pad))
	g.Field("xen_dm_op", "u", unsafe.Sizeof(op.U), unsafe.Offsetof(op.U))
	var cr createIoreqServer
	g.Size("xen_dm_op_create_ioreq_server", unsafe.Sizeof(cr))
	g.Field("xen_dm_op_create_ioreq_server", "handle_bufioreq", unsafe.Sizeof(cr.HandleBufioreq), unsafe.Offsetof(cr.HandleBufioreq))
	g.Field("xen_dm_op_create_ioreq_server", "pad", unsafe.Sizeof(cr.Pad), unsafe.Offsetof(cr.Pad))
	g.Field("xen_dm_op_create_ioreq_server", "id", unsafe.Sizeof(cr.ID), unsafe.Offsetof(cr.ID))
	var gi getIoreqServerInfo
	g.Size("xen_dm_op_get_ioreq_server_info", unsafe.Sizeof(gi))
	g.Field("xen_dm_op_get_ioreq_server_info", "id", unsafe.Sizeof(gi.ID), unsafe.Offsetof(gi.ID))
	g.Field("xen_dm_op_get_ioreq_server_info", "flags", unsafe.Sizeof(gi.Flags), unsafe.Offsetof(gi.Flags))
	g.Field("xen_dm_op_get_ioreq_server_info", "bufioreq_port", unsafe.Sizeof(gi.BufioreqPort), unsafe.Offsetof(gi.BufioreqPort))
	g.Field("xen_dm_op_get_ioreq_server_info", "ioreq_gfn", unsafe.Sizeof(gi.IoreqGFN), unsafe.Offsetof(gi.IoreqGFN))
	g.Field("xen_dm_op_get_ioreq_server_info", "bufioreq_gfn", unsafe.Sizeof(gi.BufioreqGFN), unsafe.Offsetof(gi.BufioreqGFN))
	var rg ioreqServerRange
	g.Size("xen_dm_op_ioreq_server_range", unsafe.Sizeof(rg))
	g.Field("xen_dm_op_ioreq_server_range", "id", unsafe.Sizeof(rg.ID), unsafe.Offsetof(rg.ID))
	g.Field("xen_dm_op_ioreq_server_range", "pad", unsafe.Sizeof(rg.Pad), unsafe.Offsetof(rg.Pad))
	g.Field("xen_dm_op_ioreq_server_range", "type", unsafe.Sizeof(rg.Type), unsafe.Offsetof(rg.Type))
	g.Field("xen_dm_op_ioreq_server_range", "start", unsafe.Sizeof(rg.Start), unsafe.Offsetof(rg.Start))
	g.Field("xen_dm_op_ioreq_server_range", "end", unsafe.Sizeof(rg.End), unsafe.Offsetof(rg.End))
	var ss setIoreqServerState
	g.Size("xen_dm_op_set_ioreq_server_state", unsafe.Sizeof(ss))
	g.Field("xen_dm_op_set_ioreq_server_state", "id", unsafe.Sizeof(ss.ID), unsafe.Offsetof(ss.ID))
	g.Field("xen_dm_op_set_ioreq_server_state", "enabled", unsafe.Sizeof(ss.Enabled), unsafe.Offsetof(ss.Enabled))
	g.Field("xen_dm_op_set_ioreq_server_state", "pad", unsafe.Sizeof(ss.Pad), unsafe.Offsetof(ss.Pad))
	var ds destroyIoreqServer
	g.Size("xen_dm_op_destroy_ioreq_server", unsafe.Sizeof(ds))
	g.Field("xen_dm_op_destroy_ioreq_server", "id", unsafe.Sizeof(ds.ID), unsafe.Offsetof(ds.ID))
	g.Field("xen_dm_op_destroy_ioreq_server", "pad", unsafe.Sizeof(ds.Pad), unsafe.Offsetof(ds.Pad))
	var mt setMemType
	g.Size("xen_dm_op_set_mem_type", unsafe.Sizeof(mt))
	g.Field("xen_dm_op_set_mem_type", "nr", unsafe.Sizeof(mt.Nr), unsafe.Offsetof(mt.Nr))
	g.Field("xen_dm_op_set_mem_type", "mem_type", unsafe.Sizeof(mt.MemType), unsafe.Offsetof(mt.MemType))
	g.Field("xen_dm_op_set_mem_type", "pad", unsafe.Sizeof(mt.Pad), unsafe.Offsetof(mt.Pad))
	g.Field("xen_dm_op_set_mem_type", "first_pfn", unsafe.Sizeof(mt.FirstPFN), unsafe.Offsetof(mt.FirstPFN))
	var nv nrVCPUs
	g.Size("xen_dm_op_nr_vcpus", unsafe.Sizeof(nv))
	g.Field("xen_dm_op_nr_vcpus", "vcpus", unsafe.Sizeof(nv.VCPUs), unsafe.Offsetof(nv.VCPUs))
	g["XEN_DMOP_create_ioreq_server"] = dmopCreateIoreqServer
	g["XEN_DMOP_get_ioreq_server_info"] = dmopGetIoreqServerInfo
	g["XEN_DMOP_map_io_range_to_ioreq_server"] = dmopMapIORangeToIoreqSrv
	g["XEN_DMOP_unmap_io_range_from_ioreq_server"] = dmopUnmapIORangeFromIoreq
	g["XEN_DMOP_set_ioreq_server_state"] = dmopSetIoreqServerState
	g["XEN_DMOP_destroy_ioreq_server"] = dmopDestroyIoreqServer
	g["XEN_DMOP_set_mem_type"] = dmopSetMemType
	g["XEN_DMOP_nr_vcpus"] = dmopNrVCPUs
	g["XEN_DMOP_no_gfns"] = dmopNoGFNs
	g["XEN_DMOP_IO_RANGE_PORT"] = int64(RangePort)
	g["XEN_DMOP_IO_RANGE_MEMORY"] = int64(RangeMemory)
	g["XEN_DMOP_IO_RANGE_PCI"] = int64(RangePCI)
	s1, err := MakeSBDF(0x1234, 0xab, 0x1f, 7)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := MakeSBDF(0, 0, 5, 0)
	if err != nil {
		t.Fatal(err)
	}
	g["XEN_DMOP_PCI_SBDF(0x1234,0xab,0x1f,7)"] = int64(s1)
	g["XEN_DMOP_PCI_SBDF(0,0,5,0)"] = int64(s2)
	g["sizeof ioservid_t"] = int64(unsafe.Sizeof(ServerID(0)))
	g["HVM_IOREQSRV_BUFIOREQ_OFF"] = BufIoreqOff
	g["HVM_IOREQSRV_BUFIOREQ_LEGACY"] = BufIoreqLegacy
	g["HVM_IOREQSRV_BUFIOREQ_ATOMIC"] = BufIoreqAtomic
	g["HVMMEM_ram_rw"] = int64(MemRAMRW)
	g["HVMMEM_ram_ro"] = int64(MemRAMRO)
	g["HVMMEM_mmio_dm"] = int64(MemMMIODM)
	g["HVMMEM_ioreq_server"] = int64(MemIoreqServer)
	g["XENMEM_resource_ioreq_server"] = ResourceIoreqServer
	g["XENMEM_resource_grant_table"] = ResourceGrantTable
	g["XENMEM_resource_ioreq_server_frame_bufioreq"] = FrameBufIoreq
	g["XENMEM_resource_ioreq_server_frame_ioreq(0)"] = FrameIoreq0
	g["DOMID_FIRST_RESERVED"] = 0x7FF0 // xen.DomidFirstReserved, which checkDomain uses

	cprobe.Compare(t, c, g)
}

// TestKernelHeaderAgrees compares the kernel's uapi xen/privcmd.h
// (linux-libc-dev) with the copy in Xen's tools headers that TestABI
// compiles: the kernel's own includes xen/interface/xen.h, which no
// package installs, so it cannot be compiled on its own. The structures
// this package uses must declare the same fields in the same order, and
// the ioctls the same numbers and argument types.
func TestKernelHeaderAgrees(t *testing.T) {
	kernel, err := os.ReadFile("/usr/include/xen/privcmd.h")
	if err != nil {
		t.Skip("<xen/privcmd.h> not found: install linux-libc-dev to compare it with Xen's copy")
	}
	tools, err := os.ReadFile("/usr/include/xen/sys/privcmd.h")
	if err != nil {
		t.Skip("<xen/sys/privcmd.h> not found: install libxen-dev to compare it with the kernel's")
	}
	for _, s := range []string{"privcmd_mmapbatch_v2", "privcmd_dm_op_buf", "privcmd_dm_op", "privcmd_mmap_resource"} {
		k, x := structFields(string(kernel), s), structFields(string(tools), s)
		if k == "" || k != x {
			t.Errorf("struct %s: kernel fields %q, Xen's copy %q", s, k, x)
		}
	}
	for _, n := range []string{"MMAPBATCH_V2", "DM_OP", "RESTRICT", "MMAP_RESOURCE"} {
		k, x := ioctlDef(string(kernel), n), ioctlDef(string(tools), n)
		if k == "" || k != x {
			t.Errorf("IOCTL_PRIVCMD_%s: kernel %q, Xen's copy %q", n, k, x)
		}
	}
}

// structFields returns the normalised field declarations of struct name
// in a header: comments, __user and whitespace dropped, typedef names of
// the Xen copy turned into struct tags.
func structFields(h, name string) string {
	h = regexp.MustCompile(`(?s)/\*.*?\*/`).ReplaceAllString(h, "")
	m := regexp.MustCompile(`(?s)struct\s+` + name + `\s*\{(.*?)\}`).FindStringSubmatch(h)
	if m == nil {
		return ""
	}
	body := strings.ReplaceAll(m[1], "__user", "")
	body = regexp.MustCompile(`\bprivcmd_(\w+)_t\b`).ReplaceAllString(body, "struct privcmd_$1")
	return strings.Join(strings.Fields(body), " ")
}

// ioctlDef returns the _IOC(...) expression of IOCTL_PRIVCMD_name, with
// sizeof(privcmd_x_t) written as sizeof(struct privcmd_x).
func ioctlDef(h, name string) string {
	m := regexp.MustCompile(`#define\s+IOCTL_PRIVCMD_` + name + `\s*\\?\s*(_IOC\([^)]*\([^)]*\)\))`).FindStringSubmatch(h)
	if m == nil {
		return ""
	}
	s := regexp.MustCompile(`\bprivcmd_(\w+)_t\b`).ReplaceAllString(m[1], "struct privcmd_$1")
	return strings.Join(strings.Fields(s), " ")
}
