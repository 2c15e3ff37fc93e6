package kernels

import (
	"fmt"
	"math"
	"slices"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// The host references of the Rodinia-like workloads: plain, single-threaded
// loops over the whole problem, written apart from the kernels, in the
// evaluation orders the package documentation defines, so that their results
// are bit-identical to the kernels'.

// refSquash is the logistic function 1/(1+e^−s), evaluated in float64 and
// rounded to float32.
func refSquash(s float32) float32 { return float32(1 / (1 + math.Exp(-float64(s)))) }

// BackpropF32 is the host reference of the bp workload: one training step of
// a network with len(x) inputs, nh hidden units and one output unit. w and
// oldw are the (len(x)+1)×nh input→hidden weights and their previous
// changes (row 0 the bias unit's), who the nh+1 hidden→output weights
// (who[0] the bias), target the output's target value. It returns the
// adjusted w and oldw; the arguments are not modified. It panics on
// inconsistent lengths.
func BackpropF32(x, w, oldw, who []float32, target float32, nh int) (wOut, oldwOut []float32) {
	nin := len(x)
	if nh < 1 || len(w) != (nin+1)*nh || len(oldw) != len(w) || len(who) != nh+1 {
		panic(fmt.Sprintf("kernels: backprop with %d inputs, %d hidden: %d weights, %d old, %d output weights", nin, nh, len(w), len(oldw), len(who)))
	}
	hidden := make([]float32, nh)
	for j := range nh {
		var sum float32
		for b0 := 0; b0 < nin; b0 += nvc0.BPBlockInputs {
			var part float32
			for i := b0; i < min(b0+nvc0.BPBlockInputs, nin); i++ {
				part += float32(x[i] * w[(i+1)*nh+j])
			}
			sum += part
		}
		sum += w[j]
		hidden[j] = refSquash(sum)
	}
	var osum float32
	for j := range nh {
		osum += float32(hidden[j] * who[j+1])
	}
	osum += who[0]
	out := refSquash(osum)
	deltaOut := float32(out*(1-out)) * (target - out)
	delta := make([]float32, nh)
	for j := range nh {
		delta[j] = float32(hidden[j]*(1-hidden[j])) * float32(deltaOut*who[j+1])
	}
	wOut, oldwOut = slices.Clone(w), slices.Clone(oldw)
	for r := 0; r <= nin; r++ {
		in := float32(1)
		if r > 0 {
			in = x[r-1]
		}
		for j := range nh {
			dw := float32(float32(BPEta*delta[j])*in) + float32(BPMomentum*oldw[r*nh+j])
			wOut[r*nh+j] = w[r*nh+j] + dw
			oldwOut[r*nh+j] = dw
		}
	}
	return wOut, oldwOut
}

// HotspotF32 is the host reference of the hotspot kernel: the rows×cols
// temperatures after iters steps from temp, with the given power grid and
// coefficients. It panics on inconsistent lengths.
func HotspotF32(power, temp []float32, rows, cols, iters int, k HotspotCoeffs) []float32 {
	if rows < 1 || cols < 1 || len(power) != rows*cols || len(temp) != rows*cols {
		panic(fmt.Sprintf("kernels: hotspot %d×%d with %d power and %d temperature cells", rows, cols, len(power), len(temp)))
	}
	t := slices.Clone(temp)
	out := make([]float32, len(t))
	for range iters {
		for y := range rows {
			for x := range cols {
				tc := t[y*cols+x]
				n := t[max(y-1, 0)*cols+x]
				s := t[min(y+1, rows-1)*cols+x]
				w := t[y*cols+max(x-1, 0)]
				e := t[y*cols+min(x+1, cols-1)]
				t2 := tc + tc
				v := power[y*cols+x] + float32((n+s-t2)*k.Ry1)
				v = v + float32((e+w-t2)*k.Rx1)
				v = v + float32((k.Amb-tc)*k.Rz1)
				out[y*cols+x] = tc + float32(k.StepDivCap*v)
			}
		}
		t, out = out, t
	}
	return t
}

// LUDF32 is the host reference of the LU decomposition: the n×n matrix a
// factored in place without pivoting into a unit lower triangle L (below the
// diagonal) and an upper triangle U, by right-looking elimination. It panics
// unless len(a) is n·n.
func LUDF32(a []float32, n int) []float32 {
	checkSquare(a, n)
	m := slices.Clone(a)
	for p := range n {
		for i := p + 1; i < n; i++ {
			m[i*n+p] /= m[p*n+p]
			for j := p + 1; j < n; j++ {
				m[i*n+j] -= float32(m[i*n+p] * m[p*n+j])
			}
		}
	}
	return m
}

// NNF32 is the host reference of the nn workload: the distances of the
// records in locs ((latitude, longitude) pairs) to (lat, lng), and the
// indices of the k nearest records, nearest first, ties broken by the lower
// index. It panics if len(locs) is odd.
func NNF32(locs []float32, lat, lng float32, k int) (dist []float32, nearest []int) {
	if len(locs)%2 != 0 {
		panic(fmt.Sprintf("kernels: nn with %d coordinates", len(locs)))
	}
	dist = make([]float32, len(locs)/2)
	for i := range dist {
		dlat := locs[2*i] - lat
		dlng := locs[2*i+1] - lng
		dist[i] = float32(math.Sqrt(float64(float32(dlat*dlat) + float32(dlng*dlng))))
	}
	order := make([]int, len(dist))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		switch {
		case dist[a] < dist[b]:
			return -1
		case dist[a] > dist[b]:
			return 1
		}
		return 0
	})
	return dist, order[:min(k, len(order))]
}
