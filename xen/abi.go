//go:build linux && (amd64 || arm64)

// This file is the Linux kernel's user-space ABI for the Xen devices:
// /dev/xen/gntalloc (a guest grants its own pages), /dev/xen/gntdev (dom0
// maps pages another domain granted) and /dev/xen/evtchn (event channels).
// The facts are those of the kernel's uapi headers xen/gntalloc.h,
// xen/gntdev.h and xen/evtchn.h; TestABI compiles a C program against
// those headers and checks every size, offset and ioctl number here
// against it.
//
// The build constraint lists the 64-bit architectures Xen runs on: their
// ioctl numbers use the generic _IOC encoding (mips, powerpc and sparc
// encode differently), and u64 is 8-byte aligned in C and in Go alike (not
// so on 32-bit arm, where Go aligns it to 4 and C to 8).

package xen

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The generic _IOC encoding (include/uapi/asm-generic/ioctl.h).
const (
	iocTypeShift = 8
	iocSizeShift = 16
	iocDirShift  = 30
	// iocNone is _IOC_NONE: every Xen device ioctl is declared with
	// direction "none" whatever it copies, so its number is
	// iocNone<<iocDirShift | size<<iocSizeShift | type<<iocTypeShift | nr.
	iocNone = 0
)

// /dev/xen/gntalloc: allocate pages in this domain and grant them to
// another one.

// gntallocAllocGref is struct ioctl_gntalloc_alloc_gref. The kernel copies
// the fixed part in (sizeof, padding included) and writes count grant
// references from offsetof(gref_ids) on, so the argument buffer is at least
// max(sizeof, offsetof(gref_ids) + 4×count) bytes (see allocGrefArg).
type gntallocAllocGref struct {
	Domid   uint16    // IN: the domain the pages are granted to
	Flags   uint16    // IN: gntallocFlagWritable or 0
	Count   uint32    // IN: number of pages
	Index   uint64    // OUT: the mmap offset of the pages on this fd
	GrefIDs [1]uint32 // OUT: count grant references (variable length)
	_       [4]byte   // C's tail padding to the u64 alignment
}

// gntallocDeallocGref is struct ioctl_gntalloc_dealloc_gref.
type gntallocDeallocGref struct {
	Index uint64 // IN: the offset the allocation returned
	Count uint32 // IN: number of pages
	_     [4]byte
}

// gntallocUnmapNotify is struct ioctl_gntalloc_unmap_notify (and, with the
// same layout, struct ioctl_gntdev_unmap_notify).
type gntallocUnmapNotify struct {
	Index            uint64 // IN: mmap offset of a byte within the page
	Action           uint32 // IN: UnmapNotifyClearByte | UnmapNotifySendEvent
	EventChannelPort uint32 // IN: the local port to notify
}

// gntallocFlagWritable is GNTALLOC_FLAG_WRITABLE: the other domain may
// write the pages.
const gntallocFlagWritable = 1

// The actions of an unmap notification, or-ed together (see
// GrantedPages.SetUnmapNotify and GrantMapping.SetUnmapNotify).
const (
	// UnmapNotifyClearByte is UNMAP_NOTIFY_CLEAR_BYTE: zero the byte at
	// the notification's offset.
	UnmapNotifyClearByte = 0x1
	// UnmapNotifySendEvent is UNMAP_NOTIFY_SEND_EVENT: send an event on
	// the notification's local port.
	UnmapNotifySendEvent = 0x2
)

// gntalloc ioctl numbers.
const (
	ioctlGntallocAllocGref      = iocNone<<iocDirShift | unsafe.Sizeof(gntallocAllocGref{})<<iocSizeShift | 'G'<<iocTypeShift | 5
	ioctlGntallocDeallocGref    = iocNone<<iocDirShift | unsafe.Sizeof(gntallocDeallocGref{})<<iocSizeShift | 'G'<<iocTypeShift | 6
	ioctlGntallocSetUnmapNotify = iocNone<<iocDirShift | unsafe.Sizeof(gntallocUnmapNotify{})<<iocSizeShift | 'G'<<iocTypeShift | 7
)

// /dev/xen/gntdev: map pages another domain granted.

// gntdevGrantRef is struct ioctl_gntdev_grant_ref, one entry of a map
// request.
type gntdevGrantRef struct {
	Domid uint32 // the granting domain
	Ref   uint32 // its grant reference
}

// gntdevMapGrantRef is struct ioctl_gntdev_map_grant_ref. As for gntalloc,
// count refs follow the fixed part from offsetof(refs) on (see
// mapGrantRefArg).
type gntdevMapGrantRef struct {
	Count uint32            // IN: number of grants
	Pad   uint32            // 0
	Index uint64            // OUT: the mmap offset of the grants on this fd
	Refs  [1]gntdevGrantRef // IN: count entries (variable length)
}

// gntdevUnmapGrantRef is struct ioctl_gntdev_unmap_grant_ref.
type gntdevUnmapGrantRef struct {
	Index uint64 // IN: the offset the map returned
	Count uint32 // IN: number of pages
	Pad   uint32
}

// gntdevUnmapNotify is struct ioctl_gntdev_unmap_notify.
type gntdevUnmapNotify = gntallocUnmapNotify

