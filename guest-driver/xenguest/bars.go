package xenguest

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/gpuvm/gpuvm/gpu"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// DefaultDevMem is the physical-memory device the memory BARs (without
// sysfs) and the DMA range are mapped from.
const DefaultDevMem = "/dev/mem"

// NumBARs is the number of PCI BAR slots of a type 0 header.
const NumBARs = 6

// BAR is where one of the vGPU's BARs is.
type BAR struct {
	Index int    // PCI BAR index: nvc0.BAR0, BAR1, BAR3 or BAR5
	Base  uint64 // guest-physical address (memory BAR) or first I/O port (I/O BAR)
	Size  uint64 // bytes (or ports)
	IO    bool   // an I/O-port BAR
	// Flags are the kernel's resource flags (sysfs resource file), 0 for
	// a BAR given by hand.
	Flags uint64
}

func (b BAR) String() string {
	if b.IO {
		return fmt.Sprintf("BAR%d I/O ports %#x-%#x", b.Index, b.Base, b.Base+b.Size-1)
	}
	return fmt.Sprintf("BAR%d memory %#x-%#x (%d MiB)", b.Index, b.Base, b.Base+b.Size-1, b.Size>>20)
}

// window is one BAR's access path: a mapping of a memory BAR, or a range of
// I/O ports. Offsets are checked by BARs (inside the window, 4-byte
// aligned) before they reach it; each load32 or store32 is one 32-bit
// access instruction.
type window interface {
	load32(off uint64) uint32
	store32(off uint64, v uint32)
	size() uint64
	close() error
}

// filler is a window that can store one value into a run of words with
// one instruction; fill32 returns false if it cannot (the run is then
// written word by word).
type filler interface {
	fill32(off uint64, v uint32, n int) bool
}

// BARs is the vGPU's BARs as the guest reaches them: a gpu.MMIO whose every
// access is one 32-bit load or store instruction to the BAR (for a memory
// BAR) or one IN or OUT (for the I/O BAR), which traps to Xen, and a
// gpu.Filler whose fills of a memory BAR are one REP STOSL each. Like real
// MMIO an access cannot fail: one outside a BAR, unaligned, or to a BAR
// that is not mapped reads all-ones and writes nothing, and the first such
// access is kept as a sticky error (Err). BARs counts the accesses per BAR
// and the time spent in them (Stats). Safe for concurrent use; Close must
// not race with accesses (close the driver first).
type BARs struct {
	win  [NumBARs]window
	bars [NumBARs]BAR
	err  atomic.Pointer[error]

	reads, writes   [NumBARs]atomic.Uint64
	readNs, writeNs [NumBARs]atomic.Uint64
	fills, words    [NumBARs]atomic.Uint64
	fillNs          [NumBARs]atomic.Uint64
	bad             atomic.Uint64
	closed          atomic.Bool
}

var (
	_ gpu.MMIO   = (*BARs)(nil)
	_ gpu.Filler = (*BARs)(nil)
)

// MapOptions says where the memory BARs are mapped from.
type MapOptions struct {
	// SysfsDir is the PCI function's sysfs directory (Device.Dir): each
	// memory BAR N is mapped from its file resourceN. Empty: from DevMem at
	// the BAR's Base.
	SysfsDir string
	// DevMem is the physical-memory device (default DefaultDevMem).
	DevMem string
}

