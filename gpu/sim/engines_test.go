package sim

import (
	"bytes"
	"context"
	"encoding/binary"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/gpu/hwseq"
	"github.com/gpuvm/gpuvm/gpu/kernels"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

const (
	sysVA  = 0x60000000 // where tests map system memory
	vramVA = 0x48000000 // where tests map VRAM buffers
)

func TestCopyEngine(t *testing.T) {
	const size = 64 << 10
	for _, tc := range []struct {
		name                       string
		fromSys, toSys             bool
		pitchIn, pitchOut, lineLen uint32
		lines                      uint32
	}{
		{"vram to sys linear", false, true, nvc0.PageSize, nvc0.PageSize, nvc0.PageSize, size / nvc0.PageSize}, // as nvc0_bo_move_copy
		{"sys to vram linear", true, false, size / 2, size / 2, size / 2, 2},
		{"vram to vram pitched", false, false, 1000, 600, 500, 50},
		{"sys to sys pitched", true, true, 4096, 5000, 4097, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			c := r.newChan(0, nil)
			sys := r.newSysMem(2 * size)
			c.s.mapSys(sysVA, sys.base, 2*size)
			vpa := c.s.mapVRAM(vramVA, 2*size)
			src := make([]byte, size)
			rng := rand.New(rand.NewPCG(1, 2))
			for i := range src {
				src[i] = byte(rng.Uint32())
			}
			// Source in the first half of its memory, destination in the second half.
			srcVA, dstVA := uint64(vramVA), uint64(sysVA+size)
			if tc.fromSys {
				srcVA = sysVA
				copy(sys.mem, src)
			} else {
				r.hostWrite(vpa, src)
			}
			if !tc.toSys {
				dstVA = vramVA + size
			}
			c.push(cat(bind(3, nvc0.ClassFermiCopy), copyCmd(3, srcVA, dstVA, tc.pitchIn, tc.pitchOut, tc.lineLen, tc.lines))...)
			c.mustFinish()
			var got []byte
			if tc.toSys {
				got = sys.mem[size:]
			} else {
				got = r.hostRead(vpa+size, size)
			}
			want := make([]byte, size)
			for l := range tc.lines {
				copy(want[l*tc.pitchOut:][:tc.lineLen], src[l*tc.pitchIn:][:tc.lineLen])
			}
			if !bytes.Equal(got, want) {
				t.Fatal("copied data differs")
			}
			if st := r.b.Stats(); st.BytesCopied != uint64(tc.lineLen*tc.lines) || st.CopiesRun != 1 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

func TestCopyEngineFault(t *testing.T) {
	r := newRig(t)
	c := r.newChan(0, nil)
	c.s.mapVRAM(vramVA, 2*nvc0.PageSize)
	// The destination's second page is read-only.
	ro := r.alloc(nvc0.PageSize, nvc0.PageSize)
	c.s.mapVRAM(vramVA+0x10000, nvc0.PageSize)
	c.s.mapPage(vramVA+0x11000, ro, nvc0.TargetVRAM, false, true)
	c.push(cat(bind(0, nvc0.ClassFermiCopy), copyCmd(0, vramVA, vramVA+0x10000, 0, 0, 2*nvc0.PageSize, 1))...)
	rp := c.mustFaultReason(nvc0.FaultReasonReadOnly)
	want := uint32(nvc0.FaultReasonReadOnly | nvc0.FaultTypeWrite | nvc0.FaultTypeHub | nvc0.FaultClientPCOPY0<<nvc0.FaultTypeClientShift)
	if rp.unit != nvc0.FaultUnitCE0 || rp.typ != want || rp.va != vramVA+0x11000 {
		t.Fatalf("%v, want unit CE0 type %#x at %#x", rp, want, vramVA+0x11000)
	}
}

// kernelLaunch writes a code object and parameters into c's space and returns
// the launch push buffer.
func kernelLaunch(r *rig, c *tchan, id nvc0.KernelID, magic uint32, params ...uint64) []uint32 {
	const codeVA, startID, cbVA = 0x50000000, 0x100, 0x50010000
	code := c.s.mapVRAM(codeVA, nvc0.PageSize)
	cb := c.s.mapVRAM(cbVA, nvc0.PageSize)
	obj := make([]byte, nvc0.KernelObjectSize)
	binary.LittleEndian.PutUint32(obj[0:], magic)
	binary.LittleEndian.PutUint32(obj[4:], uint32(id))
	binary.LittleEndian.PutUint32(obj[8:], nvc0.KernelVersion)
	r.hostWrite(code+startID, obj)
	p := make([]byte, 8*len(params))
	for i, v := range params {
		binary.LittleEndian.PutUint64(p[8*i:], v)
	}
	r.hostWrite(cb, p)
	return cat(bind(1, nvc0.ClassFermiCompute), []uint32{
		nvc0.Incr(1, nvc0.ComputeMthdCodeAddrHi, 2), codeVA >> 32, codeVA,
		nvc0.Incr(1, nvc0.ComputeMthdCBSize, 3), uint32(len(p)), cbVA >> 32, cbVA,
		nvc0.Incr(1, nvc0.ComputeMthdStartID, 1), startID,
		nvc0.Incr(1, nvc0.ComputeMthdGridDimX, 1), 1,
		nvc0.Incr(1, nvc0.ComputeMthdLaunch, 1), 0,
	})
}

// maddSetup maps three n×n matrices (a in VRAM, b in system memory, c in VRAM)
// and fills a and b.
func maddSetup(r *rig, c *tchan, n int) (a, b []uint32, va, vb, vc, cpa uint64) {
	bytesN := uint64(n * n * 4)
	va, vb, vc = vramVA, sysVA, vramVA+0x1000000
	apa := c.s.mapVRAM(va, bytesN)
	sys := r.newSysMem(int((bytesN + nvc0.PageSize - 1) &^ (nvc0.PageSize - 1)))
	c.s.mapSys(vb, sys.base, uint64(len(sys.mem)))
	cpa = c.s.mapVRAM(vc, bytesN)
	rng := rand.New(rand.NewPCG(3, 4))
	a, b = make([]uint32, n*n), make([]uint32, n*n)
	for i := range a {
		a[i], b[i] = rng.Uint32(), rng.Uint32()
	}
	r.hostWrite(apa, kernels.EncodeU32s(a))
	copy(sys.mem, kernels.EncodeU32s(b))
	return a, b, va, vb, vc, cpa
}

func TestKernelMadd(t *testing.T) {
	const n = 37
	r := newRig(t)
	c := r.newChan(0, nil)
	a, b, va, vb, vc, cpa := maddSetup(r, c, n)
	semPA := c.semPage()
	c.push(cat(kernelLaunch(r, c, nvc0.KernelMadd, nvc0.KernelMagic, va, vb, vc, n), semRelease(chanDataVA, 1))...)
	c.mustFinish()
	got := kernels.DecodeU32s(r.hostRead(cpa, n*n*4))
	want := kernels.MaddU32(a, b)
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("c[%d] = %d, want %d", i, got[i], want[i])
		}
	}
	if r.r32(semPA) != 1 || r.b.Stats().KernelsRun != 1 {
		t.Fatal("fence after the kernel not written / kernel not counted")
	}
}

func TestKernelFaults(t *testing.T) {
	for _, tc := range []struct {
		name   string
		id     nvc0.KernelID
		magic  uint32
		params func(va, vb, vc uint64) []uint64
		fault  bool // an MMU fault of GR (else ILLEGAL_MTHD on PBDMA 0)
	}{
		{"bad magic", nvc0.KernelMadd, 0x1234, func(va, vb, vc uint64) []uint64 { return []uint64{va, vb, vc, 4} }, false},
		{"unknown kernel", 99, nvc0.KernelMagic, func(va, vb, vc uint64) []uint64 { return nil }, false},
		{"bad params", nvc0.KernelMadd, nvc0.KernelMagic, func(va, vb, vc uint64) []uint64 { return []uint64{va} }, false},
		{"output unmapped", nvc0.KernelMadd, nvc0.KernelMagic, func(va, vb, vc uint64) []uint64 { return []uint64{va, vb, 0x48800000, 4} }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			c := r.newChan(0, nil)
			_, _, va, vb, vc, _ := maddSetup(r, c, 4)
			c.push(kernelLaunch(r, c, tc.id, tc.magic, tc.params(va, vb, vc)...)...)
			if tc.fault {
				if rp := c.mustFaultReason(nvc0.FaultReasonPageNotPresent); rp.unit != nvc0.FaultUnitGR || rp.typ&nvc0.FaultTypeHub != 0 {
					t.Fatalf("%v, want a GR (GPC) fault", rp)
				}
				return
			}
			if rp := c.mustMethodError(nvc0.PBDMAIntrIllegalMthd); rp.unit != nvc0.PBDMAGR || rp.mthd&nvc0.PBDMAMethodMask != nvc0.ComputeMthdLaunch {
				t.Fatalf("%v, want ILLEGAL_MTHD at LAUNCH on PBDMA 0", rp)
			}
		})
	}
}

// holdCompute occupies the compute engine with an operation that ends when
// unblock is called (at the latest when the test ends); done reports it.
func holdCompute(t *testing.T, r *rig) (unblock func(), done chan error) {
	release, started := make(chan struct{}), make(chan struct{})
	var once sync.Once
	unblock = func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock) // registered after the rig's Close, so it runs first
	done = make(chan error)
	go func() {
		done <- r.b.do(context.Background(), r.b.compute, 99, func(context.Context) error { close(started); <-release; return nil })
	}()
	<-started
	return unblock, done
}

