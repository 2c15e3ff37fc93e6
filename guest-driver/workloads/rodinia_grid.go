package workloads

import (
	"fmt"
	"sync"

	"github.com/gpuvm/gpuvm/gpu/kernels"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
)

// hotspotWorkload is Rodinia's hotspot: iters steps of the thermal stencil
// on an n×n grid, pyramid steps per launch, the grids ping-ponging between
// two device buffers.
type hotspotWorkload struct {
	n, iters, pyramid int
	k                 kernels.HotspotCoeffs
	once              sync.Once
	power, temp       []byte
	expect            []byte
	out               []byte // allocated once (see matrixWorkload.out)
}

func newHotspot(s rodiniaSize) *hotspotWorkload {
	return &hotspotWorkload{n: s.hsDim, iters: s.hsIters, pyramid: s.hsPyramid, k: hotspotCoeffs(s.hsDim, s.hsDim)}
}

// hotspotCoeffs returns the coefficients of a rows×cols grid over
// Rodinia's chip: 16 mm × 16 mm of silicon 0.5 mm thick (specific heat
// 1.75e6 J/(m³·K), conductivity 100 W/(m·K), at most 3e6 W/m² of power
// density, ambient 80), with the time step that keeps the steepest
// temperature slope to a 0.001 precision. The host computes them in
// float64 and passes them rounded to float32.
func hotspotCoeffs(rows, cols int) kernels.HotspotCoeffs {
	const (
		chipHeight, chipWidth, chipThick = 0.016, 0.016, 0.0005
		factorChip                       = 0.5
		specHeatSi                       = 1.75e6
		kSi                              = 100.0
		maxPowerDensity                  = 3.0e6
		precision                        = 0.001
		ambient                          = 80.0
	)
	gh, gw := chipHeight/float64(rows), chipWidth/float64(cols)
	capacity := factorChip * specHeatSi * chipThick * gw * gh
	rx := gw / (2 * kSi * chipThick * gh)
	ry := gh / (2 * kSi * chipThick * gw)
	rz := chipThick / (kSi * gh * gw)
	maxSlope := maxPowerDensity / (factorChip * chipThick * specHeatSi)
	step := precision / maxSlope
	return kernels.HotspotCoeffs{StepDivCap: float32(step / capacity), Rx1: float32(1 / rx), Ry1: float32(1 / ry), Rz1: float32(1 / rz), Amb: ambient}
}

func (*hotspotWorkload) Name() string        { return "hs" }
func (*hotspotWorkload) Description() string { return Describe("hs") }

func (w *hotspotWorkload) prepare() {
	r := rng(uint64(w.n) << 4)
	cells := w.n * w.n
	power, temp := make([]float32, cells), make([]float32, cells)
	for i := range cells {
		power[i], temp[i] = r.Float32()*0.005, 320+r.Float32()*20
	}
	w.power, w.temp = kernels.EncodeF32s(power), kernels.EncodeF32s(temp)
	w.expect = kernels.EncodeF32s(kernels.HotspotF32(power, temp, w.n, w.n, w.iters, w.k))
	w.out = make([]byte, len(w.temp))
}

func (w *hotspotWorkload) Run(drv gdev.Driver) (Phases, error) {
	w.once.Do(w.prepare)
	clear(w.out)
	size := uint64(len(w.temp))
	ph, err := runCtx(drv, func(ctx *gdev.Context, t *timer, ph *Phases) error {
		fns, err := loadFunctions(ctx, nvc0.KernelHotspot)
		if err != nil {
			return err
		}
		bufs, err := memAllocAll(ctx, size, size, size)
		if err != nil {
			return err
		}
		power, src, dst := bufs[0], bufs[1], bufs[2]
		t.lap(&ph.Init)
		if err := ctx.MemcpyHtoD(power, w.power); err != nil {
			return err
		}
		if err := ctx.MemcpyHtoD(src, w.temp); err != nil {
			return err
		}
		t.lap(&ph.HtoD)
		n, k := uint64(w.n), w.k
		for done := 0; done < w.iters; done += w.pyramid {
			steps := uint64(min(w.pyramid, w.iters-done))
			if err := ctx.Launch(fns[0], power.VA, src.VA, dst.VA, n, n, steps,
				nvc0.F32Word(k.StepDivCap), nvc0.F32Word(k.Rx1), nvc0.F32Word(k.Ry1), nvc0.F32Word(k.Rz1), nvc0.F32Word(k.Amb)); err != nil {
				return err
			}
			src, dst = dst, src
		}
		if err := ctx.Synchronize(); err != nil {
			return err
		}
		t.lap(&ph.Launch)
		if err := ctx.MemcpyDtoH(w.out, src); err != nil {
			return err
		}
		t.lap(&ph.DtoH)
		return memFreeAll(ctx, bufs)
	})
	if err == nil {
		err = verifyBytes(fmt.Sprintf("hs %dx%d, %d iterations", w.n, w.n, w.iters), w.out, w.expect)
	}
	return ph, err
}

// ludWorkload is Rodinia's lud: the blocked LU decomposition of an n×n
// matrix, three launches per block step.
type ludWorkload struct {
	n      int
	once   sync.Once
	a      []byte
	expect []byte
	out    []byte // allocated once (see matrixWorkload.out)
}

func newLUD(s rodiniaSize) *ludWorkload { return &ludWorkload{n: s.ludDim} }

func (*ludWorkload) Name() string        { return "lud" }
func (*ludWorkload) Description() string { return Describe("lud") }

func (w *ludWorkload) prepare() {
	r := rng(uint64(w.n) << 12)
	n := w.n
	a := make([]float32, n*n)
	for i := range a {
		a[i] = r.Float32()*2 - 1
	}
	for i := range n { // diagonally dominant: no pivoting needed
		a[i*n+i] += float32(n)
	}
	w.a = kernels.EncodeF32s(a)
	w.expect = kernels.EncodeF32s(kernels.LUDF32(a, n))
	w.out = make([]byte, len(w.a))
}

func (w *ludWorkload) Run(drv gdev.Driver) (Phases, error) {
	w.once.Do(w.prepare)
	clear(w.out)
	ph, err := runCtx(drv, func(ctx *gdev.Context, t *timer, ph *Phases) error {
		fns, err := loadFunctions(ctx, nvc0.KernelLUDDiagonal, nvc0.KernelLUDPerimeter, nvc0.KernelLUDInternal)
		if err != nil {
			return err
		}
		bufs, err := memAllocAll(ctx, uint64(len(w.a)))
		if err != nil {
			return err
		}
		a := bufs[0]
		t.lap(&ph.Init)
		if err := ctx.MemcpyHtoD(a, w.a); err != nil {
			return err
		}
		t.lap(&ph.HtoD)
		n := uint64(w.n)
		k := uint64(0)
		for ; k+nvc0.LUDBlockSize < n; k += nvc0.LUDBlockSize {
			for _, fn := range fns {
				if err := ctx.Launch(fn, a.VA, n, k); err != nil {
					return err
				}
			}
		}
		if err := ctx.Launch(fns[0], a.VA, n, k); err != nil {
			return err
		}
		if err := ctx.Synchronize(); err != nil {
			return err
		}
		t.lap(&ph.Launch)
		if err := ctx.MemcpyDtoH(w.out, a); err != nil {
			return err
		}
		t.lap(&ph.DtoH)
		return memFreeAll(ctx, bufs)
	})
	if err == nil {
		err = verifyBytes(fmt.Sprintf("lud %dx%d", w.n, w.n), w.out, w.expect)
	}
	return ph, err
}