// OpenBARs maps the BARs given: memory BARs from sysfs or /dev/mem (opts),
// the I/O BAR by ioperm. Indices must be distinct, of the vGPU's layout
// (BAR0, BAR1 and BAR3 memory, BAR5 I/O: gpu/nvc0), with positive sizes; a
// memory BAR must be page aligned. A BAR not given stays unmapped (its
// accesses read all-ones). On error nothing stays mapped.
func OpenBARs(bars []BAR, opts MapOptions) (*BARs, error) {
	if opts.DevMem == "" {
		opts.DevMem = DefaultDevMem
	}
	b := &BARs{}
	for _, bar := range bars {
		if err := checkBAR(bar); err != nil {
			return nil, errors.Join(err, b.Close())
		}
		if b.win[bar.Index] != nil {
			return nil, errors.Join(fmt.Errorf("BAR%d given twice", bar.Index), b.Close())
		}
		var (
			w   window
			err error
		)
		switch {
		case bar.IO:
			if w, err = openPorts(bar.Base, bar.Size); err == nil {
				if f, ok := w.(interface{ onFail(func(error)) }); ok {
					f.onFail(b.fail)
				}
			}
		case opts.SysfsDir != "":
			w, err = mapFile(resourcePath(opts.SysfsDir, bar.Index), 0, bar.Size, false)
		default:
			// O_SYNC: the kernel maps /dev/mem uncached (UC-) with it, as a
			// register BAR wants; the accesses trap either way.
			w, err = mapFile(opts.DevMem, bar.Base, bar.Size, true)
		}
		if err != nil {
			return nil, errors.Join(fmt.Errorf("%v: %w", bar, err), b.Close())
		}
		b.win[bar.Index], b.bars[bar.Index] = w, bar
	}
	return b, nil
}

// OpenDevice maps a discovered vGPU's BARs from its sysfs resource files:
// BAR0, BAR1 and BAR3, and with ports BAR5 (by ioperm), which the
// para-virtual modes' hypercalls need and full virtualization does not.
// A device a kernel driver is bound to is refused: the guest driver must
// be the vGPU's only driver.
func OpenDevice(d *Device, ports bool) (*BARs, error) {
	if d.Driver != "" {
		return nil, fmt.Errorf("%s is bound to the kernel driver %s: unbind it first (echo %s > /sys/bus/pci/drivers/%s/unbind)", d.SBDF, d.Driver, d.SBDF, d.Driver)
	}
	want := []int{nvc0.BAR0, nvc0.BAR1, nvc0.BAR3}
	if ports {
		want = append(want, nvc0.BAR5)
	}
	var bars []BAR
	for _, i := range want {
		bar, ok := d.BAR(i)
		if !ok {
			return nil, fmt.Errorf("%s: the resource file lists no BAR%d", d.SBDF, i)
		}
		bars = append(bars, bar)
	}
	b, err := OpenBARs(bars, MapOptions{SysfsDir: d.Dir})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", d.SBDF, err)
	}
	return b, nil
}

// checkBAR checks a BAR against the vGPU's layout.
func checkBAR(b BAR) error {
	want := nvc0.BARSize(b.Index)
	if want == 0 {
		return fmt.Errorf("BAR%d: the vGPU has no such BAR (it has BAR0, BAR1, BAR3 and BAR5)", b.Index)
	}
	if io := b.Index == nvc0.BAR5; io != b.IO {
		kind := map[bool]string{true: "an I/O", false: "a memory"}
		return fmt.Errorf("BAR%d: is %s BAR on the vGPU, given as %s BAR", b.Index, kind[io], kind[b.IO])
	}
	if b.Flags&(ResourceUnset|ResourceDisabled) != 0 {
		return fmt.Errorf("BAR%d: not placed (resource flags %#x): the guest's firmware assigned it no address", b.Index, b.Flags)
	}
	if b.Size == 0 || b.Size%4 != 0 {
		return fmt.Errorf("BAR%d: size %#x is not a positive multiple of 4", b.Index, b.Size)
	}
	if b.Base+b.Size < b.Base {
		return fmt.Errorf("BAR%d: %#x+%#x overflows", b.Index, b.Base, b.Size)
	}
	if !b.IO && (b.Base%nvc0.PageSize != 0 || b.Size%nvc0.PageSize != 0) {
		return fmt.Errorf("BAR%d: memory BAR at %#x size %#x is not page aligned", b.Index, b.Base, b.Size)
	}
	return nil
}

// BAR returns where BAR i is, if it is mapped.
func (b *BARs) BAR(i int) (BAR, bool) {
	if i < 0 || i >= NumBARs || b.win[i] == nil {
		return BAR{}, false
	}
	return b.bars[i], true
}

// Size returns the size of BAR i, 0 if it is not mapped.
func (b *BARs) Size(i int) uint64 {
	bar, _ := b.BAR(i)
	return bar.Size
}

