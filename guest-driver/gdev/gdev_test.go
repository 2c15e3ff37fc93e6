package gdev_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/bench"
	"github.com/gpuvm/gpuvm/gpu/hostmem"
	"github.com/gpuvm/gpuvm/gpu/kernels"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
)

func openNative(t *testing.T) *bench.Native {
	t.Helper()
	cfg := sim.DefaultConfig()
	cfg.VRAMSize, cfg.MemPartitions = 512<<20, 4
	n, err := bench.OpenNative(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return n
}

// openDevice opens the driver with opts on a fresh board of vram bytes in
// parts memory partitions, with 64 MiB of host RAM.
func openDevice(t *testing.T, vram uint64, parts int, opts nouveau.Options) (*sim.Board, *nouveau.Device) {
	t.Helper()
	cfg := sim.DefaultConfig()
	cfg.VRAMSize, cfg.MemPartitions = vram, parts
	board, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { board.Close() })
	ram, err := hostmem.New("t", 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ram.Close() })
	base, err := board.RegisterSystemMemory(ram.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	ram.SetBusBase(base)
	dev, err := nouveau.Open(board, ram, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	return board, dev
}

// madd runs c = a + b on n×n matrices in ctx and returns c.
func madd(ctx *gdev.Context, a, b []uint32, n int) ([]uint32, error) {
	fn, err := ctx.LoadFunction(nvc0.KernelMadd)
	if err != nil {
		return nil, err
	}
	size := uint64(n * n * 4)
	var p [3]gdev.DevPtr
	for i := range p {
		if p[i], err = ctx.MemAlloc(size); err != nil {
			return nil, err
		}
	}
	if err := ctx.MemcpyHtoD(p[0], kernels.EncodeU32s(a)); err != nil {
		return nil, err
	}
	if err := ctx.MemcpyHtoD(p[1], kernels.EncodeU32s(b)); err != nil {
		return nil, err
	}
	if err := ctx.Launch(fn, p[0].VA, p[1].VA, p[2].VA, uint64(n)); err != nil {
		return nil, err
	}
	if err := ctx.Synchronize(); err != nil {
		return nil, err
	}
	out := make([]byte, size)
	if err := ctx.MemcpyDtoH(out, p[2]); err != nil {
		return nil, err
	}
	return kernels.DecodeU32s(out), nil
}

func matrices(n int) (a, b []uint32) {
	a, b = make([]uint32, n*n), make([]uint32, n*n)
	for i := range a {
		a[i], b[i] = uint32(i*7+1), uint32(i*13+5)
	}
	return a, b
}

// A kernel that writes through an unmapped pointer gets a channel fault as an
// error naming the address, while a second context on the same GPU computes
// its own result undisturbed.
func TestFaultIsAnErrorAndStaysInItsChannel(t *testing.T) {
	n := openNative(t)
	var wg sync.WaitGroup
	var honestErr error
	var honestOut []uint32
	a, b := matrices(64)
	wg.Add(1)
	go func() {
		defer wg.Done()
		ctx, err := gdev.NewContext(n.Device)
		if err != nil {
			honestErr = err
			return
		}
		defer ctx.Close()
		for i := 0; i < 5 && honestErr == nil; i++ {
			honestOut, honestErr = madd(ctx, a, b, 64)
		}
	}()

	bad, err := gdev.NewContext(n.Device)
	if err != nil {
		t.Fatal(err)
	}
	fn, err := bad.LoadFunction(nvc0.KernelMadd)
	if err != nil {
		t.Fatal(err)
	}
	in, err := bad.MemAlloc(64 * 64 * 4)
	if err != nil {
		t.Fatal(err)
	}
	const wild = 0x7_0000_0000 // never mapped in this address space
	if err := bad.Launch(fn, in.VA, in.VA, wild, 64); err != nil {
		t.Fatal(err)
	}
	err = bad.Synchronize()
	var fe *nouveau.FaultError
	if !errors.As(err, &fe) || !errors.Is(err, nouveau.ErrChannelFault) {
		t.Fatalf("Synchronize after a wild write = %v, want a channel fault", err)
	}
	if !fe.Known || fe.Addr < wild || fe.Addr >= wild+64*64*4 || !fe.Write || fe.Reason != nvc0.FaultReasonPTNotPresent {
		t.Errorf("fault = %+v (%v)", fe, fe)
	}
	if err := bad.Close(); err != nil {
		t.Errorf("closing the faulted context: %v", err)
	}
	wg.Wait()
	if honestErr != nil {
		t.Fatalf("honest context: %v", honestErr)
	}
	if want := kernels.MaddU32(a, b); !equalU32(honestOut, want) {
		t.Fatal("honest context computed a wrong result")
	}
}

// A fence that can never be reached returns ErrTimeout instead of hanging.
func TestFenceTimeoutIsAnError(t *testing.T) {
	_, dev := openDevice(t, 256<<20, 1, nouveau.Options{Timeout: 200 * time.Millisecond})
	ctx, err := gdev.NewContext(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	sem, err := ctx.MemAllocHost(4096)
	if err != nil {
		t.Fatal(err)
	}
	// Acquire a semaphore value nobody will ever release.
	if err := ctx.Channel().Submit([]uint32{
		nvc0.Incr(0, nvc0.MthdSemaphoreAddrHi, 4), uint32(sem.VA >> 32), uint32(sem.VA), 42, nvc0.SemaphoreAcquireEqual,
	}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = ctx.Synchronize()
	if !errors.Is(err, nouveau.ErrTimeout) {
		t.Fatalf("Synchronize = %v, want ErrTimeout", err)
	}
	if time.Since(start) < 200*time.Millisecond {
		t.Errorf("gave up before the timeout")
	}
}

// The driver also works with every kernel object written through PRAMIN.
func TestPRAMINPath(t *testing.T) {
	board, dev := openDevice(t, 256<<20, 2, nouveau.Options{PageTables: nouveau.ViaPRAMIN})
	if dev.VRAMSize() != 256<<20 {
		t.Errorf("VRAM size %d", dev.VRAMSize())
	}
	before := board.Stats()
	ctx, err := gdev.NewContext(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	a, b := matrices(16)
	got, err := madd(ctx, a, b, 16)
	if err != nil {
		t.Fatal(err)
	}
	if !equalU32(got, kernels.MaddU32(a, b)) {
		t.Fatal("wrong result")
	}
	if after := board.Stats(); after.MMIOWrites[nvc0.BAR3] != before.MMIOWrites[nvc0.BAR3] {
		t.Errorf("PRAMIN mode wrote BAR3 %d times", after.MMIOWrites[nvc0.BAR3]-before.MMIOWrites[nvc0.BAR3])
	}
}

// deadMMIO is a device that fell off the bus: every read is all-ones.
type deadMMIO struct{}

func (deadMMIO) Read32(int, uint64) uint32   { return 0xFFFFFFFF }
func (deadMMIO) Write32(int, uint64, uint32) {}

func TestOpenDeadDevice(t *testing.T) {
	ram, err := hostmem.New("t", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer ram.Close()
	if _, err := nouveau.Open(deadMMIO{}, ram, nouveau.Options{}); !errors.Is(err, nouveau.ErrDeviceGone) {
		t.Fatalf("Open = %v, want ErrDeviceGone", err)
	}
}

func TestSmallCopiesGoThroughBAR1(t *testing.T) {
	n := openNative(t)
	ctx, err := gdev.NewContext(n.Device)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	p, err := ctx.MemAlloc(gdev.SmallCopyMax)
	if err != nil {
		t.Fatal(err)
	}
	msg := []byte("hello, device memory through the BAR1 aperture!") // not a multiple of 4
	before := n.Board.Stats()
	if err := ctx.MemcpyHtoD(p, msg); err != nil {
		t.Fatal(err)
	}
	back := make([]byte, len(msg))
	if err := ctx.MemcpyDtoH(back, p); err != nil {
		t.Fatal(err)
	}
	after := n.Board.Stats()
	if !bytes.Equal(back, msg) {
		t.Fatalf("read back %q", back)
	}
	if after.CopiesRun != before.CopiesRun || after.MMIOWrites[nvc0.BAR1] == before.MMIOWrites[nvc0.BAR1] {
		t.Errorf("small copy used the copy engine (%d) or no BAR1 writes", after.CopiesRun-before.CopiesRun)
	}
	if err := ctx.MemcpyHtoD(p, make([]byte, gdev.SmallCopyMax+4)); err == nil {
		t.Error("copy past the allocation succeeded")
	}
}

func equalU32(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A small copy back (through BAR1) right after a launch, with no explicit
// synchronisation, sees the kernel's result: copies are ordered after
// earlier work, as in CUDA.
func TestSmallCopyOrderedAfterLaunch(t *testing.T) {
	n := openNative(t)
	ctx, err := gdev.NewContext(n.Device)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	fn, err := ctx.LoadFunction(nvc0.KernelLoop)
	if err != nil {
		t.Fatal(err)
	}
	out, err := ctx.MemAlloc(8)
	if err != nil {
		t.Fatal(err)
	}
	if err := ctx.Launch(fn, 1<<20, out.VA); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 8)
	if err := ctx.MemcpyDtoH(got, out); err != nil {
		t.Fatal(err)
	}
	if v := binary.LittleEndian.Uint64(got); v != kernels.LoopValue(1<<20) {
		t.Fatalf("read %#x before the kernel finished (want %#x)", v, kernels.LoopValue(1<<20))
	}
}
