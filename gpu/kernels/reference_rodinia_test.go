package kernels

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// near reports whether got is within a relative 1e-5 of want.
func near(got float32, want float64) bool {
	return math.Abs(float64(got)-want) <= 1e-5*math.Max(1, math.Abs(want))
}

// TestRodiniaReferencesByHand pins the references to values worked out by
// hand, so that a mistake shared by a kernel and its reference still fails.
func TestRodiniaReferencesByHand(t *testing.T) {
	// [4 3; 6 3] = [1 0; 1.5 1] × [4 3; 0 -1.5]
	if got, want := LUDF32([]float32{4, 3, 6, 3}, 2), []float32{4, 3, 1.5, -1.5}; !slices.Equal(got, want) {
		t.Errorf("LUDF32 = %v, want %v", got, want)
	}
	// One cell is its own neighbour: t + c·(p + (amb-t)·rz1) = 100 + 0.5·(1 - 20·0.25) = 98.
	k := HotspotCoeffs{StepDivCap: 0.5, Rx1: 7, Ry1: 7, Rz1: 0.25, Amb: 80}
	if got := HotspotF32([]float32{1}, []float32{100}, 1, 1, 1, k); got[0] != 98 {
		t.Errorf("HotspotF32 one cell = %v, want 98", got)
	}
	// A 1×3 row [0 10 0], no power, no ambient: the middle loses 2·10·rx1·c.
	k = HotspotCoeffs{StepDivCap: 0.5, Rx1: 0.1, Ry1: 0.1}
	if got, want := HotspotF32([]float32{0, 0, 0}, []float32{0, 10, 0}, 1, 3, 1, k), []float32{0.5, 9, 0.5}; !slices.Equal(got, want) {
		t.Errorf("HotspotF32 row = %v, want %v", got, want)
	}
	dist, nearest := NNF32([]float32{3, 4, 0, 0, -3, -4, 1, 1}, 0, 0, 3)
	if !slices.Equal(dist, []float32{5, 0, 5, float32(math.Sqrt2)}) || !slices.Equal(nearest, []int{1, 3, 0}) {
		t.Errorf("NNF32 = %v, %v; want [5 0 5 √2], [1 3 0]", dist, nearest)
	}
	// One input, one hidden unit, all weights 0 but the hidden→output one:
	// h = ½, out = σ(½), δout = out(1-out)(0.1-out), δh = ¼·δout, and both
	// weights change by η·δh.
	out := 1 / (1 + math.Exp(-0.5))
	dh := 0.25 * out * (1 - out) * (0.1 - out)
	w, oldw := BackpropF32([]float32{1}, []float32{0, 0}, []float32{0, 0}, []float32{0, 1}, 0.1, 1)
	for i := range 2 {
		if !near(w[i], 0.3*dh) || !near(oldw[i], 0.3*dh) {
			t.Errorf("BackpropF32 weight %d = %v (change %v), want %v", i, w[i], oldw[i], 0.3*dh)
		}
	}
	// A 1×2 image [1 2]: q0² = 0.25/2.25; the coefficients are 1/(1+(q²-q0²)/(q0²(1+q0²)))
	// with q² = 0.28 and 1/7; the update moves c₁/8 from the right pixel to the left.
	q0 := 0.25 / 2.25
	c1 := 1 / (1 + (1.0/7-q0)/(q0*(1+q0)))
	got := SradV2F32([]float32{1, 2}, 1, 2, SradROI{0, 0, 0, 1}, 1, 0.5)
	if !near(got[0], 1+c1/8) || !near(got[1], 2-c1/8) {
		t.Errorf("SradV2F32 = %v, want [%v %v]", got, 1+c1/8, 2-c1/8)
	}
	// srad_v1 on one pixel row: extract and compress invert each other
	// when no step runs.
	img := []float32{0, 17, 255}
	for i, v := range SradF32(img, 1, 3, 0, 0.5) {
		if !near(v, float64(img[i])) {
			t.Errorf("SradF32 without steps: pixel %d = %v, want %v", i, v, img[i])
		}
	}
}

// TestRodiniaScratchShared runs the kernels one after another on one
// Scratch, larger then smaller problems, and still gets each reference's
// result: no buffer carries anything from one launch into the next.
func TestRodiniaScratchShared(t *testing.T) {
	var sc Scratch
	for _, n := range []int{70, 33, 5} {
		r := rand.New(rand.NewPCG(uint64(n), 21))
		m := ludInput(r, n)
		a := newArena(1 << 20)
		va := a.put(m)
		ludSequence(t, a, &sc, va, n)
		if !sameBits(a.get(va, n*n), LUDF32(m, n)) {
			t.Errorf("lud n=%d: wrong result", n)
		}
		power, temp := uniform(r, n*n, 0, 0.005), uniform(r, n*n, 320, 340)
		vp, vt, vo := a.put(power), a.put(temp), a.poison(n*n)
		k := testCoeffs
		a.run(t, &sc, nvc0.KernelHotspot, vp, vt, vo, uint64(n), uint64(n), 3,
			nvc0.F32Word(k.StepDivCap), nvc0.F32Word(k.Rx1), nvc0.F32Word(k.Ry1), nvc0.F32Word(k.Rz1), nvc0.F32Word(k.Amb))
		if !sameBits(a.get(vo, n*n), HotspotF32(power, temp, n, n, 3, k)) {
			t.Errorf("hotspot n=%d: wrong result", n)
		}
		locs := uniform(r, 2*n, -90, 90)
		vl, vd := a.put(locs), a.poison(n)
		a.run(t, &sc, nvc0.KernelNN, vl, vd, uint64(n), nvc0.F32Word(1), nvc0.F32Word(2))
		if want, _ := NNF32(locs, 1, 2, 1); !sameBits(a.get(vd, n), want) {
			t.Errorf("nn n=%d: wrong result", n)
		}
		img := uniform(r, n*n, 1, 255)
		b := newSradBufs(a, img)
		s := a.poison(2)
		a.run(t, &sc, nvc0.KernelSradExtract, b[0], uint64(n*n))
		a.run(t, &sc, nvc0.KernelSradReduce, b[0], s, uint64(n*n))
		sums := a.get(s, 2)
		a.run(t, &sc, nvc0.KernelSradCoeff, b.params(n, n, testQ0sqr(sums[0], sums[1], float32(n*n)))...)
		a.run(t, &sc, nvc0.KernelSradUpdate, b.params(n, n, 0.5)...)
		a.run(t, &sc, nvc0.KernelSradCompress, b[0], uint64(n*n))
		if !sameBits(a.get(b[0], n*n), SradF32(img, n, n, 1, 0.5)) {
			t.Errorf("srad n=%d: wrong result", n)
		}
	}
	if _, err := RunScratch(context.Background(), nvc0.KernelNop, nil, nil, &sc); err != nil {
		t.Fatal(err)
	}
}
