package kernels

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// errFault is the fake MMU fault of flatMem.
var errFault = errors.New("fake mmu fault")

// flatMem is a Memory backed by one flat byte slice mapped at base; any
// access outside [base, base+len(buf)) faults.
type flatMem struct {
	base uint64
	buf  []byte
	// onRead, if set, is called after every successful ReadAt.
	onRead func(va uint64)
}

func (m *flatMem) slice(n int, va uint64) ([]byte, error) {
	if va < m.base || va-m.base > uint64(len(m.buf)) || uint64(n) > uint64(len(m.buf))-(va-m.base) {
		return nil, fmt.Errorf("access %#x+%d: %w", va, n, errFault)
	}
	off := va - m.base
	return m.buf[off : off+uint64(n)], nil
}

func (m *flatMem) ReadAt(p []byte, va uint64) error {
	s, err := m.slice(len(p), va)
	if err != nil {
		return err
	}
	copy(p, s)
	if m.onRead != nil {
		m.onRead(va)
	}
	return nil
}

func (m *flatMem) WriteAt(p []byte, va uint64) error {
	s, err := m.slice(len(p), va)
	if err != nil {
		return err
	}
	copy(s, p)
	return nil
}

const testBase = 0x10_0000_0000 // a 40-bit GPU virtual address

// matrixSetup lays out a, b and an unwritten c of n×n 4-byte elements in a
// fresh flatMem and returns it with the addresses.
func matrixSetup(n int, a, b []byte) (m *flatMem, va, vb, vc uint64) {
	size := uint64(n * n * 4)
	m = &flatMem{base: testBase, buf: make([]byte, 3*size)}
	va, vb, vc = testBase, testBase+size, testBase+2*size
	copy(m.buf, a)
	copy(m.buf[size:], b)
	for i := range m.buf[2*size:] {
		m.buf[2*size+uint64(i)] = 0xEE // poison: c must be fully written
	}
	return m, va, vb, vc
}

func randU32s(r *rand.Rand, n int) []uint32 {
	v := make([]uint32, n)
	for i := range v {
		v[i] = r.Uint32()
	}
	return v
}

// randF32s returns values of mixed sign and widely varying magnitude, so that
// the result of a sum depends on its order.
func randF32s(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32((r.Float64()*2 - 1) * math.Pow(2, float64(r.IntN(24)-12)))
	}
	return v
}

var testSizes = []int{1, 2, 3, 4, 5, 7, 17, 33, 64, 67}

func TestMatrixKernelsMatchReferences(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range testSizes {
		au, bu := randU32s(r, n*n), randU32s(r, n*n)
		af, bf := randF32s(r, n*n), randF32s(r, n*n)
		cases := []struct {
			id       nvc0.KernelID
			a, b     []byte
			want     []byte
			wantCost Cost
		}{
			{nvc0.KernelMadd, EncodeU32s(au), EncodeU32s(bu), EncodeU32s(MaddU32(au, bu)), Cost{uint64(n * n), uint64(12 * n * n)}},
			{nvc0.KernelMmul, EncodeU32s(au), EncodeU32s(bu), EncodeU32s(MmulU32(au, bu, n)), Cost{uint64(2 * n * n * n), uint64(12 * n * n)}},
			{nvc0.KernelFmadd, EncodeF32s(af), EncodeF32s(bf), EncodeF32s(MaddF32(af, bf)), Cost{uint64(n * n), uint64(12 * n * n)}},
			{nvc0.KernelFmmul, EncodeF32s(af), EncodeF32s(bf), EncodeF32s(MmulF32(af, bf, n)), Cost{uint64(2 * n * n * n), uint64(12 * n * n)}},
		}
		for _, tc := range cases {
			t.Run(fmt.Sprintf("%v/n=%d", tc.id, n), func(t *testing.T) {
				m, va, vb, vc := matrixSetup(n, tc.a, tc.b)
				cost, err := Run(context.Background(), tc.id, []uint64{va, vb, vc, uint64(n)}, m)
				if err != nil {
					t.Fatalf("Run: %v", err)
				}
				if cost != tc.wantCost {
					t.Errorf("cost = %+v, want %+v", cost, tc.wantCost)
				}
				size := uint64(n * n * 4)
				if got := m.buf[2*size:]; !slices.Equal(got, tc.want) {
					t.Errorf("c differs from the reference (bit-exact comparison)")
				}
				if !slices.Equal(m.buf[:size], tc.a) || !slices.Equal(m.buf[size:2*size], tc.b) {
					t.Errorf("inputs were modified")
				}
			})
		}
	}
}

