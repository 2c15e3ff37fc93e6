package kernels

import "fmt"

// The host references below are deliberately plain, single-threaded loops,
// written independently of the kernels, for verifying workload results.

// MaddU32 returns a + b elementwise with wrapping uint32 addition: the host
// reference of the madd kernel. It panics if len(a) != len(b).
func MaddU32(a, b []uint32) []uint32 { return madd(a, b) }

// MaddF32 returns a + b elementwise in float32: the host reference of the
// fmadd kernel, bit-identical to it. It panics if len(a) != len(b).
func MaddF32(a, b []float32) []float32 { return madd(a, b) }

// madd adds elementwise (one rounding per element for float32, so it is
// exact to the kernel's result).
func madd[T uint32 | float32](a, b []T) []T {
	checkSameLen(a, b)
	c := make([]T, len(a))
	for i := range c {
		c[i] = a[i] + b[i]
	}
	return c
}

// MmulU32 returns the product a × b of n×n row-major uint32 matrices with
// wrapping arithmetic: the host reference of the mmul kernel. It panics if
// len(a) or len(b) is not n·n.
func MmulU32(a, b []uint32, n int) []uint32 {
	checkSquare(a, n)
	checkSquare(b, n)
	c := make([]uint32, n*n)
	for i := range n {
		crow := c[i*n : i*n+n]
		for k := range n {
			x := a[i*n+k]
			brow := b[k*n : k*n+n]
			for j := range crow {
				crow[j] += x * brow[j]
			}
		}
	}
	return c
}

// MmulF32 returns the product a × b of n×n row-major float32 matrices: the
// host reference of the fmmul kernel. It accumulates every c[i][j] from +0 in
// increasing k, rounding each product to float32 before adding it (no FMA),
// which is the summation order the package documentation defines, so its
// result is bit-identical to the kernel's. It panics if len(a) or len(b) is
// not n·n.
func MmulF32(a, b []float32, n int) []float32 {
	checkSquare(a, n)
	checkSquare(b, n)
	c := make([]float32, n*n)
	for i := range n {
		crow := c[i*n : i*n+n]
		for k := range n {
			x := a[i*n+k]
			brow := b[k*n : k*n+n]
			for j := range crow {
				crow[j] += float32(x * brow[j])
			}
		}
	}
	return c
}

// checkSameLen panics unless a and b have the same length.
func checkSameLen[T any](a, b []T) {
	if len(a) != len(b) {
		panic(fmt.Sprintf("kernels: operand lengths differ: %d and %d", len(a), len(b)))
	}
}

// checkSquare panics unless m holds n·n elements.
func checkSquare[T any](m []T, n int) {
	if n < 0 || len(m) != n*n {
		panic(fmt.Sprintf("kernels: matrix has %d elements, want %d×%d", len(m), n, n))
	}
}
