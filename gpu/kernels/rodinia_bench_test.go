package kernels

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// The Rodinia-like kernels at the sizes of the workloads (package
// guest-driver/workloads), with a Scratch kept from launch to launch as the
// board keeps one.

// benchLaunch times one launch of id with params in a.
func benchLaunch(b *testing.B, a *arena, id nvc0.KernelID, params ...uint64) {
	var sc Scratch
	ctx := context.Background()
	for b.Loop() {
		if _, err := RunScratch(ctx, id, params, a.m, &sc); err != nil {
			b.Fatal(err)
		}
	}
}

func benchBP(b *testing.B, id nvc0.KernelID) {
	const nin, nh = 65536, 16
	r := rand.New(rand.NewPCG(1, 2))
	a := newArena(10 << 20)
	x, w, o := a.put(uniform(r, nin, 0, 1)), a.put(uniform(r, (nin+1)*nh, -0.01, 0.01)), a.put(uniform(r, (nin+1)*nh, -0.01, 0.01))
	if id == nvc0.KernelBPForward {
		benchLaunch(b, a, id, x, w, a.poison(nin/nvc0.BPBlockInputs*nh), nin, nh)
		return
	}
	benchLaunch(b, a, id, a.put(uniform(r, nh, -0.1, 0.1)), x, w, o, nin, nh)
}

func BenchmarkBPForward_65536x16(b *testing.B) { benchBP(b, nvc0.KernelBPForward) }
func BenchmarkBPAdjust_65536x16(b *testing.B)  { benchBP(b, nvc0.KernelBPAdjust) }

func BenchmarkHotspot_512_2Steps(b *testing.B) {
	const n = 512
	r := rand.New(rand.NewPCG(3, 4))
	a := newArena(4 << 20)
	p, s, d := a.put(uniform(r, n*n, 0, 0.005)), a.put(uniform(r, n*n, 320, 340)), a.poison(n*n)
	k := testCoeffs
	benchLaunch(b, a, nvc0.KernelHotspot, p, s, d, n, n, 2,
		nvc0.F32Word(k.StepDivCap), nvc0.F32Word(k.Rx1), nvc0.F32Word(k.Ry1), nvc0.F32Word(k.Rz1), nvc0.F32Word(k.Amb))
}

// BenchmarkLUD_512 is a whole decomposition: 94 launches.
func BenchmarkLUD_512(b *testing.B) {
	const n = 512
	m := ludInput(rand.New(rand.NewPCG(5, 6)), n)
	a := newArena(2 << 20)
	va := a.put(m)
	var sc Scratch
	for b.Loop() {
		copy(a.m.buf, EncodeF32s(m))
		ludSequence(b, a, &sc, va, n)
	}
}

// benchLUD times one LU kernel at the first block step of a 512×512
// matrix, the step with the most work.
func benchLUD(b *testing.B, id nvc0.KernelID) {
	const n = 512
	a := newArena(2 << 20)
	benchLaunch(b, a, id, a.put(ludInput(rand.New(rand.NewPCG(5, 6)), n)), n, 0)
}

func BenchmarkLUDDiagonal_512(b *testing.B)  { benchLUD(b, nvc0.KernelLUDDiagonal) }
func BenchmarkLUDPerimeter_512(b *testing.B) { benchLUD(b, nvc0.KernelLUDPerimeter) }
func BenchmarkLUDInternal_512(b *testing.B)  { benchLUD(b, nvc0.KernelLUDInternal) }

func BenchmarkNN_42764(b *testing.B) {
	const n = 42764
	a := newArena(1 << 20)
	benchLaunch(b, a, nvc0.KernelNN, a.put(uniform(rand.New(rand.NewPCG(7, 8)), 2*n, -90, 90)), a.poison(n), n, nvc0.F32Word(30), nvc0.F32Word(90))
}

// benchSrad times one SRAD kernel on a rows×cols image.
func benchSrad(b *testing.B, id nvc0.KernelID, rows, cols int) {
	r := rand.New(rand.NewPCG(9, 10))
	a := newArena(7*4*rows*cols + 1<<16)
	bufs := newSradBufs(a, uniform(r, rows*cols, 1, 3))
	switch id {
	case nvc0.KernelSradReduce:
		benchLaunch(b, a, id, bufs[0], a.poison(2), uint64(rows*cols))
	case nvc0.KernelSradExtract, nvc0.KernelSradCompress:
		benchLaunch(b, a, id, bufs[0], uint64(rows*cols))
	case nvc0.KernelSradCoeff:
		benchLaunch(b, a, id, bufs.params(rows, cols, 0.05)...)
	default:
		benchLaunch(b, a, id, bufs.params(rows, cols, 0.5)...)
	}
}

func BenchmarkSradExtract_502x458(b *testing.B)  { benchSrad(b, nvc0.KernelSradExtract, 502, 458) }
func BenchmarkSradReduce_502x458(b *testing.B)   { benchSrad(b, nvc0.KernelSradReduce, 502, 458) }
func BenchmarkSradCoeff_502x458(b *testing.B)    { benchSrad(b, nvc0.KernelSradCoeff, 502, 458) }
func BenchmarkSradUpdate_502x458(b *testing.B)   { benchSrad(b, nvc0.KernelSradUpdate, 502, 458) }
func BenchmarkSradCompress_502x458(b *testing.B) { benchSrad(b, nvc0.KernelSradCompress, 502, 458) }

// srad2's image.
func BenchmarkSradCoeff_1024(b *testing.B)  { benchSrad(b, nvc0.KernelSradCoeff, 1024, 1024) }
func BenchmarkSradUpdate_1024(b *testing.B) { benchSrad(b, nvc0.KernelSradUpdate, 1024, 1024) }