// TestReferencesByHand pins the references to hand-computed values, so that
// a bug shared by a kernel and its reference still fails.
func TestReferencesByHand(t *testing.T) {
	if got, want := MaddU32([]uint32{0xFFFFFFFF, 1}, []uint32{2, 3}), []uint32{1, 4}; !slices.Equal(got, want) {
		t.Errorf("MaddU32 = %v, want %v", got, want)
	}
	// [1 2; 3 4] × [5 6; 7 8] = [19 22; 43 50]
	if got, want := MmulU32([]uint32{1, 2, 3, 4}, []uint32{5, 6, 7, 8}, 2), []uint32{19, 22, 43, 50}; !slices.Equal(got, want) {
		t.Errorf("MmulU32 = %v, want %v", got, want)
	}
	// Wrapping: 0x80000000·2 + 1·1 = 1 (mod 2^32).
	if got, want := MmulU32([]uint32{0x80000000, 1, 0, 0}, []uint32{2, 0, 1, 0}, 2), []uint32{1, 0, 0, 0}; !slices.Equal(got, want) {
		t.Errorf("MmulU32 wrap = %v, want %v", got, want)
	}
	if got, want := MaddF32([]float32{1.5, -2}, []float32{0.25, 2}), []float32{1.75, 0}; !slices.Equal(got, want) {
		t.Errorf("MaddF32 = %v, want %v", got, want)
	}
	if got, want := MmulF32([]float32{1, 2, 3, 4}, []float32{5, 6, 7, 8}, 2), []float32{19, 22, 43, 50}; !slices.Equal(got, want) {
		t.Errorf("MmulF32 = %v, want %v", got, want)
	}
	// The order is (0 + 1e8·1) + 1·1 + (-1e8)·1 = 0 in float32 (the 1 is
	// absorbed); another order could give 1.
	a := []float32{1e8, 1, -1e8, 0, 0, 0, 0, 0, 0}
	b := []float32{1, 0, 0, 1, 0, 0, 1, 0, 0}
	if got := MmulF32(a, b, 3)[0]; got != 0 {
		t.Errorf("MmulF32 order: c[0][0] = %v, want 0", got)
	}
	m, va, vb, vc := matrixSetup(3, EncodeF32s(a), EncodeF32s(b))
	if _, err := Run(context.Background(), nvc0.KernelFmmul, []uint64{va, vb, vc, 3}, m); err != nil {
		t.Fatal(err)
	}
	if got := DecodeF32s(m.buf[2*36:])[0]; got != 0 {
		t.Errorf("fmmul order: c[0][0] = %v, want 0", got)
	}
}

