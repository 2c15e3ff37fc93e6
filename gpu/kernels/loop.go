package kernels

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// loopChunk is how many loop iterations run between context checks.
const loopChunk = 1 << 20

// The loop kernel's step is a 64-bit linear congruential generator (Knuth's
// MMIX constants): each iteration depends on the previous one, so the
// iterations cannot be overlapped, vectorised or folded away.
const (
	lcgMul = 6364136223846793005
	lcgInc = 1442695040888963407
)

// runLoop is the loop kernel: params [iterations, result]; a non-zero result
// address receives the generator's final value.
func runLoop(ctx context.Context, name string, params []uint64, mem Memory, _ *Scratch) (Cost, error) {
	iters, out := params[0], params[1]
	if iters > nvc0.MaxKernelLoopIterations {
		return Cost{}, fmt.Errorf("%s: %d iterations exceeds the maximum %d: %w", name, iters, uint64(nvc0.MaxKernelLoopIterations), ErrBadParams)
	}
	x, err := loop(ctx, iters)
	if err != nil {
		return Cost{}, fmt.Errorf("%s: %w", name, err)
	}
	if out == 0 {
		return Cost{Ops: iters}, nil
	}
	if err := mem.WriteAt(binary.LittleEndian.AppendUint64(nil, x), out); err != nil {
		return Cost{}, fmt.Errorf("%s: write result at %#x: %w", name, out, err)
	}
	return Cost{Ops: iters, Bytes: 8}, nil
}

// LoopValue is the host reference of the loop kernel: the generator's value
// after iters steps from 0.
func LoopValue(iters uint64) uint64 { return spin(0, iters) }

// loop runs iters steps of the generator from seed 0, checking ctx every
// loopChunk steps, and returns the final value (the sink that keeps the work
// observable).
func loop(ctx context.Context, iters uint64) (uint64, error) {
	var x uint64
	for iters > 0 {
		chunk := min(iters, loopChunk)
		x = spin(x, chunk)
		iters -= chunk
		if iters > 0 {
			if err := ctx.Err(); err != nil {
				return x, err
			}
		}
	}
	return x, nil
}

// spin advances the generator n steps. It is not inlined, so its result is
// computed even where the caller discards it.
//
//go:noinline
func spin(x, n uint64) uint64 {
	for ; n > 0; n-- {
		x = x*lcgMul + lcgInc
	}
	return x
}
