package workloads

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/gpuvm/gpuvm/gpu/kernels"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
)

// ErrVerify reports a result that differs from the host reference.
var ErrVerify = errors.New("result differs from the host reference")

// runCtx wraps one run: it creates the context (the init phase starts here)
// and always closes it, folding a close error into the run's error.
func runCtx(drv gdev.Driver, body func(ctx *gdev.Context, t *timer, ph *Phases) error) (ph Phases, err error) {
	var obs PhaseObserver
	if o, ok := drv.(observedDriver); ok {
		obs = o.obs
	}
	t := newTimer()
	t.ph, t.obs = &ph, obs
	ctx, err := gdev.NewContextOn(drv)
	if err != nil {
		return ph, err
	}
	err = body(ctx, t, &ph)
	if err != nil {
		t = newTimer()
		t.ph, t.obs = &ph, obs
	}
	cerr := ctx.Close()
	t.lap(&ph.Close)
	return ph, errors.Join(err, cerr)
}

type nopWorkload struct{}

func (*nopWorkload) Name() string        { return "nop" }
func (*nopWorkload) Description() string { return Describe("nop") }
func (*nopWorkload) Run(drv gdev.Driver) (Phases, error) {
	return runCtx(drv, func(ctx *gdev.Context, t *timer, ph *Phases) error {
		fn, err := ctx.LoadFunction(nvc0.KernelNop)
		if err != nil {
			return err
		}
		t.lap(&ph.Init)
		t.lap(&ph.HtoD)
		if err := ctx.Launch(fn); err != nil {
			return err
		}
		if err := ctx.Synchronize(); err != nil {
			return err
		}
		t.lap(&ph.Launch)
		t.lap(&ph.DtoH)
		return nil
	})
}

type loopWorkload struct{ iters uint64 }

func (*loopWorkload) Name() string        { return "loop" }
func (*loopWorkload) Description() string { return Describe("loop") }
func (w *loopWorkload) Run(drv gdev.Driver) (Phases, error) {
	var got [8]byte
	ph, err := runCtx(drv, func(ctx *gdev.Context, t *timer, ph *Phases) error {
		fn, err := ctx.LoadFunction(nvc0.KernelLoop)
		if err != nil {
			return err
		}
		out, err := ctx.MemAlloc(8)
		if err != nil {
			return err
		}
		t.lap(&ph.Init)
		t.lap(&ph.HtoD)
		if err := ctx.Launch(fn, w.iters, out.VA); err != nil {
			return err
		}
		if err := ctx.Synchronize(); err != nil {
			return err
		}
		t.lap(&ph.Launch)
		if err := ctx.MemcpyDtoH(got[:], out); err != nil {
			return err
		}
		t.lap(&ph.DtoH)
		return ctx.MemFree(out)
	})
	if want := kernels.LoopValue(w.iters); err == nil && binary.LittleEndian.Uint64(got[:]) != want {
		err = fmt.Errorf("loop %d: %w (got %#x, want %#x)", w.iters, ErrVerify, binary.LittleEndian.Uint64(got[:]), want)
	}
	return ph, err
}

// matrixWorkload runs one n×n matrix kernel on deterministic inputs.
type matrixWorkload struct {
	name   string
	id     nvc0.KernelID
	n      int
	a, b   []byte
	once   sync.Once
	expect []byte
	// out receives the result: allocated once and cleared before each run,
	// so a run's copy-back does not page-fault fresh memory in (which made
	// the first runs of a process up to 10× slower in DtoH, by however the
	// Go heap happened to grow, not by anything the GPU or the
	// virtualization did).
	out []byte
	ref func() []byte
}

func newMatrix(name string, n int, mul, float bool) *matrixWorkload {
	w := &matrixWorkload{name: name, n: n}
	r := rng(uint64(n))
	if float {
		a, b := make([]float32, n*n), make([]float32, n*n)
		for i := range a {
			a[i], b[i] = r.Float32()*2-1, r.Float32()*2-1
		}
		w.a, w.b = kernels.EncodeF32s(a), kernels.EncodeF32s(b)
		w.id, w.ref = nvc0.KernelFmadd, func() []byte { return kernels.EncodeF32s(kernels.MaddF32(a, b)) }
		if mul {
			w.id, w.ref = nvc0.KernelFmmul, func() []byte { return kernels.EncodeF32s(kernels.MmulF32(a, b, n)) }
		}
	} else {
		a, b := make([]uint32, n*n), make([]uint32, n*n)
		for i := range a {
			a[i], b[i] = r.Uint32(), r.Uint32()
		}
		w.a, w.b = kernels.EncodeU32s(a), kernels.EncodeU32s(b)
		w.id, w.ref = nvc0.KernelMadd, func() []byte { return kernels.EncodeU32s(kernels.MaddU32(a, b)) }
		if mul {
			w.id, w.ref = nvc0.KernelMmul, func() []byte { return kernels.EncodeU32s(kernels.MmulU32(a, b, n)) }
		}
	}
	return w
}

