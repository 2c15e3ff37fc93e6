//go:build linux && (amd64 || arm64)

package xen

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

// openDev opens dir/name (dir "" is DevDir) read-write.
func openDev(dir, name string, flags int) (int, error) {
	if dir == "" {
		dir = DevDir
	}
	p := filepath.Join(dir, name)
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_CLOEXEC|flags, 0)
	if err != nil {
		perr := &fs.PathError{Op: "open", Path: p, Err: err}
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENXIO) {
			return -1, fmt.Errorf("xen: %w: %w", ErrNoXen, perr)
		}
		return -1, fmt.Errorf("xen: %w", perr)
	}
	return fd, nil
}

// checkGrantCount bounds a Share or Map.
func checkGrantCount(n int) error {
	if n < 1 || n > MaxGrantPages {
		return fmt.Errorf("xen: %d pages: want 1..%d per call", n, MaxGrantPages)
	}
	return nil
}

// Gntalloc shares this domain's pages with another domain: the guest's
// side of grant sharing (/dev/xen/gntalloc).
type Gntalloc struct{ fd int }

// OpenGntalloc opens dir/gntalloc (dir "" is DevDir).
func OpenGntalloc(dir string) (*Gntalloc, error) {
	fd, err := openDev(dir, "gntalloc", 0)
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
	fixed bool // mapped at the caller's address (ShareAt)
	flags uint16
}

// Share allocates that many zeroed pages, grants them to domain domid
// (writable or read-only) and maps them here. The grant references go to
// the other domain, which maps them with Gntdev.Map.
func (g *Gntalloc) Share(domid uint16, pages int, writable bool) (*GrantedPages, error) {
	return g.ShareAt(domid, pages, writable, nil)
}

// ShareAt is Share with the pages mapped at address at (nil: anywhere),
// replacing what was mapped there (MAP_FIXED): the caller reserves the
// range, e.g. to lay several shares out next to one another. Close then
// leaves the range reserved (inaccessible) rather than unmapped, so no
// other mapping can take its place before the caller releases it.
func (g *Gntalloc) ShareAt(domid uint16, pages int, writable bool, at unsafe.Pointer) (*GrantedPages, error) {
	if err := checkGrantCount(pages); err != nil {
		return nil, err
	}
	if domid >= DomidFirstReserved {
		return nil, fmt.Errorf("xen: share with domain %d: not an ordinary domain", domid)
	}
	var flags uint16
	if writable {
		flags = gntallocFlagWritable
	}
	arg := allocGrefArg(domid, flags, pages)
	if _, err := ioctl(uintptr(g.fd), ioctlGntallocAllocGref, unsafe.Pointer(&arg[0])); err != nil {
		return nil, fmt.Errorf("xen: grant %d pages to domain %d: %w", pages, domid, err)
	}
	p := &GrantedPages{fd: g.fd, fixed: at != nil, flags: flags}
	p.index, p.refs = allocGrefResult(arg, pages)
	mem, err := mmapAt(g.fd, p.index, pages*PageSize, unix.PROT_READ|unix.PROT_WRITE, at)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("xen: map %d granted pages: %w", pages, err), p.Close())
	}
	p.mem = mem
	return p, nil
}

// mmapAt maps length bytes of fd at offset index, at address at (MAP_FIXED)
// or, with at nil, where the kernel chooses.
func mmapAt(fd int, index uint64, length, prot int, at unsafe.Pointer) ([]byte, error) {
	if at == nil {
		return unix.Mmap(fd, int64(index), length, prot, unix.MAP_SHARED)
	}
	p, err := unix.MmapPtr(fd, int64(index), at, uintptr(length), prot, unix.MAP_SHARED|unix.MAP_FIXED)
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*byte)(p), length), nil
}