func TestPGRAPHBusyWhileKernelRuns(t *testing.T) {
	r := newRig(t)
	unblock, done := holdCompute(t, r)
	if r.b.Read32(nvc0.BAR0, nvc0.RegPGRAPHStatus) == 0 {
		t.Error("PGRAPH idle while the compute engine runs")
	}
	// A channel's kernel queues behind it (one kernel at a time).
	c := r.newChan(0, nil)
	pa := c.semPage()
	c.push(cat(kernelLaunch(r, c, nvc0.KernelNop, nvc0.KernelMagic), semRelease(chanDataVA, 1))...)
	if r.r32(pa) != 0 || r.b.Stats().KernelsRun != 0 {
		t.Error("kernel ran while the engine was busy")
	}
	unblock()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	c.mustFinish()
	if r.b.Read32(nvc0.BAR0, nvc0.RegPGRAPHStatus) != 0 || r.r32(pa) != 1 {
		t.Error("PGRAPH busy after the work / kernel not run")
	}
}

func TestTimingFermiEndToEnd(t *testing.T) {
	// The profile must not change results (no wall-clock assertions).
	r := newRigConfig(t, Config{VRAMSize: testVRAM, Channels: 2, MemPartitions: 1, Timing: TimingFermi()})
	c := r.newChan(1, nil)
	pa := c.semPage()
	c.push(cat(kernelLaunch(r, c, nvc0.KernelLoop, nvc0.KernelMagic, 1000, 0), semRelease(chanDataVA, 5))...)
	c.mustFinish()
	if r.r32(pa) != 5 {
		t.Fatal("semaphore not written")
	}
}

