package kernels

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// rodiniaCase is a valid launch of one Rodinia-like kernel in its own arena,
// and which of its parameter words are what.
type rodiniaCase struct {
	name   string
	id     nvc0.KernelID
	a      *arena
	params []uint64
	inputs []int          // array words the kernel reads
	arrays []int          // every array word
	floats []int          // float32 words
	dims   map[int]uint64 // dimension words and their bounds
}

// rodiniaCases returns a valid small launch of every Rodinia-like kernel.
func rodiniaCases() []rodiniaCase {
	var cs []rodiniaCase
	f := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = 1 + float32(i%7)
		}
		return v
	}
	{
		a := newArena(1 << 16)
		x, w, p := a.put(f(20)), a.put(f(21*3)), a.poison(2*3)
		cs = append(cs, rodiniaCase{"bp_layerforward", nvc0.KernelBPForward, a, []uint64{x, w, p, 20, 3},
			[]int{0, 1}, []int{0, 1, 2}, nil, map[int]uint64{3: nvc0.MaxKernelBPInputs, 4: nvc0.MaxKernelBPHidden}})
	}
	{
		a := newArena(1 << 16)
		d, x, w, o := a.put(f(3)), a.put(f(20)), a.put(f(21*3)), a.put(f(21*3))
		cs = append(cs, rodiniaCase{"bp_adjust_weights", nvc0.KernelBPAdjust, a, []uint64{d, x, w, o, 20, 3},
			[]int{0, 1, 2, 3}, []int{0, 1, 2, 3}, nil, map[int]uint64{4: nvc0.MaxKernelBPInputs, 5: nvc0.MaxKernelBPHidden}})
	}
	{
		a := newArena(1 << 16)
		p, s, d := a.put(f(35)), a.put(f(35)), a.poison(35)
		k := testCoeffs
		cs = append(cs, rodiniaCase{"hotspot", nvc0.KernelHotspot, a, []uint64{p, s, d, 5, 7, 2,
			nvc0.F32Word(k.StepDivCap), nvc0.F32Word(k.Rx1), nvc0.F32Word(k.Ry1), nvc0.F32Word(k.Rz1), nvc0.F32Word(k.Amb)},
			[]int{0, 1}, []int{0, 1, 2}, []int{6, 7, 8, 9, 10}, map[int]uint64{3: nvc0.MaxKernelGridDim, 4: nvc0.MaxKernelGridDim, 5: nvc0.MaxKernelStencilSteps}})
	}
	for _, id := range []nvc0.KernelID{nvc0.KernelLUDDiagonal, nvc0.KernelLUDPerimeter, nvc0.KernelLUDInternal} {
		a := newArena(1 << 16)
		v := make([]float32, 40*40)
		for i := range 40 {
			for j := range 40 {
				v[i*40+j] = float32((i*7+j*3)%11) / 11
			}
			v[i*40+i] += 40
		}
		cs = append(cs, rodiniaCase{id.String(), id, a, []uint64{a.put(v), 40, 16},
			[]int{0}, []int{0}, nil, map[int]uint64{1: nvc0.MaxKernelMatrixDim}})
	}
	{
		a := newArena(1 << 16)
		l, d := a.put(f(2*9)), a.poison(9)
		cs = append(cs, rodiniaCase{"nn_euclid", nvc0.KernelNN, a, []uint64{l, d, 9, nvc0.F32Word(30), nvc0.F32Word(90)},
			[]int{0}, []int{0, 1}, []int{3, 4}, map[int]uint64{2: nvc0.MaxKernelNNRecords}})
	}
	for _, id := range []nvc0.KernelID{nvc0.KernelSradExtract, nvc0.KernelSradCompress} {
		a := newArena(1 << 16)
		cs = append(cs, rodiniaCase{id.String(), id, a, []uint64{a.put(f(33)), 33},
			[]int{0}, []int{0}, nil, map[int]uint64{1: nvc0.MaxKernelPixels}})
	}
	{
		a := newArena(1 << 16)
		i, s := a.put(f(33)), a.poison(2)
		cs = append(cs, rodiniaCase{"srad_reduce", nvc0.KernelSradReduce, a, []uint64{i, s, 33},
			[]int{0}, []int{0, 1}, nil, map[int]uint64{2: nvc0.MaxKernelPixels}})
	}
	for _, id := range []nvc0.KernelID{nvc0.KernelSradCoeff, nvc0.KernelSradUpdate} {
		a := newArena(1 << 16)
		b := sradBufs{a.put(f(35))}
		for i := 1; i < len(b); i++ {
			b[i] = a.put(f(35))
		}
		inputs := []int{0}
		if id == nvc0.KernelSradUpdate {
			inputs = []int{0, 1, 2, 3, 4, 5}
		}
		cs = append(cs, rodiniaCase{id.String(), id, a, b.params(5, 7, 0.5),
			inputs, []int{0, 1, 2, 3, 4, 5}, []int{8}, map[int]uint64{6: nvc0.MaxKernelGridDim, 7: nvc0.MaxKernelGridDim}})
	}
	return cs
}

