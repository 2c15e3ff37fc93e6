package sim

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/gpuvm/gpuvm/gpu/kernels"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/internal/spin"
)

// Engines run work items handed over by channel workers, in their own
// goroutines, one item at a time per engine, in the order they were handed
// over, and without preemption by other channels. The channel worker waits
// for its item before it continues, so work within a channel stays in order
// while channels using different engines overlap. An item runs under its
// channel's run context: a preempt of the channel cancels it, and the item
// stops at its next check (kernels between blocks of work, copies between
// pages, timing-model waits at once).

// engine is a pool of identical engine goroutines fed by one FIFO queue.
type engine struct {
	name   string
	reqs   chan *job
	queued atomic.Int32   // submitters waiting for the engine to take their item
	cur    []atomic.Int32 // per engine goroutine: channel id + 1 of the item it runs, 0 when idle
	// resident is the instance word (address >> 12 and target) of the
	// channel whose context the engine last loaded, with bit 31 set once
	// one was: the copy engines' CHANNEL_CUR and FECS CHAN_ADDR show it.
	resident atomic.Uint32
}

type job struct {
	ctx  context.Context
	ch   int
	run  func(ctx context.Context) error
	err  error
	done chan struct{}
}

// startEngine starts workers goroutines serving one queue; busy (if not nil)
// counts the items in progress.
func (b *Board) startEngine(name string, workers int, busy *atomic.Int32) *engine {
	e := &engine{name: name, reqs: make(chan *job), cur: make([]atomic.Int32, workers)}
	for w := range workers {
		b.goTracked(func() {
			for {
				select {
				case <-b.ctx.Done():
					return
				case j := <-e.reqs:
					if busy != nil {
						busy.Add(1)
					}
					e.cur[w].Store(int32(j.ch) + 1)
					j.err = j.run(j.ctx)
					e.cur[w].Store(0)
					if busy != nil {
						busy.Add(-1)
					}
					close(j.done)
				}
			}
		})
	}
	return e
}

// status returns the reader of engine goroutine w's PFIFO engine status
// word: EngineStatusBusy and the channel id while it runs an item.
func (e *engine) status(w int) func() uint32 {
	return func() uint32 {
		if c := e.cur[w].Load(); c != 0 {
			return nvc0.EngineStatusBusy | uint32(c-1)&nvc0.EngineStatusChanMask
		}
		return 0
	}
}

// do hands run to the engine on behalf of channel ch and waits for it to
// finish. If ctx ends (the channel was preempted, or the board closes)
// before the engine takes the item, it is dropped; once taken, do waits for
// it to end, which it does promptly once ctx is done — so when do returns,
// the engine no longer touches the channel's memory.
func (b *Board) do(ctx context.Context, e *engine, ch int, run func(ctx context.Context) error) error {
	j := &job{ctx: ctx, ch: ch, run: run, done: make(chan struct{})}
	e.queued.Add(1)
	select {
	case e.reqs <- j:
		e.queued.Add(-1)
	case <-ctx.Done():
		e.queued.Add(-1)
		return fmt.Errorf("%s engine: %w", e.name, ctx.Err())
	}
	<-j.done
	return j.err
}

// modelWait stretches work that started at start to last at least d,
// giving up early if ctx ends.
func (b *Board) modelWait(ctx context.Context, start time.Time, d time.Duration) {
	deadline := start.Add(d)
	for ctx.Err() == nil {
		left := time.Until(deadline)
		if left <= spin.SleepAbove {
			spin.Until(deadline)
			return
		}
		spin.Nap(min(left-spin.SleepAbove/2, 10*time.Millisecond))
	}
}

