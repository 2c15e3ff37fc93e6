package workloads

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/gpuvm/gpuvm/gpu/kernels"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
)

// rodiniaSize is the problem size of every Rodinia-like workload at one
// scale (see the package documentation).
type rodiniaSize struct {
	bpInputs, bpHidden           int
	hsDim, hsIters, hsPyramid    int
	ludDim                       int
	nnRecords, nnK               int
	sradRows, sradCols, sradIter int
	srad2Dim, srad2Iter          int
}

// rodiniaSizes returns the sizes at scale (a divisor of the linear sizes;
// iteration counts stay).
func rodiniaSizes(scale int) rodiniaSize {
	d := func(v, floor int) int { return max(v/max(scale, 1), floor) }
	return rodiniaSize{
		bpInputs: d(65536, 16), bpHidden: 16,
		hsDim: d(512, 4), hsIters: 24, hsPyramid: 2,
		ludDim:    d(512, 4),
		nnRecords: d(42764, 16), nnK: 5,
		sradRows: d(502, 4), sradCols: d(458, 4), sradIter: 20,
		srad2Dim: d(1024, 4), srad2Iter: 2,
	}
}

// loadFunctions loads the built-in kernels ids into ctx.
func loadFunctions(ctx *gdev.Context, ids ...nvc0.KernelID) ([]gdev.Function, error) {
	fns := make([]gdev.Function, len(ids))
	for i, id := range ids {
		var err error
		if fns[i], err = ctx.LoadFunction(id); err != nil {
			return nil, err
		}
	}
	return fns, nil
}

// memAllocAll allocates one device buffer of each size.
func memAllocAll(ctx *gdev.Context, sizes ...uint64) ([]gdev.DevPtr, error) {
	bufs := make([]gdev.DevPtr, len(sizes))
	for i, size := range sizes {
		var err error
		if bufs[i], err = ctx.MemAlloc(size); err != nil {
			return nil, err
		}
	}
	return bufs, nil
}

// memFreeAll frees bufs (context close frees any left on an error path).
func memFreeAll(ctx *gdev.Context, bufs []gdev.DevPtr) error {
	var errs []error
	for _, b := range bufs {
		errs = append(errs, ctx.MemFree(b))
	}
	return errors.Join(errs...)
}

// verifyBytes reports whether got is the expected result, as an error
// wrapping ErrVerify.
func verifyBytes(what string, got, want []byte) error {
	if bytes.Equal(got, want) {
		return nil
	}
	return fmt.Errorf("%s: %w (first difference at byte %d)", what, ErrVerify, firstDiff(got, want))
}

// f32At decodes the float32 at index i of the little-endian array p.
func f32At(p []byte, i int) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(p[4*i:])) }

// squash is the logistic function 1/(1+e^−s) of Rodinia's backprop,
// computed in float64 and rounded to float32 (package kernels documents the
// evaluation).
func squash(s float32) float32 { return float32(1 / (1 + math.Exp(-float64(s)))) }

// bpTarget is the output unit's target value (Rodinia's).
const bpTarget = 0.1

// bpWorkload is Rodinia's backprop: one training step of an nin-input,
// nh-hidden-unit, one-output network. The GPU computes the hidden layer's
// partial sums and adjusts the input→hidden weights; the host sums the
// partial sums, squashes them and computes the error terms in between.
type bpWorkload struct {
	nin, nh int
	once    sync.Once
	// Inputs: x, the weights w and previous changes oldw ((nin+1)×nh, row 0
	// the bias unit's), the hidden→output weights who (who[0] the bias).
	x, w, oldw, who []float32
	xb, wb, oldwb   []byte
	expW, expOld    []byte
	// Results and the mid-run copy back, allocated once (see matrixWorkload.out).
	outW, outOld, partial []byte
}

func newBP(s rodiniaSize) *bpWorkload { return &bpWorkload{nin: s.bpInputs, nh: s.bpHidden} }

func (*bpWorkload) Name() string        { return "bp" }
func (*bpWorkload) Description() string { return Describe("bp") }

