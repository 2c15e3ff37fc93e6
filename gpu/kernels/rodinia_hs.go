package kernels

import (
	"context"
	"fmt"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// hotspotOps is the arithmetic of one hotspot cell update (see the package
// documentation): 14 operations.
const hotspotOps = 14

// HotspotCoeffs are the float32 scalars of the hotspot kernel: the time
// step over the cell's heat capacity, the inverse thermal resistances to the
// neighbours in x and y and to the ambient in z, and the ambient
// temperature.
type HotspotCoeffs struct {
	StepDivCap, Rx1, Ry1, Rz1, Amb float32
}

// runHotspot is the hotspot kernel: params [power, src, dst, rows, cols,
// steps, stepDivCap, rx1, ry1, rz1, amb]. Scratch: f32 0 power, 1 and 2 the
// two grids the steps alternate between.
func runHotspot(ctx context.Context, name string, params []uint64, mem Memory, sc *Scratch) (Cost, error) {
	vp, vs, vd, rows, cols, steps := params[0], params[1], params[2], params[3], params[4], params[5]
	if err := checkCount(name, "rows", rows, nvc0.MaxKernelGridDim); err != nil {
		return Cost{}, err
	}
	if err := checkCount(name, "cols", cols, nvc0.MaxKernelGridDim); err != nil {
		return Cost{}, err
	}
	if err := checkCount(name, "steps", steps, nvc0.MaxKernelStencilSteps); err != nil {
		return Cost{}, err
	}
	var k HotspotCoeffs
	for i, f := range []struct {
		what string
		dst  *float32
	}{{"stepDivCap", &k.StepDivCap}, {"rx1", &k.Rx1}, {"ry1", &k.Ry1}, {"rz1", &k.Rz1}, {"amb", &k.Amb}} {
		v, err := f32Param(name, f.what, params[6+i])
		if err != nil {
			return Cost{}, err
		}
		*f.dst = v
	}
	cells := rows * cols
	if err := checkArrays(name, array{"power", vp, 4 * cells}, array{"src", vs, 4 * cells}, array{"dst", vd, 4 * cells}); err != nil {
		return Cost{}, err
	}
	if mem == nil {
		return Cost{}, errNilMemory(name)
	}
	r, c := int(rows), int(cols)
	power := sc.f32.get(0, r*c)
	if err := readF32s(name, mem, sc, power, "power", vp); err != nil {
		return Cost{}, err
	}
	cur, next := sc.f32.get(1, r*c), sc.f32.get(2, r*c)
	if err := readF32s(name, mem, sc, cur, "src", vs); err != nil {
		return Cost{}, err
	}
	for range steps {
		err := parallelRows(ctx, r, gridBlockRows(c), func(y0, y1 int) {
			for y := y0; y < y1; y++ {
				hotspotRow(next, cur, power, r, c, y, k)
			}
		})
		if err != nil {
			return Cost{}, fmt.Errorf("%s: %w", name, err)
		}
		cur, next = next, cur
	}
	if err := writeF32s(name, mem, sc, cur, "dst", vd); err != nil {
		return Cost{}, err
	}
	return Cost{Ops: hotspotOps * cells * steps, Bytes: 3 * 4 * cells}, nil
}

// hotspotRow computes row y of one hotspot step from t into out. A
// neighbour outside the grid is the cell itself. The expression is the one
// the package documentation defines, each product rounded to float32.
func hotspotRow(out, t, power []float32, rows, cols, y int, k HotspotCoeffs) {
	row := t[y*cols : y*cols+cols]
	north := t[max(y-1, 0)*cols:][:cols]
	south := t[min(y+1, rows-1)*cols:][:cols]
	p := power[y*cols : y*cols+cols]
	o := out[y*cols : y*cols+cols]
	for x, tc := range row {
		w, e := row[max(x-1, 0)], row[min(x+1, cols-1)]
		t2 := tc + tc
		v := p[x] + float32((north[x]+south[x]-t2)*k.Ry1)
		v += float32((e + w - t2) * k.Rx1)
		v += float32((k.Amb - tc) * k.Rz1)
		o[x] = tc + float32(k.StepDivCap*v)
	}
}
