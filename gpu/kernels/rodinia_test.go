package kernels

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// arena lays arrays out one after another in a flatMem, each on a fresh
// 256-byte boundary, and remembers where.
type arena struct {
	m    *flatMem
	next uint64
}

func newArena(size int) *arena {
	return &arena{m: &flatMem{base: testBase, buf: make([]byte, size)}, next: testBase}
}

// put places v and returns its address.
func (a *arena) put(v []float32) uint64 {
	va := a.next
	copy(a.m.buf[va-a.m.base:], EncodeF32s(v))
	a.next += (uint64(4*len(v)) + 255) &^ 255
	return va
}

// poison reserves n float32 values filled with 0xEE bytes (an output the
// kernel must write completely) and returns their address.
func (a *arena) poison(n int) uint64 {
	va := a.next
	for i := range 4 * n {
		a.m.buf[va-a.m.base+uint64(i)] = 0xEE
	}
	a.next += (uint64(4*n) + 255) &^ 255
	return va
}

// get decodes n float32 values at va.
func (a *arena) get(va uint64, n int) []float32 {
	return DecodeF32s(a.m.buf[va-a.m.base:][:4*n])
}

// run runs kernel id with params and fails the test on error.
func (a *arena) run(t testing.TB, sc *Scratch, id nvc0.KernelID, params ...uint64) Cost {
	t.Helper()
	cost, err := RunScratch(context.Background(), id, params, a.m, sc)
	if err != nil {
		t.Fatalf("%v %v: %v", id, params, err)
	}
	return cost
}

// sameBits reports whether got and want are bit-identical.
func sameBits(got, want []float32) bool {
	return slices.EqualFunc(got, want, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
}

// uniform returns n values in [lo, hi).
func uniform(r *rand.Rand, n int, lo, hi float32) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = lo + r.Float32()*(hi-lo)
	}
	return v
}

// testSquash is the logistic function as the bp workload's host code
// evaluates it.
func testSquash(s float32) float32 { return float32(1 / (1 + math.Exp(-float64(s)))) }

func TestBackpropMatchesReference(t *testing.T) {
	var sc Scratch
	for _, tc := range []struct{ nin, nh int }{{1, 1}, {3, 2}, {16, 16}, {17, 5}, {33, 16}, {100, 3}, {1000, 16}} {
		t.Run(fmt.Sprintf("%dx%d", tc.nin, tc.nh), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(tc.nin), uint64(tc.nh)))
			nin, nh := tc.nin, tc.nh
			x := uniform(r, nin, 0, 1)
			w := uniform(r, (nin+1)*nh, -0.3, 0.3)
			oldw := uniform(r, (nin+1)*nh, -0.01, 0.01)
			who := uniform(r, nh+1, -1, 1)
			const target = 0.1
			nb := (nin + nvc0.BPBlockInputs - 1) / nvc0.BPBlockInputs
			a := newArena(1 << 20)
			vx, vw, vo, vp := a.put(x), a.put(w), a.put(oldw), a.poison(nb*nh)
			cost := a.run(t, &sc, nvc0.KernelBPForward, vx, vw, vp, uint64(nin), uint64(nh))
			if want := (Cost{uint64(2 * nin * nh), uint64(4 * (nin + nin*nh + nb*nh))}); cost != want {
				t.Errorf("forward cost %+v, want %+v", cost, want)
			}
			// The host's share, as the workload does it.
			partial := a.get(vp, nb*nh)
			hidden := make([]float32, nh)
			for j := range nh {
				var s float32
				for b := range nb {
					s += partial[b*nh+j]
				}
				hidden[j] = testSquash(s + w[j])
			}
			var o float32
			for j := range nh {
				o += float32(hidden[j] * who[j+1])
			}
			out := testSquash(o + who[0])
			dOut := float32(out*(1-out)) * (target - out)
			delta := make([]float32, nh)
			for j := range nh {
				delta[j] = float32(hidden[j]*(1-hidden[j])) * float32(dOut*who[j+1])
			}
			vd := a.put(delta)
			cost = a.run(t, &sc, nvc0.KernelBPAdjust, vd, vx, vw, vo, uint64(nin), uint64(nh))
			if want := (Cost{uint64(4*(nin+1)*nh + nh), uint64(4 * (nh + nin + 4*(nin+1)*nh))}); cost != want {
				t.Errorf("adjust cost %+v, want %+v", cost, want)
			}
			wantW, wantOld := BackpropF32(x, w, oldw, who, target, nh)
			if !sameBits(a.get(vw, len(w)), wantW) || !sameBits(a.get(vo, len(w)), wantOld) {
				t.Errorf("weights differ from the reference (bit-exact comparison)")
			}
			if slices.Equal(wantW, w) {
				t.Errorf("the step changed no weight: a vacuous test")
			}
			if !sameBits(a.get(vx, nin), x) || !sameBits(a.get(vd, nh), delta) {
				t.Errorf("inputs were modified")
			}
		})
	}
}

// testCoeffs are hotspot coefficients of Rodinia's magnitudes.
var testCoeffs = HotspotCoeffs{StepDivCap: 0.3413, Rx1: 0.1, Ry1: 0.1, Rz1: 1.0 / 5120, Amb: 80}

