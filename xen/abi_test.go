//go:build linux && (amd64 || arm64)

package xen

import (
	"testing"
	"unsafe"

	"github.com/gpuvm/gpuvm/internal/cprobe"
)

// TestABI checks every size, offset, ioctl number and flag of abi.go
// against the kernel's uapi headers, compiled by gcc.
func TestABI(t *testing.T) {
	c := cprobe.Run(t, "linux-libc-dev", []string{"linux/types.h", "xen/gntalloc.h", "xen/gntdev.h", "xen/evtchn.h"},
		// The headers need _IOC from linux/ioctl.h, and gntdev.h and evtchn.h
		// use Xen's own types without defining them.
		"#include <linux/types.h>\n#include <linux/ioctl.h>\ntypedef uint32_t grant_ref_t;\ntypedef uint16_t domid_t;\n", `
	SZ(ioctl_gntalloc_alloc_gref);
	FIELD(ioctl_gntalloc_alloc_gref, domid); FIELD(ioctl_gntalloc_alloc_gref, flags);
	FIELD(ioctl_gntalloc_alloc_gref, count); FIELD(ioctl_gntalloc_alloc_gref, index);
	FIELD(ioctl_gntalloc_alloc_gref, gref_ids);
	SZ(ioctl_gntalloc_dealloc_gref);
	FIELD(ioctl_gntalloc_dealloc_gref, index); FIELD(ioctl_gntalloc_dealloc_gref, count);
	SZ(ioctl_gntalloc_unmap_notify);
	FIELD(ioctl_gntalloc_unmap_notify, index); FIELD(ioctl_gntalloc_unmap_notify, action);
	FIELD(ioctl_gntalloc_unmap_notify, event_channel_port);
	P("IOCTL_GNTALLOC_ALLOC_GREF", IOCTL_GNTALLOC_ALLOC_GREF);
	P("IOCTL_GNTALLOC_DEALLOC_GREF", IOCTL_GNTALLOC_DEALLOC_GREF);
	P("IOCTL_GNTALLOC_SET_UNMAP_NOTIFY", IOCTL_GNTALLOC_SET_UNMAP_NOTIFY);
	P("GNTALLOC_FLAG_WRITABLE", GNTALLOC_FLAG_WRITABLE);
	P("UNMAP_NOTIFY_CLEAR_BYTE", UNMAP_NOTIFY_CLEAR_BYTE);
	P("UNMAP_NOTIFY_SEND_EVENT", UNMAP_NOTIFY_SEND_EVENT);

	SZ(ioctl_gntdev_grant_ref);
	FIELD(ioctl_gntdev_grant_ref, domid); FIELD(ioctl_gntdev_grant_ref, ref);
	SZ(ioctl_gntdev_map_grant_ref);
	FIELD(ioctl_gntdev_map_grant_ref, count); FIELD(ioctl_gntdev_map_grant_ref, pad);
	FIELD(ioctl_gntdev_map_grant_ref, index); FIELD(ioctl_gntdev_map_grant_ref, refs);
	SZ(ioctl_gntdev_unmap_grant_ref);
	FIELD(ioctl_gntdev_unmap_grant_ref, index); FIELD(ioctl_gntdev_unmap_grant_ref, count);
	FIELD(ioctl_gntdev_unmap_grant_ref, pad);
	SZ(ioctl_gntdev_unmap_notify);
	FIELD(ioctl_gntdev_unmap_notify, index); FIELD(ioctl_gntdev_unmap_notify, action);
	FIELD(ioctl_gntdev_unmap_notify, event_channel_port);
	P("IOCTL_GNTDEV_MAP_GRANT_REF", IOCTL_GNTDEV_MAP_GRANT_REF);
	P("IOCTL_GNTDEV_UNMAP_GRANT_REF", IOCTL_GNTDEV_UNMAP_GRANT_REF);
	P("IOCTL_GNTDEV_SET_UNMAP_NOTIFY", IOCTL_GNTDEV_SET_UNMAP_NOTIFY);

	SZ(ioctl_evtchn_bind_interdomain);
	FIELD(ioctl_evtchn_bind_interdomain, remote_domain); FIELD(ioctl_evtchn_bind_interdomain, remote_port);
	SZ(ioctl_evtchn_bind_unbound_port);
	FIELD(ioctl_evtchn_bind_unbound_port, remote_domain);
	SZ(ioctl_evtchn_unbind); FIELD(ioctl_evtchn_unbind, port);
	SZ(ioctl_evtchn_notify); FIELD(ioctl_evtchn_notify, port);
	P("IOCTL_EVTCHN_BIND_INTERDOMAIN", IOCTL_EVTCHN_BIND_INTERDOMAIN);
	P("IOCTL_EVTCHN_BIND_UNBOUND_PORT", IOCTL_EVTCHN_BIND_UNBOUND_PORT);
	P("IOCTL_EVTCHN_UNBIND", IOCTL_EVTCHN_UNBIND);
	P("IOCTL_EVTCHN_NOTIFY", IOCTL_EVTCHN_NOTIFY);
	P("IOCTL_EVTCHN_RESET", IOCTL_EVTCHN_RESET);
	P("sizeof evtchn_port_t", sizeof(unsigned int));`)

	g := cprobe.Layout{}
	var ag gntallocAllocGref
	g.Size("ioctl_gntalloc_alloc_gref", unsafe.Sizeof(ag))
	g.Field("ioctl_gntalloc_alloc_gref", "domid", unsafe.Sizeof(ag.Domid), unsafe.Offsetof(ag.Domid))
	g.Field("ioctl_gntalloc_alloc_gref", "flags", unsafe.Sizeof(ag.Flags), unsafe.Offsetof(ag.Flags))
	g.Field("ioctl_gntalloc_alloc_gref", "count", unsafe.Sizeof(ag.Count), unsafe.Offsetof(ag.Count))
	g.Field("ioctl_gntalloc_alloc_gref", "index", unsafe.Sizeof(ag.Index), unsafe.Offsetof(ag.Index))
	g.Field("ioctl_gntalloc_alloc_gref", "gref_ids", unsafe.Sizeof(ag.GrefIDs), unsafe.Offsetof(ag.GrefIDs))
	var dg gntallocDeallocGref
	g.Size("ioctl_gntalloc_dealloc_gref", unsafe.Sizeof(dg))
	g.Field("ioctl_gntalloc_dealloc_gref", "index", unsafe.Sizeof(dg.Index), unsafe.Offsetof(dg.Index))
	g.Field("ioctl_gntalloc_dealloc_gref", "count", unsafe.Sizeof(dg.Count), unsafe.Offsetof(dg.Count))
	var an gntallocUnmapNotify
	for _, s := range []string{"ioctl_gntalloc_unmap_notify", "ioctl_gntdev_unmap_notify"} {
		g.Size(s, unsafe.Sizeof(an))
		g.Field(s, "index", unsafe.Sizeof(an.Index), unsafe.Offsetof(an.Index))
		g.Field(s, "action", unsafe.Sizeof(an.Action), unsafe.Offsetof(an.Action))
		g.Field(s, "event_channel_port", unsafe.Sizeof(an.EventChannelPort), unsafe.Offsetof(an.EventChannelPort))
	}
	g["IOCTL_GNTALLOC_ALLOC_GREF"] = int64(ioctlGntallocAllocGref)
	g["IOCTL_GNTALLOC_DEALLOC_GREF"] = int64(ioctlGntallocDeallocGref)
	g["IOCTL_GNTALLOC_SET_UNMAP_NOTIFY"] = int64(ioctlGntallocSetUnmapNotify)
	g["GNTALLOC_FLAG_WRITABLE"] = gntallocFlagWritable
	g["UNMAP_NOTIFY_CLEAR_BYTE"] = UnmapNotifyClearByte
	g["UNMAP_NOTIFY_SEND_EVENT"] = UnmapNotifySendEvent

	var gr gntdevGrantRef
	g.Size("ioctl_gntdev_grant_ref", unsafe.Sizeof(gr))
	g.Field("ioctl_gntdev_grant_ref", "domid", unsafe.Sizeof(gr.Domid), unsafe.Offsetof(gr.Domid))
	g.Field("ioctl_gntdev_grant_ref", "ref", unsafe.Sizeof(gr.Ref), unsafe.Offsetof(gr.Ref))
	var mg gntdevMapGrantRef
	g.Size("ioctl_gntdev_map_grant_ref", unsafe.Sizeof(mg))
	g.Field("ioctl_gntdev_map_grant_ref", "count", unsafe.Sizeof(mg.Count), unsafe.Offsetof(mg.Count))
	g.Field("ioctl_gntdev_map_grant_ref", "pad", unsafe.Sizeof(mg.Pad), unsafe.Offsetof(mg.Pad))
	g.Field("ioctl_gntdev_map_grant_ref", "index", unsafe.Sizeof(mg.Index), unsafe.Offsetof(mg.Index))
	g.Field("ioctl_gntdev_map_grant_ref", "refs", unsafe.Sizeof(mg.Refs), unsafe.Offsetof(mg.Refs))
	var ug gntdevUnmapGrantRef
	g.Size("ioctl_gntdev_unmap_grant_ref", unsafe.Sizeof(ug))
	g.Field("ioctl_gntdev_unmap_grant_ref", "index", unsafe.Sizeof(ug.Index), unsafe.Offsetof(ug.Index))
	g.Field("ioctl_gntdev_unmap_grant_ref", "count", unsafe.Sizeof(ug.Count), unsafe.Offsetof(ug.Count))
	g.Field("ioctl_gntdev_unmap_grant_ref", "pad", unsafe.Sizeof(ug.Pad), unsafe.Offsetof(ug.Pad))
	g["IOCTL_GNTDEV_MAP_GRANT_REF"] = int64(ioctlGntdevMapGrantRef)
	g["IOCTL_GNTDEV_UNMAP_GRANT_REF"] = int64(ioctlGntdevUnmapGrantRef)
	g["IOCTL_GNTDEV_SET_UNMAP_NOTIFY"] = int64(ioctlGntdevSetUnmapNotify)

	var bi evtchnBindInterdomain
	g.Size("ioctl_evtchn_bind_interdomain", unsafe.Sizeof(bi))
	g.Field("ioctl_evtchn_bind_interdomain", "remote_domain", unsafe.Sizeof(bi.RemoteDomain), unsafe.Offsetof(bi.RemoteDomain))
	g.Field("ioctl_evtchn_bind_interdomain", "remote_port", unsafe.Sizeof(bi.RemotePort), unsafe.Offsetof(bi.RemotePort))
	var bu evtchnBindUnboundPort
	g.Size("ioctl_evtchn_bind_unbound_port", unsafe.Sizeof(bu))
	g.Field("ioctl_evtchn_bind_unbound_port", "remote_domain", unsafe.Sizeof(bu.RemoteDomain), unsafe.Offsetof(bu.RemoteDomain))
	var ep evtchnPort
	for _, s := range []string{"ioctl_evtchn_unbind", "ioctl_evtchn_notify"} {
		g.Size(s, unsafe.Sizeof(ep))
		g.Field(s, "port", unsafe.Sizeof(ep.Port), unsafe.Offsetof(ep.Port))
	}
	g["IOCTL_EVTCHN_BIND_INTERDOMAIN"] = int64(ioctlEvtchnBindInterdomain)
	g["IOCTL_EVTCHN_BIND_UNBOUND_PORT"] = int64(ioctlEvtchnBindUnboundPort)
	g["IOCTL_EVTCHN_UNBIND"] = int64(ioctlEvtchnUnbind)
	g["IOCTL_EVTCHN_NOTIFY"] = int64(ioctlEvtchnNotify)
	g["IOCTL_EVTCHN_RESET"] = int64(ioctlEvtchnReset)
	g["sizeof evtchn_port_t"] = int64(unsafe.Sizeof(uint32(0))) // what drain writes to unmask

	cprobe.Compare(t, c, g)
}

