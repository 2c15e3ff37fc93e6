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

// computeState is the compute class's method state.
type computeState struct {
	codeHi, codeLo uint32
	cbSize         uint32
	cbHi, cbLo     uint32
	startID        uint32
	gridX          uint32
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

func (c *channel) computeMethod(ctx context.Context, v *vm, hva uint64, m, data uint32) error {
	if m == nvc0.ComputeMthdLaunch {
		return c.launch(ctx, v, hva)
	}
	return storeMethod(computeFields, &c.compute, hva, m, data)
}

// storeMethod stores a method's data in the state field the table names, or
// faults on a method the class does not have.
func storeMethod[S any](fields map[uint32]func(*S) *uint32, s *S, hva uint64, m, data uint32) error {
	f, ok := fields[m]
	if !ok {
		return methodFault(hva)
	}
	*f(s) = data
	return nil
}

// kernelMem is a kernel's view of the channel's address space.
type kernelMem struct {
	b *Board
	v *vm
}

func (m kernelMem) ReadAt(p []byte, va uint64) error  { return m.b.vmRead(m.v, p, va) }
func (m kernelMem) WriteAt(p []byte, va uint64) error { return m.b.vmWrite(m.v, p, va) }

// launch reads the code object and parameters and runs the kernel on the
// compute engine.
func (c *channel) launch(ctx context.Context, v *vm, hva uint64) error {
	b, s := c.b, &c.compute
	codeVA := uint64(s.codeHi)<<32 | uint64(s.codeLo) + uint64(s.startID)
	var obj [nvc0.KernelObjectSize]byte
	if err := b.vmRead(v, obj[:], codeVA); err != nil {
		return err
	}
	magic, id, version := load32(obj[0:]), load32(obj[4:]), load32(obj[8:])
	if magic != nvc0.KernelMagic || version != nvc0.KernelVersion {
		return methodFault(codeVA)
	}
	if s.cbSize > nvc0.MaxConstBufferSize {
		return methodFault(hva)
	}
	cb := make([]byte, s.cbSize/8*8)
	if err := b.vmRead(v, cb, uint64(s.cbHi)<<32|uint64(s.cbLo)); err != nil {
		return err
	}
	params := make([]uint64, len(cb)/8)
	for i := range params {
		params[i] = uint64(load32(cb[8*i:])) | uint64(load32(cb[8*i+4:]))<<32
	}
	return b.do(ctx, b.compute, c.id, func(ctx context.Context) error {
		start := time.Now()
		cost, err := kernels.Run(ctx, nvc0.KernelID(id), params, kernelMem{b, v})
		if err != nil {
			var fe *faultError
			switch {
			case errors.As(err, &fe):
				return fe
			case ctx.Err() != nil:
				return fmt.Errorf("kernel %v: %w", nvc0.KernelID(id), err)
			}
			return methodFault(codeVA) // unknown kernel or bad parameters
		}
		b.modelWait(ctx, start, b.timing.kernelTime(cost.Ops, cost.Bytes))
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("kernel %v: %w", nvc0.KernelID(id), err)
		}
		b.st.kernels.Add(1)
		return nil
	})
}

// copyState is the copy class's method state.
type copyState struct {
	inHi, inLo, outHi, outLo uint32
	pitchIn, pitchOut        uint32
	lineLen, lineCount       uint32
}

// copyFields maps each stored copy method to its field (LAUNCH_DMA apart).
var copyFields = map[uint32]func(*copyState) *uint32{
	nvc0.CopyMthdOffsetInHi:   func(s *copyState) *uint32 { return &s.inHi },
	nvc0.CopyMthdOffsetInLo:   func(s *copyState) *uint32 { return &s.inLo },
	nvc0.CopyMthdOffsetOutHi:  func(s *copyState) *uint32 { return &s.outHi },
	nvc0.CopyMthdOffsetOutLo:  func(s *copyState) *uint32 { return &s.outLo },
	nvc0.CopyMthdPitchIn:      func(s *copyState) *uint32 { return &s.pitchIn },
	nvc0.CopyMthdPitchOut:     func(s *copyState) *uint32 { return &s.pitchOut },
	nvc0.CopyMthdLineLengthIn: func(s *copyState) *uint32 { return &s.lineLen },
	nvc0.CopyMthdLineCount:    func(s *copyState) *uint32 { return &s.lineCount },
}

func (c *channel) copyMethod(ctx context.Context, v *vm, hva uint64, m, data uint32) error {
	if m == nvc0.CopyMthdLaunchDMA {
		return c.copyLaunch(ctx, v, hva)
	}
	return storeMethod(copyFields, &c.copy, hva, m, data)
}

// copyLaunch runs a pitch-linear copy on a copy engine.
func (c *channel) copyLaunch(ctx context.Context, v *vm, hva uint64) error {
	b, s := c.b, c.copy
	total := uint64(s.lineLen) * uint64(s.lineCount)
	if total > nvc0.MaxCopyBytes {
		return methodFault(hva)
	}
	if total == 0 {
		return nil
	}
	in := uint64(s.inHi)<<32 | uint64(s.inLo)
	out := uint64(s.outHi)<<32 | uint64(s.outLo)
	return b.do(ctx, b.copy, c.id, func(ctx context.Context) error {
		start := time.Now()
		sys := false
		for line := range uint64(s.lineCount) {
			src, dst := in+line*uint64(s.pitchIn), out+line*uint64(s.pitchOut)
			for left := uint64(s.lineLen); left > 0; {
				if err := ctx.Err(); err != nil {
					return fmt.Errorf("copy: %w", err)
				}
				n, touchedSys, err := b.vmCopy(v, dst, src, left)
				if err != nil {
					return err
				}
				sys = sys || touchedSys
				src, dst, left = src+n, dst+n, left-n
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
}
