package kernels

import (
	"context"
	"fmt"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// ludStep is one of the three LU decomposition kernels at block offset k of
// an n×n matrix whose block there is b wide (b = min(nvc0.LUDBlockSize,
// n-k)) and whose trailing part is m = n-k-b wide.
type ludStep struct {
	// rows returns the rows the kernel reads, [k, r1), and the first row it
	// writes, w0 (it writes rows [w0, r1)). Whole rows move, so each is one
	// contiguous transfer.
	rows func(n, k, b int) (r1, w0 int)
	// compute works on rows [k, r1) of the matrix, held in a (row i of the
	// matrix at a[(i-k)·n:]).
	compute func(ctx context.Context, a []float32, n, k, b int) error
	// cost is the kernel's work.
	cost func(b, m uint64) Cost
}

// runLUD builds the handler of an LU kernel: params [a, n, k]. Scratch: f32
// 0 the rows the kernel reads.
func runLUD(s ludStep) func(context.Context, string, []uint64, Memory, *Scratch) (Cost, error) {
	return func(ctx context.Context, name string, params []uint64, mem Memory, sc *Scratch) (Cost, error) {
		va, n64, k64 := params[0], params[1], params[2]
		if err := checkCount(name, "matrix dimension", n64, nvc0.MaxKernelMatrixDim); err != nil {
			return Cost{}, err
		}
		if k64 >= n64 || k64%nvc0.LUDBlockSize != 0 {
			return Cost{}, fmt.Errorf("%s: block offset %d is not a multiple of %d below %d: %w", name, k64, nvc0.LUDBlockSize, n64, ErrBadParams)
		}
		if err := checkArrays(name, array{"a", va, 4 * n64 * n64}); err != nil {
			return Cost{}, err
		}
		if mem == nil {
			return Cost{}, errNilMemory(name)
		}
		n, k := int(n64), int(k64)
		b := min(nvc0.LUDBlockSize, n-k)
		r1, w0 := s.rows(n, k, b)
		if w0 >= r1 { // the last block has no perimeter and no interior
			return Cost{}, nil
		}
		rowBytes := 4 * uint64(n)
		a := sc.f32.get(0, (r1-k)*n)
		if err := readF32s(name, mem, sc, a, "a", va+uint64(k)*rowBytes); err != nil {
			return Cost{}, err
		}
		if err := s.compute(ctx, a, n, k, b); err != nil {
			return Cost{}, fmt.Errorf("%s: %w", name, err)
		}
		if err := writeF32s(name, mem, sc, a[(w0-k)*n:], "a", va+uint64(w0)*rowBytes); err != nil {
			return Cost{}, err
		}
		return s.cost(uint64(b), uint64(n-k-b)), nil
	}
}

// ludRowsPerTask is how many rows one task of a parallel LU loop handles
// when each row costs work multiply-subtracts: about 2^18 of them.
func ludRowsPerTask(work int) int { return max(1, (1<<18)/max(work, 1)) }

// ludDiagonal factors the diagonal block in place: Doolittle elimination,
// each element's updates in increasing pivot order.
var ludDiagonal = ludStep{
	rows: func(n, k, b int) (int, int) { return k + b, k },
	compute: func(ctx context.Context, a []float32, n, k, b int) error {
		if err := ctx.Err(); err != nil { // one block: the only check
			return err
		}
		for p := k; p < k+b; p++ {
			up := a[(p-k)*n:][:n]
			for i := p + 1; i < k+b; i++ {
				ri := a[(i-k)*n:][:n]
				l := ri[p] / up[p]
				ri[p] = l
				for j := p + 1; j < k+b; j++ {
					ri[j] -= float32(l * up[j])
				}
			}
		}
		return nil
	},
	cost: func(b, _ uint64) Cost {
		// Pivot column p has m = b-1-p rows below it: m divisions and m²
		// multiply-subtracts; summed over m = 0..b-1.
		ops := b*(b-1)/2 + (b-1)*b*(2*b-1)/3
		return Cost{Ops: ops, Bytes: 2 * 4 * b * b}
	},
}

// ludPerimeter solves the block row right of the diagonal block (forward
// substitution with its unit lower triangle) and the block column below it
// (with its upper triangle).
var ludPerimeter = ludStep{
	rows: func(n, k, b int) (int, int) {
		if k+b == n {
			return n, n
		}
		return n, k
	},
	compute: func(ctx context.Context, a []float32, n, k, b int) error {
		row := func(i int) []float32 { return a[(i-k)*n:][:n] }
		for p := k; p < k+b; p++ { // the block row, sequentially: b²/2 short rows
			up := row(p)[k+b:]
			for i := p + 1; i < k+b; i++ {
				ri := row(i)
				l, rt := ri[p], ri[k+b:]
				for j, u := range up {
					rt[j] -= float32(l * u)
				}
			}
		}
		return parallelRows(ctx, n-k-b, ludRowsPerTask(b*b), func(i0, i1 int) {
			for i := k + b + i0; i < k+b+i1; i++ {
				ri := row(i)
				for p := k; p < k+b; p++ {
					up := row(p)
					l := ri[p] / up[p]
					ri[p] = l
					for j := p + 1; j < k+b; j++ {
						ri[j] -= float32(l * up[j])
					}
				}
			}
		})
	},
	cost: func(b, m uint64) Cost {
		// Block row: m columns of b(b-1)/2 multiply-subtracts; block
		// column: m rows of b divisions and b(b-1)/2 multiply-subtracts.
		return Cost{Ops: m * (2*b*b - b), Bytes: 4 * (b*b + 4*b*m)}
	},
}

// ludInternal subtracts the product of the block column and the block row
// from the trailing submatrix, one rounded product at a time in increasing
// pivot order.
var ludInternal = ludStep{
	rows: func(n, k, b int) (int, int) { return n, k + b },
	compute: func(ctx context.Context, a []float32, n, k, b int) error {
		m := n - k - b
		return parallelRows(ctx, m, ludRowsPerTask(b*m), func(i0, i1 int) {
			for i := k + b + i0; i < k+b+i1; i++ {
				ri := a[(i-k)*n:][:n]
				rt := ri[k+b:]
				for p := k; p < k+b; p++ {
					l, up := ri[p], a[(p-k)*n+k+b:][:m]
					for j, u := range up {
						rt[j] -= float32(l * u)
					}
				}
			}
		})
	},
	cost: func(b, m uint64) Cost {
		return Cost{Ops: 2 * b * m * m, Bytes: 4 * (2*b*m + 2*m*m)}
	},
}