// prepare builds the inputs, the reference result and the result buffers.
func (w *bpWorkload) prepare() {
	r := rng(uint64(w.nin)<<8 | uint64(w.nh))
	uni := func(n int, lo, hi float32) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = lo + r.Float32()*(hi-lo)
		}
		return v
	}
	// Weights small enough that the hidden units do not saturate, so the
	// step changes every weight.
	w.x = uni(w.nin, 0, 1)
	w.w = uni((w.nin+1)*w.nh, -0.01, 0.01)
	w.oldw = uni((w.nin+1)*w.nh, -0.001, 0.001)
	w.who = uni(w.nh+1, -1, 1)
	w.xb, w.wb, w.oldwb = kernels.EncodeF32s(w.x), kernels.EncodeF32s(w.w), kernels.EncodeF32s(w.oldw)
	ew, eo := kernels.BackpropF32(w.x, w.w, w.oldw, w.who, bpTarget, w.nh)
	w.expW, w.expOld = kernels.EncodeF32s(ew), kernels.EncodeF32s(eo)
	w.outW, w.outOld = make([]byte, len(w.wb)), make([]byte, len(w.wb))
	w.partial = make([]byte, 4*w.blocks()*w.nh)
}

// blocks is the number of input blocks bp_layerforward sums separately.
func (w *bpWorkload) blocks() int { return (w.nin + nvc0.BPBlockInputs - 1) / nvc0.BPBlockInputs }

// hostStep is the host's share between the two kernels: the hidden units
// from the partial sums (in block order) and the bias weights, the output
// unit, its error, and the hidden units' error terms, encoded for the
// device.
func (w *bpWorkload) hostStep(partial []byte) []byte {
	nh := w.nh
	hidden := make([]float32, nh)
	for j := range nh {
		var s float32
		for b := range w.blocks() {
			s += f32At(partial, b*nh+j)
		}
		s += w.w[j]
		hidden[j] = squash(s)
	}
	var o float32
	for j, h := range hidden {
		o += float32(h * w.who[j+1])
	}
	o += w.who[0]
	out := squash(o)
	errOut := float32(out*(1-out)) * (bpTarget - out)
	delta := make([]float32, nh)
	for j, h := range hidden {
		delta[j] = float32(h*(1-h)) * float32(errOut*w.who[j+1])
	}
	return kernels.EncodeF32s(delta)
}

func (w *bpWorkload) Run(drv gdev.Driver) (Phases, error) {
	w.once.Do(w.prepare)
	clear(w.outW)
	clear(w.outOld)
	nin, nh := uint64(w.nin), uint64(w.nh)
	ph, err := runCtx(drv, func(ctx *gdev.Context, t *timer, ph *Phases) error {
		fns, err := loadFunctions(ctx, nvc0.KernelBPForward, nvc0.KernelBPAdjust)
		if err != nil {
			return err
		}
		bufs, err := memAllocAll(ctx, 4*nin, uint64(len(w.wb)), uint64(len(w.wb)), uint64(len(w.partial)), 4*nh)
		if err != nil {
			return err
		}
		x, wt, oldw, partial, delta := bufs[0], bufs[1], bufs[2], bufs[3], bufs[4]
		t.lap(&ph.Init)
		for _, c := range []struct {
			dst gdev.DevPtr
			src []byte
		}{{x, w.xb}, {wt, w.wb}, {oldw, w.oldwb}} {
			if err := ctx.MemcpyHtoD(c.dst, c.src); err != nil {
				return err
			}
		}
		t.lap(&ph.HtoD)
		if err := ctx.Launch(fns[0], x.VA, wt.VA, partial.VA, nin, nh); err != nil {
			return err
		}
		if err := ctx.Synchronize(); err != nil {
			return err
		}
		if err := ctx.MemcpyDtoH(w.partial, partial); err != nil {
			return err
		}
		if err := ctx.MemcpyHtoD(delta, w.hostStep(w.partial)); err != nil {
			return err
		}
		if err := ctx.Launch(fns[1], delta.VA, x.VA, wt.VA, oldw.VA, nin, nh); err != nil {
			return err
		}
		if err := ctx.Synchronize(); err != nil {
			return err
		}
		t.lap(&ph.Launch)
		if err := ctx.MemcpyDtoH(w.outW, wt); err != nil {
			return err
		}
		if err := ctx.MemcpyDtoH(w.outOld, oldw); err != nil {
			return err
		}
		t.lap(&ph.DtoH)
		return memFreeAll(ctx, bufs)
	})
	if err == nil {
		what := fmt.Sprintf("bp %d×%d", w.nin, w.nh)
		err = errors.Join(verifyBytes(what+" weights", w.outW, w.expW), verifyBytes(what+" weight changes", w.outOld, w.expOld))
	}
	return ph, err
}

