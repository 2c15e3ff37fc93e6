package nouveau

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpuvm/gpuvm/gpu"
	"github.com/gpuvm/gpuvm/gpu/hostmem"
	"github.com/gpuvm/gpuvm/gpu/hwseq"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/internal/rangealloc"
)

// HostMemory is DMA-able host (guest) RAM: *hostmem.RAM satisfies it.
type HostMemory interface {
	Alloc(size uint64) (hostmem.Buffer, error)
	Free(b hostmem.Buffer) error
}

// PTPath says how the driver writes page tables and other kernel objects in VRAM.
type PTPath int

const (
	// ViaBAR3 maps kernel objects into the BAR3 aperture and writes them there,
	// as nouveau does once BAR3 is up (the default).
	ViaBAR3 PTPath = iota
	// ViaPRAMIN writes every kernel object through the BAR0 PRAMIN window.
	ViaPRAMIN
)

// PVMode says whether the driver is para-virtual: whether the aggregator,
// asked by hypercalls (package hypercall), owns the GPU page tables.
type PVMode int

const (
	// PVOff is full virtualization (or native): the driver writes its page
	// tables and the BAR instance blocks in VRAM itself (the default).
	PVOff PVMode = iota
	// PVNaive makes one hypercall per update: a MAP per PTE, an UNMAP_BATCH
	// of one entry per page, a BAR_MAP or BAR_UNMAP per aperture page, a
	// VM_FLUSH per flush, a MAP_PGT per new page table.
	PVNaive
	// PVMulticall batches the updates of one operation into multicalls: a
	// mapping becomes a MAP_BATCH (or UNMAP_BATCH) per page table it
	// touches and the VM_FLUSH, packed into as few multicall pages as fit;
	// a BAR mapping is one BAR_MAP or BAR_UNMAP.
	PVMulticall
)

// String names the mode: "off", "naive" or "multicall".
func (m PVMode) String() string {
	switch m {
	case PVOff:
		return "off"
	case PVNaive:
		return "naive"
	case PVMulticall:
		return "multicall"
	}
	return fmt.Sprintf("PVMode(%d)", int(m))
}

// Options tune the driver. The zero value is nouveau's behaviour.
type Options struct {
	PageTables PTPath
	Timeout    time.Duration // longest wait for any GPU operation; default 10 s
	FaultPoll  time.Duration // how often a polling fence wait checks the channel for a fault; default 1 ms
	// IRQPoll is how long a fence wait sleeps on the GPU's interrupt
	// before it checks the channel for a fault anyway (irq.go); default
	// 50 ms.
	IRQPoll time.Duration
	// FenceSpin is the most a fence wait spins before it sleeps on the
	// interrupt; the spin adapts to the channel's waits (irq.go).
	// Default 200 µs; negative: never spin past the first 256 checks.
	FenceSpin time.Duration
	// PollFences makes fence waits poll even on a GPU that delivers
	// interrupts (gpu.Interrupter), as on one that does not.
	PollFences bool
	Logger     *slog.Logger
	// BAR1Size and BAR3Size are the usable aperture sizes (a virtual GPU may
	// offer only a slice of each); 0 means the whole BAR.
	BAR1Size, BAR3Size uint64
	// PV makes the driver para-virtual: the page tables of channel address
	// spaces and of the BAR1/BAR3 apertures belong to the aggregator and are
	// built by hypercalls; Open fails (ErrNotSupported) on a GPU that offers
	// none.
	PV PVMode
}