// Engine contexts. Each engine operation runs with the channel's context
// loaded: the engine reads its context pointer from the channel's RAMIN
// (nvc0.RAMINEngineGR, CE0, CE1), loads the context image from there, and
// saves it back (with the engine's method state) when the operation ends.
// A pointer with RAMINEngineVirtual set is a virtual address in the
// channel's own address space (what nouveau writes); one without it names
// VRAM directly (NVIDIA documents bit 2 clear as a physical pointer) — the
// board honours both, so a hypervisor must confine the second kind. An
// all-zero pointer means the engine was never bound to the channel: the
// operation faults (NO_CHANNEL). sim: a GF100 switches context only when
// another channel's work arrives; the board loads and saves around every
// operation.

// engineContext is the place one engine operation's context lives.
type engineContext struct {
	v       *vm
	addr    uint64
	virtual bool
	src     faultSource
}

// loadContext reads the channel's context pointer at RAMIN offset off and
// loads the image: it returns the place to save it back to.
func (c *channel) loadContext(v *vm, off uint64, src faultSource, e *engine) (engineContext, []byte, error) {
	b := c.b
	lo, hi := b.vramRead32(c.ramin+off), b.vramRead32(c.ramin+off+4)
	addr, virtual := nvc0.RAMINEngineDecode(lo, hi)
	ec := engineContext{v: v, addr: addr, virtual: virtual, src: src}
	img := make([]byte, nvc0.EngineContextSize)
	switch {
	case lo == 0 && hi == 0:
		return ec, nil, &faultError{reason: nvc0.FaultReasonNoChannel, src: &src}
	case virtual:
		if err := b.vmRead(v, img, addr); err != nil {
			return ec, nil, withSource(err, src)
		}
	case lo&nvc0.RAMINAddrTargetMask != nvc0.MemTargetVRAM:
		return ec, nil, &faultError{va: addr, reason: nvc0.FaultReasonTargetUnsupported, src: &src}
	default:
		if !b.physCopyOut(img, phys{addr: addr}) {
			return ec, nil, &faultError{va: addr, reason: nvc0.FaultReasonNoMemory, src: &src}
		}
	}
	e.resident.Store(c.instWord&(nvc0.ChanInstMask|3<<nvc0.ChanInstTargetShift) | 1<<31)
	return ec, img, nil
}

// saveContext writes the image back, with state in its first words.
func (c *channel) saveContext(ec engineContext, img []byte, state []uint32) error {
	for i, w := range state {
		store32(img[4*i:], w)
	}
	if ec.virtual {
		return withSource(c.b.vmWrite(ec.v, img, ec.addr), ec.src)
	}
	if !c.b.physCopyIn(phys{addr: ec.addr}, img) {
		return &faultError{va: ec.addr, reason: nvc0.FaultReasonNoMemory, write: true, src: &ec.src}
	}
	return nil
}

// withContext runs op with the channel's context for engine e loaded.
func (c *channel) withContext(v *vm, off uint64, src faultSource, e *engine, state func() []uint32, op func() error) error {
	ec, img, err := c.loadContext(v, off, src, e)
	if err != nil {
		return err
	}
	if err := op(); err != nil {
		return err
	}
	return c.saveContext(ec, img, state())
}

// computeState is the compute class's method state.
type computeState struct {
	codeHi, codeLo uint32
	cbSize         uint32
	cbHi, cbLo     uint32
	startID        uint32
	gridX          uint32
}

func (s *computeState) words() []uint32 {
	return []uint32{s.codeHi, s.codeLo, s.cbSize, s.cbHi, s.cbLo, s.startID, s.gridX}
}

// computeFields maps each stored compute method to its field (a table,
// never modified; LAUNCH is handled apart).
var computeFields = map[uint32]func(*computeState) *uint32{
	nvc0.ComputeMthdCodeAddrHi: func(s *computeState) *uint32 { return &s.codeHi },
	nvc0.ComputeMthdCodeAddrLo: func(s *computeState) *uint32 { return &s.codeLo },
	nvc0.ComputeMthdCBSize:     func(s *computeState) *uint32 { return &s.cbSize },
	nvc0.ComputeMthdCBAddrHi:   func(s *computeState) *uint32 { return &s.cbHi },
	nvc0.ComputeMthdCBAddrLo:   func(s *computeState) *uint32 { return &s.cbLo },
	nvc0.ComputeMthdStartID:    func(s *computeState) *uint32 { return &s.startID },
	nvc0.ComputeMthdGridDimX:   func(s *computeState) *uint32 { return &s.gridX },
}

