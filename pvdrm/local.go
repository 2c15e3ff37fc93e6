package pvdrm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/ipc"
)

// Local is the local transport: the ring in a sealed memfd both processes
// map, and one eventfd per direction for notifications. It is what the
// harness, the tests and the benchmarks use on a machine without Xen (the
// xen transport shares the ring page by grant reference and notifies by
// event channel instead).
type Local struct {
	mem     []byte
	ring    *os.File
	out, in *os.File // eventfds: this end writes out and waits on in
}

// ResumesHandoff reports that the front end comes back by itself after a
// saved Bye (a handoff of the daemon included): it dials again with the
// same ring and GART heap.
func (l *Local) ResumesHandoff() bool { return true }

// Ring size limits (pages of 4 KiB).
const (
	MinRingPages = 1
	MaxRingPages = 16
	pageSize     = 4096
)

// NewLocalFront creates the ring memory (pages × 4 KiB, sealed so neither
// side can resize it under the other's mapping) and the two eventfds. Its
// Files go to the back end (over a Unix socket).
func NewLocalFront(pages int) (*Local, error) {
	if pages < MinRingPages || pages > MaxRingPages {
		return nil, fmt.Errorf("pvdrm local: %d ring pages, want %d..%d", pages, MinRingPages, MaxRingPages)
	}
	l := &Local{}
	var err error
	if l.ring, err = ipc.CreateMemfd("gpuvm-pvdrm-ring", uint64(pages*pageSize)); err != nil {
		return nil, err
	}
	for _, f := range []**os.File{&l.out, &l.in} {
		fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("pvdrm local: eventfd: %w", err), l.Close())
		}
		*f = os.NewFile(uintptr(fd), "eventfd")
	}
	if l.mem, err = unix.Mmap(int(l.ring.Fd()), 0, pages*pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return nil, errors.Join(fmt.Errorf("pvdrm local: map ring: %w", err), l.Close())
	}
	return l, nil
}

// Files returns what the back end needs: the ring memfd, the front-to-back
// eventfd and the back-to-front eventfd. The caller must not close them
// while the transport is in use.
func (l *Local) Files() []*os.File { return []*os.File{l.ring, l.out, l.in} }

// AttachLocalBack attaches the back end to files a front end sent: it
// checks each is what it must be (a sealed read-write memfd of whole pages
// within the limits, two eventfds) before mapping anything. It takes
// ownership of the files.
func AttachLocalBack(files []*os.File) (*Local, error) {
	if len(files) != 3 {
		return nil, fmt.Errorf("pvdrm local: want 3 files (ring, to-back, to-front), got %d", len(files))
	}
	l := &Local{ring: files[0], in: files[1], out: files[2]}
	size, err := ipc.CheckMemfd(int(l.ring.Fd()), "pvdrm ring", pageSize)
	if err == nil && (size%pageSize != 0 || size > MaxRingPages*pageSize) {
		err = fmt.Errorf("pvdrm ring memfd of %d bytes: want whole pages, at most %d", size, MaxRingPages)
	}
	for _, f := range []*os.File{l.in, l.out} {
		if err == nil {
			err = checkEventfd(f)
		}
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("pvdrm local: %w", err), l.Close())
	}
	if l.mem, err = unix.Mmap(int(l.ring.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return nil, errors.Join(fmt.Errorf("pvdrm local: map ring: %w", err), l.Close())
	}
	return l, nil
}

// checkEventfd refuses a file that is not an eventfd.
func checkEventfd(f *os.File) error {
	link, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", f.Fd()))
	if err != nil {
		return fmt.Errorf("notification fd: %w", err)
	}
	if !strings.Contains(link, "[eventfd]") {
		return fmt.Errorf("notification fd is not an eventfd (it is %q)", link)
	}
	return nil
}

// Ring returns the shared ring memory.
func (l *Local) Ring() []byte { return l.mem }

// Notify kicks the other end.
func (l *Local) Notify() error {
	var one [8]byte
	one[0] = 1
	if _, err := unix.Write(int(l.out.Fd()), one[:]); err != nil && !errors.Is(err, unix.EAGAIN) {
		return fmt.Errorf("pvdrm local: notify: %w", err)
	}
	return nil // EAGAIN: the counter is saturated, a kick is pending anyway
}