func TestPreemptDropsQueuedEngineOperation(t *testing.T) {
	r := newRig(t)
	unblock, done := holdCompute(t, r)
	if st := r.b.Read32(nvc0.BAR0, uint64(nvc0.RegEngineStatus(nvc0.EngineGR))); st != nvc0.EngineStatusBusy|99 {
		t.Fatalf("GR engine status %#x while channel 99's item runs", st)
	}
	for r.b.compute.queued.Load() != 0 { // our own hand-over is accounted for
	}
	c := r.newChan(0, nil)
	pa := c.semPage()
	c.push(cat(kernelLaunch(r, c, nvc0.KernelNop, nvc0.KernelMagic), semRelease(chanDataVA, 1))...)
	for r.b.compute.queued.Load() == 0 { // the channel is handing its kernel over
	}
	hwseq.DisableChannel(r.b, c.id)
	if err := hwseq.Preempt(r.b, c.id, 5*time.Second); err != nil {
		t.Fatalf("preempt of a channel waiting for the engine: %v", err)
	}
	unblock()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if r.b.Stats().KernelsRun != 0 {
		t.Error("the preempted channel's kernel ran")
	}
	if r.r32(pa) != 0 {
		t.Error("the preempted channel kept executing methods")
	}
	if rp, ok := c.report(); ok {
		t.Errorf("a preempt reported an error: %v", rp)
	}
}