// lookup returns the window for an access, or records why there is none.
func (b *BARs) lookup(bar int, off uint64, what string) window {
	var w window
	if bar >= 0 && bar < NumBARs && !b.closed.Load() {
		w = b.win[bar]
	}
	switch {
	case w == nil:
		b.fail(fmt.Errorf("%s of BAR%d offset %#x: BAR%d is not mapped", what, bar, off, bar))
	case off%4 != 0:
		b.fail(fmt.Errorf("%s of BAR%d offset %#x: not 4-byte aligned", what, bar, off))
	case off >= w.size():
		b.fail(fmt.Errorf("%s of BAR%d offset %#x: outside the BAR (%#x bytes)", what, bar, off, w.size()))
	default:
		return w
	}
	return nil
}

func (b *BARs) fail(err error) {
	b.bad.Add(1)
	b.err.CompareAndSwap(nil, &err)
}

// Read32 reads the 32-bit word at off in BAR bar: one load instruction.
func (b *BARs) Read32(bar int, off uint64) uint32 {
	w := b.lookup(bar, off, "read")
	if w == nil {
		return nvc0.ReadAllOnes
	}
	t := time.Now()
	v := w.load32(off)
	b.readNs[bar].Add(uint64(time.Since(t)))
	b.reads[bar].Add(1)
	return v
}

// Write32 writes the 32-bit word at off in BAR bar: one store instruction.
func (b *BARs) Write32(bar int, off uint64, v uint32) {
	w := b.lookup(bar, off, "write")
	if w == nil {
		return
	}
	t := time.Now()
	w.store32(off, v)
	b.writeNs[bar].Add(uint64(time.Since(t)))
	b.writes[bar].Add(1)
}

// Fill32 stores v into the n words from off in BAR bar (gpu.Filler): in a
// memory BAR on amd64 with one REP STOSL, which Xen hands the device model
// as one ioreq per up to 4096 words where n stores would be n traps;
// otherwise (the I/O BAR: Xen repeats no port I/O for a device model, or
// another architecture) word by word, each a Write32. A run that leaves
// the BAR or is unaligned writes nothing and records the error.
func (b *BARs) Fill32(bar int, off uint64, v uint32, n int) {
	if n <= 0 {
		return
	}
	w := b.lookup(bar, off, "fill")
	if w == nil {
		return
	}
	if end := off + 4*uint64(n); end > w.size() || end < off {
		b.fail(fmt.Errorf("fill of BAR%d offset %#x, %d words: beyond the BAR (%#x bytes)", bar, off, n, w.size()))
		return
	}
	if f, ok := w.(filler); ok {
		t := time.Now()
		if f.fill32(off, v, n) {
			b.fillNs[bar].Add(uint64(time.Since(t)))
			b.fills[bar].Add(1)
			b.words[bar].Add(uint64(n))
			return
		}
	}
	for i := range uint64(n) {
		b.Write32(bar, off+4*i, v)
	}
}

// Err returns the first access that could not be made (outside a BAR,
// unaligned, to an unmapped BAR, or from a thread ioperm refused), or nil.
func (b *BARs) Err() error {
	if p := b.err.Load(); p != nil {
		if n := b.bad.Load(); n > 1 {
			return fmt.Errorf("%w (and %d more bad accesses)", *p, n-1)
		}
		return *p
	}
	return nil
}