// Wait blocks until the other end kicked (consuming the kicks), ctx is
// done, or max passes (then it returns nil: callers re-check the ring, as
// after any wake-up).
func (l *Local) Wait(ctx context.Context, max time.Duration) error {
	deadline := time.Now().Add(max)
	fd := int(l.in.Fd())
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(pfd, int(min(left, 50*time.Millisecond)/time.Millisecond)+1)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("pvdrm local: wait: %w", err)
		}
		if n > 0 {
			var buf [8]byte
			_, _ = unix.Read(fd, buf[:]) // resets the counter
			return nil
		}
	}
}

// Close unmaps the ring and closes the files.
func (l *Local) Close() error {
	var errs []error
	if l.mem != nil {
		errs = append(errs, unix.Munmap(l.mem))
		l.mem = nil
	}
	for _, f := range []*os.File{l.ring, l.out, l.in} {
		if f != nil {
			errs = append(errs, f.Close())
		}
	}
	l.ring, l.out, l.in = nil, nil, nil
	return errors.Join(errs...)
}

// Shares maps the pages a GEM_MMAP shared into the front end.
type Shares interface {
	// Map maps pages pages of the share at offset (GEM_MMAP's results).
	Map(share, pages uint32, offset uint64) ([]byte, error)
	// Unmap ends a mapping Map returned.
	Unmap(b []byte) error
}

// LocalShares maps shares of the local transport: ranges of the front
// end's GART memfd, whose offset GEM_MMAP names. With keep set (the back
// end pools buffers), an unmapped range stays mapped for reuse, up to a
// bound, as a pooled buffer's pages stay shared.
type LocalShares struct {
	fd   int
	size uint64
	keep bool

	mu     sync.Mutex
	offset map[*byte]uint64 // live mappings: their offsets
	cache  []cachedShare    // kept mappings, most recently unmapped last
	bytes  uint64
	maps   uint64
}

type cachedShare struct {
	off uint64
	b   []byte
}

// Bounds of the mappings LocalShares keeps.
const (
	keptShareBytes = 256 << 20
	keptShares     = 64
)

// NewLocalShares maps shares of the GART memfd gartFd (size bytes; it must stay open); keep says whether to keep
// unmapped ranges mapped for reuse.
func NewLocalShares(gartFd int, size uint64, keep bool) *LocalShares {
	return &LocalShares{fd: gartFd, size: size, keep: keep, offset: map[*byte]uint64{}}
}

// Mappings returns how many ranges were mapped (shares the front end took).
func (s *LocalShares) Mappings() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maps
}

// Map maps the range (a kept mapping of the same range is reused).
func (s *LocalShares) Map(_ uint32, pages uint32, offset uint64) ([]byte, error) {
	n := uint64(pages) * pageSize
	if pages == 0 || offset%pageSize != 0 || offset > s.size || n > s.size-offset {
		return nil, fmt.Errorf("pvdrm local: share of %d pages at %#x outside the %d-byte GART heap", pages, offset, s.size)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, c := range s.cache {
		if c.off == offset && uint64(len(c.b)) == n {
			s.cache = append(s.cache[:i], s.cache[i+1:]...)
			s.bytes -= n
			s.offset[&c.b[0]] = offset
			return c.b, nil
		}
	}
	// MAP_POPULATE maps every page at once, as a grant mapping does.
	b, err := unix.Mmap(s.fd, int64(offset), int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("pvdrm local: map share: %w", err)
	}
	s.maps++
	s.offset[&b[0]] = offset
	return b, nil
}

// Unmap unmaps b, or keeps it for reuse.
func (s *LocalShares) Unmap(b []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	off, ok := s.offset[&b[0]]
	if !ok {
		return errors.New("pvdrm local: unmap of a range not mapped")
	}
	delete(s.offset, &b[0])
	if !s.keep {
		return unix.Munmap(b)
	}
	s.cache = append(s.cache, cachedShare{off: off, b: b})
	s.bytes += uint64(len(b))
	var errs []error
	for len(s.cache) > keptShares || s.bytes > keptShareBytes {
		errs = append(errs, unix.Munmap(s.cache[0].b))
		s.bytes -= uint64(len(s.cache[0].b))
		s.cache = s.cache[1:]
	}
	return errors.Join(errs...)
}

// Close unmaps every kept mapping.
func (s *LocalShares) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, c := range s.cache {
		errs = append(errs, unix.Munmap(c.b))
	}
	s.cache, s.bytes = nil, 0
	return errors.Join(errs...)
}