// with returns a copy of params with word i set to v.
func with(params []uint64, i int, v uint64) []uint64 {
	p := slices.Clone(params)
	p[i] = v
	return p
}

func TestRodiniaBadParams(t *testing.T) {
	for _, c := range rodiniaCases() {
		bad := map[string][]uint64{
			"one word short": c.params[:len(c.params)-1],
			"one word extra": append(slices.Clone(c.params), 0),
		}
		for i, limit := range c.dims {
			bad[fmt.Sprintf("word %d = 0", i)] = with(c.params, i, 0)
			bad[fmt.Sprintf("word %d above its bound", i)] = with(c.params, i, limit+1)
			bad[fmt.Sprintf("word %d huge", i)] = with(c.params, i, 1<<40)
		}
		for _, i := range c.arrays {
			bad[fmt.Sprintf("array word %d wraps", i)] = with(c.params, i, math.MaxUint64-2)
		}
		for _, i := range c.floats {
			bad[fmt.Sprintf("float word %d high bits", i)] = with(c.params, i, c.params[i]|1<<32)
		}
		switch c.id {
		case nvc0.KernelLUDDiagonal, nvc0.KernelLUDPerimeter, nvc0.KernelLUDInternal:
			bad["k not a block multiple"] = with(c.params, 2, 5)
			bad["k = n"] = with(with(c.params, 1, 32), 2, 32)
			bad["k beyond n"] = with(c.params, 2, 48)
		case nvc0.KernelBPForward, nvc0.KernelBPAdjust:
			bad["too many weights"] = with(with(c.params, len(c.params)-2, nvc0.MaxKernelBPInputs), len(c.params)-1, 8)
		}
		for what, params := range bad {
			t.Run(c.name+"/"+what, func(t *testing.T) {
				before := slices.Clone(c.a.m.buf)
				cost, err := Run(context.Background(), c.id, params, c.a.m)
				if !errors.Is(err, ErrBadParams) {
					t.Errorf("err = %v, want ErrBadParams", err)
				}
				if cost != (Cost{}) {
					t.Errorf("cost = %+v, want zero", cost)
				}
				if !slices.Equal(c.a.m.buf, before) {
					t.Errorf("memory was modified")
				}
			})
		}
		// The valid launch runs, and at its bounds a kernel accepts its parameters.
		if _, err := Run(context.Background(), c.id, c.params, c.a.m); err != nil {
			t.Errorf("%s: valid launch: %v", c.name, err)
		}
		if _, err := Run(context.Background(), c.id, c.params, nil); err == nil || errors.Is(err, ErrBadParams) {
			t.Errorf("%s: nil Memory: err = %v", c.name, err)
		}
	}
}

// TestRodiniaFaults faults each input of every kernel in turn — unmapped, or
// running off the end of memory after a first good part — and expects the
// MMU's error and memory left as it was.
func TestRodiniaFaults(t *testing.T) {
	const unmapped = 0x20_0000_0000
	for _, c := range rodiniaCases() {
		end := c.a.m.base + uint64(len(c.a.m.buf))
		for _, i := range c.inputs {
			for _, va := range []uint64{unmapped, end - 4} {
				t.Run(fmt.Sprintf("%s/word %d at %#x", c.name, i, va), func(t *testing.T) {
					before := slices.Clone(c.a.m.buf)
					cost, err := Run(context.Background(), c.id, with(c.params, i, va), c.a.m)
					if !errors.Is(err, errFault) {
						t.Errorf("err = %v, want errFault", err)
					}
					if cost != (Cost{}) {
						t.Errorf("cost = %+v, want zero", cost)
					}
					if !slices.Equal(c.a.m.buf, before) {
						t.Errorf("memory was modified")
					}
				})
			}
		}
		for _, i := range c.arrays {
			if slices.Contains(c.inputs, i) {
				continue
			}
			if _, err := Run(context.Background(), c.id, with(c.params, i, unmapped), c.a.m); !errors.Is(err, errFault) {
				t.Errorf("%s: output word %d unmapped: err = %v, want errFault", c.name, i, err)
			}
		}
	}
}

// TestRodiniaCancel cancels the context during a kernel's first read: the
// kernel must stop with the context's error and write nothing.
func TestRodiniaCancel(t *testing.T) {
	for _, c := range rodiniaCases() {
		ctx, cancel := context.WithCancel(context.Background())
		c.a.m.onRead = func(uint64) { cancel() }
		before := slices.Clone(c.a.m.buf)
		cost, err := Run(ctx, c.id, c.params, c.a.m)
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%s: err = %v, want context.Canceled", c.name, err)
		}
		if cost != (Cost{}) {
			t.Errorf("%s: cost = %+v, want zero", c.name, cost)
		}
		if !slices.Equal(c.a.m.buf, before) {
			t.Errorf("%s: memory was modified after cancellation", c.name)
		}
		if _, err := Run(ctx, c.id, c.params, c.a.m); !errors.Is(err, context.Canceled) {
			t.Errorf("%s: cancelled before the start: err = %v", c.name, err)
		}
		cancel()
	}
}
