package kernels

import (
	"context"
	"errors"
	"fmt"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// Memory is the GPU virtual address space a kernel runs in. ReadAt fills p
// from the bytes at virtual address va; WriteAt stores p at va. Errors are MMU
// faults: Run returns them wrapped with %w, so errors.Is and errors.As still
// see the original error.
type Memory interface {
	ReadAt(p []byte, va uint64) error
	WriteAt(p []byte, va uint64) error
}

// Cost is the work a kernel did, used by the board's timing model. Ops counts
// arithmetic operations (a multiply-add is 2); Bytes counts array bytes read
// and written in GPU memory.
type Cost struct{ Ops, Bytes uint64 }

// ErrBadParams classifies errors caused by an invalid parameter list: the
// wrong number of words, a dimension or count of 0 or above its bound in
// package nvc0 (nvc0.MaxKernelMatrixDim, nvc0.MaxKernelGridDim, …), a loop
// or step count above its bound, an LU block offset that is not a multiple of
// nvc0.LUDBlockSize below n, a float32 word with its high 32 bits set, or an
// array whose address range wraps past 2^64.
var ErrBadParams = errors.New("bad kernel parameters")

// ErrUnknownKernel classifies errors caused by a kernel id the library does
// not implement.
var ErrUnknownKernel = errors.New("unknown kernel")

// Scratch holds a kernel's working buffers from one launch to the next, so
// that a launch does not page-fault fresh memory in: on the simulated board
// that cost is the host's memory manager, not the kernel, and it varied
// 5–50 ms per madd launch with the Go heap's history. The zero value is
// ready; a Scratch is not safe for concurrent use (the board's compute
// engine, which runs one kernel at a time, keeps one).
type Scratch struct {
	raw slab[byte]
	u32 slab[uint32]
	f32 slab[float32]
}

// slab hands out reusable buffers by index.
type slab[T any] struct{ bufs [8][]T }

// get returns buffer i with length n (its contents are whatever was there).
func (s *slab[T]) get(i, n int) []T {
	if cap(s.bufs[i]) < n {
		s.bufs[i] = make([]T, n)
	}
	return s.bufs[i][:n]
}

// handler is one entry of the dispatch table.
type handler struct {
	nparams int
	run     func(ctx context.Context, name string, params []uint64, mem Memory, s *Scratch) (Cost, error)
}

// kernelTable maps a kernel id to its handler. It is filled by this literal
// and never modified.
var kernelTable = map[nvc0.KernelID]handler{
	nvc0.KernelNop:   {nparams: 0, run: runNop},
	nvc0.KernelLoop:  {nparams: 2, run: runLoop},
	nvc0.KernelMadd:  {nparams: 4, run: matrixKernel(u32Slab, decodeU32sInto, encodeU32sInto, maddU32, addOps)},
	nvc0.KernelMmul:  {nparams: 4, run: matrixKernel(u32Slab, decodeU32sInto, encodeU32sInto, mmulU32, mulOps)},
	nvc0.KernelFmadd: {nparams: 4, run: matrixKernel(f32Slab, decodeF32sInto, encodeF32sInto, maddF32, addOps)},
	nvc0.KernelFmmul: {nparams: 4, run: matrixKernel(f32Slab, decodeF32sInto, encodeF32sInto, mmulF32, mulOps)},

	nvc0.KernelBPForward:    {nparams: 5, run: runBPForward},
	nvc0.KernelBPAdjust:     {nparams: 6, run: runBPAdjust},
	nvc0.KernelHotspot:      {nparams: 11, run: runHotspot},
	nvc0.KernelLUDDiagonal:  {nparams: 3, run: runLUD(ludDiagonal)},
	nvc0.KernelLUDPerimeter: {nparams: 3, run: runLUD(ludPerimeter)},
	nvc0.KernelLUDInternal:  {nparams: 3, run: runLUD(ludInternal)},
	nvc0.KernelNN:           {nparams: 5, run: runNN},
	nvc0.KernelSradExtract:  {nparams: 2, run: runSradPointwise(sradExtract)},
	nvc0.KernelSradReduce:   {nparams: 3, run: runSradReduce},
	nvc0.KernelSradCoeff:    {nparams: 9, run: runSradCoeff},
	nvc0.KernelSradUpdate:   {nparams: 9, run: runSradUpdate},
	nvc0.KernelSradCompress: {nparams: 2, run: runSradPointwise(sradCompress)},
}

// Run executes built-in kernel id with the given parameter words in the
// address space mem and returns the work it did.
//
// Errors name the kernel and carry context; they wrap ErrUnknownKernel,
// ErrBadParams, the MMU fault returned by mem, or ctx.Err() when the context
// is cancelled (checked before the kernel starts, between row blocks of the
// matrix products and of the Rodinia-like kernels, and about every million
// loop iterations). On error the returned Cost is zero.
func Run(ctx context.Context, id nvc0.KernelID, params []uint64, mem Memory) (Cost, error) {
	return RunScratch(ctx, id, params, mem, nil)
}

// RunScratch is Run with working buffers kept in s from launch to launch
// (nil: fresh buffers).
func RunScratch(ctx context.Context, id nvc0.KernelID, params []uint64, mem Memory, s *Scratch) (Cost, error) {
	if s == nil {
		s = &Scratch{}
	}
	h, ok := kernelTable[id]
	if !ok {
		return Cost{}, fmt.Errorf("kernels: kernel id %d: %w", uint32(id), ErrUnknownKernel)
	}
	name := id.String()
	if len(params) != h.nparams {
		return Cost{}, fmt.Errorf("%s: got %d parameter words, want %d: %w", name, len(params), h.nparams, ErrBadParams)
	}
	if err := ctx.Err(); err != nil {
		return Cost{}, fmt.Errorf("%s: %w", name, err)
	}
	return h.run(ctx, name, params, mem, s)
}

func u32Slab(s *Scratch) *slab[uint32]  { return &s.u32 }
func f32Slab(s *Scratch) *slab[float32] { return &s.f32 }

// runNop is the nop kernel.
func runNop(context.Context, string, []uint64, Memory, *Scratch) (Cost, error) {
	return Cost{}, nil
}