func TestCodecRoundTrip(t *testing.T) {
	u := []uint32{0, 1, 0xDEADBEEF, 0xFFFFFFFF}
	p := EncodeU32s(u)
	if want := []byte{0, 0, 0, 0, 1, 0, 0, 0, 0xEF, 0xBE, 0xAD, 0xDE, 0xFF, 0xFF, 0xFF, 0xFF}; !slices.Equal(p, want) {
		t.Errorf("EncodeU32s = %x, want %x (little-endian)", p, want)
	}
	if got := DecodeU32s(append(p, 9)); !slices.Equal(got, u) {
		t.Errorf("DecodeU32s = %v, want %v", got, u)
	}
	bits := []uint32{0x3F800000, 0x80000000, 0x7FC00001, 0xFF800000}
	f := make([]float32, len(bits))
	for i, b := range bits {
		f[i] = math.Float32frombits(b)
	}
	q := EncodeF32s(f)
	if !slices.Equal(q, EncodeU32s(bits)) {
		t.Errorf("EncodeF32s = %x, want %x", q, EncodeU32s(bits))
	}
	for i, x := range DecodeF32s(q) {
		if math.Float32bits(x) != bits[i] {
			t.Errorf("DecodeF32s[%d] = %#x, want %#x", i, math.Float32bits(x), bits[i])
		}
	}
}

func TestInPlace(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const n = 9
	a, b := randU32s(r, n*n), randU32s(r, n*n)
	m, va, vb, _ := matrixSetup(n, EncodeU32s(a), EncodeU32s(b))
	if _, err := Run(context.Background(), nvc0.KernelMmul, []uint64{va, vb, va, n}, m); err != nil {
		t.Fatal(err)
	}
	if got := DecodeU32s(m.buf[:n*n*4]); !slices.Equal(got, MmulU32(a, b, n)) {
		t.Errorf("c aliasing a: wrong result")
	}
}

func TestNop(t *testing.T) {
	cost, err := Run(context.Background(), nvc0.KernelNop, nil, nil)
	if err != nil || cost != (Cost{}) {
		t.Errorf("nop = %+v, %v; want zero cost, nil", cost, err)
	}
}

func TestLoop(t *testing.T) {
	for _, iters := range []uint64{0, 1, 5, loopChunk - 1, loopChunk, 2*loopChunk + 3} {
		cost, err := Run(context.Background(), nvc0.KernelLoop, []uint64{iters, 0}, nil)
		if err != nil || cost != (Cost{Ops: iters}) {
			t.Errorf("loop %d = %+v, %v; want Ops %d", iters, cost, err, iters)
		}
		var want uint64
		for range iters {
			want = want*lcgMul + lcgInc
		}
		if got, err := loop(context.Background(), iters); err != nil || got != want {
			t.Errorf("loop sink after %d = %#x, %v; want %#x", iters, got, err, want)
		}
	}
}

func TestFaultPropagates(t *testing.T) {
	const n = 5
	size := uint64(n * n * 4)
	bad := uint64(0x20_0000_0000)
	for _, id := range []nvc0.KernelID{nvc0.KernelMadd, nvc0.KernelMmul, nvc0.KernelFmadd, nvc0.KernelFmmul} {
		for _, tc := range []struct {
			what         string
			a, b, c      uint64
			cUntouchedAt uint64
		}{
			{"a", bad, testBase + size, testBase + 2*size, 2 * size},
			{"b", testBase, bad, testBase + 2*size, 2 * size},
			{"c", testBase, testBase + size, bad, 2 * size},
			{"c straddles end", testBase, testBase + size, testBase + 2*size + 4, 2 * size},
		} {
			m, _, _, _ := matrixSetup(n, nil, nil)
			before := slices.Clone(m.buf)
			cost, err := Run(context.Background(), id, []uint64{tc.a, tc.b, tc.c, n}, m)
			if !errors.Is(err, errFault) {
				t.Errorf("%v fault in %s: err = %v, want wrapping errFault", id, tc.what, err)
			}
			if cost != (Cost{}) {
				t.Errorf("%v fault in %s: cost = %+v, want zero", id, tc.what, cost)
			}
			if !slices.Equal(m.buf, before) {
				t.Errorf("%v fault in %s: memory was modified", id, tc.what)
			}
		}
	}
}

