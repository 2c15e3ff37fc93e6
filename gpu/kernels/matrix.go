package kernels

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// addOps is the Ops of an elementwise n×n kernel: one operation per element.
func addOps(n uint64) uint64 { return n * n }

// mulOps is the Ops of an n×n matrix product: a multiply and an add for each
// of the n³ terms.
func mulOps(n uint64) uint64 { return 2 * n * n * n }

// matrixKernel builds the handler of a kernel with params [a, b, c, n] over
// n×n matrices of T: it validates the parameters, reads a and b completely,
// computes c and writes it. Its buffers come from the Scratch (raw 0 the
// bytes read, raw 1 the bytes written; T slabs 0 and 1 a and b, 2 and 3
// the computation's own).
func matrixKernel[T uint32 | float32](
	slabOf func(*Scratch) *slab[T],
	decode func([]T, []byte),
	encode func([]byte, []T),
	compute func(ctx context.Context, a, b []T, n int, sl *slab[T]) ([]T, error),
	ops func(n uint64) uint64,
) func(context.Context, string, []uint64, Memory, *Scratch) (Cost, error) {
	return func(ctx context.Context, name string, params []uint64, mem Memory, sc *Scratch) (Cost, error) {
		va, vb, vc, n := params[0], params[1], params[2], params[3]
		if n == 0 || n > nvc0.MaxKernelMatrixDim {
			return Cost{}, fmt.Errorf("%s: matrix dimension %d not in [1, %d]: %w", name, n, nvc0.MaxKernelMatrixDim, ErrBadParams)
		}
		size := n * n * 4
		for _, m := range []struct {
			what string
			va   uint64
		}{{"a", va}, {"b", vb}, {"c", vc}} {
			if m.va > math.MaxUint64-(size-1) {
				return Cost{}, fmt.Errorf("%s: matrix %s at %#x (%d bytes) wraps the address space: %w", name, m.what, m.va, size, ErrBadParams)
			}
		}
		if mem == nil {
			return Cost{}, fmt.Errorf("%s: nil Memory", name)
		}
		sl := slabOf(sc)
		buf := sc.raw.get(0, int(size))
		if err := mem.ReadAt(buf, va); err != nil {
			return Cost{}, fmt.Errorf("%s: read a at %#x: %w", name, va, err)
		}
		a := sl.get(0, int(n*n))
		decode(a, buf)
		if err := mem.ReadAt(buf, vb); err != nil {
			return Cost{}, fmt.Errorf("%s: read b at %#x: %w", name, vb, err)
		}
		b := sl.get(1, int(n*n))
		decode(b, buf)
		c, err := compute(ctx, a, b, int(n), sl)
		if err != nil {
			return Cost{}, fmt.Errorf("%s: %w", name, err)
		}
		out := sc.raw.get(1, int(size))
		encode(out, c)
		if err := mem.WriteAt(out, vc); err != nil {
			return Cost{}, fmt.Errorf("%s: write c at %#x: %w", name, vc, err)
		}
		return Cost{Ops: ops(n), Bytes: 3 * size}, nil
	}
}

// maddU32 is the madd kernel's computation; it reuses a for the result.
func maddU32(_ context.Context, a, b []uint32, _ int, _ *slab[uint32]) ([]uint32, error) {
	b = b[:len(a)]
	for i := range a {
		a[i] += b[i]
	}
	return a, nil
}

// maddF32 is the fmadd kernel's computation; it reuses a for the result.
func maddF32(_ context.Context, a, b []float32, _ int, _ *slab[float32]) ([]float32, error) {
	b = b[:len(a)]
	for i := range a {
		a[i] += b[i]
	}
	return a, nil
}

// mmulBlockWork is the target number of multiply-adds in one row block of a
// matrix product: the granularity of work sharing and of context checks
// (about 10 ms of one core).
const mmulBlockWork = 1 << 24

// mmulBlockRows returns how many rows of c one block of an n×n product
// computes: an even number (the inner kernels go two rows at a time) giving
// about mmulBlockWork multiply-adds.
func mmulBlockRows(n int) int {
	r := mmulBlockWork / (n * n)
	return max(2, r&^1)
}

// mmulU32 is the mmul kernel's computation: c = a × b, wrapping.
func mmulU32(ctx context.Context, a, b []uint32, n int, sl *slab[uint32]) ([]uint32, error) {
	bt, err := transpose(ctx, b, n, sl.get(2, n*n))
	if err != nil {
		return nil, err
	}
	c := sl.get(3, n*n)
	err = parallelRows(ctx, n, mmulBlockRows(n), func(i0, i1 int) {
		mmulRowsU32(c, a, bt, n, i0, i1)
	})
	return c, err
}

// mmulF32 is the fmmul kernel's computation: c = a × b in the summation
// order described in the package documentation.
func mmulF32(ctx context.Context, a, b []float32, n int, sl *slab[float32]) ([]float32, error) {
	bt, err := transpose(ctx, b, n, sl.get(2, n*n))
	if err != nil {
		return nil, err
	}
	c := sl.get(3, n*n)
	err = parallelRows(ctx, n, mmulBlockRows(n), func(i0, i1 int) {
		mmulRowsF32(c, a, bt, n, i0, i1)
	})
	return c, err
}

// transposeTile is the tile edge of the cache-blocked transpose.
const transposeTile = 32

// transpose writes the transpose of the n×n row-major matrix m into t
// (n·n elements) and returns it.
func transpose[T any](ctx context.Context, m []T, n int, t []T) ([]T, error) {
	err := parallelRows(ctx, n, transposeTile, func(j0, j1 int) {
		for k0 := 0; k0 < n; k0 += transposeTile {
			k1 := min(k0+transposeTile, n)
			for j := j0; j < j1; j++ {
				row := t[j*n : j*n+n]
				for k := k0; k < k1; k++ {
					row[k] = m[k*n+j]
				}
			}
		}
	})
	return t, err
}

