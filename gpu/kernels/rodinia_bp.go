package kernels

import (
	"context"
	"fmt"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// The learning rate and momentum of the back-propagation weight adjustment
// (Rodinia's ETA and MOMENTUM).
const (
	BPEta      float32 = 0.3
	BPMomentum float32 = 0.3
)

// bpBlocksPerTask is how many input blocks of bp_layerforward one task of
// the parallel loop computes.
const bpBlocksPerTask = 1024

// bpRowsPerTask is how many weight rows of bp_adjust_weights one task of
// the parallel loop updates.
const bpRowsPerTask = 1 << 14

// checkBP validates the back-propagation dimensions nin and nh.
func checkBP(name string, nin, nh uint64) error {
	if err := checkCount(name, "input count", nin, nvc0.MaxKernelBPInputs); err != nil {
		return err
	}
	if err := checkCount(name, "hidden count", nh, nvc0.MaxKernelBPHidden); err != nil {
		return err
	}
	if (nin+1)*nh > nvc0.MaxKernelBPWeights {
		return fmt.Errorf("%s: %d×%d weights exceed %d: %w", name, nin+1, nh, nvc0.MaxKernelBPWeights, ErrBadParams)
	}
	return nil
}

// runBPForward is the bp_layerforward kernel: params [x, w, partial, nin, nh].
// Scratch: f32 0 x, 1 the weights of rows 1..nin, 2 the partial sums.
func runBPForward(ctx context.Context, name string, params []uint64, mem Memory, sc *Scratch) (Cost, error) {
	vx, vw, vp, nin, nh := params[0], params[1], params[2], params[3], params[4]
	if err := checkBP(name, nin, nh); err != nil {
		return Cost{}, err
	}
	nb := (nin + nvc0.BPBlockInputs - 1) / nvc0.BPBlockInputs
	if err := checkArrays(name, array{"x", vx, 4 * nin}, array{"w", vw, 4 * (nin + 1) * nh}, array{"partial", vp, 4 * nb * nh}); err != nil {
		return Cost{}, err
	}
	if mem == nil {
		return Cost{}, errNilMemory(name)
	}
	n, h := int(nin), int(nh)
	x := sc.f32.get(0, n)
	if err := readF32s(name, mem, sc, x, "x", vx); err != nil {
		return Cost{}, err
	}
	w := sc.f32.get(1, n*h) // rows 1..nin; the bias row is the host's to add
	if err := readF32s(name, mem, sc, w, "w", vw+4*nh); err != nil {
		return Cost{}, err
	}
	p := sc.f32.get(2, int(nb)*h)
	err := parallelRows(ctx, int(nb), bpBlocksPerTask, func(b0, b1 int) {
		for b := b0; b < b1; b++ {
			acc := p[b*h : b*h+h]
			clear(acc)
			for i := b * nvc0.BPBlockInputs; i < min((b+1)*nvc0.BPBlockInputs, n); i++ {
				xi, row := x[i], w[i*h:i*h+h]
				for j, wij := range row {
					acc[j] += float32(xi * wij)
				}
			}
		}
	})
	if err != nil {
		return Cost{}, fmt.Errorf("%s: %w", name, err)
	}
	if err := writeF32s(name, mem, sc, p, "partial", vp); err != nil {
		return Cost{}, err
	}
	return Cost{Ops: 2 * nin * nh, Bytes: 4 * (nin + nin*nh + nb*nh)}, nil
}

// runBPAdjust is the bp_adjust_weights kernel: params [delta, x, w, oldw,
// nin, nh]. Scratch: f32 0 x, 1 w, 2 oldw, 3 delta, 4 η·delta.
func runBPAdjust(ctx context.Context, name string, params []uint64, mem Memory, sc *Scratch) (Cost, error) {
	vd, vx, vw, vo, nin, nh := params[0], params[1], params[2], params[3], params[4], params[5]
	if err := checkBP(name, nin, nh); err != nil {
		return Cost{}, err
	}
	wsize := 4 * (nin + 1) * nh
	if err := checkArrays(name, array{"delta", vd, 4 * nh}, array{"x", vx, 4 * nin}, array{"w", vw, wsize}, array{"oldw", vo, wsize}); err != nil {
		return Cost{}, err
	}
	if mem == nil {
		return Cost{}, errNilMemory(name)
	}
	n, h := int(nin), int(nh)
	delta := sc.f32.get(3, h)
	x := sc.f32.get(0, n)
	w := sc.f32.get(1, (n+1)*h)
	oldw := sc.f32.get(2, (n+1)*h)
	for _, in := range []struct {
		what string
		dst  []float32
		va   uint64
	}{{"delta", delta, vd}, {"x", x, vx}, {"w", w, vw}, {"oldw", oldw, vo}} {
		if err := readF32s(name, mem, sc, in.dst, in.what, in.va); err != nil {
			return Cost{}, err
		}
	}
	ed := sc.f32.get(4, h)
	for j := range ed {
		ed[j] = BPEta * delta[j]
	}
	err := parallelRows(ctx, n+1, bpRowsPerTask, func(r0, r1 int) {
		for r := r0; r < r1; r++ {
			in := float32(1) // row 0: the bias unit
			if r > 0 {
				in = x[r-1]
			}
			wr, or := w[r*h:r*h+h], oldw[r*h:r*h+h]
			for j := range wr {
				dw := float32(ed[j]*in) + float32(BPMomentum*or[j])
				wr[j] += dw
				or[j] = dw
			}
		}
	})
	if err != nil {
		return Cost{}, fmt.Errorf("%s: %w", name, err)
	}
	if err := writeF32s(name, mem, sc, w, "w", vw); err != nil {
		return Cost{}, err
	}
	if err := writeF32s(name, mem, sc, oldw, "oldw", vo); err != nil {
		return Cost{}, err
	}
	return Cost{Ops: 4*(nin+1)*nh + nh, Bytes: 4 * (nh + nin + 4*(nin+1)*nh)}, nil
}
