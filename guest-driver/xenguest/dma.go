package xenguest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/gpu/hostmem"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
	"github.com/gpuvm/gpuvm/internal/rangealloc"
)

// DefaultIOMem is the kernel's map of the physical address space.
const DefaultIOMem = "/proc/iomem"

// DMAConfig says which guest RAM the driver may give the GPU.
type DMAConfig struct {
	// Base and Size are the guest-physical range, page aligned; the guest
	// kernel must have been booted with memmap=Size$Base (MemmapParam) so
	// that it never uses the range itself.
	Base, Size uint64
	// DevMem is the physical-memory device (default DefaultDevMem).
	DevMem string
	// IOMem is the kernel's resource map (default DefaultIOMem), read to
	// check that the range is reserved and not System RAM. A map that
	// cannot be read, or that hides its addresses (read without
	// CAP_SYS_ADMIN they are all 0), is not checked (Logger says so).
	IOMem string
	// Logger receives the warning when IOMem cannot be checked.
	Logger *slog.Logger
}

// DMA is the reserved guest RAM range, mapped, with a page allocator: the
// driver's DMA memory (nouveau.HostMemory). A buffer's Bus address is its
// guest-physical address. Safe for concurrent use.
type DMA struct {
	mem   []byte
	base  uint64
	alloc *rangealloc.Allocator
	// Checked tells whether the range was found reserved in the kernel's
	// resource map (false: the map could not be read).
	Checked bool
}

var _ nouveau.HostMemory = (*DMA)(nil)

// CheckRange validates a DMA range: page-aligned base and size, size > 0,
// no overflow.
func CheckRange(base, size uint64) error {
	switch {
	case size == 0:
		return fmt.Errorf("DMA range at %#x: zero size", base)
	case base%nvc0.PageSize != 0 || size%nvc0.PageSize != 0:
		return fmt.Errorf("DMA range %#x+%#x: base and size must be multiples of %d KiB", base, size, nvc0.PageSize>>10)
	case base+size < base:
		return fmt.Errorf("DMA range %#x+%#x: overflows", base, size)
	}
	return nil
}

// OpenDMA checks the range against the kernel's resource map and maps it
// from /dev/mem, shared (cached: it is RAM, and Xen's device model maps
// the same frames).
func OpenDMA(cfg DMAConfig) (*DMA, error) {
	if cfg.DevMem == "" {
		cfg.DevMem = DefaultDevMem
	}
	if cfg.IOMem == "" {
		cfg.IOMem = DefaultIOMem
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if err := CheckRange(cfg.Base, cfg.Size); err != nil {
		return nil, err
	}
	checked := false
	switch f, err := os.Open(cfg.IOMem); {
	case err == nil:
		err = CheckIOMem(f, cfg.Base, cfg.Size)
		f.Close()
		switch {
		case errors.Is(err, ErrIOMemHidden):
			cfg.Logger.Warn("cannot check that the DMA range is reserved", "iomem", cfg.IOMem, "reason", err)
		case err != nil:
			return nil, fmt.Errorf("%s: %w", cfg.IOMem, err)
		default:
			checked = true
		}
	case errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission):
		cfg.Logger.Warn("cannot check that the DMA range is reserved", "iomem", cfg.IOMem, "reason", err)
	default:
		return nil, err
	}
	mem, err := mapShared(cfg.DevMem, cfg.Base, cfg.Size, false)
	if err != nil {
		return nil, fmt.Errorf("DMA range: %w", err)
	}
	return &DMA{mem: mem, base: cfg.Base, alloc: rangealloc.New(cfg.Base, cfg.Size), Checked: checked}, nil
}

// Alloc returns a zeroed, page-aligned buffer of at least size bytes.
func (d *DMA) Alloc(size uint64) (hostmem.Buffer, error) {
	if size == 0 || size > uint64(len(d.mem)) {
		return hostmem.Buffer{}, fmt.Errorf("DMA memory: alloc of %#x bytes from a %#x-byte range", size, len(d.mem))
	}
	size = (size + nvc0.PageSize - 1) &^ (nvc0.PageSize - 1)
	bus, err := d.alloc.Alloc(size, nvc0.PageSize)
	if err != nil {
		return hostmem.Buffer{}, fmt.Errorf("DMA memory (%s): %w", MemmapParam(d.base, uint64(len(d.mem))), err)
	}
	off := bus - d.base
	b := d.mem[off : off+size : off+size]
	clear(b)
	return hostmem.Buffer{Bytes: b, Bus: bus}, nil
}

// Free returns a buffer to the range.
func (d *DMA) Free(b hostmem.Buffer) error {
	if b.Bus < d.base || b.Bus-d.base >= uint64(len(d.mem)) {
		return fmt.Errorf("DMA memory: free of foreign buffer at %#x", b.Bus)
	}
	return d.alloc.Free(b.Bus)
}