// parallelRows calls body on consecutive blocks [i0, i1) of block rows
// covering [0, n), spread over runtime.GOMAXPROCS(0) goroutines. Before each
// block it checks ctx; once ctx is done no further blocks start and
// parallelRows returns ctx.Err() after the running blocks finish.
func parallelRows(ctx context.Context, n, block int, body func(i0, i1 int)) error {
	workers := min(runtime.GOMAXPROCS(0), (n+block-1)/block)
	var next atomic.Int64
	var cancelled atomic.Bool
	worker := func() {
		for {
			if ctx.Err() != nil {
				cancelled.Store(true)
				return
			}
			i0 := int(next.Add(int64(block))) - block
			if i0 >= n {
				return
			}
			body(i0, min(i0+block, n))
		}
	}
	var wg sync.WaitGroup
	for range workers - 1 {
		wg.Go(worker)
	}
	worker()
	wg.Wait()
	if cancelled.Load() {
		return ctx.Err()
	}
	return nil
}

// mmulRowsU32 computes rows [i0, i1) of c = a × b for uint32 matrices, given
// bt, the transpose of b. It works on 2×4 tiles of c so that each loaded
// element feeds several independent accumulators.
func mmulRowsU32(c, a, bt []uint32, n, i0, i1 int) {
	i := i0
	for ; i+1 < i1; i += 2 {
		a0 := a[i*n:][:n]
		a1 := a[(i+1)*n:][:n]
		c0 := c[i*n:][:n]
		c1 := c[(i+1)*n:][:n]
		j := 0
		for ; j+3 < n; j += 4 {
			b0 := bt[j*n:][:n]
			b1 := bt[(j+1)*n:][:n]
			b2 := bt[(j+2)*n:][:n]
			b3 := bt[(j+3)*n:][:n]
			var s00, s01, s02, s03, s10, s11, s12, s13 uint32
			for k := range a0 {
				x0, x1 := a0[k], a1[k]
				y0, y1, y2, y3 := b0[k], b1[k], b2[k], b3[k]
				s00 += x0 * y0
				s01 += x0 * y1
				s02 += x0 * y2
				s03 += x0 * y3
				s10 += x1 * y0
				s11 += x1 * y1
				s12 += x1 * y2
				s13 += x1 * y3
			}
			c0[j], c0[j+1], c0[j+2], c0[j+3] = s00, s01, s02, s03
			c1[j], c1[j+1], c1[j+2], c1[j+3] = s10, s11, s12, s13
		}
		for ; j < n; j++ {
			b0 := bt[j*n:][:n]
			var s0, s1 uint32
			for k := range a0 {
				s0 += a0[k] * b0[k]
				s1 += a1[k] * b0[k]
			}
			c0[j], c1[j] = s0, s1
		}
	}
	if i < i1 {
		a0 := a[i*n:][:n]
		c0 := c[i*n:][:n]
		for j := range c0 {
			b0 := bt[j*n:][:n]
			var s uint32
			for k := range a0 {
				s += a0[k] * b0[k]
			}
			c0[j] = s
		}
	}
}

// mmulRowsF32 computes rows [i0, i1) of c = a × b for float32 matrices, given
// bt, the transpose of b, on 2×4 tiles of c. Each accumulator starts at +0
// and adds its rounded products in increasing k, which is the order the
// package documentation defines; the float32 conversions keep the compiler
// from fusing a multiply and an add.
func mmulRowsF32(c, a, bt []float32, n, i0, i1 int) {
	i := i0
	for ; i+1 < i1; i += 2 {
		a0 := a[i*n:][:n]
		a1 := a[(i+1)*n:][:n]
		c0 := c[i*n:][:n]
		c1 := c[(i+1)*n:][:n]
		j := 0
		for ; j+3 < n; j += 4 {
			b0 := bt[j*n:][:n]
			b1 := bt[(j+1)*n:][:n]
			b2 := bt[(j+2)*n:][:n]
			b3 := bt[(j+3)*n:][:n]
			var s00, s01, s02, s03, s10, s11, s12, s13 float32
			for k := range a0 {
				x0, x1 := a0[k], a1[k]
				y0, y1, y2, y3 := b0[k], b1[k], b2[k], b3[k]
				s00 += float32(x0 * y0)
				s01 += float32(x0 * y1)
				s02 += float32(x0 * y2)
				s03 += float32(x0 * y3)
				s10 += float32(x1 * y0)
				s11 += float32(x1 * y1)
				s12 += float32(x1 * y2)
				s13 += float32(x1 * y3)
			}
			c0[j], c0[j+1], c0[j+2], c0[j+3] = s00, s01, s02, s03
			c1[j], c1[j+1], c1[j+2], c1[j+3] = s10, s11, s12, s13
		}
		for ; j < n; j++ {
			b0 := bt[j*n:][:n]
			var s0, s1 float32
			for k := range a0 {
				s0 += float32(a0[k] * b0[k])
				s1 += float32(a1[k] * b0[k])
			}
			c0[j], c1[j] = s0, s1
		}
	}
	if i < i1 {
		a0 := a[i*n:][:n]
		c0 := c[i*n:][:n]
		for j := range c0 {
			b0 := bt[j*n:][:n]
			var s float32
			for k := range a0 {
				s += float32(a0[k] * b0[k])
			}
			c0[j] = s
		}
	}
}
