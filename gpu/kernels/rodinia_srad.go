package kernels

import (
	"context"
	"fmt"
	"math"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// SradReduceChunk is how many consecutive pixels srad_reduce sums into one
// partial sum before it adds the partial sums up in order (see the package
// documentation).
const SradReduceChunk = 1024

// The arithmetic of one pixel of the SRAD kernels (see the package
// documentation).
const (
	sradCoeffOps  = 31
	sradUpdateOps = 9
)

// sradPixelsPerTask is how many pixels one task of the pointwise SRAD
// kernels' parallel loops handles.
const sradPixelsPerTask = 1 << 16

// sradExtract is srad_extract's map: exp(v/255).
func sradExtract(v float32) float32 { return float32(math.Exp(float64(v / 255))) }

// sradCompress is srad_compress's map: log(v)·255.
func sradCompress(v float32) float32 { return float32(math.Log(float64(v))) * 255 }

// runSradPointwise builds the handler of srad_extract or srad_compress:
// params [img, n], f applied to each pixel in place. Scratch: f32 0 the
// pixels.
func runSradPointwise(f func(float32) float32) func(context.Context, string, []uint64, Memory, *Scratch) (Cost, error) {
	return func(ctx context.Context, name string, params []uint64, mem Memory, sc *Scratch) (Cost, error) {
		vi, n := params[0], params[1]
		if err := checkCount(name, "pixel count", n, nvc0.MaxKernelPixels); err != nil {
			return Cost{}, err
		}
		if err := checkArrays(name, array{"img", vi, 4 * n}); err != nil {
			return Cost{}, err
		}
		if mem == nil {
			return Cost{}, errNilMemory(name)
		}
		img := sc.f32.get(0, int(n))
		if err := readF32s(name, mem, sc, img, "img", vi); err != nil {
			return Cost{}, err
		}
		err := parallelRows(ctx, int(n), sradPixelsPerTask, func(i0, i1 int) {
			for i := i0; i < i1; i++ {
				img[i] = f(img[i])
			}
		})
		if err != nil {
			return Cost{}, fmt.Errorf("%s: %w", name, err)
		}
		if err := writeF32s(name, mem, sc, img, "img", vi); err != nil {
			return Cost{}, err
		}
		return Cost{Ops: 2 * n, Bytes: 8 * n}, nil
	}
}

// runSradReduce is the srad_reduce kernel: params [img, sums, n]. Scratch:
// f32 0 the pixels, 1 the chunks' partial sums and sums of squares.
func runSradReduce(ctx context.Context, name string, params []uint64, mem Memory, sc *Scratch) (Cost, error) {
	vi, vs, n := params[0], params[1], params[2]
	if err := checkCount(name, "pixel count", n, nvc0.MaxKernelPixels); err != nil {
		return Cost{}, err
	}
	if err := checkArrays(name, array{"img", vi, 4 * n}, array{"sums", vs, 8}); err != nil {
		return Cost{}, err
	}
	if mem == nil {
		return Cost{}, errNilMemory(name)
	}
	img := sc.f32.get(0, int(n))
	if err := readF32s(name, mem, sc, img, "img", vi); err != nil {
		return Cost{}, err
	}
	chunks := (int(n) + SradReduceChunk - 1) / SradReduceChunk
	part := sc.f32.get(1, 2*chunks)
	err := parallelRows(ctx, chunks, sradPixelsPerTask/SradReduceChunk, func(c0, c1 int) {
		for c := c0; c < c1; c++ {
			var s, s2 float32
			for _, v := range img[c*SradReduceChunk : min((c+1)*SradReduceChunk, int(n))] {
				s += v
				s2 += float32(v * v)
			}
			part[2*c], part[2*c+1] = s, s2
		}
	})
	if err != nil {
		return Cost{}, fmt.Errorf("%s: %w", name, err)
	}
	var sums [2]float32
	for c := range chunks {
		sums[0] += part[2*c]
		sums[1] += part[2*c+1]
	}
	if err := writeF32s(name, mem, sc, sums[:], "sums", vs); err != nil {
		return Cost{}, err
	}
	return Cost{Ops: 3 * n, Bytes: 4*n + 8}, nil
}

// sradGrid validates the parameters the two SRAD grid kernels share —
// [j, dn, ds, dw, de, c, rows, cols, scalar] — and returns the grid size
// and the scalar.
func sradGrid(name, scalar string, params []uint64, mem Memory) (rows, cols int, f float32, err error) {
	r, c := params[6], params[7]
	if err := checkCount(name, "rows", r, nvc0.MaxKernelGridDim); err != nil {
		return 0, 0, 0, err
	}
	if err := checkCount(name, "cols", c, nvc0.MaxKernelGridDim); err != nil {
		return 0, 0, 0, err
	}
	if f, err = f32Param(name, scalar, params[8]); err != nil {
		return 0, 0, 0, err
	}
	size := 4 * r * c
	var arrays [len(sradArrays)]array
	for i, what := range sradArrays {
		arrays[i] = array{what, params[i], size}
	}
	if err := checkArrays(name, arrays[:]...); err != nil {
		return 0, 0, 0, err
	}
	if mem == nil {
		return 0, 0, 0, errNilMemory(name)
	}
	return int(r), int(c), f, nil
}

// sradArrays names the array parameters of the SRAD grid kernels, in order.
var sradArrays = [6]string{"j", "dn", "ds", "dw", "de", "c"}

// sradPlanes returns Scratch f32 buffers 0..5 sized for a grid of cells
// pixels: j, dn, ds, dw, de and c.
func sradPlanes(sc *Scratch, cells int) (p [6][]float32) {
	for i := range p {
		p[i] = sc.f32.get(i, cells)
	}
	return p
}

// runSradCoeff is the srad_coeff kernel: params [j, dn, ds, dw, de, c, rows,
// cols, q0sqr]. Scratch: f32 0..5 the six arrays.
func runSradCoeff(ctx context.Context, name string, params []uint64, mem Memory, sc *Scratch) (Cost, error) {
	rows, cols, q0sqr, err := sradGrid(name, "q0sqr", params, mem)
	if err != nil {
		return Cost{}, err
	}
	p := sradPlanes(sc, rows*cols)
	if err := readF32s(name, mem, sc, p[0], "j", params[0]); err != nil {
		return Cost{}, err
	}
	qq := q0sqr * (1 + q0sqr)
	err = parallelRows(ctx, rows, gridBlockRows(cols), func(y0, y1 int) {
		for y := y0; y < y1; y++ {
			sradCoeffRow(p, rows, cols, y, q0sqr, qq)
		}
	})
	if err != nil {
		return Cost{}, fmt.Errorf("%s: %w", name, err)
	}
	for i := 1; i < len(p); i++ {
		if err := writeF32s(name, mem, sc, p[i], sradArrays[i], params[i]); err != nil {
			return Cost{}, err
		}
	}
	cells := uint64(rows * cols)
	return Cost{Ops: sradCoeffOps * cells, Bytes: 6 * 4 * cells}, nil
}

// sradCoeffRow computes row y of srad_coeff's five outputs from the image
// p[0], in the package documentation's order; qq is q0sqr·(1+q0sqr).
func sradCoeffRow(p [6][]float32, rows, cols, y int, q0sqr, qq float32) {
	at := func(a []float32, y int) []float32 { return a[y*cols:][:cols] }
	j := at(p[0], y)
	north, south := at(p[0], max(y-1, 0)), at(p[0], min(y+1, rows-1))
	dn, ds, dw, de, c := at(p[1], y), at(p[2], y), at(p[3], y), at(p[4], y), at(p[5], y)
	for x, jc := range j {
		n, s := north[x]-jc, south[x]-jc
		w, e := j[max(x-1, 0)]-jc, j[min(x+1, cols-1)]-jc
		g2 := (float32(n*n) + float32(s*s) + float32(w*w) + float32(e*e)) / float32(jc*jc)
		l := (n + s + w + e) / jc
		num := float32(0.5*g2) - float32(0.0625*float32(l*l))
		den := 1 + float32(0.25*l)
		qsqr := num / float32(den*den)
		den = (qsqr - q0sqr) / qq
		cc := 1 / (1 + den)
		if cc < 0 {
			cc = 0
		} else if cc > 1 {
			cc = 1
		}
		dn[x], ds[x], dw[x], de[x], c[x] = n, s, w, e, cc
	}
}

// runSradUpdate is the srad_update kernel: params [j, dn, ds, dw, de, c,
// rows, cols, lambda]. Scratch: f32 0..5 the six arrays.
func runSradUpdate(ctx context.Context, name string, params []uint64, mem Memory, sc *Scratch) (Cost, error) {
	rows, cols, lambda, err := sradGrid(name, "lambda", params, mem)
	if err != nil {
		return Cost{}, err
	}
	p := sradPlanes(sc, rows*cols)
	for i, what := range sradArrays {
		if err := readF32s(name, mem, sc, p[i], what, params[i]); err != nil {
			return Cost{}, err
		}
	}
	ql := 0.25 * lambda
	err = parallelRows(ctx, rows, gridBlockRows(cols), func(y0, y1 int) {
		for y := y0; y < y1; y++ {
			sradUpdateRow(p, rows, cols, y, ql)
		}
	})
	if err != nil {
		return Cost{}, fmt.Errorf("%s: %w", name, err)
	}
	if err := writeF32s(name, mem, sc, p[0], "j", params[0]); err != nil {
		return Cost{}, err
	}
	cells := uint64(rows * cols)
	return Cost{Ops: sradUpdateOps * cells, Bytes: 7 * 4 * cells}, nil
}

// sradUpdateRow updates row y of the image p[0] from the differences and
// coefficients, in the package documentation's order; ql is 0.25·lambda.
func sradUpdateRow(p [6][]float32, rows, cols, y int, ql float32) {
	at := func(a []float32, y int) []float32 { return a[y*cols:][:cols] }
	j, dn, ds, dw, de := at(p[0], y), at(p[1], y), at(p[2], y), at(p[3], y), at(p[4], y)
	c, south := at(p[5], y), at(p[5], min(y+1, rows-1))
	for x, cc := range c {
		ce := c[min(x+1, cols-1)]
		d := float32(cc*dn[x]) + float32(south[x]*ds[x]) + float32(cc*dw[x]) + float32(ce*de[x])
		j[x] += float32(ql * d)
	}
}
