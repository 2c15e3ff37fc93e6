package kernels

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

func benchMatrix(b *testing.B, id nvc0.KernelID, n int) {
	r := rand.New(rand.NewPCG(5, 6))
	var a, bb []byte
	if id == nvc0.KernelFmadd || id == nvc0.KernelFmmul {
		a, bb = EncodeF32s(randF32s(r, n*n)), EncodeF32s(randF32s(r, n*n))
	} else {
		a, bb = EncodeU32s(randU32s(r, n*n)), EncodeU32s(randU32s(r, n*n))
	}
	m, va, vb, vc := matrixSetup(n, a, bb)
	params := []uint64{va, vb, vc, uint64(n)}
	b.SetBytes(int64(3 * n * n * 4))
	b.ResetTimer()
	for b.Loop() {
		if _, err := Run(context.Background(), id, params, m); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkMmulU32_1024(b *testing.B) { benchMatrix(b, nvc0.KernelMmul, 1024) }
func BenchmarkMmulF32_1024(b *testing.B) { benchMatrix(b, nvc0.KernelFmmul, 1024) }
func BenchmarkMaddU32_1024(b *testing.B) { benchMatrix(b, nvc0.KernelMadd, 1024) }
func BenchmarkMaddF32_1024(b *testing.B) { benchMatrix(b, nvc0.KernelFmadd, 1024) }

// BenchmarkLoop reports the cost of one loop-kernel iteration.
func BenchmarkLoop(b *testing.B) {
	for b.Loop() {
		if _, err := Run(context.Background(), nvc0.KernelLoop, []uint64{1 << 24, 0}, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/(1<<24), "ns/iter")
}

// BenchmarkRefMmulF32_1024 is the host reference's cost for verification.
func BenchmarkRefMmulF32_1024(b *testing.B) {
	r := rand.New(rand.NewPCG(7, 8))
	x, y := randF32s(r, 1024*1024), randF32s(r, 1024*1024)
	for b.Loop() {
		MmulF32(x, y, 1024)
	}
}
