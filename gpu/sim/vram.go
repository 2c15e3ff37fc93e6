package sim

import (
	"fmt"
	"os"
	"sort"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// vram is the board's device memory: sparse memfds mapped shared, one after
// the other in a single contiguous mapping. Pages cost host memory only once
// written; ScrubVRAM punches them out again. With several segments, each is
// its own memfd, so one segment (a VM's slice) can be handed to another
// process without exposing the rest. The mapping is accessed without locks
// (like real memory, concurrent device and CPU accesses are the driver's
// business).
type vram struct {
	mem  []byte
	mu   sync.Mutex // guards segs' file descriptors (RenewVRAMSegment replaces them)
	segs []segment
}

// segment is one memfd-backed part of VRAM.
type segment struct {
	base, size uint64
	fd         int
}

// newVRAM maps size bytes of VRAM made of segments of the given sizes (one
// segment of the whole size when sizes is empty): new memfds, or — fds
// not nil, one per segment — memfds another board left (NewOver), which
// the vram then owns.
func newVRAM(size uint64, sizes []uint64, fds []int) (v *vram, err error) {
	adopted := 0 // fds[:adopted] belong to v's segments
	defer func() {
		if err != nil {
			for _, fd := range fds[min(adopted, len(fds)):] {
				unix.Close(fd)
			}
		}
	}()
	if len(sizes) == 0 {
		sizes = []uint64{size}
	}
	var sum uint64
	for _, n := range sizes {
		if n == 0 || n%nvc0.PageSize != 0 {
			return nil, fmt.Errorf("vram segment of %#x bytes: not a positive page multiple", n)
		}
		sum += n
	}
	if sum != size {
		return nil, fmt.Errorf("vram segments add up to %#x, not %#x", sum, size)
	}
	// Reserve the address range, then map each segment's memfd over its part.
	mem, err := unix.Mmap(-1, 0, int(size), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("vram reserve %d: %w", size, err)
	}
	if fds != nil && len(fds) != len(sizes) {
		_ = unix.Munmap(mem)
		return nil, fmt.Errorf("vram of %d segments over %d memfds", len(sizes), len(fds))
	}
	v = &vram{mem: mem}
	defer func() {
		if err != nil {
			v.close()
		}
	}()
	var base uint64
	for i, n := range sizes {
		var fd int
		var err error
		if fds == nil {
			fd, err = v.mapSegment(base, n)
		} else {
			adopted++ // adoptSegment owns it, also on error
			fd, err = v.adoptSegment(base, n, fds[i])
		}
		if err != nil {
			return v, err
		}
		v.segs = append(v.segs, segment{base: base, size: n, fd: fd})
		base += n
	}
	return v, nil
}

// mapSegment creates a sealed memfd of n bytes and maps it over
// [base, base+n) of the VRAM view, replacing whatever was mapped there.
func (v *vram) mapSegment(base, n uint64) (int, error) {
	fd, err := unix.MemfdCreate("gpuvm-vram", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, fmt.Errorf("vram memfd: %w", err)
	}
	fail := func(err error) (int, error) {
		unix.Close(fd)
		return -1, err
	}
	if err := unix.Ftruncate(fd, int64(n)); err != nil {
		return fail(fmt.Errorf("vram ftruncate %d: %w", n, err))
	}
	// Whoever maps a segment (a device model, for BAR remap) must not be
	// able to shrink it under the board.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		return fail(fmt.Errorf("vram seal: %w", err))
	}
	addr := uintptr(unsafe.Pointer(&v.mem[base]))
	if _, _, errno := unix.Syscall6(unix.SYS_MMAP, addr, uintptr(n), unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_SHARED|unix.MAP_FIXED|unix.MAP_NORESERVE, uintptr(fd), 0); errno != 0 {
		return fail(fmt.Errorf("vram mmap segment %#x+%#x: %w", base, n, errno))
	}
	return fd, nil
}

