package kernels

import (
	"context"
	"fmt"
	"math"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// nnRecordsPerTask is how many records one task of the nearest-neighbour
// kernel's parallel loop computes.
const nnRecordsPerTask = 1 << 14

// runNN is the nn_euclid kernel: params [locs, dist, n, lat, lng]. Scratch:
// f32 0 the (lat, lng) pairs, 1 the distances.
func runNN(ctx context.Context, name string, params []uint64, mem Memory, sc *Scratch) (Cost, error) {
	vl, vd, n := params[0], params[1], params[2]
	if err := checkCount(name, "record count", n, nvc0.MaxKernelNNRecords); err != nil {
		return Cost{}, err
	}
	lat, err := f32Param(name, "lat", params[3])
	if err != nil {
		return Cost{}, err
	}
	lng, err := f32Param(name, "lng", params[4])
	if err != nil {
		return Cost{}, err
	}
	if err := checkArrays(name, array{"locs", vl, 8 * n}, array{"dist", vd, 4 * n}); err != nil {
		return Cost{}, err
	}
	if mem == nil {
		return Cost{}, errNilMemory(name)
	}
	locs := sc.f32.get(0, 2*int(n))
	if err := readF32s(name, mem, sc, locs, "locs", vl); err != nil {
		return Cost{}, err
	}
	dist := sc.f32.get(1, int(n))
	err = parallelRows(ctx, int(n), nnRecordsPerTask, func(i0, i1 int) {
		for i := i0; i < i1; i++ {
			dlat, dlng := locs[2*i]-lat, locs[2*i+1]-lng
			s := float32(dlat*dlat) + float32(dlng*dlng)
			dist[i] = float32(math.Sqrt(float64(s)))
		}
	})
	if err != nil {
		return Cost{}, fmt.Errorf("%s: %w", name, err)
	}
	if err := writeF32s(name, mem, sc, dist, "dist", vd); err != nil {
		return Cost{}, err
	}
	return Cost{Ops: 6 * n, Bytes: 12 * n}, nil
}