func (o *Options) fill() {
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Second
	}
	if o.FaultPoll == 0 {
		o.FaultPoll = time.Millisecond
	}
	if o.IRQPoll == 0 {
		o.IRQPoll = defaultIRQPoll
	}
	if o.FenceSpin == 0 {
		o.FenceSpin = defaultFenceSpin
	} else if o.FenceSpin < 0 {
		o.FenceSpin = 0
	}
	if o.BAR1Size == 0 || o.BAR1Size > nvc0.BAR1Size {
		o.BAR1Size = nvc0.BAR1Size
	}
	if o.BAR3Size == 0 || o.BAR3Size > nvc0.BAR3Size {
		o.BAR3Size = nvc0.BAR3Size
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// vramReserved is the bottom of VRAM the driver leaves alone (VBIOS/VGA area on
// real boards).
const vramReserved = 1 << 20

// Device is an opened GPU.
type Device struct {
	mmio gpu.MMIO
	host HostMemory
	opts Options
	log  *slog.Logger

	vramSize uint64
	vram     *rangealloc.Allocator

	prMu      sync.Mutex // serialises PRAMIN window use
	window    uint64     // current PRAMIN window base (prMu)
	windowSet bool
	flushMu   sync.Mutex      // serialises TLB flush sequences
	pv        *pvClient       // the hypercall client in PV modes, nil in PVOff
	irq       gpu.Interrupter // the GPU's interrupt line, nil if fence waits poll (irq.go)
	// gen counts the resets the driver went through (reset.go): channels
	// and VMs of an older generation are orphaned.
	gen atomic.Uint64
	// faultLook is the interrupt count when a fence sleep last looked at
	// the fault registers: an interrupt since then may announce a fault
	// that no waiter has seen yet (irq.go).
	faultLook atomic.Uint32

	errMu sync.Mutex                    // serialises error collection; guards errs
	errs  [nvc0.MaxChannels]*FaultError // each channel's first error report (intr.go)

	mu       sync.Mutex // guards the fields below
	closed   bool
	bar3     *barSpace
	bar1     *barSpace
	userArea *kobj  // poll area backing: MaxChannels user pages
	pollBase uint64 // BAR1 offset of the poll area
	playlist [2]*kobj
	plCur    int
	chans    [nvc0.MaxChannels]*Channel
}

// Open identifies the GPU behind mmio and brings up its MMU, BAR1, BAR3 and
// the poll area.
func Open(mmio gpu.MMIO, host HostMemory, opts Options) (*Device, error) {
	opts.fill()
	d := &Device{mmio: mmio, host: host, opts: opts, log: opts.Logger, irq: interrupter(mmio, opts)}
	boot0 := mmio.Read32(nvc0.BAR0, nvc0.RegBoot0)
	if boot0 == nvc0.ReadAllOnes {
		return nil, fmt.Errorf("open: PMC_BOOT_0: %w", ErrDeviceGone)
	}
	if chipset := nvc0.Boot0Chipset(boot0); !nvc0.IsFermi(chipset) {
		return nil, fmt.Errorf("open: chipset %#x (PMC_BOOT_0 %#08x) is not a Fermi: %w", chipset, boot0, ErrNotSupported)
	}
	size, err := d.probeVRAM()
	if err != nil {
		return nil, fmt.Errorf("open: %w", err)
	}
	d.vramSize = size
	d.vram = rangealloc.New(vramReserved, size-vramReserved)
	d.wr(nvc0.RegPMCEnable, nvc0.PMCEnableAll)
	switch opts.PV {
	case PVOff:
	case PVNaive, PVMulticall:
		if d.pv, err = d.openPV(opts.PV == PVMulticall); err != nil {
			return nil, fmt.Errorf("open: %w", err)
		}
	default:
		return nil, fmt.Errorf("open: unknown PV mode %d", int(opts.PV))
	}
	if err := d.initBARs(); err != nil {
		if d.pv != nil {
			d.pv.close()
		}
		return nil, fmt.Errorf("open: %w", err)
	}
	d.log.Debug("gpu up", "boot0", fmt.Sprintf("%#08x", boot0), "vram_mib", size>>20)
	return d, nil
}

// probeVRAM sums the enabled memory partitions' sizes, as nouveau's gf100 RAM code does.
func (d *Device) probeVRAM() (uint64, error) {
	parts := d.rd(nvc0.RegMemPartCount)
	if parts == 0 || parts > nvc0.MaxMemPartitions {
		return 0, fmt.Errorf("memory partition count %d out of range", parts)
	}
	mask := d.rd(nvc0.RegMemPartMask)
	var total uint64
	for i := 0; i < int(parts); i++ {
		if mask&(1<<i) != 0 {
			continue
		}
		total += uint64(d.rd(nvc0.MemPartSize(i))) << nvc0.MemPartSizeShift
	}
	if total < 16<<20 {
		return 0, fmt.Errorf("VRAM size %d MiB too small", total>>20)
	}
	return total, nil
}

// VRAMSize returns the VRAM size the GPU reported.
func (d *Device) VRAMSize() uint64 { return d.vramSize }

// MMIO returns the BAR access the device was opened with.
func (d *Device) MMIO() gpu.MMIO { return d.mmio }

// Host returns the DMA memory the device was opened with.
func (d *Device) Host() HostMemory { return d.host }

func (d *Device) rd(reg uint32) uint32    { return d.mmio.Read32(nvc0.BAR0, uint64(reg)) }
func (d *Device) wr(reg uint32, v uint32) { d.mmio.Write32(nvc0.BAR0, uint64(reg), v) }

// wait polls reg until cond holds or the driver's timeout passes.
func (d *Device) wait(what string, reg uint32, cond func(uint32) bool) error {
	return hwseq.Wait(d.mmio, what, reg, d.opts.Timeout, cond)
}

// AllocVRAM allocates VRAM.
func (d *Device) AllocVRAM(size, align uint64) (uint64, error) {
	a, err := d.vram.Alloc(size, align)
	if err != nil {
		return 0, fmt.Errorf("VRAM: %w", err)
	}
	return a, nil
}

// FreeVRAM frees VRAM from AllocVRAM.
func (d *Device) FreeVRAM(addr uint64) error { return d.vram.Free(addr) }

// VRAMFree returns the free VRAM in bytes.
func (d *Device) VRAMFree() uint64 { return d.vram.FreeBytes() }

// Close kills every channel still open and releases the device's objects.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	var open []*Channel
	for _, c := range d.chans {
		if c != nil {
			open = append(open, c)
		}
	}
	d.mu.Unlock()
	var first error
	for _, c := range open {
		if err := c.Close(); err != nil && first == nil {
			first = err
		}
	}
	d.mu.Lock()
	d.closed = true
	d.wr(nvc0.RegPollArea, 0)
	if d.pv == nil {
		d.wr(nvc0.RegBAR1Inst, 0)
		d.wr(nvc0.RegBAR3Inst, 0)
	} else if err := d.pv.close(); err != nil && first == nil {
		first = err
	}
	d.mu.Unlock()
	return first
}
