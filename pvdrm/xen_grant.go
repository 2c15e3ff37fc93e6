//go:build linux && (amd64 || arm64)

package pvdrm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// XenDevDir is where Linux puts the Xen devices.
const XenDevDir = "/dev/xen"

// MaxGrantPages bounds the pages one Share or Map call handles.
const MaxGrantPages = 4096

// ErrNoXen is wrapped when a Xen device is missing: this is not a Xen
// domain, or the kernel driver (xen-gntalloc, xen-gntdev, xen-evtchn) is
// not loaded.
var ErrNoXen = errors.New("no Xen device (not a Xen domain, or the xen-gntalloc, xen-gntdev or xen-evtchn driver is not loaded)")

// openXenDev opens dir/name (dir "" is XenDevDir) read-write.
func openXenDev(dir, name string, flags int) (int, error) {
	if dir == "" {
		dir = XenDevDir
	}
	p := filepath.Join(dir, name)
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_CLOEXEC|flags, 0)
	if err != nil {
		perr := &fs.PathError{Op: "open", Path: p, Err: err}
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENXIO) {
			return -1, fmt.Errorf("pvdrm xen: %w: %w", ErrNoXen, perr)
		}
		return -1, fmt.Errorf("pvdrm xen: %w", perr)
	}
	return fd, nil
}

// checkGrantCount bounds a Share or Map.
func checkGrantCount(n int) error {
	if n < 1 || n > MaxGrantPages {
		return fmt.Errorf("pvdrm xen: %d pages: want 1..%d per call", n, MaxGrantPages)
	}
	return nil
}

// Gntalloc shares this domain's pages with another domain: the guest's
// side of grant sharing (/dev/xen/gntalloc).
type Gntalloc struct{ fd int }

// OpenGntalloc opens dir/gntalloc (dir "" is XenDevDir).
func OpenGntalloc(dir string) (*Gntalloc, error) {
	fd, err := openXenDev(dir, "gntalloc", 0)
	if err != nil {
		return nil, err
	}
	return &Gntalloc{fd: fd}, nil
}

// Close closes the device. Pages shared through it must be closed first.
func (g *Gntalloc) Close() error { return closeFd(&g.fd) }

// GrantedPages are pages this domain allocated and granted to another.
type GrantedPages struct {
	fd    int
	index uint64
	refs  []uint32
	mem   []byte
}

// Share allocates that many zeroed pages, grants them to domain domid
// (writable or read-only) and maps them here. The grant references go to
// the other domain, which maps them with Gntdev.Map.
func (g *Gntalloc) Share(domid uint16, pages int, writable bool) (*GrantedPages, error) {
	if err := checkGrantCount(pages); err != nil {
		return nil, err
	}
	if domid >= DomidFirstReserved {
		return nil, fmt.Errorf("pvdrm xen: share with domain %d: not an ordinary domain", domid)
	}
	var flags uint16
	if writable {
		flags = gntallocFlagWritable
	}
	arg := allocGrefArg(domid, flags, pages)
	if _, err := xenIoctl(uintptr(g.fd), ioctlGntallocAllocGref, unsafe.Pointer(&arg[0])); err != nil {
		return nil, fmt.Errorf("pvdrm xen: grant %d pages to domain %d: %w", pages, domid, err)
	}
	p := &GrantedPages{fd: g.fd}
	p.index, p.refs = allocGrefResult(arg, pages)
	mem, err := unix.Mmap(g.fd, int64(p.index), pages*pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("pvdrm xen: map %d granted pages: %w", pages, err), p.Close())
	}
	p.mem = mem
	return p, nil
}

// Refs returns the grant references, one per page, in order.
func (p *GrantedPages) Refs() []uint32 { return append([]uint32(nil), p.refs...) }

// Mem returns the pages' memory.
func (p *GrantedPages) Mem() []byte { return p.mem }

// setUnmapNotify arms the kernel to act when these pages are released
// (this process exits or closes them): clear the byte at off and/or send
// an event on local port.
func (p *GrantedPages) setUnmapNotify(off int, action, port uint32) error {
	n := gntallocUnmapNotify{Index: p.index + uint64(off), Action: action, EventChannelPort: port}
	if _, err := xenIoctl(uintptr(p.fd), ioctlGntallocSetUnmapNotify, unsafe.Pointer(&n)); err != nil {
		return fmt.Errorf("pvdrm xen: gntalloc unmap notification: %w", err)
	}
	return nil
}

