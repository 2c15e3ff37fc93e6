package aggregator

import (
	"context"
	"encoding/binary"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
	"github.com/gpuvm/gpuvm/pvdrm"
)

// Attacks on the pvdrm back end, each beside an honest pvdrm VM whose
// workloads must still verify afterwards.

// do sends a raw request and returns the status (0 or a negative errno).
func (g *pvdrmGuest) do(t *testing.T, r pvdrm.Request) (pvdrm.Response, int32) {
	t.Helper()
	rsp, err := g.c.Do(context.Background(), r)
	var se *pvdrm.StatusError
	switch {
	case errors.As(err, &se):
		return rsp, se.Status
	case err != nil:
		t.Fatalf("%v: %v", r.Op, err)
	}
	return rsp, 0
}

func (g *pvdrmGuest) open(t *testing.T) uint32 {
	t.Helper()
	rsp, st := g.do(t, pvdrm.Request{Op: pvdrm.OpOpen})
	if st != 0 {
		t.Fatalf("open: %d", st)
	}
	return uint32(rsp.Results["file"])
}

func (g *pvdrmGuest) gemNew(t *testing.T, file uint32, size uint64, domain, flags uint32) (uint32, uint64) {
	t.Helper()
	rsp, st := g.do(t, pvdrm.Request{Op: pvdrm.OpGEMNew, File: file, Args: map[string]uint64{"size": size, "domain": uint64(domain), "flags": uint64(flags)}})
	if st != 0 {
		t.Fatalf("GEM_NEW %d bytes in domain %d: %d", size, domain, st)
	}
	return uint32(rsp.Results["handle"]), rsp.Results["gpu_va"]
}

// pushbuf maps a new GART buffer of file, writes words into it and returns
// its handle.
func (g *pvdrmGuest) pushbuf(t *testing.T, file uint32, words []uint32) uint32 {
	t.Helper()
	h, _ := g.gemNew(t, file, nvc0.PageSize, pvdrm.DomainGART, pvdrm.GEMMappable)
	rsp, st := g.do(t, pvdrm.Request{Op: pvdrm.OpGEMMmap, File: file, Args: map[string]uint64{"handle": uint64(h)}})
	if st != 0 {
		t.Fatalf("GEM_MMAP: %d", st)
	}
	b, err := g.shares.Map(uint32(rsp.Results["share"]), uint32(rsp.Results["pages"]), rsp.Results["offset"])
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range words {
		binary.LittleEndian.PutUint32(b[4*i:], w)
	}
	t.Cleanup(func() { g.shares.Unmap(b) })
	return h
}

func (g *pvdrmGuest) honestRun(t *testing.T) {
	t.Helper()
	ctx, err := gdev.NewContextOn(g.driver())
	if err != nil {
		t.Fatalf("honest VM: %v", err)
	}
	defer ctx.Close()
	if err := maddOnce(ctx, 16); err != nil {
		t.Fatalf("honest VM: %v", err)
	}
}

func expect(t *testing.T, what string, got, want int32) {
	t.Helper()
	if got != want {
		t.Errorf("%s: status %d, want %d", what, got, want)
	}
}