func TestHotspotMatchesReference(t *testing.T) {
	var sc Scratch
	for _, tc := range []struct {
		rows, cols int
		steps      []int // the pyramid height of each launch
	}{
		{1, 1, []int{1}}, {1, 7, []int{2}}, {5, 1, []int{1, 1}}, {3, 3, []int{3}},
		{17, 33, []int{2, 2, 1}}, {64, 67, []int{4}}, {130, 9, []int{1, 3}},
	} {
		t.Run(fmt.Sprintf("%dx%d/%v", tc.rows, tc.cols, tc.steps), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(tc.rows), uint64(tc.cols)))
			cells := tc.rows * tc.cols
			power, temp := uniform(r, cells, 0, 0.005), uniform(r, cells, 320, 340)
			a := newArena(1 << 20)
			vp, bufs := a.put(power), [2]uint64{a.put(temp), a.poison(cells)}
			total := 0
			for i, s := range tc.steps {
				k := testCoeffs
				cost := a.run(t, &sc, nvc0.KernelHotspot, vp, bufs[i%2], bufs[(i+1)%2], uint64(tc.rows), uint64(tc.cols), uint64(s),
					nvc0.F32Word(k.StepDivCap), nvc0.F32Word(k.Rx1), nvc0.F32Word(k.Ry1), nvc0.F32Word(k.Rz1), nvc0.F32Word(k.Amb))
				if want := (Cost{uint64(14 * cells * s), uint64(12 * cells)}); cost != want {
					t.Errorf("cost %+v, want %+v", cost, want)
				}
				total += s
			}
			got := a.get(bufs[len(tc.steps)%2], cells)
			if want := HotspotF32(power, temp, tc.rows, tc.cols, total, testCoeffs); !sameBits(got, want) {
				t.Errorf("temperatures differ from the reference (bit-exact comparison)")
			}
			if sameBits(got, temp) {
				t.Errorf("nothing changed: a vacuous test")
			}
		})
	}
}

// ludSequence launches Rodinia's sequence of LU kernels on the n×n matrix at
// va and returns the total cost.
func ludSequence(t testing.TB, a *arena, sc *Scratch, va uint64, n int) Cost {
	var total Cost
	add := func(c Cost) { total.Ops += c.Ops; total.Bytes += c.Bytes }
	k := 0
	for ; k+nvc0.LUDBlockSize < n; k += nvc0.LUDBlockSize {
		add(a.run(t, sc, nvc0.KernelLUDDiagonal, va, uint64(n), uint64(k)))
		add(a.run(t, sc, nvc0.KernelLUDPerimeter, va, uint64(n), uint64(k)))
		add(a.run(t, sc, nvc0.KernelLUDInternal, va, uint64(n), uint64(k)))
	}
	add(a.run(t, sc, nvc0.KernelLUDDiagonal, va, uint64(n), uint64(k)))
	return total
}

// ludInput returns a diagonally dominant n×n matrix, which needs no pivoting.
func ludInput(r *rand.Rand, n int) []float32 {
	m := uniform(r, n*n, -1, 1)
	for i := range n {
		m[i*n+i] += float32(n)
	}
	return m
}

func TestLUDMatchesReference(t *testing.T) {
	var sc Scratch
	for _, n := range []int{1, 2, 3, 15, 16, 17, 31, 32, 33, 50, 64, 67} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			m := ludInput(rand.New(rand.NewPCG(uint64(n), 11)), n)
			a := newArena(1 << 16)
			va := a.put(m)
			cost := ludSequence(t, a, &sc, va, n)
			if want := ludFlops(n); cost.Ops != want {
				t.Errorf("ops %d, want %d", cost.Ops, want)
			}
			if got, want := a.get(va, n*n), LUDF32(m, n); !sameBits(got, want) {
				t.Errorf("LU factors differ from the reference (bit-exact comparison)")
			}
		})
	}
}

// ludFlops counts the divisions, multiplications and subtractions of
// unblocked elimination on an n×n matrix: the blocked kernels do the same
// work.
func ludFlops(n int) uint64 {
	var ops uint64
	for p := range n {
		m := uint64(n - 1 - p)
		ops += m + 2*m*m
	}
	return ops
}

func TestNNMatchesReference(t *testing.T) {
	var sc Scratch
	for _, n := range []int{1, 2, 5, 17, 1000, nnRecordsPerTask + 3} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(n), 13))
			locs := make([]float32, 2*n)
			for i := range n {
				locs[2*i], locs[2*i+1] = r.Float32()*180-90, r.Float32()*360-180
			}
			a := newArena(1 << 20)
			vl, vd := a.put(locs), a.poison(n)
			cost := a.run(t, &sc, nvc0.KernelNN, vl, vd, uint64(n), nvc0.F32Word(30), nvc0.F32Word(90))
			if want := (Cost{uint64(6 * n), uint64(12 * n)}); cost != want {
				t.Errorf("cost %+v, want %+v", cost, want)
			}
			want, _ := NNF32(locs, 30, 90, 5)
			if got := a.get(vd, n); !sameBits(got, want) {
				t.Errorf("distances differ from the reference (bit-exact comparison)")
			}
		})
	}
}