// unmapKeep ends a mapping: munmap, or for one placed at a caller's
// address (fixed), an inaccessible anonymous mapping in its place, which
// releases the device's pages and keeps the range reserved.
func unmapKeep(mem []byte, fixed bool) error {
	if !fixed {
		return unix.Munmap(mem)
	}
	_, err := unix.MmapPtr(-1, 0, unsafe.Pointer(&mem[0]), uintptr(len(mem)), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED)
	return err
}

// Regrant grants old's pages afresh to domain domid: new pages, granted
// as old's were, filled with old's contents and mapped in old's place
// (MAP_FIXED), so that the memory keeps its address; old's grants are
// revoked and old is spent. A domain restored from a save (xl restore)
// has a fresh grant table: its earlier grants are gone, and a front end
// grants its shared memory again this way.
//
// The copy and the remapping are not one step: a write to old's memory
// between them is lost. The caller stops its own writers first; writes
// by others (an application's to a buffer it maps) are its contract's.
func (g *Gntalloc) Regrant(old *GrantedPages, domid uint16) (*GrantedPages, error) {
	if old.mem == nil || old.refs == nil {
		return nil, errors.New("xen: regrant: the pages were closed")
	}
	pages := len(old.refs)
	arg := allocGrefArg(domid, old.flags, pages)
	if _, err := ioctl(uintptr(g.fd), ioctlGntallocAllocGref, unsafe.Pointer(&arg[0])); err != nil {
		return nil, fmt.Errorf("xen: grant %d pages to domain %d again: %w", pages, domid, err)
	}
	p := &GrantedPages{fd: g.fd, fixed: old.fixed, flags: old.flags}
	p.index, p.refs = allocGrefResult(arg, pages)
	tmp, err := unix.Mmap(g.fd, int64(p.index), pages*PageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("xen: map %d regranted pages: %w", pages, err), p.Close())
	}
	copy(tmp, old.mem)
	mem, err := mmapAt(g.fd, p.index, pages*PageSize, unix.PROT_READ|unix.PROT_WRITE, unsafe.Pointer(&old.mem[0]))
	if uerr := unix.Munmap(tmp); err == nil && uerr != nil {
		err = uerr
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("xen: map %d regranted pages in place: %w", pages, err), p.Close())
	}
	p.mem = mem
	old.mem = nil // replaced: its mapping is gone, the range is p's
	return p, old.Close()
}

// Refs returns the grant references, one per page, in order.
func (p *GrantedPages) Refs() []uint32 { return append([]uint32(nil), p.refs...) }

// Mem returns the pages' memory.
func (p *GrantedPages) Mem() []byte { return p.mem }

// SetUnmapNotify arms the kernel to act when these pages are released
// (this process exits or closes them): action is UnmapNotifyClearByte to
// clear the byte at offset off of the pages and/or UnmapNotifySendEvent to
// send an event on local port (an Evtchn's Port). A split driver arms it
// on a liveness byte, so that the other end learns when this one is gone.
func (p *GrantedPages) SetUnmapNotify(off int, action, port uint32) error {
	n := gntallocUnmapNotify{Index: p.index + uint64(off), Action: action, EventChannelPort: port}
	if _, err := ioctl(uintptr(p.fd), ioctlGntallocSetUnmapNotify, unsafe.Pointer(&n)); err != nil {
		return fmt.Errorf("xen: gntalloc unmap notification: %w", err)
	}
	return nil
}

// Close unmaps the pages and revokes the grants (the kernel frees each
// page once the other domain unmapped it too).
func (p *GrantedPages) Close() error {
	var errs []error
	if p.mem != nil {
		errs = append(errs, unmapKeep(p.mem, p.fixed))
		p.mem = nil
	}
	if p.refs != nil {
		d := gntallocDeallocGref{Index: p.index, Count: uint32(len(p.refs))}
		if _, err := ioctl(uintptr(p.fd), ioctlGntallocDeallocGref, unsafe.Pointer(&d)); err != nil {
			errs = append(errs, fmt.Errorf("xen: revoke %d grants: %w", len(p.refs), err))
		}
		p.refs = nil
	}
	return errors.Join(errs...)
}