func (c *channel) computeMethod(ctx context.Context, v *vm, m methodCall) error {
	if m.method == nvc0.ComputeMthdLaunch {
		return c.launch(ctx, v, m)
	}
	f, ok := computeFields[m.method]
	if !ok {
		return c.err(m, nvc0.PBDMAIntrIllegalMthd)
	}
	*f(&c.compute) = m.data
	return nil
}

// kernelMem is a kernel's view of the channel's address space: its faults
// are the GR unit's.
type kernelMem struct {
	b *Board
	v *vm
}

func (m kernelMem) ReadAt(p []byte, va uint64) error {
	return withSource(m.b.vmRead(m.v, p, va), srcGR)
}

func (m kernelMem) WriteAt(p []byte, va uint64) error {
	return withSource(m.b.vmWrite(m.v, p, va), srcGR)
}

// launch reads the code object and parameters and runs the kernel on the
// compute engine. sim: an invalid code object, parameter buffer or kernel
// is reported as ILLEGAL_MTHD on the LAUNCH (a GF100 raises a PGRAPH
// exception instead).
func (c *channel) launch(ctx context.Context, v *vm, m methodCall) error {
	b, s := c.b, &c.compute
	mem := kernelMem{b, v}
	codeVA := uint64(s.codeHi)<<32 | uint64(s.codeLo) + uint64(s.startID)
	var obj [nvc0.KernelObjectSize]byte
	if err := mem.ReadAt(obj[:], codeVA); err != nil {
		return err
	}
	magic, id, version := load32(obj[0:]), load32(obj[4:]), load32(obj[8:])
	if magic != nvc0.KernelMagic || version != nvc0.KernelVersion || s.cbSize > nvc0.MaxConstBufferSize {
		return c.err(m, nvc0.PBDMAIntrIllegalMthd)
	}
	cb := make([]byte, s.cbSize/8*8)
	if err := mem.ReadAt(cb, uint64(s.cbHi)<<32|uint64(s.cbLo)); err != nil {
		return err
	}
	params := make([]uint64, len(cb)/8)
	for i := range params {
		params[i] = uint64(load32(cb[8*i:])) | uint64(load32(cb[8*i+4:]))<<32
	}
	return b.do(ctx, b.compute, c.id, func(ctx context.Context) error {
		return c.withContext(v, nvc0.RAMINEngineGR, srcGR, b.compute, s.words, func() error {
			start := time.Now()
			cost, err := kernels.RunScratch(ctx, nvc0.KernelID(id), params, mem, &b.kscratch)
			if err != nil {
				var fe *faultError
				switch {
				case errors.As(err, &fe):
					return fe
				case ctx.Err() != nil:
					return fmt.Errorf("kernel %v: %w", nvc0.KernelID(id), err)
				}
				return c.err(m, nvc0.PBDMAIntrIllegalMthd) // unknown kernel or bad parameters
			}
			b.modelWait(ctx, start, b.timing.kernelTime(cost.Ops, cost.Bytes))
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("kernel %v: %w", nvc0.KernelID(id), err)
			}
			b.st.kernels.Add(1)
			return nil
		})
	})
}

// copyState is a copy engine's method state (nouveau's CE microcode
// layout, nvc0.CopyMthd*).
type copyState struct {
	srcHi, srcLo, dstHi, dstLo uint32
	srcPitch, dstPitch         uint32
	xCount, yCount             uint32
}

