// Package kernels is the built-in compute-kernel library of the simulated
// Fermi board, plus the host-side reference implementations that benchmark
// workloads verify results against.
//
// The board's compute engine decodes a kernel code object (see the kernel ABI
// in package nvc0), reads the parameter words from the constant buffer and
// calls [Run] with the kernel id, the parameters and the channel's GPU virtual
// address space as a [Memory]. Run dispatches through a table keyed by
// [nvc0.KernelID], validates the parameters, executes the kernel for real on
// the data in GPU memory and reports the work done as a [Cost] for the board's
// timing model.
//
// The kernels:
//
//	nop    no parameters; does nothing; Cost{}.
//	loop   [iterations]; spins a dependent integer computation;
//	       Cost{Ops: iterations}.
//	madd   [a, b, c, n]; c = a + b over n×n uint32 matrices (wrapping);
//	       Cost{Ops: n², Bytes: 3·n²·4}.
//	mmul   [a, b, c, n]; c = a × b over n×n uint32 matrices (wrapping);
//	       Cost{Ops: 2·n³, Bytes: 3·n²·4}.
//	fmadd  as madd over float32 matrices.
//	fmmul  as mmul over float32 matrices.
//
// Matrices are n×n, row-major, 4-byte little-endian elements at GPU virtual
// addresses a, b and c. A matrix kernel reads both inputs completely before it
// writes the result, so c may alias a or b. If it fails (an MMU fault or a
// cancelled context) before the write, c is left untouched.
//
// # Float summation order
//
// The float32 matrix product is defined, on the "GPU" and in the host
// reference [MmulF32] alike, as
//
//	c[i][j] = (…((0 + a[i][0]·b[0][j]) + a[i][1]·b[1][j]) + …) + a[i][n-1]·b[n-1][j]
//
// evaluated in float32 with round-to-nearest-even: every product is rounded to
// float32 before it is added (never fused into an FMA; the code uses explicit
// float32 conversions, which the Go specification guarantees prevent fusion),
// and the additions run in increasing k starting from +0. The kernel blocks
// and parallelises over rows and columns only, never over k, so its results
// are bit-identical to the reference and verification can compare exactly.
// Elementwise fmadd is a single rounded addition per element, also exact.
package kernels
