// Package privcmd is a device model's interface to Xen through the Linux
// kernel's /dev/xen/privcmd: device-model operations (the dm_op hypercall
// through IOCTL_PRIVCMD_DM_OP) to create, configure and destroy ioreq
// servers and to change memory types; mapping a domain's resources
// (XENMEM_acquire_resource through IOCTL_PRIVCMD_MMAP_RESOURCE, e.g. an
// ioreq server's pages) and its guest frames (foreign mapping through
// IOCTL_PRIVCMD_MMAPBATCH_V2, each frame's error checked); and restricting
// a descriptor to one domain (IOCTL_PRIVCMD_RESTRICT).
//
// It is what libxendevicemodel and libxenforeignmemory do, written with
// golang.org/x/sys/unix instead of cgo, so a gpuvm binary stays static
// (CGO_ENABLED=0). The layouts are those of the kernel's uapi
// xen/privcmd.h and Xen's public hvm/dm_op.h, hvm/hvm_op.h and memory.h;
// TestABI compiles a C program against those headers and checks every
// size, offset, ioctl number and constant here against it.
//
// The device exists only in dom0 (or a device-model stub domain) with the
// xen-privcmd driver loaded; without it Open fails with an error that
// wraps xen.ErrNoXen. The ioctl wrappers build on linux/amd64 and
// linux/arm64, like package xen; the Xen constants and SBDF build
// everywhere. The ioreq protocol built on these calls is package
// xen/ioreq, and a domain's RAM as one mapping is package xen/foreign.
package privcmd