// Handles are the file's own: another file's, another VM's and made-up
// handles and files are refused.
func TestPVDRMForeignHandles(t *testing.T) {
	agg, _ := newTestAggregator(t, 2)
	good := startPVDRM(t, agg, "good", "pvdrm")
	bad := startPVDRM(t, agg, "bad", "pvdrm")
	gf := good.open(t)
	goodBuf, _ := good.gemNew(t, gf, 1<<20, pvdrm.DomainVRAM, 0)

	f1, f2 := bad.open(t), bad.open(t)
	own, _ := bad.gemNew(t, f1, 1<<20, pvdrm.DomainVRAM, 0)
	_, st := bad.do(t, pvdrm.Request{Op: pvdrm.OpGEMInfo, File: f2, Args: map[string]uint64{"handle": uint64(own)}})
	expect(t, "another file's handle", st, -pvdrm.ENOENT)
	_, st = bad.do(t, pvdrm.Request{Op: pvdrm.OpGEMClose, File: f2, Args: map[string]uint64{"handle": uint64(own)}})
	expect(t, "closing another file's handle", st, -pvdrm.ENOENT)
	_, st = bad.do(t, pvdrm.Request{Op: pvdrm.OpGEMInfo, File: f2, Args: map[string]uint64{"handle": uint64(goodBuf) + 1000}})
	expect(t, "a made-up handle", st, -pvdrm.ENOENT)
	_, st = bad.do(t, pvdrm.Request{Op: pvdrm.OpGEMInfo, File: 77, Args: map[string]uint64{"handle": uint64(goodBuf)}})
	expect(t, "a file it never opened", st, -pvdrm.EBADF)
	_, st = bad.do(t, pvdrm.Request{Op: pvdrm.OpOpen, File: f1})
	expect(t, "a file where none belongs", st, -pvdrm.EBADF)
	_, st = bad.do(t, pvdrm.Request{Op: pvdrm.OpHello, Args: map[string]uint64{"version": 1}})
	expect(t, "a second HELLO", st, -pvdrm.EPROTO)
	_, st = bad.do(t, pvdrm.Request{Op: pvdrm.OpGEMMmap, File: f1, Args: map[string]uint64{"handle": uint64(own)}})
	expect(t, "mapping VRAM into the guest", st, -pvdrm.EINVAL)
	_, st = bad.do(t, pvdrm.Request{Op: pvdrm.OpGEMNew, File: f1, Args: map[string]uint64{"size": 4096, "domain": pvdrm.DomainVRAM, "flags": pvdrm.GEMMappable}})
	expect(t, "mappable VRAM", st, -pvdrm.EINVAL)
	// The good VM's buffer is still its own.
	rsp, st := good.do(t, pvdrm.Request{Op: pvdrm.OpGEMInfo, File: gf, Args: map[string]uint64{"handle": uint64(goodBuf)}})
	if st != 0 || rsp.Results["size"] != 1<<20 {
		t.Errorf("the good VM's buffer: status %d, %v", st, rsp.Results)
	}
	good.honestRun(t)
}

// A push buffer may only use the file's buffers, listed; what its methods
// reach beyond the file's address space faults on the GPU, in that channel
// only.
func TestPVDRMPushbufOwnership(t *testing.T) {
	agg, board := newTestAggregator(t, 2)
	good := startPVDRM(t, agg, "good", "pvdrm")
	bad := startPVDRM(t, agg, "bad", "pvdrm")
	_ = board
	f, other := bad.open(t), bad.open(t)
	rsp, st := bad.do(t, pvdrm.Request{Op: pvdrm.OpChannelAlloc, File: f})
	if st != 0 {
		t.Fatal(st)
	}
	ch := rsp.Results["channel"]
	for range 4 { // handles are per file: make the foreign one's number one f lacks
		bad.gemNew(t, other, nvc0.PageSize, pvdrm.DomainVRAM, 0)
	}
	foreign := bad.pushbuf(t, other, []uint32{0})
	nop := []uint32{nvc0.Incr(nouveau.SubcCompute, nvc0.MthdSetObject, 1), nvc0.ClassFermiCompute}
	pb := bad.pushbuf(t, f, nop)
	push := func(bufs []uint32, seg pvdrm.PushEntry) int32 {
		_, st := bad.do(t, pvdrm.Request{Op: pvdrm.OpPushbuf, File: f, Args: map[string]uint64{"channel": ch}, Buffers: bufs, Push: []pvdrm.PushEntry{seg}})
		return st
	}
	expect(t, "a buffer of another file listed", push([]uint32{pb, foreign}, pvdrm.PushEntry{Handle: pb, Length: 8}), -pvdrm.ENOENT)
	expect(t, "a segment in another file's buffer", push([]uint32{pb}, pvdrm.PushEntry{Handle: foreign, Length: 8}), -pvdrm.EINVAL)
	expect(t, "a segment in a buffer not listed", push(nil, pvdrm.PushEntry{Handle: pb, Length: 8}), -pvdrm.EINVAL)
	expect(t, "a segment past its buffer", push([]uint32{pb}, pvdrm.PushEntry{Handle: pb, Offset: nvc0.PageSize - 4, Length: 8}), -pvdrm.EINVAL)
	expect(t, "a segment whose end wraps", push([]uint32{pb}, pvdrm.PushEntry{Handle: pb, Offset: 0xFFFFFFFC, Length: 8}), -pvdrm.EINVAL)
	expect(t, "an unaligned segment", push([]uint32{pb}, pvdrm.PushEntry{Handle: pb, Offset: 2, Length: 8}), -pvdrm.EINVAL)
	_, st = bad.do(t, pvdrm.Request{Op: pvdrm.OpPushbuf, File: f, Args: map[string]uint64{"channel": ch + 9}, Buffers: []uint32{pb}, Push: []pvdrm.PushEntry{{Handle: pb, Length: 8}}})
	expect(t, "a channel it does not have", st, -pvdrm.ENOENT)
	expect(t, "its own push buffer", push([]uint32{pb}, pvdrm.PushEntry{Handle: pb, Length: 8}), 0)

	// Methods that copy from an address the file never mapped (where the
	// good VM's buffers live in the good VM's own space): a GPU fault,
	// reported on that channel; nothing is read.
	gf := good.open(t)
	_, secretVA := good.gemNew(t, gf, 1<<20, pvdrm.DomainVRAM, 0)
	dst, dstVA := bad.gemNew(t, f, 1<<20, pvdrm.DomainVRAM, 0)
	steal := []uint32{nvc0.Incr(nouveau.SubcCopy, nvc0.MthdSetObject, 1), nvc0.ClassFermiCopy,
		nvc0.Incr(nouveau.SubcCopy, nvc0.CopyMthdSrcAddrHi, 8),
		uint32((secretVA + 64<<30) >> 32), uint32(secretVA + 64<<30), uint32(dstVA >> 32), uint32(dstVA),
		nvc0.PageSize, nvc0.PageSize, nvc0.PageSize, 1,
		nvc0.Immd(nouveau.SubcCopy, nvc0.CopyMthdExec, nvc0.CopyExecLinear)}
	thief := bad.pushbuf(t, f, steal)
	_, st = bad.do(t, pvdrm.Request{Op: pvdrm.OpPushbuf, File: f, Args: map[string]uint64{"channel": ch}, Buffers: []uint32{thief, dst}, Push: []pvdrm.PushEntry{{Handle: thief, Length: uint32(4 * len(steal))}}})
	expect(t, "a push buffer reaching outside its space (submitted)", st, 0)
	_, st = bad.do(t, pvdrm.Request{Op: pvdrm.OpCPUPrep, File: f, Args: map[string]uint64{"handle": uint64(dst), "timeout_ns": uint64(5 * time.Second)}})
	expect(t, "waiting on the faulted work", st, -pvdrm.EIO)
	good.honestRun(t)
	if c := bad.b.VGPU().Counters(); c.PVDRMRejected != 8 {
		t.Errorf("rejections counted: %d", c.PVDRMRejected)
	}
}