// Close unmaps the pages and revokes the grants (the kernel frees each
// page once the other domain unmapped it too).
func (p *GrantedPages) Close() error {
	var errs []error
	if p.mem != nil {
		errs = append(errs, unix.Munmap(p.mem))
		p.mem = nil
	}
	if p.refs != nil {
		d := gntallocDeallocGref{Index: p.index, Count: uint32(len(p.refs))}
		if _, err := xenIoctl(uintptr(p.fd), ioctlGntallocDeallocGref, unsafe.Pointer(&d)); err != nil {
			errs = append(errs, fmt.Errorf("pvdrm xen: revoke %d grants: %w", len(p.refs), err))
		}
		p.refs = nil
	}
	return errors.Join(errs...)
}

// Gntdev maps pages other domains granted: dom0's side of grant sharing
// (/dev/xen/gntdev).
type Gntdev struct{ fd int }

// OpenGntdev opens dir/gntdev (dir "" is XenDevDir).
func OpenGntdev(dir string) (*Gntdev, error) {
	fd, err := openXenDev(dir, "gntdev", 0)
	if err != nil {
		return nil, err
	}
	return &Gntdev{fd: fd}, nil
}

// Close closes the device. Mappings made through it must be closed first.
func (g *Gntdev) Close() error { return closeFd(&g.fd) }

// GrantMapping is another domain's granted pages mapped here.
type GrantMapping struct {
	fd    int
	index uint64
	count int
	mem   []byte
}

// Map maps the pages domain domid granted under refs, in order, read-write
// or read-only. The references come from the other domain and are checked:
// a reserved one (below GrantRefFirst) is refused.
func (g *Gntdev) Map(domid uint16, refs []uint32, writable bool) (*GrantMapping, error) {
	if err := checkGrantCount(len(refs)); err != nil {
		return nil, err
	}
	if domid >= DomidFirstReserved {
		return nil, fmt.Errorf("pvdrm xen: map grants of domain %d: not an ordinary domain", domid)
	}
	for _, r := range refs {
		if r < GrantRefFirst {
			return nil, fmt.Errorf("pvdrm xen: map grants of domain %d: reference %d is reserved", domid, r)
		}
	}
	arg := mapGrantRefArg(domid, refs)
	if _, err := xenIoctl(uintptr(g.fd), ioctlGntdevMapGrantRef, unsafe.Pointer(&arg[0])); err != nil {
		return nil, fmt.Errorf("pvdrm xen: map %d grants of domain %d: %w", len(refs), domid, err)
	}
	m := &GrantMapping{fd: g.fd, index: mapGrantRefIndex(arg), count: len(refs)}
	prot := unix.PROT_READ
	if writable {
		prot |= unix.PROT_WRITE // gntdev maps read-only grants where PROT_WRITE is absent
	}
	mem, err := unix.Mmap(g.fd, int64(m.index), len(refs)*pageSize, prot, unix.MAP_SHARED)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("pvdrm xen: map %d grants of domain %d: %w", len(refs), domid, err), m.Close())
	}
	m.mem = mem
	return m, nil
}

// Mem returns the mapped pages.
func (m *GrantMapping) Mem() []byte { return m.mem }

// setUnmapNotify arms the kernel to act when this mapping goes (this
// process exits or closes it): clear the byte at off in the granting
// domain's page and/or send an event on local port.
func (m *GrantMapping) setUnmapNotify(off int, action, port uint32) error {
	n := gntdevUnmapNotify{Index: m.index + uint64(off), Action: action, EventChannelPort: port}
	if _, err := xenIoctl(uintptr(m.fd), ioctlGntdevSetUnmapNotify, unsafe.Pointer(&n)); err != nil {
		return fmt.Errorf("pvdrm xen: gntdev unmap notification: %w", err)
	}
	return nil
}

// Close unmaps the pages and releases the grants.
func (m *GrantMapping) Close() error {
	var errs []error
	if m.mem != nil {
		errs = append(errs, unix.Munmap(m.mem)) // before the ioctl, which fails on mapped pages
		m.mem = nil
	}
	if m.count > 0 {
		u := gntdevUnmapGrantRef{Index: m.index, Count: uint32(m.count)}
		if _, err := xenIoctl(uintptr(m.fd), ioctlGntdevUnmapGrantRef, unsafe.Pointer(&u)); err != nil {
			errs = append(errs, fmt.Errorf("pvdrm xen: unmap %d grants: %w", m.count, err))
		}
		m.count = 0
	}
	return errors.Join(errs...)
}