func TestBadParams(t *testing.T) {
	m := &flatMem{base: testBase, buf: make([]byte, 1<<12)}
	for _, tc := range []struct {
		name   string
		id     nvc0.KernelID
		params []uint64
		want   error
	}{
		{"nop extra", nvc0.KernelNop, []uint64{1}, ErrBadParams},
		{"loop none", nvc0.KernelLoop, nil, ErrBadParams},
		{"loop too many", nvc0.KernelLoop, []uint64{nvc0.MaxKernelLoopIterations + 1, 0}, ErrBadParams},
		{"loop one word", nvc0.KernelLoop, []uint64{5}, ErrBadParams},
		{"madd 3 params", nvc0.KernelMadd, []uint64{testBase, testBase, testBase}, ErrBadParams},
		{"mmul 5 params", nvc0.KernelMmul, []uint64{testBase, testBase, testBase, 1, 0}, ErrBadParams},
		{"madd n=0", nvc0.KernelMadd, []uint64{testBase, testBase, testBase, 0}, ErrBadParams},
		{"fmmul n too big", nvc0.KernelFmmul, []uint64{testBase, testBase, testBase, nvc0.MaxKernelMatrixDim + 1}, ErrBadParams},
		{"mmul n huge", nvc0.KernelMmul, []uint64{testBase, testBase, testBase, 1 << 33}, ErrBadParams},
		{"fmadd c wraps", nvc0.KernelFmadd, []uint64{testBase, testBase, math.MaxUint64 - 2, 1}, ErrBadParams},
		{"unknown 0", 0, nil, ErrUnknownKernel},
		{"unknown next", nvc0.KernelSradCompress + 1, []uint64{}, ErrUnknownKernel},
		{"unknown max", math.MaxUint32, nil, ErrUnknownKernel},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := slices.Clone(m.buf)
			cost, err := Run(context.Background(), tc.id, tc.params, m)
			if !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
			if cost != (Cost{}) {
				t.Errorf("cost = %+v, want zero", cost)
			}
			if !slices.Equal(m.buf, before) {
				t.Errorf("memory was modified")
			}
		})
	}
	// At the limits the kernels accept their parameters.
	if _, err := Run(context.Background(), nvc0.KernelMadd, []uint64{testBase, testBase, testBase, 1}, m); err != nil {
		t.Errorf("madd n=1: %v", err)
	}
}

func TestCancelledBeforeStart(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, id := range []nvc0.KernelID{nvc0.KernelNop, nvc0.KernelLoop, nvc0.KernelMmul} {
		params := map[nvc0.KernelID][]uint64{nvc0.KernelNop: nil, nvc0.KernelLoop: {1, 0}, nvc0.KernelMmul: {testBase, testBase, testBase, 1}}[id]
		if _, err := Run(ctx, id, params, &flatMem{base: testBase, buf: make([]byte, 4)}); !errors.Is(err, context.Canceled) {
			t.Errorf("%v: err = %v, want context.Canceled", id, err)
		}
	}
}

func TestLoopCancel(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	cost, err := Run(ctx, nvc0.KernelLoop, []uint64{nvc0.MaxKernelLoopIterations, 0}, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want context.DeadlineExceeded", err)
	}
	if cost != (Cost{}) {
		t.Errorf("cost = %+v, want zero", cost)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("loop took %v to notice cancellation", d)
	}
}

// TestMmulCancelMidRun cancels the context while the kernel reads b, so the
// product itself must notice the cancellation; c must stay unwritten.
func TestMmulCancelMidRun(t *testing.T) {
	const n = 64
	for _, id := range []nvc0.KernelID{nvc0.KernelMmul, nvc0.KernelFmmul} {
		ctx, cancel := context.WithCancel(context.Background())
		m, va, vb, vc := matrixSetup(n, nil, nil)
		m.onRead = func(addr uint64) {
			if addr == vb {
				cancel()
			}
		}
		before := slices.Clone(m.buf)
		_, err := Run(ctx, id, []uint64{va, vb, vc, n}, m)
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%v: err = %v, want context.Canceled", id, err)
		}
		if !slices.Equal(m.buf, before) {
			t.Errorf("%v: c was written after cancellation", id)
		}
		cancel()
	}
}