// testQ0sqr is the speckle scale as the srad workloads' host code computes it.
func testQ0sqr(sum, sum2, n float32) float32 {
	mean := sum / n
	v := sum2/n - float32(mean*mean)
	return v / float32(mean*mean)
}

// sradBufs are the six device arrays of an SRAD run.
type sradBufs [6]uint64

func (b sradBufs) params(rows, cols int, scalar float32) []uint64 {
	return append(b[:], uint64(rows), uint64(cols), nvc0.F32Word(scalar))
}

func newSradBufs(a *arena, j []float32) sradBufs {
	b := sradBufs{a.put(j)}
	for i := 1; i < len(b); i++ {
		b[i] = a.poison(len(j))
	}
	return b
}

func TestSradMatchesReference(t *testing.T) {
	var sc Scratch
	for _, tc := range []struct{ rows, cols, iters int }{{1, 1, 1}, {1, 5, 2}, {4, 1, 1}, {3, 3, 3}, {17, 33, 2}, {64, 45, 4}, {40, 1100, 1}} {
		t.Run(fmt.Sprintf("%dx%d/%d", tc.rows, tc.cols, tc.iters), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(tc.rows), uint64(tc.cols)))
			n := tc.rows * tc.cols
			img := uniform(r, n, 0, 255)
			a := newArena(8 << 20)
			b := newSradBufs(a, img)
			sums := a.poison(2)
			const lambda = 0.5
			a.run(t, &sc, nvc0.KernelSradExtract, b[0], uint64(n))
			for range tc.iters {
				if cost := a.run(t, &sc, nvc0.KernelSradReduce, b[0], sums, uint64(n)); cost != (Cost{uint64(3 * n), uint64(4*n + 8)}) {
					t.Errorf("reduce cost %+v", cost)
				}
				s := a.get(sums, 2)
				q0sqr := testQ0sqr(s[0], s[1], float32(n))
				if cost := a.run(t, &sc, nvc0.KernelSradCoeff, b.params(tc.rows, tc.cols, q0sqr)...); cost != (Cost{uint64(31 * n), uint64(24 * n)}) {
					t.Errorf("coeff cost %+v", cost)
				}
				if cost := a.run(t, &sc, nvc0.KernelSradUpdate, b.params(tc.rows, tc.cols, lambda)...); cost != (Cost{uint64(9 * n), uint64(28 * n)}) {
					t.Errorf("update cost %+v", cost)
				}
			}
			if cost := a.run(t, &sc, nvc0.KernelSradCompress, b[0], uint64(n)); cost != (Cost{uint64(2 * n), uint64(8 * n)}) {
				t.Errorf("compress cost %+v", cost)
			}
			got, want := a.get(b[0], n), SradF32(img, tc.rows, tc.cols, tc.iters, lambda)
			if !sameBits(got, want) {
				t.Errorf("image differs from the reference (bit-exact comparison)")
			}
			if n > 1 && sameBits(got, img) {
				t.Errorf("nothing changed: a vacuous test")
			}
		})
	}
}

func TestSradV2MatchesReference(t *testing.T) {
	var sc Scratch
	for _, tc := range []struct {
		rows, cols, iters int
		roi               SradROI
	}{{2, 2, 1, SradROI{0, 1, 0, 1}}, {7, 5, 2, SradROI{1, 3, 2, 4}}, {33, 67, 3, SradROI{0, 15, 0, 15}}, {130, 130, 2, SradROI{0, 127, 0, 127}}} {
		t.Run(fmt.Sprintf("%dx%d/%d", tc.rows, tc.cols, tc.iters), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(tc.rows), uint64(tc.cols)))
			n := tc.rows * tc.cols
			j := make([]float32, n)
			for i := range j {
				j[i] = float32(math.Exp(float64(r.Float32())))
			}
			a := newArena(2 << 20)
			b := newSradBufs(a, j)
			host := slices.Clone(j)
			const lambda = 0.5
			for range tc.iters {
				var sum, sum2 float32
				for y := tc.roi.R1; y <= tc.roi.R2; y++ {
					for x := tc.roi.C1; x <= tc.roi.C2; x++ {
						v := host[y*tc.cols+x]
						sum += v
						sum2 += float32(v * v)
					}
				}
				size := float32((tc.roi.R2 - tc.roi.R1 + 1) * (tc.roi.C2 - tc.roi.C1 + 1))
				a.run(t, &sc, nvc0.KernelSradCoeff, b.params(tc.rows, tc.cols, testQ0sqr(sum, sum2, size))...)
				a.run(t, &sc, nvc0.KernelSradUpdate, b.params(tc.rows, tc.cols, lambda)...)
				host = a.get(b[0], n)
			}
			if want := SradV2F32(j, tc.rows, tc.cols, tc.roi, tc.iters, lambda); !sameBits(host, want) {
				t.Errorf("image differs from the reference (bit-exact comparison)")
			}
		})
	}
}
