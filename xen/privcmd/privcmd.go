//go:build linux && (amd64 || arm64)

package privcmd

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/xen"
)

// Handle is an open /dev/xen/privcmd. Its methods may be called
// concurrently, except Close.
type Handle struct {
	fd int
	// ioctl issues one ioctl on fd; tests replace it to play the kernel.
	ioctl func(req uintptr, arg unsafe.Pointer) error
}

// Open opens dir/privcmd (dir "" is xen.DevDir). It fails with an error
// wrapping xen.ErrNoXen where there is no such device, and refuses a
// kernel whose page size is not Xen's (privcmd then maps in other units).
func Open(dir string) (*Handle, error) {
	if ps := os.Getpagesize(); ps != xen.PageSize {
		return nil, fmt.Errorf("xen privcmd: the kernel's page size is %d, not Xen's %d", ps, xen.PageSize)
	}
	if dir == "" {
		dir = xen.DevDir
	}
	p := filepath.Join(dir, "privcmd")
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		perr := &fs.PathError{Op: "open", Path: p, Err: err}
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENXIO) {
			return nil, fmt.Errorf("xen privcmd: %w (the xen-privcmd driver): %w", xen.ErrNoXen, perr)
		}
		return nil, fmt.Errorf("xen privcmd: %w", perr)
	}
	h := &Handle{fd: fd}
	h.ioctl = h.sysIoctl
	return h, nil
}

// sysIoctl issues the ioctl on the device. arg is memory the caller keeps
// alive (Go heap memory does not move).
// An ioctl that fails with EINTR, interrupted by a signal before it did
// anything (the Go runtime preempts goroutines with SIGURG), is issued again.
func (h *Handle) sysIoctl(req uintptr, arg unsafe.Pointer) error {
	for {
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(h.fd), req, uintptr(arg))
		runtime.KeepAlive(arg)
		switch errno {
		case 0:
			return nil
		case unix.EINTR:
			continue
		}
		return errno
	}
}

// Close closes the device. Mappings made through it stay valid until
// their own Close.
func (h *Handle) Close() error {
	if h.fd < 0 {
		return nil
	}
	err := unix.Close(h.fd)
	h.fd = -1
	if err != nil {
		return fmt.Errorf("xen privcmd: close: %w", err)
	}
	return nil
}

// Restrict limits this descriptor to domain dom for good: dm_ops and
// mappings for any other domain then fail with EPERM (what a device model
// does once it knows its guest, as QEMU's -xen-domid-restrict).
func (h *Handle) Restrict(dom uint16) error {
	if err := checkDomain(dom); err != nil {
		return fmt.Errorf("xen privcmd: restrict: %w", err)
	}
	d := dom
	if err := h.ioctl(ioctlRestrict, unsafe.Pointer(&d)); err != nil {
		return fmt.Errorf("xen privcmd: restrict to domain %d: %w", dom, err)
	}
	return nil
}

// checkDomain refuses the reserved domain ids (DOMID_SELF and the like):
// a device model serves an ordinary domain.
func checkDomain(dom uint16) error {
	if dom >= xen.DomidFirstReserved {
		return fmt.Errorf("domain %d: not an ordinary domain (want < %d)", dom, xen.DomidFirstReserved)
	}
	return nil
}

// dmop issues one dm_op for domain dom with op as its only buffer; Xen
// writes the OUT fields back into op.
func (h *Handle) dmop(dom uint16, op *xenDMOp, what string) error {
	if err := checkDomain(dom); err != nil {
		return fmt.Errorf("xen dm_op %s: %w", what, err)
	}
	buf := dmOpBuf{Uptr: unsafe.Pointer(op), Size: uint64(unsafe.Sizeof(*op))}
	arg := dmOp{Dom: dom, Num: 1, Ubufs: unsafe.Pointer(&buf)}
	err := h.ioctl(ioctlDMOp, unsafe.Pointer(&arg))
	runtime.KeepAlive(op)
	runtime.KeepAlive(&buf)
	if err != nil {
		return fmt.Errorf("xen dm_op %s for domain %d: %w", what, dom, err)
	}
	return nil
}

// Mapping is memory mapped through privcmd: a domain's resource or its
// foreign-mapped frames.
type Mapping struct {
	mem []byte
}

// Bytes returns the mapped memory; nil after Close.
func (m *Mapping) Bytes() []byte { return m.mem }