// evtchn is one event channel port bound through its own /dev/xen/evtchn
// descriptor (non-blocking).
type evtchn struct {
	fd   int
	port uint32 // local port, 0 until bound
}

func openEvtchn(dir string) (*evtchn, error) {
	fd, err := openXenDev(dir, "evtchn", unix.O_NONBLOCK)
	if err != nil {
		return nil, err
	}
	return &evtchn{fd: fd}, nil
}

// bindUnbound allocates a port for domain remote to bind (the front end's
// side).
func (e *evtchn) bindUnbound(remote uint16) error {
	arg := evtchnBindUnboundPort{RemoteDomain: uint32(remote)}
	port, err := evtchnIoctl(uintptr(e.fd), ioctlEvtchnBindUnboundPort, &arg, fmt.Sprintf("allocate a port for domain %d", remote))
	e.port = port
	return err
}

// bindInterdomain binds to port remotePort of domain remote (the back
// end's side).
func (e *evtchn) bindInterdomain(remote uint16, remotePort uint32) error {
	arg := evtchnBindInterdomain{RemoteDomain: uint32(remote), RemotePort: remotePort}
	port, err := evtchnIoctl(uintptr(e.fd), ioctlEvtchnBindInterdomain, &arg, fmt.Sprintf("bind port %d of domain %d", remotePort, remote))
	e.port = port
	return err
}

func (e *evtchn) notify() error {
	if e == nil {
		return errors.New("xen evtchn: notify: transport closed")
	}
	arg := evtchnPort{Port: e.port}
	_, err := evtchnIoctl(uintptr(e.fd), ioctlEvtchnNotify, &arg, "notify")
	return err
}

// wait blocks until an event arrived on the port (and re-enables it), ctx
// is done, or max passes.
func (e *evtchn) wait(ctx context.Context, max time.Duration) error {
	if e == nil {
		return errors.New("xen evtchn: wait: transport closed")
	}
	deadline := time.Now().Add(max)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil
		}
		pfd := []unix.PollFd{{Fd: int32(e.fd), Events: unix.POLLIN}}
		n, err := unix.Poll(pfd, int(min(left, 50*time.Millisecond)/time.Millisecond)+1)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("xen evtchn: wait: %w", err)
		}
		if n > 0 {
			return e.drain()
		}
	}
}

// drain reads the pending ports (4 bytes each) and unmasks this one: the
// kernel masks a port as it delivers it. An overflowed event ring
// (EFBIG) is reset.
func (e *evtchn) drain() error {
	var buf [64]byte
	for range 64 { // bounded: each read takes up to 16 ports, and only one is bound
		n, err := unix.Read(e.fd, buf[:])
		if errors.Is(err, unix.EFBIG) {
			if _, err := xenIoctl(uintptr(e.fd), ioctlEvtchnReset, nil); err != nil {
				return fmt.Errorf("xen evtchn: reset after overflow: %w", err)
			}
			continue
		}
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) || (err == nil && n == 0) {
			break
		}
		if err != nil {
			return fmt.Errorf("xen evtchn: read: %w", err)
		}
	}
	var p [4]byte
	binary.NativeEndian.PutUint32(p[:], e.port)
	if _, err := unix.Write(e.fd, p[:]); err != nil {
		return fmt.Errorf("xen evtchn: unmask port %d: %w", e.port, err)
	}
	return nil
}

// close unbinds the port and closes the descriptor.
func (e *evtchn) close() error {
	var err error
	if e.port != 0 {
		arg := evtchnPort{Port: e.port}
		_, err = evtchnIoctl(uintptr(e.fd), ioctlEvtchnUnbind, &arg, fmt.Sprintf("unbind port %d", e.port))
		e.port = 0
	}
	return errors.Join(err, closeFd(&e.fd))
}

// closeFd closes *fd once.
func closeFd(fd *int) error {
	if *fd < 0 {
		return nil
	}
	err := unix.Close(*fd)
	*fd = -1
	return err
}
