package sim

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/gpu"
	"github.com/gpuvm/gpuvm/gpu/errreport"
	"github.com/gpuvm/gpuvm/gpu/kernels"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

const mib = 1 << 20

// Config describes a board.
type Config struct {
	// VRAMSize is the device memory size in bytes: a multiple of 1 MiB and of
	// MemPartitions MiB, at most 2^40 (the reach of a PTE).
	VRAMSize uint64
	// Channels is the number of PFIFO channels, 1..nvc0.MaxChannels.
	Channels int
	// MemPartitions is the number of memory partitions, 1..nvc0.MaxMemPartitions.
	MemPartitions int
	// Timing is the timing model.
	Timing Timing
	// VRAMSegments optionally splits VRAM into separately backed segments of
	// these sizes (page multiples adding up to VRAMSize), so that a segment —
	// a VM's slice — can be handed to another process alone
	// (VRAMSegmentFile). Empty means one segment.
	VRAMSegments []uint64
}

// DefaultConfig is a Quadro 6000: 6 GiB of VRAM in 6 partitions, 128
// channels, and no timing delays.
func DefaultConfig() Config {
	return Config{VRAMSize: 6 << 30, Channels: nvc0.MaxChannels, MemPartitions: 6, Timing: TimingNone()}
}

func (c Config) validate() error {
	if c.MemPartitions < 1 || c.MemPartitions > nvc0.MaxMemPartitions {
		return fmt.Errorf("sim: %d memory partitions, want 1..%d", c.MemPartitions, nvc0.MaxMemPartitions)
	}
	if c.Channels < 1 || c.Channels > nvc0.MaxChannels {
		return fmt.Errorf("sim: %d channels, want 1..%d", c.Channels, nvc0.MaxChannels)
	}
	if c.VRAMSize == 0 || c.VRAMSize%mib != 0 {
		return fmt.Errorf("sim: VRAM size %#x is not a positive multiple of 1 MiB", c.VRAMSize)
	}
	if c.VRAMSize%(uint64(c.MemPartitions)*mib) != 0 {
		return fmt.Errorf("sim: VRAM size %#x is not a multiple of %d MiB (one per partition)", c.VRAMSize, c.MemPartitions)
	}
	if c.VRAMSize > nvc0.VASize {
		return fmt.Errorf("sim: VRAM size %#x beyond the 40-bit physical address space", c.VRAMSize)
	}
	if err := c.Timing.validate(); err != nil {
		return fmt.Errorf("sim: config: %w", err)
	}
	return nil
}

// Board is a simulated Fermi GPU. It implements gpu.MMIO. All methods are safe
// for concurrent use.
type Board struct {
	cfg    Config
	timing Timing
	start  time.Time

	// kscratch is the compute engine's kernel working memory, reused from
	// launch to launch (the engine has one goroutine: one kernel at a time).
	kscratch kernels.Scratch

	vram  *vram
	sys   sysmem
	sysMu sync.RWMutex // pins system memory during accesses (phys.go)
	mmu   *mmu
	regs  regTable

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// life guards the board against Close: every external entry point holds
	// it for reading and checks closed; Close takes it for writing.
	life   sync.RWMutex
	closed bool
	// busLost: the board fell off the bus (FailBus): it answers nothing.
	busLost atomic.Bool

	st counters
	r  regState

	// afterWalk, if set (by this package's tests only), runs between a
	// TLB miss's page walk and the caching of its result.
	afterWalk func()
	// afterPublish, if set (by this package's tests only), runs when a
	// run has published an entry's GP_GET, before it looks at GP_PUT again.
	afterPublish func(ch int)
	// inDMA, if set (by this package's tests only), runs inside a copy
	// engine's pinned section, between the lookup and the move.
	inDMA func()

	chans   []*channel
	fifo    fifoState
	intr    *errreport.Reports
	compute *engine
	ce      [nvc0.NumCopyEngines]*engine
}

var _ gpu.MMIO = (*Board)(nil)

// New creates a board.
func New(cfg Config) (*Board, error) { return newBoard(cfg, nil) }

// NewOver creates a board whose VRAM is the memfds another board's
// VRAMSegmentFiles handed over — one per segment of cfg, in order, each
// exactly its segment's size and sealed against resizing — as a GPU's
// memory outlives the driver that let go of it (a daemon handing its
// boards to the process that replaces it). Their contents are the new
// board's VRAM as they are: renew or scrub what no tenant carries over.
// It takes duplicates of the files' descriptors; the caller closes files.
// Registers, channels and engines start afresh.
func NewOver(cfg Config, files []*os.File) (*Board, error) {
	fds := make([]int, 0, len(files))
	for _, f := range files {
		fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			for _, d := range fds {
				unix.Close(d)
			}
			return nil, fmt.Errorf("sim: new board over %s: %w", f.Name(), err)
		}
		fds = append(fds, fd)
	}
	if fds == nil {
		fds = []int{}
	}
	return newBoard(cfg, fds)
}

func newBoard(cfg Config, fds []int) (*Board, error) {
	if err := cfg.validate(); err != nil {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, err
	}
	v, err := newVRAM(cfg.VRAMSize, cfg.VRAMSegments, fds)
	if err != nil {
		return nil, fmt.Errorf("sim: new board: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b := &Board{
		cfg:    cfg,
		timing: cfg.Timing,
		start:  time.Now(),
		vram:   v,
		ctx:    ctx,
		cancel: cancel,
		intr:   errreport.New(maxQueued),
	}
	b.mmu = newMMU(b)
	b.chans = make([]*channel, cfg.Channels)
	for i := range b.chans {
		b.chans[i] = newChannel(b, i)
	}
	b.compute = b.startEngine("compute", 1, &b.r.pgraphBusy)
	b.ce[0] = b.startEngine("CE0", 1, nil)
	b.ce[1] = b.startEngine("CE1", 1, nil)
	b.regs = b.buildRegs()
	return b, nil
}

// Close stops the board's goroutines and releases VRAM. It is idempotent;
// after Close, MMIO reads return 0 and writes are dropped.
func (b *Board) Close() error {
	b.life.Lock()
	if b.closed {
		b.life.Unlock()
		return nil
	}
	b.closed = true
	b.cancel()
	b.life.Unlock()
	b.wg.Wait()
	if err := b.vram.close(); err != nil {
		return fmt.Errorf("sim: close: %w", err)
	}
	return nil
}

// enter takes the board's life lock for an external operation; it reports
// false (and takes nothing) if the board is closed.
func (b *Board) enter() bool {
	b.life.RLock()
	if b.closed {
		b.life.RUnlock()
		return false
	}
	return true
}

func (b *Board) leave() { b.life.RUnlock() }

// goTracked runs f in a goroutine that Close waits for. The caller must hold the
// life lock (inside enter/leave) or be a board goroutine itself.
func (b *Board) goTracked(f func()) {
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		f()
	}()
}

// now returns the PTIMER value: nanoseconds since the board was created.
func (b *Board) now() uint64 { return uint64(time.Since(b.start).Nanoseconds()) }

// VRAMSize returns the VRAM size in bytes.
func (b *Board) VRAMSize() uint64 { return b.cfg.VRAMSize }

// Config returns the board's configuration.
func (b *Board) Config() Config { return b.cfg }