func (w *matrixWorkload) Name() string        { return w.name }
func (w *matrixWorkload) Description() string { return Describe(w.name) }

func (w *matrixWorkload) Run(drv gdev.Driver) (Phases, error) {
	size := uint64(len(w.a))
	w.once.Do(func() {
		w.expect = w.ref() // the reference is computed once, outside the timed phases
		w.out = make([]byte, size)
	})
	out := w.out
	clear(out) // resident and holding nothing of the last run's result, before the timed phases
	ph, err := runCtx(drv, func(ctx *gdev.Context, t *timer, ph *Phases) error {
		fn, err := ctx.LoadFunction(w.id)
		if err != nil {
			return err
		}
		var bufs [3]gdev.DevPtr
		for i := range bufs {
			if bufs[i], err = ctx.MemAlloc(size); err != nil {
				return err
			}
		}
		t.lap(&ph.Init)
		if err := ctx.MemcpyHtoD(bufs[0], w.a); err != nil {
			return err
		}
		if err := ctx.MemcpyHtoD(bufs[1], w.b); err != nil {
			return err
		}
		t.lap(&ph.HtoD)
		if err := ctx.Launch(fn, bufs[0].VA, bufs[1].VA, bufs[2].VA, uint64(w.n)); err != nil {
			return err
		}
		if err := ctx.Synchronize(); err != nil {
			return err
		}
		t.lap(&ph.Launch)
		if err := ctx.MemcpyDtoH(out, bufs[2]); err != nil {
			return err
		}
		t.lap(&ph.DtoH)
		for _, b := range bufs {
			if err := ctx.MemFree(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil && !bytes.Equal(out, w.expect) {
		err = fmt.Errorf("%s %dx%d: %w (first difference at byte %d)", w.name, w.n, w.n, ErrVerify, firstDiff(out, w.expect))
	}
	return ph, err
}

// copyWorkload moves size bytes host→device→host, pageable or pinned.
type copyWorkload struct {
	size   uint64
	pinned bool
	once   sync.Once
	data   []byte
	out    []byte // the copy back: allocated once, cleared before each run (see matrixWorkload.out)
}

func (w *copyWorkload) Name() string {
	if w.pinned {
		return "pincpy"
	}
	return "cpy"
}
func (w *copyWorkload) Description() string { return Describe(w.Name()) }

func (w *copyWorkload) Run(drv gdev.Driver) (Phases, error) {
	w.once.Do(func() {
		w.out = make([]byte, w.size)
		w.data = make([]byte, w.size)
		r := rng(w.size)
		for i := 0; i+8 <= len(w.data); i += 8 {
			v := r.Uint64()
			for k := 0; k < 8; k++ {
				w.data[i+k] = byte(v >> (8 * k))
			}
		}
	})
	out := w.out
	clear(out) // resident, and holding nothing of the last run, before the timed phases
	ph, err := runCtx(drv, func(ctx *gdev.Context, t *timer, ph *Phases) error {
		buf, err := ctx.MemAlloc(w.size)
		if err != nil {
			return err
		}
		var in, back gdev.HostBuf
		if w.pinned {
			if in, err = ctx.MemAllocHost(w.size); err != nil {
				return err
			}
			if back, err = ctx.MemAllocHost(w.size); err != nil {
				return err
			}
			copy(in.Bytes, w.data) // the application's data already lives in pinned memory
		}
		t.lap(&ph.Init)
		if w.pinned {
			err = ctx.MemcpyHtoDPinned(buf, in, w.size)
		} else {
			err = ctx.MemcpyHtoD(buf, w.data)
		}
		if err != nil {
			return err
		}
		t.lap(&ph.HtoD)
		t.lap(&ph.Launch)
		if w.pinned {
			err = ctx.MemcpyDtoHPinned(back, buf, w.size)
		} else {
			err = ctx.MemcpyDtoH(out, buf)
		}
		if err != nil {
			return err
		}
		t.lap(&ph.DtoH)
		if w.pinned {
			copy(out, back.Bytes) // verification reads the result; not timed
			t.skip()
		}
		return ctx.MemFree(buf)
	})
	if err == nil && !bytes.Equal(out, w.data) {
		err = fmt.Errorf("%s %d bytes: %w (first difference at byte %d)", w.Name(), w.size, ErrVerify, firstDiff(out, w.data))
	}
	return ph, err
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