func TestPreemptAbortsRunningKernel(t *testing.T) {
	r := newRig(t)
	c := r.newChan(0, nil)
	pa := c.semPage()
	// 2^40 iterations: hours of work unless the preempt ends it.
	c.push(cat(kernelLaunch(r, c, nvc0.KernelLoop, nvc0.KernelMagic, nvc0.MaxKernelLoopIterations, chanDataVA+8), semRelease(chanDataVA, 1))...)
	gr := uint64(nvc0.RegEngineStatus(nvc0.EngineGR))
	for r.b.Read32(nvc0.BAR0, gr) != nvc0.EngineStatusBusy|uint32(c.id) {
	}
	if err := hwseq.StopChannel(r.b, c.id, 10*time.Second); err != nil {
		t.Fatalf("stop of a channel running a 2^40-iteration kernel: %v", err)
	}
	if st := r.b.Read32(nvc0.BAR0, gr); st != 0 {
		t.Errorf("GR engine status %#x after the stop", st)
	}
	if r.r32(pa) != 0 || r.b.Stats().KernelsRun != 0 {
		t.Error("the kernel completed or the channel went on")
	}
	if r.b.Stats().Preempts != 1 {
		t.Errorf("preempts %d", r.b.Stats().Preempts)
	}
}

// TestUnregisterWaitsForDMA: system memory unregistered (and then unmapped,
// as the aggregator does at a VM's teardown) while a copy engine moves a
// page of it must not crash the board: the unregister waits for the page
// being moved, and the copy then faults on the next one.
func TestUnregisterWaitsForDMA(t *testing.T) {
	r := newRig(t)
	c := r.newChan(0, nil)
	const size = 1 << 20
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	base, err := r.b.RegisterSystemMemory(mem)
	if err != nil {
		t.Fatal(err)
	}
	c.s.mapSys(sysVA, base, size)
	c.s.mapVRAM(vramVA, nvc0.PageSize)
	moving, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	r.b.inDMA = func() {
		once.Do(func() {
			close(moving)
			<-release
		})
	}
	// Every page of the region into the same VRAM page.
	c.push(cat(bind(3, nvc0.ClassFermiCopy), copyCmd(3, sysVA, vramVA, nvc0.PageSize, 0, nvc0.PageSize, size/nvc0.PageSize))...)
	<-moving
	unregistered := make(chan error, 1)
	go func() { unregistered <- r.b.UnregisterSystemMemory(base) }()
	select {
	case <-unregistered:
		close(release)
		t.Fatal("UnregisterSystemMemory returned while a copy engine was moving a page of the region")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if err := <-unregistered; err != nil {
		t.Fatal(err)
	}
	if err := unix.Munmap(mem); err != nil {
		t.Fatal(err)
	}
	c.mustFaultReason(nvc0.FaultReasonNoMemory)
}

// TestFlushOrdersAfterWalks: a TLB flush completes only after the page
// walks in flight, so a translation read from a page table before the flush
// is never cached after it. A walk is held between reading the old PTE and
// caching it while the page is remapped and the TLB flushed; once the flush
// returns, a read must see the new page.
func TestFlushOrdersAfterWalks(t *testing.T) {
	r := newRig(t)
	c := r.newChan(0, nil)
	pa := c.s.mapVRAM(vramVA, nvc0.PageSize)
	pb := r.alloc(nvc0.PageSize, nvc0.PageSize)
	r.w32(pa, 1)
	r.w32(pb, 2)
	v, _ := r.b.vmFromRAMIN(c.ramin, false)
	walked, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	r.b.afterWalk = func() {
		once.Do(func() {
			close(walked)
			<-release
		})
	}
	reader := make(chan struct{})
	go func() { // walks the old PTE, then waits
		defer close(reader)
		r.b.vmRead32(v, vramVA)
	}()
	<-walked
	c.s.mapPage(vramVA, pb, nvc0.TargetVRAM, false, false)
	flushed := make(chan struct{})
	go func() {
		r.b.mmu.flush(v.pd, nvc0.TLBFlushTypeVM)
		close(flushed)
	}()
	select {
	case <-flushed:
		close(release)
		<-reader
		t.Fatal("the TLB flush completed while a page walk that read the old page table was in flight")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	<-flushed
	<-reader
	r.b.afterWalk = nil
	if got, err := r.b.vmRead32(v, vramVA); err != nil || got != 2 {
		t.Fatalf("read %d (%v) after the flush, want 2 from the new page: a stale translation survived the flush", got, err)
	}
}