// Close unmaps the memory (the frames go back to their domain's sole
// use). Closing twice is a no-op.
func (m *Mapping) Close() error {
	if m.mem == nil {
		return nil
	}
	err := unix.Munmap(m.mem)
	m.mem = nil
	if err != nil {
		return fmt.Errorf("xen privcmd: unmap: %w", err)
	}
	return nil
}

// MaxResourceFrames bounds one MapResource.
const MaxResourceFrames = 64

// ResourceSize asks Xen how many frames resource typ/id of domain dom has.
func (h *Handle) ResourceSize(dom uint16, typ, id uint32) (uint64, error) {
	if err := checkDomain(dom); err != nil {
		return 0, fmt.Errorf("xen privcmd: resource size: %w", err)
	}
	arg := mmapResource{Dom: dom, Type: typ, ID: id}
	if err := h.ioctl(ioctlMmapResource, unsafe.Pointer(&arg)); err != nil {
		return 0, fmt.Errorf("xen privcmd: size of resource %d/%d of domain %d: %w", typ, id, dom, err)
	}
	return arg.Num, nil
}

// MapResource maps frames frames of resource typ/id of domain dom, from
// frame index first on, read-write (XENMEM_acquire_resource). An ioreq
// server's synchronous page is ResourceIoreqServer, id the server's,
// first FrameIoreq0, one frame.
func (h *Handle) MapResource(dom uint16, typ, id, first uint32, frames int) (*Mapping, error) {
	if err := checkDomain(dom); err != nil {
		return nil, fmt.Errorf("xen privcmd: map resource: %w", err)
	}
	if frames < 1 || frames > MaxResourceFrames {
		return nil, fmt.Errorf("xen privcmd: map %d frames of resource %d/%d: want 1..%d", frames, typ, id, MaxResourceFrames)
	}
	mem, err := unix.Mmap(h.fd, 0, frames*xen.PageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("xen privcmd: reserve %d frames for resource %d/%d of domain %d: %w", frames, typ, id, dom, err)
	}
	arg := mmapResource{Dom: dom, Type: typ, ID: id, Idx: first, Num: uint64(frames), Addr: uint64(uintptr(unsafe.Pointer(&mem[0])))}
	if err := h.ioctl(ioctlMmapResource, unsafe.Pointer(&arg)); err != nil {
		return nil, errors.Join(fmt.Errorf("xen privcmd: map frames %d..%d of resource %d/%d of domain %d: %w", first, int(first)+frames-1, typ, id, dom, err),
			unix.Munmap(mem))
	}
	return &Mapping{mem: mem}, nil
}

// MaxBatchFrames bounds one foreign mapping call (1 GiB of guest frames).
const MaxBatchFrames = 1 << 18

// MaxFrame bounds a frame number: 52-bit physical addresses, 4 KiB frames.
const MaxFrame = 1 << 40

// MapForeign maps frames gfns of domain dom read-write, in order, as one
// new mapping. Every frame must map; otherwise nothing stays mapped and
// the error is a *BatchError naming the frames that failed.
func (h *Handle) MapForeign(dom uint16, gfns []uint64) (*Mapping, error) {
	if err := checkBatch(dom, gfns); err != nil {
		return nil, err
	}
	mem, err := unix.Mmap(h.fd, 0, len(gfns)*xen.PageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("xen privcmd: reserve %d frames of domain %d: %w", len(gfns), dom, err)
	}
	if err := h.batch(mem, dom, gfns); err != nil {
		return nil, errors.Join(err, unix.Munmap(mem))
	}
	return &Mapping{mem: mem}, nil
}

// MapForeignInto maps frames gfns of domain dom read-write over dst, which
// must be page-aligned memory of exactly len(gfns) pages that the caller
// mapped (an anonymous reservation) and will unmap: the frames replace
// what was there. On error dst holds an unspecified mix of frames and
// nothing, and the caller unmaps it; a failure of individual frames is a
// *BatchError.
func (h *Handle) MapForeignInto(dst []byte, dom uint16, gfns []uint64) error {
	if err := checkBatch(dom, gfns); err != nil {
		return err
	}
	if len(dst) != len(gfns)*xen.PageSize || uintptr(unsafe.Pointer(unsafe.SliceData(dst)))%xen.PageSize != 0 {
		return fmt.Errorf("xen privcmd: map %d frames of domain %d into %d bytes: want %d page-aligned bytes", len(gfns), dom, len(dst), len(gfns)*xen.PageSize)
	}
	if _, err := unix.MmapPtr(h.fd, 0, unsafe.Pointer(&dst[0]), uintptr(len(dst)), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_FIXED); err != nil {
		return fmt.Errorf("xen privcmd: place %d frames of domain %d: %w", len(gfns), dom, err)
	}
	return h.batch(dst, dom, gfns)
}

