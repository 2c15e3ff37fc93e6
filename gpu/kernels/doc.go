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
// The Rodinia-like kernels of the thesis' Table 4.2 (bp, hs, lud, nn, srad,
// srad2), over float32 arrays; B is nvc0.BPBlockInputs (16), nb = ⌈nin/B⌉,
// b = min(nvc0.LUDBlockSize, n−k) and m = n−k−b:
//
//	bp_layerforward    [x, w, partial, nin, nh]; partial[q][j] = Σ x[i]·w[i+1][j]
//	                   over block q's inputs i ∈ [qB, qB+B) ∩ [0, nin), for nb×nh
//	                   values; Cost{Ops: 2·nin·nh, Bytes: 4·(nin + nin·nh + nb·nh)}.
//	bp_adjust_weights  [delta, x, w, oldw, nin, nh]; for r ∈ [0, nin] with input
//	                   1 (r = 0, the bias) or x[r−1]: dw = η·delta[j]·input +
//	                   μ·oldw[r][j], w[r][j] += dw, oldw[r][j] = dw (η = BPEta,
//	                   μ = BPMomentum); Cost{Ops: 4·(nin+1)·nh + nh,
//	                   Bytes: 4·(nh + nin + 4·(nin+1)·nh)}.
//	hotspot            [power, src, dst, rows, cols, steps, stepDivCap, rx1, ry1,
//	                   rz1, amb]; steps stencil iterations from src into dst;
//	                   Cost{Ops: 14·rows·cols·steps, Bytes: 12·rows·cols}.
//	lud_diagonal       [a, n, k]; factors the b×b block at (k, k) in place;
//	                   Cost{Ops: b(b−1)/2 + (b−1)b(2b−1)/3, Bytes: 8·b²}.
//	lud_perimeter      [a, n, k]; solves the b×m block row right of it and the
//	                   m×b block column below it; Cost{Ops: m·(2b²−b),
//	                   Bytes: 4·(b² + 4·b·m)}.
//	lud_internal       [a, n, k]; subtracts their product from the m×m trailing
//	                   block; Cost{Ops: 2·b·m², Bytes: 4·(2·b·m + 2·m²)}.
//	nn_euclid          [locs, dist, n, lat, lng]; dist[i] = √((lat_i−lat)² +
//	                   (lng_i−lng)²); Cost{Ops: 6·n, Bytes: 12·n}.
//	srad_extract       [img, n]; img[i] = exp(img[i]/255); Cost{Ops: 2·n, Bytes: 8·n}.
//	srad_reduce        [img, sums, n]; sums = (Σ img[i], Σ img[i]²);
//	                   Cost{Ops: 3·n, Bytes: 4·n + 8}.
//	srad_coeff         [j, dn, ds, dw, de, c, rows, cols, q0sqr]; neighbour
//	                   differences and diffusion coefficients;
//	                   Cost{Ops: 31·rows·cols, Bytes: 24·rows·cols}.
//	srad_update        [j, dn, ds, dw, de, c, rows, cols, lambda]; the divergence
//	                   step, j in place; Cost{Ops: 9·rows·cols, Bytes: 28·rows·cols}.
//	srad_compress      [img, n]; img[i] = log(img[i])·255; Cost{Ops: 2·n, Bytes: 8·n}.
//
// Scalars named in the parameter lists after the dimensions (stepDivCap …
// amb, lat, lng, q0sqr, lambda) are float32 words (nvc0.F32Word). Bytes
// counts each array once per launch, as a GPU that keeps a tile's
// neighbours on chip moves them; the lud kernels transfer whole rows but
// count only the blocks they use. Every kernel validates all of its words
// (see [ErrBadParams]), reads all of its inputs before it writes any output,
// and checks its context between blocks of rows (or records, or pixels), so
// an MMU fault on an input or a cancellation leaves every output untouched;
// a fault writing an output can leave the outputs before it, in parameter
// order, written. hotspot, lud and srad_update work in place (dst may be
// src). A grid neighbour outside the grid (hotspot, srad) is the cell itself.
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
//
// # Evaluation order of the Rodinia-like kernels
//
// The same rules hold for the Rodinia-like kernels and their references
// ([BackpropF32], [HotspotF32], [LUDF32], [NNF32], [SradF32], [SradV2F32]):
// every operation is a float32 operation rounded to nearest even, every
// product is rounded before it is added (explicit conversions, no FMA), sums
// run left to right as written below, and the kernels parallelise only over
// independent outputs. exp, log and √ are Go's float64 math.Exp, math.Log and
// math.Sqrt of the float32 argument, rounded to float32.
//
//	bp_layerforward    partial[q][j] = (…((0 + x[i₀]·w[i₀+1][j]) + x[i₀+1]·w[i₀+2][j]) + …),
//	                   i increasing over the block; the host then sums
//	                   (…(0 + partial[0][j]) + partial[1][j] …) + w[0][j] and
//	                   squashes it to h[j] = 1/(1+e^−s) in float64.
//	bp_adjust_weights  dw = (η·delta[j])·input + μ·oldw[r][j]; w + dw.
//	hotspot            with t the cell, n, s, w, e its neighbours, p its power:
//	                   v = p + ((n + s) − (t + t))·ry1; v = v + ((e + w) − (t + t))·rx1;
//	                   v = v + (amb − t)·rz1; t' = t + stepDivCap·v.
//	lud_*              Doolittle elimination without pivoting: element (i, j)
//	                   receives a[i][j] −= a[i][p]·a[p][j] for p = 0, 1, … below
//	                   min(i, j), one rounded product at a time in increasing p
//	                   (across the launches of the block steps), and an element
//	                   below the diagonal is then divided by a[j][j].
//	nn_euclid          d = √((lat_i − lat)·(lat_i − lat) + (lng_i − lng)·(lng_i − lng)).
//	srad_reduce        partial sums over chunks of SradReduceChunk consecutive
//	                   pixels, each from +0 in increasing index, then the
//	                   chunks' sums added from +0 in chunk order; the same for
//	                   the squares v·v.
//	srad_coeff         with J the pixel and dN, dS, dW, dE the neighbours minus J:
//	                   g2 = (((dN·dN + dS·dS) + dW·dW) + dE·dE) / (J·J);
//	                   l = (((dN + dS) + dW) + dE) / J; num = 0.5·g2 − 0.0625·(l·l);
//	                   den = 1 + 0.25·l; q² = num / (den·den);
//	                   c = 1 / (1 + (q² − q0sqr) / (q0sqr·(1 + q0sqr))), then 0 if
//	                   c < 0 and 1 if c > 1.
//	srad_update        with cS, cE the coefficients of the south and east
//	                   neighbours: D = ((c·dN + cS·dS) + c·dW) + cE·dE;
//	                   J' = J + (0.25·lambda)·D.
//
// The workloads' host code computes the SRAD speckle scale as
// q0sqr = (sum2/n − mean·mean) / (mean·mean) with mean = sum/n, from
// srad_reduce's sums over the whole image (srad) or from float32 sums over a
// region, row by row (srad2).
package kernels