func (s *copyState) words() []uint32 {
	return []uint32{s.srcHi, s.srcLo, s.dstHi, s.dstLo, s.srcPitch, s.dstPitch, s.xCount, s.yCount}
}

// copyFields maps each copy method the board acts on to its field; other
// methods nvc0.CopyMethodMask allows are accepted and ignored.
var copyFields = map[uint32]func(*copyState) *uint32{
	nvc0.CopyMthdSrcAddrHi: func(s *copyState) *uint32 { return &s.srcHi },
	nvc0.CopyMthdSrcAddrLo: func(s *copyState) *uint32 { return &s.srcLo },
	nvc0.CopyMthdDstAddrHi: func(s *copyState) *uint32 { return &s.dstHi },
	nvc0.CopyMthdDstAddrLo: func(s *copyState) *uint32 { return &s.dstLo },
	nvc0.CopyMthdSrcPitch:  func(s *copyState) *uint32 { return &s.srcPitch },
	nvc0.CopyMthdDstPitch:  func(s *copyState) *uint32 { return &s.dstPitch },
	nvc0.CopyMthdXCount:    func(s *copyState) *uint32 { return &s.xCount },
	nvc0.CopyMthdYCount:    func(s *copyState) *uint32 { return &s.yCount },
}

// copyMethod executes a method of copy engine ce. sim: the microcode's own
// errors (an unknown method, INVALID_BITFIELD) are reported as PBDMA
// ILLEGAL_MTHD on the engine's PBDMA rather than as a copy-engine
// interrupt.
func (c *channel) copyMethod(ctx context.Context, v *vm, ce int, m methodCall) error {
	mask, ok := nvc0.CopyMethodMask(m.method)
	if !ok || m.data&^mask != 0 {
		return c.err(m, nvc0.PBDMAIntrIllegalMthd)
	}
	if m.method == nvc0.CopyMthdExec {
		return c.copyExec(ctx, v, ce, m)
	}
	if f, ok := copyFields[m.method]; ok {
		*f(&c.copy[ce]) = m.data
	}
	return nil
}

// copyExec runs a pitch-linear byte copy on copy engine ce. EXEC must ask
// for exactly that (nvc0.CopyExecLinear, as nvc0_bo_move_copy does);
// FORMAT, tiled layouts and queries are not supported and refused.
func (c *channel) copyExec(ctx context.Context, v *vm, ce int, m methodCall) error {
	if m.data != nvc0.CopyExecLinear {
		return c.err(m, nvc0.PBDMAIntrIllegalMthd)
	}
	b, s := c.b, c.copy[ce]
	total := uint64(s.xCount) * uint64(s.yCount)
	if total == 0 {
		return nil
	}
	src := uint64(s.srcHi)<<32 | uint64(s.srcLo)
	dst := uint64(s.dstHi)<<32 | uint64(s.dstLo)
	off := uint64(nvc0.RAMINEngineCE0)
	if ce == 1 {
		off = nvc0.RAMINEngineCE1
	}
	e := b.ce[ce]
	return b.do(ctx, e, c.id, func(ctx context.Context) error {
		return c.withContext(v, off, srcCE[ce], e, s.words, func() error {
			start := time.Now()
			sys := false
			for line := range uint64(s.yCount) {
				sa, da := src+line*uint64(s.srcPitch), dst+line*uint64(s.dstPitch)
				for left := uint64(s.xCount); left > 0; {
					if err := ctx.Err(); err != nil {
						return fmt.Errorf("copy: %w", err)
					}
					n, touchedSys, err := b.vmCopy(v, da, sa, left)
					if err != nil {
						return withSource(err, srcCE[ce])
					}
					sys = sys || touchedSys
					sa, da, left = sa+n, da+n, left-n
				}
			}
			b.modelWait(ctx, start, b.timing.copyTime(total, sys))
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("copy: %w", err)
			}
			b.st.copies.Add(1)
			b.st.bytesCopied.Add(total)
			return nil
		})
	})
}
