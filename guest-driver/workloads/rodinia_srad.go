package workloads

import (
	"fmt"
	"math"
	"sync"

	"github.com/gpuvm/gpuvm/gpu/kernels"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
)

// sradLambda is the diffusion rate of both SRAD workloads (Rodinia's
// default run).
const sradLambda = 0.5

// speckleScale is SRAD's q0sqr for a region of n pixels with the given sum
// and sum of squares: the variance over the squared mean, in float32 as
// Rodinia's host code computes it.
func speckleScale(sum, sum2, n float32) float32 {
	mean := sum / n
	variance := sum2/n - float32(mean*mean)
	return variance / float32(mean*mean)
}

// sradParams returns the parameter words of srad_coeff or srad_update: the
// six arrays, the grid and the scalar.
func sradParams(bufs []gdev.DevPtr, rows, cols int, scalar float32) []uint64 {
	p := make([]uint64, 0, 9)
	for _, b := range bufs[:6] {
		p = append(p, b.VA)
	}
	return append(p, uint64(rows), uint64(cols), nvc0.F32Word(scalar))
}

// sradWorkload is Rodinia's srad_v1: the image goes to the device once; per
// iteration the device sums it, the host reads the two sums back and
// computes the speckle scale, and the two SRAD kernels run.
type sradWorkload struct {
	rows, cols, iters int
	once              sync.Once
	img               []byte
	expect            []byte
	out               []byte // allocated once (see matrixWorkload.out)
}

func newSrad(s rodiniaSize) *sradWorkload {
	return &sradWorkload{rows: s.sradRows, cols: s.sradCols, iters: s.sradIter}
}

func (*sradWorkload) Name() string        { return "srad" }
func (*sradWorkload) Description() string { return Describe("srad") }

// prepare builds a speckled test image: a smooth pattern of grey levels
// times unit-mean multiplicative noise, as ultrasound speckle is.
func (w *sradWorkload) prepare() {
	r := rng(uint64(w.rows)<<16 | uint64(w.cols))
	img := make([]float32, w.rows*w.cols)
	for y := range w.rows {
		for x := range w.cols {
			base := 96 + 64*math.Sin(float64(x)/23)*math.Cos(float64(y)/31)
			img[y*w.cols+x] = float32(min(255, base*(0.5+r.Float64())))
		}
	}
	w.img = kernels.EncodeF32s(img)
	w.expect = kernels.EncodeF32s(kernels.SradF32(img, w.rows, w.cols, w.iters, sradLambda))
	w.out = make([]byte, len(w.img))
}

func (w *sradWorkload) Run(drv gdev.Driver) (Phases, error) {
	w.once.Do(w.prepare)
	clear(w.out)
	size, n := uint64(len(w.img)), uint64(w.rows*w.cols)
	ph, err := runCtx(drv, func(ctx *gdev.Context, t *timer, ph *Phases) error {
		fns, err := loadFunctions(ctx, nvc0.KernelSradExtract, nvc0.KernelSradReduce, nvc0.KernelSradCoeff, nvc0.KernelSradUpdate, nvc0.KernelSradCompress)
		if err != nil {
			return err
		}
		extract, reduce, coeff, update, compress := fns[0], fns[1], fns[2], fns[3], fns[4]
		// The image, the four differences, the coefficients, and the sums.
		bufs, err := memAllocAll(ctx, size, size, size, size, size, size, 8)
		if err != nil {
			return err
		}
		img, sums := bufs[0], bufs[6]
		t.lap(&ph.Init)
		if err := ctx.MemcpyHtoD(img, w.img); err != nil {
			return err
		}
		t.lap(&ph.HtoD)
		if err := ctx.Launch(extract, img.VA, n); err != nil {
			return err
		}
		var s [8]byte
		for range w.iters {
			if err := ctx.Launch(reduce, img.VA, sums.VA, n); err != nil {
				return err
			}
			if err := ctx.Synchronize(); err != nil {
				return err
			}
			if err := ctx.MemcpyDtoH(s[:], sums); err != nil {
				return err
			}
			q0sqr := speckleScale(f32At(s[:], 0), f32At(s[:], 1), float32(n))
			if err := ctx.Launch(coeff, sradParams(bufs, w.rows, w.cols, q0sqr)...); err != nil {
				return err
			}
			if err := ctx.Launch(update, sradParams(bufs, w.rows, w.cols, sradLambda)...); err != nil {
				return err
			}
		}
		if err := ctx.Launch(compress, img.VA, n); err != nil {
			return err
		}
		if err := ctx.Synchronize(); err != nil {
			return err
		}
		t.lap(&ph.Launch)
		if err := ctx.MemcpyDtoH(w.out, img); err != nil {
			return err
		}
		t.lap(&ph.DtoH)
		return memFreeAll(ctx, bufs)
	})
	if err == nil {
		err = verifyBytes(fmt.Sprintf("srad %dx%d, %d iterations", w.rows, w.cols, w.iters), w.out, w.expect)
	}
	return ph, err
}