// VRAM beyond the VM's quota is refused; the other VM keeps its own.
func TestPVDRMVRAMQuota(t *testing.T) {
	agg, _ := newTestAggregator(t, 2)
	good := startPVDRM(t, agg, "good", "pvdrm")
	bad := startPVDRM(t, agg, "bad", "pvdrm")
	f := bad.open(t)
	quota := bad.b.VGPU().Slot.VRAM.Size
	var got uint64
	for {
		_, st := bad.do(t, pvdrm.Request{Op: pvdrm.OpGEMNew, File: f, Args: map[string]uint64{"size": 32 << 20, "domain": pvdrm.DomainVRAM}})
		if st != 0 {
			expect(t, "VRAM past the quota", st, -pvdrm.ENOMEM)
			break
		}
		got += 32 << 20
		if got > quota {
			t.Fatalf("allocated %d MiB of a %d MiB quota", got>>20, quota>>20)
		}
	}
	_, st := bad.do(t, pvdrm.Request{Op: pvdrm.OpGEMNew, File: f, Args: map[string]uint64{"size": quota + 1, "domain": pvdrm.DomainVRAM}})
	expect(t, "one buffer larger than the quota", st, -pvdrm.ENOMEM)
	_, st = bad.do(t, pvdrm.Request{Op: pvdrm.OpGEMNew, File: f, Args: map[string]uint64{"size": 1 << 62, "domain": pvdrm.DomainGART}})
	expect(t, "an absurd size", st, -pvdrm.EINVAL)
	good.honestRun(t)
}