// gntdev ioctl numbers.
const (
	ioctlGntdevMapGrantRef     = iocNone<<iocDirShift | unsafe.Sizeof(gntdevMapGrantRef{})<<iocSizeShift | 'G'<<iocTypeShift | 0
	ioctlGntdevUnmapGrantRef   = iocNone<<iocDirShift | unsafe.Sizeof(gntdevUnmapGrantRef{})<<iocSizeShift | 'G'<<iocTypeShift | 1
	ioctlGntdevSetUnmapNotify  = iocNone<<iocDirShift | unsafe.Sizeof(gntdevUnmapNotify{})<<iocSizeShift | 'G'<<iocTypeShift | 7
	gntdevMapGrantRefFixedSize = unsafe.Offsetof(gntdevMapGrantRef{}.Refs)
)

// /dev/xen/evtchn: event channels. A bound port's events are read from
// the fd as 4-byte port numbers; the kernel masks a port when it delivers
// it, and writing the port number back unmasks it.

// evtchnBindInterdomain is struct ioctl_evtchn_bind_interdomain.
type evtchnBindInterdomain struct {
	RemoteDomain uint32
	RemotePort   uint32
}

// evtchnBindUnboundPort is struct ioctl_evtchn_bind_unbound_port.
type evtchnBindUnboundPort struct {
	RemoteDomain uint32
}

// evtchnPort is struct ioctl_evtchn_unbind and struct ioctl_evtchn_notify
// (one unsigned int port each).
type evtchnPort struct {
	Port uint32
}

// evtchn ioctl numbers. The bind ioctls return the local port.
const (
	ioctlEvtchnBindInterdomain = iocNone<<iocDirShift | unsafe.Sizeof(evtchnBindInterdomain{})<<iocSizeShift | 'E'<<iocTypeShift | 1
	ioctlEvtchnBindUnboundPort = iocNone<<iocDirShift | unsafe.Sizeof(evtchnBindUnboundPort{})<<iocSizeShift | 'E'<<iocTypeShift | 2
	ioctlEvtchnUnbind          = iocNone<<iocDirShift | unsafe.Sizeof(evtchnPort{})<<iocSizeShift | 'E'<<iocTypeShift | 3
	ioctlEvtchnNotify          = iocNone<<iocDirShift | unsafe.Sizeof(evtchnPort{})<<iocSizeShift | 'E'<<iocTypeShift | 4
	ioctlEvtchnReset           = iocNone<<iocDirShift | 0<<iocSizeShift | 'E'<<iocTypeShift | 5
)

// ioctl issues an ioctl whose argument is the memory at arg (a buffer
// the caller keeps alive; Go heap memory does not move) and returns the
// ioctl's non-negative result.
func ioctl(fd uintptr, req uintptr, arg unsafe.Pointer) (uintptr, error) {
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, req, uintptr(arg))
	runtime.KeepAlive(arg)
	if errno != 0 {
		return 0, errno
	}
	return r, nil
}

// allocGrefArg builds the variable-length ioctl_gntalloc_alloc_gref
// argument for count pages: an 8-byte-aligned buffer with the fixed part
// filled in and room for count references.
func allocGrefArg(domid uint16, flags uint16, count int) []uint64 {
	size := max(unsafe.Sizeof(gntallocAllocGref{}), unsafe.Offsetof(gntallocAllocGref{}.GrefIDs)+4*uintptr(count))
	buf := make([]uint64, (size+7)/8)
	hdr := (*gntallocAllocGref)(unsafe.Pointer(&buf[0]))
	hdr.Domid, hdr.Flags, hdr.Count = domid, flags, uint32(count)
	return buf
}

// allocGrefResult reads the index and the count references the kernel
// wrote into an allocGrefArg buffer.
func allocGrefResult(buf []uint64, count int) (index uint64, refs []uint32) {
	hdr := (*gntallocAllocGref)(unsafe.Pointer(&buf[0]))
	ids := unsafe.Slice((*uint32)(unsafe.Pointer(&hdr.GrefIDs[0])), count)
	return hdr.Index, append([]uint32(nil), ids...)
}

// mapGrantRefArg builds the variable-length ioctl_gntdev_map_grant_ref
// argument mapping refs granted by domid.
func mapGrantRefArg(domid uint16, refs []uint32) []uint64 {
	size := gntdevMapGrantRefFixedSize + unsafe.Sizeof(gntdevGrantRef{})*uintptr(max(len(refs), 1))
	buf := make([]uint64, (size+7)/8)
	hdr := (*gntdevMapGrantRef)(unsafe.Pointer(&buf[0]))
	hdr.Count = uint32(len(refs))
	ents := unsafe.Slice((*gntdevGrantRef)(unsafe.Pointer(&hdr.Refs[0])), len(refs))
	for i, r := range refs {
		ents[i] = gntdevGrantRef{Domid: uint32(domid), Ref: r}
	}
	return buf
}

// mapGrantRefIndex reads the mmap offset the kernel wrote into a
// mapGrantRefArg buffer.
func mapGrantRefIndex(buf []uint64) uint64 {
	return (*gntdevMapGrantRef)(unsafe.Pointer(&buf[0])).Index
}

// evtchnIoctl issues an evtchn ioctl whose argument is a small struct and
// returns its result (the port, for the bind ioctls).
func evtchnIoctl[T any](fd uintptr, req uintptr, arg *T, what string) (uint32, error) {
	r, err := ioctl(fd, req, unsafe.Pointer(arg))
	if err != nil {
		return 0, fmt.Errorf("xen evtchn: %s: %w", what, err)
	}
	return uint32(r), nil
}