// Close unmaps every BAR (and drops the I/O permission). Accesses after
// Close read all-ones and record an error.
func (b *BARs) Close() error {
	b.closed.Store(true)
	var errs []error
	for i, w := range b.win {
		if w != nil {
			if err := w.close(); err != nil {
				errs = append(errs, fmt.Errorf("BAR%d: %w", i, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Stats are a BARs' access counts and the time spent in the accesses, per
// BAR index. Inside a Xen guest each access of a trapped page is one trap:
// a VM exit, the ioreq to the device model and back, and the vCPU's
// resumption; the time is that round trip as the guest sees it (plus the
// clock reads around it, a few tens of nanoseconds).
type Stats struct {
	Reads, Writes   [NumBARs]uint64
	ReadNs, WriteNs [NumBARs]uint64
	// Fills are the string stores (a Fill32 made as one REP STOSL),
	// FillWords the words they stored and FillNs their time. Under Xen a
	// fill is one trap per up to 4096 words; it is not among the single
	// accesses of Reads and Writes.
	Fills, FillWords, FillNs [NumBARs]uint64
	BadAccesses              uint64 // accesses refused without touching a BAR (see Err)
}

// Stats returns a snapshot of the counters.
func (b *BARs) Stats() Stats {
	var s Stats
	for i := range NumBARs {
		s.Reads[i], s.Writes[i] = b.reads[i].Load(), b.writes[i].Load()
		s.ReadNs[i], s.WriteNs[i] = b.readNs[i].Load(), b.writeNs[i].Load()
		s.Fills[i], s.FillWords[i], s.FillNs[i] = b.fills[i].Load(), b.words[i].Load(), b.fillNs[i].Load()
	}
	s.BadAccesses = b.bad.Load()
	return s
}

// Sub returns s - o, counter by counter (o taken earlier).
func (s Stats) Sub(o Stats) Stats {
	for i := range NumBARs {
		s.Reads[i] -= o.Reads[i]
		s.Writes[i] -= o.Writes[i]
		s.ReadNs[i] -= o.ReadNs[i]
		s.WriteNs[i] -= o.WriteNs[i]
		s.Fills[i] -= o.Fills[i]
		s.FillWords[i] -= o.FillWords[i]
		s.FillNs[i] -= o.FillNs[i]
	}
	s.BadAccesses -= o.BadAccesses
	return s
}

// TotalReads, TotalWrites and Accesses sum the single-word accesses over
// the BARs (fills apart).
func (s Stats) TotalReads() uint64  { return sum(s.Reads) }
func (s Stats) TotalWrites() uint64 { return sum(s.Writes) }
func (s Stats) Accesses() uint64    { return s.TotalReads() + s.TotalWrites() }

// TotalFills and TotalFillWords sum the fills over the BARs.
func (s Stats) TotalFills() uint64     { return sum(s.Fills) }
func (s Stats) TotalFillWords() uint64 { return sum(s.FillWords) }

// Time is the total time spent in single-word accesses; FillTime in fills.
func (s Stats) Time() time.Duration     { return time.Duration(sum(s.ReadNs) + sum(s.WriteNs)) }
func (s Stats) FillTime() time.Duration { return time.Duration(sum(s.FillNs)) }

// MeanRead, MeanWrite and Mean are the mean time of one access (0 without
// accesses).
func (s Stats) MeanRead() time.Duration  { return mean(sum(s.ReadNs), s.TotalReads()) }
func (s Stats) MeanWrite() time.Duration { return mean(sum(s.WriteNs), s.TotalWrites()) }
func (s Stats) Mean() time.Duration      { return mean(uint64(s.Time()), s.Accesses()) }

// Counters returns the counts under the names a benchmark report uses for
// the guest's own view: guest_barN_reads and guest_barN_writes (single
// accesses) and guest_barN_fills for each of the vGPU's BARs,
// guest_access_ns (the time in single accesses), guest_fill_words and
// guest_fill_ns. They are not the aggregator's counters: they count what
// the guest did, not what reached the aggregator.
func (s Stats) Counters() map[string]uint64 {
	c := map[string]uint64{"guest_access_ns": uint64(s.Time()), "guest_fill_words": s.TotalFillWords(), "guest_fill_ns": uint64(s.FillTime())}
	for i := range NumBARs {
		if nvc0.BARSize(i) == 0 {
			continue
		}
		c[fmt.Sprintf("guest_bar%d_reads", i)] = s.Reads[i]
		c[fmt.Sprintf("guest_bar%d_writes", i)] = s.Writes[i]
		c[fmt.Sprintf("guest_bar%d_fills", i)] = s.Fills[i]
	}
	return c
}

func sum(a [NumBARs]uint64) uint64 {
	var n uint64
	for _, v := range a {
		n += v
	}
	return n
}

func mean(ns, n uint64) time.Duration {
	if n == 0 {
		return 0
	}
	return time.Duration(ns / n)
}

// ClockOverhead is what timing adds to each access's measured time: the
// mean of n empty measurements, the same two clock reads around nothing.
// Subtract it from Stats' means to estimate the trap alone.
func ClockOverhead(n int) time.Duration {
	if n <= 0 {
		return 0
	}
	var total time.Duration
	for range n {
		t := time.Now()
		total += time.Since(t)
	}
	return total / time.Duration(n)
}