// A producer index that runs past the ring disconnects that front end, and
// only it: its vGPU goes, the other VM goes on.
func TestPVDRMRingOverflow(t *testing.T) {
	agg, _ := newTestAggregator(t, 2)
	good := startPVDRM(t, agg, "good", "pvdrm")
	bad := startPVDRM(t, agg, "bad", "pvdrm")
	bad.open(t)
	ring := bad.front.Ring()
	prod := binary.LittleEndian.Uint32(ring[0:])
	binary.LittleEndian.PutUint32(ring[0:], prod+pvdrm.Slots(len(ring))+5) // req_prod far ahead
	if err := bad.front.Notify(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-bad.served:
		if !errors.Is(err, pvdrm.ErrOverflow) {
			t.Errorf("back end ended with %v, want the overflow", err)
		}
		bad.served <- err // for the cleanup
	case <-time.After(time.Minute):
		t.Fatal("the back end did not notice the overflow")
	}
	good.honestRun(t)
}

// A request rewritten in the ring after the back end copied it: what runs
// is the copy. The rewrite turns a 4-KiB GEM_NEW into a 1-GiB one.
func TestPVDRMRequestRewrittenAfterCopy(t *testing.T) {
	agg, _ := newTestAggregator(t, 1)
	var fired, armed atomic.Bool
	g := startPVDRMWith(t, agg, "vm", "pvdrm", func(g *pvdrmGuest) {
		ring := g.front.Ring()
		// Runs in the back end's goroutine, after each copy.
		g.b.afterCopy = func() {
			if !armed.Load() || fired.Load() {
				return
			}
			// Every slot's size argument becomes 1 GiB.
			for off := pvdrm.HeaderSize; off+pvdrm.SlotSize <= len(ring); off += pvdrm.SlotSize {
				binary.LittleEndian.PutUint64(ring[off+pvdrm.OffArgs:], 1<<30)
			}
			fired.Store(true)
		}
	})
	f := g.open(t)
	armed.Store(true)
	_, size := g.gemNew(t, f, nvc0.PageSize, pvdrm.DomainVRAM, 0)
	_ = size
	rsp, st := g.do(t, pvdrm.Request{Op: pvdrm.OpGEMInfo, File: f, Args: map[string]uint64{"handle": 1}})
	if !fired.Load() || st != 0 || rsp.Results["size"] != nvc0.PageSize {
		t.Errorf("rewrite fired %v; the buffer made: status %d, %v (want %d bytes)", fired.Load(), st, rsp.Results, nvc0.PageSize)
	}
}

// A front end that vanishes while its work runs and a request waits: its
// channels are stopped, its slot scrubbed, and the next tenant of the slot
// reads zeros.
func TestPVDRMFrontEndVanishesMidRequest(t *testing.T) {
	agg, board := newTestAggregator(t, 1)
	g := startPVDRM(t, agg, "victim", "pvdrm")
	ctx, err := gdev.NewContextOn(g.driver())
	if err != nil {
		t.Fatal(err)
	}
	secret, err := ctx.MemAlloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	pattern := make([]byte, 1<<20)
	for i := range pattern {
		pattern[i] = 0xA5
	}
	if err := ctx.MemcpyHtoD(secret, pattern); err != nil {
		t.Fatal(err)
	}
	loop, err := ctx.LoadFunction(nvc0.KernelLoop)
	if err != nil {
		t.Fatal(err)
	}
	if err := ctx.LaunchRepeat(loop, 64, 1<<40, secret.VA); err != nil { // far longer than the test
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- ctx.Synchronize() }() // a CPU_PREP outstanding
	time.Sleep(50 * time.Millisecond)
	slot := g.b.VGPU().Slot
	g.stop(t) // the front end is gone: the back end stops and detaches
	g.c.Close()
	if err := <-waited; err == nil {
		t.Error("the wait of a vanished front end succeeded")
	}
	buf := make([]byte, 1<<20)
	for off := uint64(0); off < 64<<20; off += 1 << 20 {
		if err := board.ReadVRAM(buf, slot.VRAM.Base+off); err != nil {
			t.Fatal(err)
		}
		for i, b := range buf {
			if b != 0 {
				t.Fatalf("slot VRAM at %#x+%#x is %#x after teardown", slot.VRAM.Base, off+uint64(i), b)
			}
		}
	}
	next := startPVDRM(t, agg, "next", "pvdrm")
	nctx, err := gdev.NewContextOn(next.driver())
	if err != nil {
		t.Fatal(err)
	}
	defer nctx.Close()
	p, err := nctx.MemAlloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]byte, 1<<20)
	if err := nctx.MemcpyDtoH(out, p); err != nil {
		t.Fatal(err)
	}
	for i, b := range out {
		if b != 0 {
			t.Fatalf("the next tenant reads %#x at %d", b, i)
		}
	}
	next.honestRun(t)
}