// adoptSegment maps fd, a memfd another board backed a segment with, over
// [base, base+n) of the VRAM view. It must be exactly n bytes and sealed as
// mapSegment seals it (no one can shrink it under the board). The vram
// owns it from here, also on error.
func (v *vram) adoptSegment(base, n uint64, fd int) (int, error) {
	fail := func(err error) (int, error) {
		unix.Close(fd)
		return -1, fmt.Errorf("vram segment %#x+%#x over memfd %d: %w", base, n, fd, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fail(err)
	}
	if uint64(st.Size) != n {
		return fail(fmt.Errorf("the memfd is %d bytes", st.Size))
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return fail(fmt.Errorf("not a memfd: %w", err))
	}
	if want := unix.F_SEAL_SHRINK | unix.F_SEAL_GROW; seals&want != want {
		return fail(fmt.Errorf("seals %#x: want shrink and grow sealed", seals))
	}
	unix.CloseOnExec(fd)
	addr := uintptr(unsafe.Pointer(&v.mem[base]))
	if _, _, errno := unix.Syscall6(unix.SYS_MMAP, addr, uintptr(n), unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_SHARED|unix.MAP_FIXED|unix.MAP_NORESERVE, uintptr(fd), 0); errno != 0 {
		return fail(fmt.Errorf("mmap: %w", errno))
	}
	return fd, nil
}

func (v *vram) close() error {
	var first error
	if v.mem != nil {
		first = unix.Munmap(v.mem)
		v.mem = nil
	}
	for _, s := range v.segs {
		if err := unix.Close(s.fd); err != nil && first == nil {
			first = err
		}
	}
	v.segs = nil
	if first != nil {
		return fmt.Errorf("vram release: %w", first)
	}
	return nil
}

// segmentAt returns the segment holding off.
func (v *vram) segmentAt(off uint64) segment {
	v.mu.Lock()
	defer v.mu.Unlock()
	i := sort.Search(len(v.segs), func(i int) bool { return v.segs[i].base+v.segs[i].size > off })
	return v.segs[i]
}

// inRange reports whether [off, off+n) lies inside VRAM.
func (v *vram) inRange(off, n uint64) bool {
	size := uint64(len(v.mem))
	return off <= size && n <= size-off
}

// punch returns the pages of [lo, hi) (page aligned) to the host, segment by
// segment; it reports false if the filesystem cannot punch holes.
func (v *vram) punch(lo, hi uint64) bool {
	for lo < hi {
		s := v.segmentAt(lo)
		end := min(hi, s.base+s.size)
		if unix.Fallocate(s.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, int64(lo-s.base), int64(end-lo)) != nil {
			return false
		}
		lo = end
	}
	return true
}

// VRAMSegmentFile returns a new *os.File on the memfd of the VRAM segment
// that is exactly [base, base+size) (see Config.VRAMSegments), for handing a
// VM's slice to its device model. The caller closes it.
func (b *Board) VRAMSegmentFile(base, size uint64) (*os.File, error) {
	b.vram.mu.Lock()
	defer b.vram.mu.Unlock()
	i, err := b.vram.segmentIndex(base, size)
	if err != nil {
		return nil, err
	}
	fd, err := unix.FcntlInt(uintptr(b.vram.segs[i].fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("sim: VRAM segment: %w", err)
	}
	return os.NewFile(uintptr(fd), "gpuvm-vram-segment"), nil
}

// VRAMSegmentFiles returns a new *os.File on each VRAM segment's memfd,
// in order (Config.VRAMSegments; one when VRAM is not split): what a board
// built over them (NewOver) takes as its VRAM. The caller closes them.
func (b *Board) VRAMSegmentFiles() ([]*os.File, error) {
	b.vram.mu.Lock()
	defer b.vram.mu.Unlock()
	out := make([]*os.File, 0, len(b.vram.segs))
	for _, s := range b.vram.segs {
		fd, err := unix.FcntlInt(uintptr(s.fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			for _, f := range out {
				f.Close()
			}
			return nil, fmt.Errorf("sim: VRAM segment %#x: %w", s.base, err)
		}
		out = append(out, os.NewFile(uintptr(fd), fmt.Sprintf("gpuvm-vram-%#x", s.base)))
	}
	return out, nil
}

// RenewVRAMSegment gives the segment [base, base+size) fresh, zeroed
// backing: a new memfd mapped over the range. Processes that mapped the old
// one (a departed VM's device model) keep only orphaned pages that are no
// longer VRAM, so a slot can pass to the next tenant without the previous
// one reaching it. Nothing on the board may be using the range.
func (b *Board) RenewVRAMSegment(base, size uint64) error {
	if !b.enter() {
		return errClosed
	}
	defer b.leave()
	defer b.chargeFrom(time.Now(), int64(perSec(size, b.timing.VRAMBytesPerSec))) // a scrub, as ScrubVRAM
	b.vram.mu.Lock()
	defer b.vram.mu.Unlock()
	i, err := b.vram.segmentIndex(base, size)
	if err != nil {
		return err
	}
	fd, err := b.vram.mapSegment(base, size)
	if err != nil {
		return fmt.Errorf("sim: renew VRAM segment: %w", err)
	}
	old := b.vram.segs[i].fd
	b.vram.segs[i].fd = fd
	if err := unix.Close(old); err != nil {
		return fmt.Errorf("sim: renew VRAM segment: close old: %w", err)
	}
	return nil
}

// segmentIndex finds the segment that is exactly [base, base+size).
// Callers hold v.mu.
func (v *vram) segmentIndex(base, size uint64) (int, error) {
	for i := range v.segs {
		if s := &v.segs[i]; s.base == base && s.size == size {
			return i, nil
		}
	}
	return 0, fmt.Errorf("sim: no VRAM segment is exactly [%#x, +%#x)", base, size)
}

// VRAMFd returns the memfd that backs the first VRAM segment (all of VRAM
// unless Config.VRAMSegments split it). The board owns it; Close closes it.
func (b *Board) VRAMFd() int {
	b.vram.mu.Lock()
	defer b.vram.mu.Unlock()
	return b.vram.segs[0].fd
}

// ReadVRAM copies VRAM at off into p (host-side access, bypassing the
// MMU). It costs what uncached reads through a BAR mapping cost: the timing
// model's MMIOReadNs per 32-bit word.
func (b *Board) ReadVRAM(p []byte, off uint64) error {
	if !b.enter() {
		return errClosed
	}
	defer b.leave()
	if b.busLost.Load() {
		return ErrBusLost
	}
	defer b.chargeFrom(time.Now(), int64(b.timing.hostAccess(len(p), false)))
	if !b.vram.inRange(off, uint64(len(p))) {
		return fmt.Errorf("sim: read VRAM [%#x, +%#x): beyond %#x", off, len(p), b.cfg.VRAMSize)
	}
	copy(p, b.vram.mem[off:])
	return nil
}

// WriteVRAM copies p into VRAM at off (host-side access, bypassing the
// MMU), at the timing model's MMIOWriteNs per 32-bit word.
func (b *Board) WriteVRAM(p []byte, off uint64) error {
	if !b.enter() {
		return errClosed
	}
	defer b.leave()
	if b.busLost.Load() {
		return ErrBusLost
	}
	defer b.chargeFrom(time.Now(), int64(b.timing.hostAccess(len(p), true)))
	if !b.vram.inRange(off, uint64(len(p))) {
		return fmt.Errorf("sim: write VRAM [%#x, +%#x): beyond %#x", off, len(p), b.cfg.VRAMSize)
	}
	copy(b.vram.mem[off:], p)
	return nil
}

// ScrubVRAM zeroes [off, off+n). Whole pages are punched out of the memfd
// (returning their host memory); partial pages at the ends are cleared. It
// costs a GPU-side clear: n bytes at the VRAM bandwidth.
func (b *Board) ScrubVRAM(off, n uint64) error {
	if !b.enter() {
		return errClosed
	}
	defer b.leave()
	if b.busLost.Load() {
		return ErrBusLost
	}
	defer b.chargeFrom(time.Now(), int64(perSec(n, b.timing.VRAMBytesPerSec)))
	if !b.vram.inRange(off, n) {
		return fmt.Errorf("sim: scrub VRAM [%#x, +%#x): beyond %#x", off, n, b.cfg.VRAMSize)
	}
	end := off + n
	lo := (off + nvc0.PageSize - 1) &^ (nvc0.PageSize - 1)
	hi := end &^ (nvc0.PageSize - 1)
	if lo >= hi {
		clear(b.vram.mem[off:end])
		return nil
	}
	clear(b.vram.mem[off:lo])
	clear(b.vram.mem[hi:end])
	if !b.vram.punch(lo, hi) {
		// A filesystem without hole punching still gets the right contents.
		clear(b.vram.mem[lo:hi])
	}
	return nil
}

// VRAMResident returns how many bytes of the VRAM segment that is exactly
// [base, base+size) hold pages: the VRAM its tenant has written since the
// segment was last scrubbed or renewed (memfd pages are allocated on first
// write and punched out by scrubbing).
func (b *Board) VRAMResident(base, size uint64) (uint64, error) {
	b.vram.mu.Lock()
	defer b.vram.mu.Unlock()
	i, err := b.vram.segmentIndex(base, size)
	if err != nil {
		return 0, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(b.vram.segs[i].fd, &st); err != nil {
		return 0, fmt.Errorf("sim: VRAM segment: %w", err)
	}
	return uint64(st.Blocks) * 512, nil
}
