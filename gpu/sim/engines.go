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
// over, and without preemption. The channel worker waits for its item before
// it continues, so work within a channel stays in order while channels using
// different engines overlap.

// engine is a pool of identical engine goroutines fed by one FIFO queue.
type engine struct {
	name   string
	reqs   chan *job
	queued atomic.Int32 // submitters waiting for the engine to take their item
}

type job struct {
	run  func() error
	err  error
	done chan struct{}
}

// startEngine starts workers goroutines serving one queue; busy (if not nil)
// counts the items in progress.
func (b *Board) startEngine(name string, workers int, busy *atomic.Int32) *engine {
	e := &engine{name: name, reqs: make(chan *job)}
	for range workers {
		b.goTracked(func() {
			for {
				select {
				case <-b.ctx.Done():
					return
				case j := <-e.reqs:
					if busy != nil {
						busy.Add(1)
					}
					j.err = j.run()
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

// do hands run to the engine and waits for it to finish. Only Close
// interrupts the wait: engines are not preemptible.
func (b *Board) do(e *engine, run func() error) error {
	j := &job{run: run, done: make(chan struct{})}
	e.queued.Add(1)
	select {
	case e.reqs <- j:
		e.queued.Add(-1)
	case <-b.ctx.Done():
		e.queued.Add(-1)
		return fmt.Errorf("%s engine: %w", e.name, errClosed)
	}
	select {
	case <-j.done:
		return j.err
	case <-b.ctx.Done():
		return fmt.Errorf("%s engine: %w", e.name, errClosed)
	}
}

// modelWait stretches work that started at start to last at least d,
// giving up early if the board closes.
func (b *Board) modelWait(start time.Time, d time.Duration) {
	deadline := start.Add(d)
	for b.ctx.Err() == nil {
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

func (c *channel) computeMethod(_ context.Context, v *vm, hva uint64, m, data uint32) error {
	if m == nvc0.ComputeMthdLaunch {
		return c.launch(v, hva)
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
func (c *channel) launch(v *vm, hva uint64) error {
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
	return b.do(b.compute, func() error {
		start := time.Now()
		cost, err := kernels.Run(b.ctx, nvc0.KernelID(id), params, kernelMem{b, v})
		if err != nil {
			var fe *faultError
			switch {
			case errors.As(err, &fe):
				return fe
			case b.ctx.Err() != nil:
				return fmt.Errorf("kernel %v: %w", nvc0.KernelID(id), err)
			}
			return methodFault(codeVA) // unknown kernel or bad parameters
		}
		b.modelWait(start, b.timing.kernelTime(cost.Ops, cost.Bytes))
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

func (c *channel) copyMethod(_ context.Context, v *vm, hva uint64, m, data uint32) error {
	if m == nvc0.CopyMthdLaunchDMA {
		return c.copyLaunch(v, hva)
	}
	return storeMethod(copyFields, &c.copy, hva, m, data)
}

// copyLaunch runs a pitch-linear copy on a copy engine.
func (c *channel) copyLaunch(v *vm, hva uint64) error {
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
	return b.do(b.copy, func() error {
		start := time.Now()
		sys := false
		for line := range uint64(s.lineCount) {
			src, dst := in+line*uint64(s.pitchIn), out+line*uint64(s.pitchOut)
			for left := uint64(s.lineLen); left > 0; {
				from, fsys, err := b.vmSlice(v, src, left, false)
				if err != nil {
					return err
				}
				to, tsys, err := b.vmSlice(v, dst, uint64(len(from)), true)
				if err != nil {
					return err
				}
				n := uint64(copy(to, from))
				sys = sys || fsys || tsys
				src, dst, left = src+n, dst+n, left-n
			}
		}
		b.modelWait(start, b.timing.copyTime(total, sys))
		b.st.copies.Add(1)
		b.st.bytesCopied.Add(total)
		return nil
	})
}