// Gntdev maps pages other domains granted: dom0's side of grant sharing
// (/dev/xen/gntdev).
type Gntdev struct{ fd int }

// OpenGntdev opens dir/gntdev (dir "" is DevDir).
func OpenGntdev(dir string) (*Gntdev, error) {
	fd, err := openDev(dir, "gntdev", 0)
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
	fixed bool // mapped at the caller's address (MapAt)
}

// Map maps the pages domain domid granted under refs, in order, read-write
// or read-only. The references come from the other domain and are checked:
// a reserved one (below GrantRefFirst) is refused.
func (g *Gntdev) Map(domid uint16, refs []uint32, writable bool) (*GrantMapping, error) {
	return g.MapAt(domid, refs, writable, nil)
}

// MapAt is Map with the pages mapped at address at (nil: anywhere),
// replacing what was mapped there (MAP_FIXED): the caller reserves the
// range, e.g. to lay several mappings out next to one another. Close then
// leaves the range reserved (inaccessible) rather than unmapped.
func (g *Gntdev) MapAt(domid uint16, refs []uint32, writable bool, at unsafe.Pointer) (*GrantMapping, error) {
	if err := checkGrantCount(len(refs)); err != nil {
		return nil, err
	}
	if domid >= DomidFirstReserved {
		return nil, fmt.Errorf("xen: map grants of domain %d: not an ordinary domain", domid)
	}
	for _, r := range refs {
		if r < GrantRefFirst {
			return nil, fmt.Errorf("xen: map grants of domain %d: reference %d is reserved", domid, r)
		}
	}
	arg := mapGrantRefArg(domid, refs)
	if _, err := ioctl(uintptr(g.fd), ioctlGntdevMapGrantRef, unsafe.Pointer(&arg[0])); err != nil {
		return nil, fmt.Errorf("xen: map %d grants of domain %d: %w", len(refs), domid, err)
	}
	m := &GrantMapping{fd: g.fd, index: mapGrantRefIndex(arg), count: len(refs), fixed: at != nil}
	prot := unix.PROT_READ
	if writable {
		prot |= unix.PROT_WRITE // gntdev maps read-only grants where PROT_WRITE is absent
	}
	mem, err := mmapAt(g.fd, m.index, len(refs)*PageSize, prot, at)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("xen: map %d grants of domain %d: %w", len(refs), domid, err), m.Close())
	}
	m.mem = mem
	return m, nil
}

// Mem returns the mapped pages.
func (m *GrantMapping) Mem() []byte { return m.mem }

// SetUnmapNotify arms the kernel to act when this mapping goes (this
// process exits or closes it): action is UnmapNotifyClearByte to clear the
// byte at offset off of the granting domain's pages and/or
// UnmapNotifySendEvent to send an event on local port (an Evtchn's Port).
func (m *GrantMapping) SetUnmapNotify(off int, action, port uint32) error {
	n := gntdevUnmapNotify{Index: m.index + uint64(off), Action: action, EventChannelPort: port}
	if _, err := ioctl(uintptr(m.fd), ioctlGntdevSetUnmapNotify, unsafe.Pointer(&n)); err != nil {
		return fmt.Errorf("xen: gntdev unmap notification: %w", err)
	}
	return nil
}

// Close unmaps the pages and releases the grants.
func (m *GrantMapping) Close() error {
	var errs []error
	if m.mem != nil {
		errs = append(errs, unmapKeep(m.mem, m.fixed)) // before the ioctl, which fails on mapped pages
		m.mem = nil
	}
	if m.count > 0 {
		u := gntdevUnmapGrantRef{Index: m.index, Count: uint32(m.count)}
		if _, err := ioctl(uintptr(m.fd), ioctlGntdevUnmapGrantRef, unsafe.Pointer(&u)); err != nil {
			errs = append(errs, fmt.Errorf("xen: unmap %d grants: %w", m.count, err))
		}
		m.count = 0
	}
	return errors.Join(errs...)
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