// checkBatch bounds a foreign mapping.
func checkBatch(dom uint16, gfns []uint64) error {
	if err := checkDomain(dom); err != nil {
		return fmt.Errorf("xen privcmd: foreign map: %w", err)
	}
	if len(gfns) < 1 || len(gfns) > MaxBatchFrames {
		return fmt.Errorf("xen privcmd: foreign map of %d frames of domain %d: want 1..%d per call", len(gfns), dom, MaxBatchFrames)
	}
	for i, g := range gfns {
		if g >= MaxFrame {
			return fmt.Errorf("xen privcmd: foreign map of domain %d: frame %d is %#x, beyond %#x", dom, i, g, uint64(MaxFrame))
		}
	}
	return nil
}

// batch issues IOCTL_PRIVCMD_MMAPBATCH_V2 over mem, a privcmd mapping of
// exactly len(gfns) pages, and checks every frame's error.
func (h *Handle) batch(mem []byte, dom uint16, gfns []uint64) error {
	errs := make([]int32, len(gfns))
	arg := mmapbatchV2{Num: uint32(len(gfns)), Dom: dom, Addr: uint64(uintptr(unsafe.Pointer(&mem[0]))),
		Arr: unsafe.Pointer(&gfns[0]), Err: unsafe.Pointer(&errs[0])}
	err := h.ioctl(ioctlMmapbatchV2, unsafe.Pointer(&arg))
	runtime.KeepAlive(gfns)
	runtime.KeepAlive(errs)
	// ENOENT: the call went through but some frame is paged out; the
	// per-frame codes are valid then too (uapi privcmd.h).
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("xen privcmd: foreign map of %d frames of domain %d: %w", len(gfns), dom, err)
	}
	if ferr := frameErrors(dom, gfns, errs); ferr != nil {
		return ferr
	}
	if err != nil {
		return fmt.Errorf("xen privcmd: foreign map of %d frames of domain %d: %w, yet no frame reported an error", len(gfns), dom, err)
	}
	return nil
}

// FrameError is one frame a foreign mapping could not map.
type FrameError struct {
	Index int        // position in the frame list
	GFN   uint64     // the frame
	Err   unix.Errno // why (ENOENT: paged out; EINVAL, EFAULT, EPERM: not the domain's RAM)
}

// maxFrameErrors bounds the frames a BatchError lists.
const maxFrameErrors = 8

// BatchError reports the frames of a foreign mapping that failed.
type BatchError struct {
	Dom    uint16
	Frames int          // frames asked for
	Failed int          // how many failed
	First  []FrameError // the first few (at most 8)
	// Indices lists every failed frame's index in the batch, ascending.
	Indices []int
}

// Error names the domain, the count and the first failures.
func (e *BatchError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "xen privcmd: foreign map of domain %d: %d of %d frames failed:", e.Dom, e.Failed, e.Frames)
	for _, f := range e.First {
		fmt.Fprintf(&b, " gfn %#x (#%d): %v;", f.GFN, f.Index, f.Err)
	}
	if e.Failed > len(e.First) {
		fmt.Fprintf(&b, " …")
	}
	return strings.TrimSuffix(b.String(), ";")
}

// Unwrap returns the first failure's errno, so errors.Is(err, unix.ENOENT)
// tells a paged-out frame.
func (e *BatchError) Unwrap() error {
	if len(e.First) == 0 {
		return nil
	}
	return e.First[0].Err
}

// frameErrors turns the kernel's per-frame codes into a *BatchError, or
// nil if every frame mapped. A positive code is not one the kernel
// writes: it counts as a failure (EINVAL) too.
func frameErrors(dom uint16, gfns []uint64, codes []int32) error {
	var e *BatchError
	for i, c := range codes {
		if c == 0 {
			continue
		}
		if e == nil {
			e = &BatchError{Dom: dom, Frames: len(gfns)}
		}
		e.Failed++
		e.Indices = append(e.Indices, i)
		if len(e.First) < maxFrameErrors {
			errno := unix.EINVAL
			if c < 0 && c > -4096 {
				errno = unix.Errno(-c)
			}
			e.First = append(e.First, FrameError{Index: i, GFN: gfns[i], Err: errno})
		}
	}
	if e == nil {
		return nil
	}
	return e
}