// Several contexts of one VM at once (one file each, requests from
// several goroutines in flight on one ring), beside a VM that floods its
// ring with allocations, frees and bad requests: every context verifies,
// the honest VM too, and the flooder holds nothing when it lets go.
func TestPVDRMConcurrentContextsAndFlood(t *testing.T) {
	agg, _ := newTestAggregator(t, 2)
	good := startPVDRM(t, agg, "good", "pvdrm-pooling")
	bad := startPVDRM(t, agg, "flood", "pvdrm")
	stop := make(chan struct{})
	flooded := make(chan int, 4)
	for range 4 {
		go func() {
			n := 0
			f := bad.open(t)
			for {
				select {
				case <-stop:
					bad.do(t, pvdrm.Request{Op: pvdrm.OpClose, File: f})
					flooded <- n
					return
				default:
				}
				rsp, st := bad.do(t, pvdrm.Request{Op: pvdrm.OpGEMNew, File: f, Args: map[string]uint64{"size": 1 << 20, "domain": pvdrm.DomainVRAM}})
				if st == 0 {
					bad.do(t, pvdrm.Request{Op: pvdrm.OpGEMClose, File: f, Args: map[string]uint64{"handle": rsp.Results["handle"]}})
				}
				bad.do(t, pvdrm.Request{Op: pvdrm.OpGEMInfo, File: f, Args: map[string]uint64{"handle": 99999}})
				n += 3
			}
		}()
	}
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			ctx, err := gdev.NewContextOn(good.driver())
			if err != nil {
				errs <- err
				return
			}
			defer ctx.Close()
			for range 5 {
				if err := maddOnce(ctx, 16); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Errorf("a context of the good VM: %v", err)
		}
	}
	close(stop)
	total := 0
	for range 4 {
		total += <-flooded
	}
	if total == 0 {
		t.Fatal("the flood made no requests")
	}
	// What the flooder made is freed: with its files closed, the back end
	// holds no buffers and no files for it (read once it stopped serving).
	bad.halt()
	if objects, files := bad.b.objects, len(bad.b.files); objects != 0 || files != 0 {
		t.Errorf("after the flood the back end holds %d buffers in %d files", objects, files)
	}
	t.Logf("flood: %d requests, %d rejected", total, bad.b.VGPU().Counters().PVDRMRejected)
}

// A buffer closed while a kernel still writes into it stays mapped as long
// as the kernel runs, and is freed once the channel is stopped.
func TestPVDRMBufferClosedUnderRunningKernel(t *testing.T) {
	agg, _ := newTestAggregator(t, 1)
	var zombies atomic.Int64
	g := startPVDRMWith(t, agg, "vm", "pvdrm", func(g *pvdrmGuest) {
		// Runs in the back end's goroutine before each request: count the
		// closed buffers it still keeps for the GPU.
		g.b.afterCopy = func() {
			n := 0
			for _, f := range g.b.files {
				n += len(f.zombies)
			}
			zombies.Store(int64(n))
		}
	})
	ctx, err := gdev.NewContextOn(g.driver())
	if err != nil {
		t.Fatal(err)
	}
	out, err := ctx.MemAlloc(8)
	if err != nil {
		t.Fatal(err)
	}
	loop, err := ctx.LoadFunction(nvc0.KernelLoop)
	if err != nil {
		t.Fatal(err)
	}
	if err := ctx.LaunchRepeat(loop, 1, 1<<40, out.VA); err != nil { // runs until its channel is stopped
		t.Fatal(err)
	}
	if err := ctx.MemFree(out); err != nil { // GEM_CLOSE while the kernel writes into it
		t.Fatal(err)
	}
	probe := func() int { // the count as the back end saw it before answering this request
		g.do(t, pvdrm.Request{Op: pvdrm.OpGetParam, File: 0xFFFF, Args: map[string]uint64{"param": pvdrm.ParamChipset}})
		return int(zombies.Load())
	}
	for range 3 {
		if n := probe(); n != 1 {
			t.Fatalf("while the kernel runs the back end keeps %d closed buffers, want the busy one", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := ctx.Close(); err != nil { // stops the channel, closes the file
		t.Fatal(err)
	}
	if n := probe(); n != 0 {
		t.Errorf("after the channel stopped %d closed buffers are still kept", n)
	}
}