// Base returns the guest-physical address of the range.
func (d *DMA) Base() uint64 { return d.base }

// Size returns the size of the range.
func (d *DMA) Size() uint64 { return uint64(len(d.mem)) }

// FreeBytes returns how much of the range is not allocated.
func (d *DMA) FreeBytes() uint64 { return d.alloc.FreeBytes() }

// Close unmaps the range.
func (d *DMA) Close() error {
	if d.mem == nil {
		return nil
	}
	err := unix.Munmap(d.mem)
	d.mem = nil
	if err != nil {
		return fmt.Errorf("DMA range: munmap: %w", err)
	}
	return nil
}

// MemmapParam is the kernel command-line parameter that reserves a range:
// memmap=SIZE$BASE (size in the largest unit that divides it). In a GRUB
// configuration the $ must be written \$.
func MemmapParam(base, size uint64) string {
	s := strconv.FormatUint(size, 10)
	for _, u := range []struct {
		suffix string
		shift  uint
	}{{"G", 30}, {"M", 20}, {"K", 10}} {
		if size != 0 && size%(1<<u.shift) == 0 {
			s = strconv.FormatUint(size>>u.shift, 10) + u.suffix
			break
		}
	}
	return fmt.Sprintf("memmap=%s$%#x", s, base)
}

// ErrIOMemHidden is CheckIOMem's answer for a resource map whose addresses
// are all 0: Linux shows them only to CAP_SYS_ADMIN.
var ErrIOMemHidden = errors.New("the resource map hides its addresses (read it as root)")

// iomemEntry is one line of /proc/iomem.
type iomemEntry struct {
	start, end uint64 // inclusive
	name       string
	depth      int
}

// CheckIOMem checks, against the kernel's resource map (/proc/iomem: lines
// "start-end : name", nested by indentation), that [base, base+size) is
// wholly inside one entry named Reserved (what memmap=SIZE$BASE makes of
// it) and that nothing else claims any of it: no System RAM (the kernel
// would allocate it) and no entry nested in the Reserved one (a driver
// uses it).
func CheckIOMem(r io.Reader, base, size uint64) error {
	if err := CheckRange(base, size); err != nil {
		return err
	}
	last := base + size - 1
	var ents []iomemEntry
	nonzero := false
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			continue
		}
		body := strings.TrimLeft(line, " ")
		rng, name, ok := strings.Cut(body, " : ")
		lo, hi, ok2 := strings.Cut(rng, "-")
		if !ok || !ok2 {
			return fmt.Errorf("resource map line %q: want start-end : name", line)
		}
		var e iomemEntry
		var err1, err2 error
		e.start, err1 = strconv.ParseUint(lo, 16, 64)
		e.end, err2 = strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil {
			return fmt.Errorf("resource map line %q: bad address", line)
		}
		e.name, e.depth = strings.TrimSpace(name), (len(line)-len(body))/2
		nonzero = nonzero || e.start != 0 || e.end != 0
		ents = append(ents, e)
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("resource map: %w", err)
	}
	if !nonzero {
		return ErrIOMemHidden
	}
	param := MemmapParam(base, size)
	overlaps := func(e iomemEntry) bool { return e.start <= last && e.end >= base }
	for _, e := range ents {
		if overlaps(e) && strings.EqualFold(e.name, "System RAM") {
			return fmt.Errorf("DMA range %#x-%#x overlaps System RAM %#x-%#x: the guest kernel uses it; boot the guest with %s on its command line to reserve it",
				base, last, e.start, e.end, param)
		}
	}
	for i, e := range ents {
		if !strings.EqualFold(e.name, "Reserved") || e.start > base || e.end < last {
			continue
		}
		// Entries nested in it follow it, deeper.
		for _, c := range ents[i+1:] {
			if c.depth <= e.depth {
				break
			}
			if overlaps(c) {
				return fmt.Errorf("DMA range %#x-%#x: %#x-%#x of it is claimed by %q", base, last, c.start, c.end, c.name)
			}
		}
		return nil
	}
	// memmap=SIZE$BASE changes the kernel's own e820 map, but the resource
	// map is built from the firmware's: the reserved range shows as a gap
	// between System RAM entries (seen in a PVH guest of Xen 4.17 with
	// Linux 6.1). A range nothing at all claims is therefore accepted;
	// whether guest RAM backs it cannot be told from here.
	for _, e := range ents {
		if overlaps(e) {
			return fmt.Errorf("DMA range %#x-%#x overlaps %q %#x-%#x, not a reserved range of guest RAM: boot the guest with %s on its command line (it must lie in guest RAM, e.g. below the guest's memory size)",
				base, last, e.name, e.start, e.end, param)
		}
	}
	return nil
}