// TestMmulCancelTimed cancels a large product part-way through.
func TestMmulCancelTimed(t *testing.T) {
	const n = 2048
	m, va, vb, vc := matrixSetup(n, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := Run(ctx, nvc0.KernelMmul, []uint64{va, vb, vc, n}, m)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("mmul took %v to notice cancellation", d)
	}
}

func TestParallelRowsCoversAll(t *testing.T) {
	for _, tc := range []struct{ n, block int }{{1, 2}, {5, 2}, {64, 16}, {67, 16}, {100, 3}} {
		seen := make([]int32, tc.n)
		if err := parallelRows(context.Background(), tc.n, tc.block, func(i0, i1 int) {
			for i := i0; i < i1; i++ {
				seen[i]++ // each block is owned by one goroutine
			}
		}); err != nil {
			t.Fatal(err)
		}
		for i, s := range seen {
			if s != 1 {
				t.Errorf("n=%d block=%d: row %d visited %d times", tc.n, tc.block, i, s)
			}
		}
	}
}

func TestLoopWritesResult(t *testing.T) {
	m := &flatMem{base: testBase, buf: make([]byte, 64)}
	cost, err := Run(context.Background(), nvc0.KernelLoop, []uint64{1000, testBase + 8}, m)
	if err != nil || cost != (Cost{Ops: 1000, Bytes: 8}) {
		t.Fatalf("loop = %+v, %v", cost, err)
	}
	if got := binary.LittleEndian.Uint64(m.buf[8:]); got != LoopValue(1000) || got == 0 {
		t.Fatalf("result %#x, want %#x", got, LoopValue(1000))
	}
	if _, err := Run(context.Background(), nvc0.KernelLoop, []uint64{10, testBase + 60}, m); !errors.Is(err, errFault) {
		t.Fatalf("result write off the end: %v", err)
	}
}

// One Scratch serves launches of every matrix kernel and size in turn
// (larger, smaller, odd), and each result is still the reference's: the
// reused buffers carry nothing from one launch into the next.
func TestScratchReuse(t *testing.T) {
	var sc Scratch
	for _, n := range []int{64, 33, 7, 64, 2} {
		r := rand.New(rand.NewPCG(uint64(n), 9))
		au, bu := randU32s(r, n*n), randU32s(r, n*n)
		af, bf := randF32s(r, n*n), randF32s(r, n*n)
		for _, tc := range []struct {
			id         nvc0.KernelID
			a, b, want []byte
		}{
			{nvc0.KernelMmul, EncodeU32s(au), EncodeU32s(bu), EncodeU32s(MmulU32(au, bu, n))},
			{nvc0.KernelMadd, EncodeU32s(au), EncodeU32s(bu), EncodeU32s(MaddU32(au, bu))},
			{nvc0.KernelFmmul, EncodeF32s(af), EncodeF32s(bf), EncodeF32s(MmulF32(af, bf, n))},
			{nvc0.KernelFmadd, EncodeF32s(af), EncodeF32s(bf), EncodeF32s(MaddF32(af, bf))},
		} {
			size := uint64(len(tc.a))
			mem := &flatMem{buf: make([]byte, 3*size)}
			copy(mem.buf, tc.a)
			copy(mem.buf[size:], tc.b)
			if _, err := RunScratch(context.Background(), tc.id, []uint64{0, size, 2 * size, uint64(n)}, mem, &sc); err != nil {
				t.Fatalf("%v n=%d: %v", tc.id, n, err)
			}
			if !bytes.Equal(mem.buf[2*size:], tc.want) {
				t.Errorf("%v n=%d with a reused Scratch: wrong result", tc.id, n)
			}
		}
	}
}