// nnWorkload is Rodinia's nn: the distances of n records to a target on the
// GPU, the k nearest picked on the host.
type nnWorkload struct {
	n, k     int
	once     sync.Once
	locs     []byte
	expDist  []byte
	expNear  []int
	out      []byte    // the distances back, allocated once
	dist     []float32 // decoded for the selection, allocated once
	nearest  []int
	lat, lng float32
}

func newNN(s rodiniaSize) *nnWorkload {
	return &nnWorkload{n: s.nnRecords, k: s.nnK, lat: 30, lng: 90}
}

func (*nnWorkload) Name() string        { return "nn" }
func (*nnWorkload) Description() string { return Describe("nn") }

func (w *nnWorkload) prepare() {
	r := rng(uint64(w.n))
	locs := make([]float32, 2*w.n)
	for i := range w.n {
		locs[2*i], locs[2*i+1] = r.Float32()*180-90, r.Float32()*360-180
	}
	w.locs = kernels.EncodeF32s(locs)
	dist, near := kernels.NNF32(locs, w.lat, w.lng, w.k)
	w.expDist, w.expNear = kernels.EncodeF32s(dist), near
	w.out, w.dist = make([]byte, 4*w.n), make([]float32, w.n)
}

// kNearest returns the indices of the k smallest distances, nearest first,
// ties to the earlier record: Rodinia's scan keeping a sorted list of the k
// best so far.
func kNearest(dist []float32, k int) []int {
	best := make([]int, 0, k+1)
	for i, d := range dist {
		if len(best) == k && !(d < dist[best[k-1]]) {
			continue
		}
		pos := len(best)
		for pos > 0 && dist[best[pos-1]] > d {
			pos--
		}
		best = slices.Insert(best, pos, i)
		if len(best) > k {
			best = best[:k]
		}
	}
	return best
}

func (w *nnWorkload) Run(drv gdev.Driver) (Phases, error) {
	w.once.Do(w.prepare)
	clear(w.out)
	w.nearest = nil
	ph, err := runCtx(drv, func(ctx *gdev.Context, t *timer, ph *Phases) error {
		fns, err := loadFunctions(ctx, nvc0.KernelNN)
		if err != nil {
			return err
		}
		bufs, err := memAllocAll(ctx, uint64(len(w.locs)), uint64(len(w.out)))
		if err != nil {
			return err
		}
		t.lap(&ph.Init)
		if err := ctx.MemcpyHtoD(bufs[0], w.locs); err != nil {
			return err
		}
		t.lap(&ph.HtoD)
		if err := ctx.Launch(fns[0], bufs[0].VA, bufs[1].VA, uint64(w.n), nvc0.F32Word(w.lat), nvc0.F32Word(w.lng)); err != nil {
			return err
		}
		if err := ctx.Synchronize(); err != nil {
			return err
		}
		t.lap(&ph.Launch)
		if err := ctx.MemcpyDtoH(w.out, bufs[1]); err != nil {
			return err
		}
		for i := range w.dist {
			w.dist[i] = f32At(w.out, i)
		}
		w.nearest = kNearest(w.dist, w.k)
		t.lap(&ph.DtoH)
		return memFreeAll(ctx, bufs)
	})
	if err == nil {
		err = verifyBytes(fmt.Sprintf("nn %d records: distances", w.n), w.out, w.expDist)
	}
	if err == nil && !slices.Equal(w.nearest, w.expNear) {
		err = fmt.Errorf("nn %d records: %w (nearest %v, want %v)", w.n, ErrVerify, w.nearest, w.expNear)
	}
	return ph, err
}