// srad2Workload is Rodinia's srad_v2: per iteration the host computes the
// speckle scale of a region of its copy of the image, sends the image to
// the device, runs the two SRAD kernels and reads the image back.
type srad2Workload struct {
	n, iters int
	roi      kernels.SradROI
	once     sync.Once
	img      []byte
	expect   []byte
	out      []byte // the host's image: allocated once, reset before each run
}

func newSrad2(s rodiniaSize) *srad2Workload {
	last := min(127, s.srad2Dim-1)
	return &srad2Workload{n: s.srad2Dim, iters: s.srad2Iter, roi: kernels.SradROI{R1: 0, R2: last, C1: 0, C2: last}}
}

func (*srad2Workload) Name() string        { return "srad2" }
func (*srad2Workload) Description() string { return Describe("srad2") }

// prepare builds Rodinia's random pseudo-input: exp of uniform [0, 1) pixels.
func (w *srad2Workload) prepare() {
	r := rng(uint64(w.n) << 20)
	j := make([]float32, w.n*w.n)
	for i := range j {
		j[i] = float32(math.Exp(float64(r.Float32())))
	}
	w.img = kernels.EncodeF32s(j)
	w.expect = kernels.EncodeF32s(kernels.SradV2F32(j, w.n, w.n, w.roi, w.iters, sradLambda))
	w.out = make([]byte, len(w.img))
}

// regionScale is the speckle scale of the region of the host's image p,
// summed row by row.
func (w *srad2Workload) regionScale(p []byte) float32 {
	var sum, sum2 float32
	for y := w.roi.R1; y <= w.roi.R2; y++ {
		for x := w.roi.C1; x <= w.roi.C2; x++ {
			v := f32At(p, y*w.n+x)
			sum += v
			sum2 += float32(v * v)
		}
	}
	return speckleScale(sum, sum2, float32((w.roi.R2-w.roi.R1+1)*(w.roi.C2-w.roi.C1+1)))
}

func (w *srad2Workload) Run(drv gdev.Driver) (Phases, error) {
	w.once.Do(w.prepare)
	copy(w.out, w.img) // the host's image starts as the input, before the timed phases
	size := uint64(len(w.img))
	ph, err := runCtx(drv, func(ctx *gdev.Context, t *timer, ph *Phases) error {
		fns, err := loadFunctions(ctx, nvc0.KernelSradCoeff, nvc0.KernelSradUpdate)
		if err != nil {
			return err
		}
		bufs, err := memAllocAll(ctx, size, size, size, size, size, size)
		if err != nil {
			return err
		}
		t.lap(&ph.Init)
		for range w.iters {
			q0sqr := w.regionScale(w.out)
			t.add(&ph.Launch)
			if err := ctx.MemcpyHtoD(bufs[0], w.out); err != nil {
				return err
			}
			t.add(&ph.HtoD)
			if err := ctx.Launch(fns[0], sradParams(bufs, w.n, w.n, q0sqr)...); err != nil {
				return err
			}
			if err := ctx.Launch(fns[1], sradParams(bufs, w.n, w.n, sradLambda)...); err != nil {
				return err
			}
			if err := ctx.Synchronize(); err != nil {
				return err
			}
			t.add(&ph.Launch)
			if err := ctx.MemcpyDtoH(w.out, bufs[0]); err != nil {
				return err
			}
			t.add(&ph.DtoH)
		}
		return memFreeAll(ctx, bufs)
	})
	if err == nil {
		err = verifyBytes(fmt.Sprintf("srad2 %dx%d, %d iterations", w.n, w.n, w.iters), w.out, w.expect)
	}
	return ph, err
}