// TestABIArgBuffers checks the variable-length ioctl arguments: the
// fixed part where the kernel reads it, room for every entry, and results
// read back from where the kernel writes them.
func TestABIArgBuffers(t *testing.T) {
	for _, n := range []int{1, 2, 3, MaxGrantPages} {
		buf := allocGrefArg(7, gntallocFlagWritable, n)
		size := uintptr(len(buf) * 8)
		if min := max(unsafe.Sizeof(gntallocAllocGref{}), 16+4*uintptr(n)); size < min {
			t.Fatalf("alloc arg for %d pages: %d bytes, kernel touches %d", n, size, min)
		}
		hdr := (*gntallocAllocGref)(unsafe.Pointer(&buf[0]))
		if hdr.Domid != 7 || hdr.Flags != 1 || hdr.Count != uint32(n) {
			t.Fatalf("alloc arg header %+v", *hdr)
		}
		// Play the kernel: write the index and the references.
		hdr.Index = 0x5000
		ids := unsafe.Slice((*uint32)(unsafe.Pointer(uintptr(unsafe.Pointer(&buf[0]))+16)), n)
		for i := range ids {
			ids[i] = uint32(100 + i)
		}
		idx, refs := allocGrefResult(buf, n)
		if idx != 0x5000 || len(refs) != n || refs[0] != 100 || refs[n-1] != uint32(100+n-1) {
			t.Fatalf("alloc result %#x %v", idx, refs[:min(n, 4)])
		}

		in := make([]uint32, n)
		for i := range in {
			in[i] = uint32(1000 + i)
		}
		mb := mapGrantRefArg(9, in)
		if msize := uintptr(len(mb) * 8); msize < 16+8*uintptr(n) {
			t.Fatalf("map arg for %d refs: %d bytes", n, msize)
		}
		ents := unsafe.Slice((*uint32)(unsafe.Pointer(uintptr(unsafe.Pointer(&mb[0]))+16)), 2*n)
		if mb[0]&0xffffffff != uint64(n) || ents[0] != 9 || ents[1] != 1000 || ents[2*n-1] != uint32(1000+n-1) {
			t.Fatalf("map arg for %d refs: %v…", n, ents[:min(2*n, 6)])
		}
		mb[1] = 0x7000
		if mapGrantRefIndex(mb) != 0x7000 {
			t.Fatal("map index not read from offset 8")
		}
	}
}
