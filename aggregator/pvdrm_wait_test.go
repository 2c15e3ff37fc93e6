package aggregator

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
	"github.com/gpuvm/gpuvm/pvdrm"
)

// CPU_PREP waits that must block, not poll. Each test holds a channel on a
// semaphore acquire in a GART buffer the guest maps, so the GPU work ends
// exactly when the test writes the semaphore, whatever the machine's speed,
// and counts the passes the back end's waiter made over its fences
// (PVDRMBackend.waitChecks). The waiter's periodic fault check is set to an
// hour: every wake-up the tests see comes from an event (a completion, a
// fault, a stop, the back end stopping, the deadline), and a waiter that
// polled would make hundreds of passes while the test holds the semaphore.

// holdFor is how long a test keeps a waiter waiting before it lets the GPU
// go on: long enough for a polling waiter (10–160 µs naps) to make well over
// a hundred passes. No assertion depends on it.
const holdFor = 20 * time.Millisecond

// maxChecksPerWait bounds a blocking waiter's passes: one before it first
// sleeps, one for the event that ends the wait, and one to spare.
const maxChecksPerWait = 3

// semWait is a file of a pvdrm guest with a channel that a submission
// holds on a semaphore acquire until the test writes the semaphore.
type semWait struct {
	g     *pvdrmGuest
	file  uint32
	ch    uint64
	sem   uint32 // the semaphore's buffer (GART, mapped by the guest)
	semVA uint64
	word  *uint32 // the semaphore, as the guest maps it
}

// newSemWait opens a file with a channel and a mapped semaphore buffer.
func newSemWait(t *testing.T, g *pvdrmGuest) *semWait {
	t.Helper()
	s := &semWait{g: g, file: g.open(t)}
	rsp, st := g.do(t, pvdrm.Request{Op: pvdrm.OpChannelAlloc, File: s.file})
	if st != 0 {
		t.Fatalf("CHANNEL_ALLOC: %d", st)
	}
	s.ch = rsp.Results["channel"]
	s.sem, s.semVA = g.gemNew(t, s.file, nvc0.PageSize, pvdrm.DomainGART, pvdrm.GEMMappable)
	rsp, st = g.do(t, pvdrm.Request{Op: pvdrm.OpGEMMmap, File: s.file, Args: map[string]uint64{"handle": uint64(s.sem)}})
	if st != 0 {
		t.Fatalf("GEM_MMAP: %d", st)
	}
	b, err := g.shares.Map(uint32(rsp.Results["share"]), uint32(rsp.Results["pages"]), rsp.Results["offset"])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.shares.Unmap(b) })
	s.word = (*uint32)(unsafe.Pointer(&b[0]))
	return s
}

// submit submits a push buffer that waits until the semaphore equals val,
// then runs then (more methods, or nothing). The semaphore's buffer is
// listed, so it is busy until the submission's fence passes.
func (s *semWait) submit(t *testing.T, val uint32, then ...uint32) {
	t.Helper()
	words := append([]uint32{nvc0.Incr(0, nvc0.MthdSemaphoreAddrHi, 4), uint32(s.semVA >> 32), uint32(s.semVA), val, nvc0.SemaphoreAcquireEqual}, then...)
	pb := s.g.pushbuf(t, s.file, words)
	_, st := s.g.do(t, pvdrm.Request{Op: pvdrm.OpPushbuf, File: s.file, Args: map[string]uint64{"channel": s.ch},
		Buffers: []uint32{pb, s.sem}, Push: []pvdrm.PushEntry{{Handle: pb, Length: uint32(4 * len(words))}}})
	if st != 0 {
		t.Fatalf("PUSHBUF: %d", st)
	}
}

// release lets a submission waiting for val go on.
func (s *semWait) release(val uint32) { atomic.StoreUint32(s.word, val) }

// prepResult is a CPU_PREP's answer: a status, or err when the request got
// none (the client gave up on it).
type prepResult struct {
	status int32
	err    error
}

// prep sends CPU_PREP on the semaphore's buffer from its own goroutine.
func (s *semWait) prep(timeout time.Duration) <-chan prepResult {
	out := make(chan prepResult, 1)
	go func() {
		_, err := s.g.c.Do(context.Background(), pvdrm.Request{Op: pvdrm.OpCPUPrep, File: s.file,
			Args: map[string]uint64{"handle": uint64(s.sem), "timeout_ns": uint64(timeout)}})
		var se *pvdrm.StatusError
		switch {
		case err == nil:
			out <- prepResult{}
		case errors.As(err, &se):
			out <- prepResult{status: se.Status}
		default:
			out <- prepResult{err: err}
		}
	}()
	return out
}

// busy checks, by CPU_PREP without waiting, that the buffer is in use.
func (s *semWait) busy(t *testing.T) {
	t.Helper()
	_, st := s.g.do(t, pvdrm.Request{Op: pvdrm.OpCPUPrep, File: s.file, Args: map[string]uint64{"handle": uint64(s.sem)}})
	expect(t, "CPU_PREP without waiting on the held buffer", st, -pvdrm.EBUSY)
}

// waiting returns once a waiter made checks passes (it has started and
// found the buffer busy), then holds it for holdFor; the CPU_PREP must
// still be unanswered.
func waiting(t *testing.T, g *pvdrmGuest, checks uint64, prep <-chan prepResult) {
	t.Helper()
	for give := time.Now().Add(time.Minute); g.b.waitChecks.Load() < checks; time.Sleep(100 * time.Microsecond) {
		if time.Now().After(give) {
			t.Fatal("no CPU_PREP waiter started")
		}
	}
	time.Sleep(holdFor)
	select {
	case r := <-prep:
		t.Fatalf("CPU_PREP answered %+v while the GPU still held the buffer", r)
	default:
	}
}

// answer returns the CPU_PREP's answer (a minute bounds a hung back end).
func answer(t *testing.T, prep <-chan prepResult) prepResult {
	t.Helper()
	select {
	case r := <-prep:
		return r
	case <-time.After(time.Minute):
		t.Fatal("CPU_PREP never answered")
		return prepResult{}
	}
}

// startBlockingPVDRM is startPVDRM with the waiters' periodic fault check
// set to an hour.
func startBlockingPVDRM(t *testing.T, agg *Aggregator, name string) *pvdrmGuest {
	t.Helper()
	return startPVDRMWith(t, agg, name, "pvdrm", func(g *pvdrmGuest) { g.b.faultPoll = time.Hour })
}

// checkPasses fails the test if the waiters made more than max passes.
func checkPasses(t *testing.T, g *pvdrmGuest, max uint64) {
	t.Helper()
	n := g.b.waitChecks.Load()
	t.Logf("the waiters made %d passes over their fences (at most %d expected)", n, max)
	if n > max {
		t.Errorf("the waiters made %d passes over their fences, want at most %d: they poll instead of blocking", n, max)
	}
}

// A CPU_PREP on a busy buffer is answered once the work completes, after a
// few passes per wait however long the work held the buffer.
func TestPVDRMCPUPrepWakesOnCompletion(t *testing.T) {
	agg, _ := newTestAggregator(t, 1)
	g := startBlockingPVDRM(t, agg, "vm")
	s := newSemWait(t, g)
	const rounds = 3
	for i := range uint32(rounds) {
		s.submit(t, i+1)
		s.busy(t)
		before := g.b.waitChecks.Load()
		prep := s.prep(10 * time.Second)
		waiting(t, g, before+1, prep)
		s.release(i + 1)
		if r := answer(t, prep); r.err != nil || r.status != 0 {
			t.Fatalf("round %d: CPU_PREP answered %+v, want 0", i, r)
		}
		// The fence passed: the buffer is idle.
		_, st := g.do(t, pvdrm.Request{Op: pvdrm.OpCPUPrep, File: s.file, Args: map[string]uint64{"handle": uint64(s.sem)}})
		expect(t, "CPU_PREP without waiting after the wait", st, 0)
	}
	checkPasses(t, g, rounds*maxChecksPerWait)
	g.honestRun(t)
}

// A fault of the awaited work ends the wait with EIO, without the periodic
// fault check: the fault ends the submission, which wakes the waiter.
func TestPVDRMCPUPrepFaultDuringWait(t *testing.T) {
	agg, _ := newTestAggregator(t, 1)
	g := startBlockingPVDRM(t, agg, "vm")
	s := newSemWait(t, g)
	_, dstVA := g.gemNew(t, s.file, nvc0.PageSize, pvdrm.DomainVRAM, 0)
	const unmapped = 1 << 38 // nothing of the file's address space is there
	s.submit(t, 1, nvc0.Incr(nouveau.SubcCopy, nvc0.MthdSetObject, 1), nvc0.ClassFermiCopy,
		nvc0.Incr(nouveau.SubcCopy, nvc0.CopyMthdSrcAddrHi, 8),
		uint32(unmapped>>32), uint32(unmapped&0xFFFFFFFF), uint32(dstVA>>32), uint32(dstVA),
		nvc0.PageSize, nvc0.PageSize, nvc0.PageSize, 1,
		nvc0.Immd(nouveau.SubcCopy, nvc0.CopyMthdExec, nvc0.CopyExecLinear))
	s.busy(t)
	prep := s.prep(10 * time.Second)
	waiting(t, g, 1, prep)
	s.release(1)
	r := answer(t, prep)
	if r.err != nil {
		t.Fatalf("CPU_PREP: %v", r.err)
	}
	expect(t, "CPU_PREP on work that faulted", r.status, -pvdrm.EIO)
	checkPasses(t, g, maxChecksPerWait)
}

// Freeing the channel during the wait answers the wait: nothing of the
// channel runs any more.
func TestPVDRMCPUPrepChannelFreedDuringWait(t *testing.T) {
	agg, _ := newTestAggregator(t, 1)
	g := startBlockingPVDRM(t, agg, "vm")
	s := newSemWait(t, g)
	s.submit(t, 1)
	prep := s.prep(10 * time.Second)
	waiting(t, g, 1, prep)
	_, st := g.do(t, pvdrm.Request{Op: pvdrm.OpChannelFree, File: s.file, Args: map[string]uint64{"channel": s.ch}})
	expect(t, "CHANNEL_FREE under a wait", st, 0)
	if r := answer(t, prep); r.err != nil || r.status != 0 {
		t.Errorf("CPU_PREP answered %+v, want 0", r)
	}
	checkPasses(t, g, maxChecksPerWait)
	g.honestRun(t)
}

// The back end stopping (its front end gone) ends the waiter at once: Serve
// returns with no waiter left, and the request is not answered.
func TestPVDRMCPUPrepBackEndStopsDuringWait(t *testing.T) {
	agg, _ := newTestAggregator(t, 1)
	g := startBlockingPVDRM(t, agg, "vm")
	s := newSemWait(t, g)
	s.submit(t, 1)
	prep := s.prep(10 * time.Second) // the longest wait a front end gets
	waiting(t, g, 1, prep)
	g.halt() // returns once b.waiters drained
	g.c.Close()
	if r := answer(t, prep); r.err == nil {
		t.Errorf("CPU_PREP answered %+v by a back end that stopped", r)
	}
	checkPasses(t, g, maxChecksPerWait)
}

// The vGPU destroyed through the control API during the wait: Serve returns
// and no waiter is left.
func TestPVDRMCPUPrepDestroyedDuringWait(t *testing.T) {
	agg, _ := newTestAggregator(t, 1)
	g := startBlockingPVDRM(t, agg, "vm")
	s := newSemWait(t, g)
	s.submit(t, 1)
	prep := s.prep(10 * time.Second)
	waiting(t, g, 1, prep)
	if err := agg.Destroy(g.b.VGPU(), "test"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-g.served: // Serve returns once b.waiters drained
		if !errors.Is(err, ErrDetached) {
			t.Errorf("Serve ended with %v, want ErrDetached", err)
		}
		g.served <- err // for the cleanup
	case <-time.After(time.Minute):
		t.Fatal("the back end of a destroyed vGPU still serves")
	}
	g.c.Close()
	r := answer(t, prep)
	t.Logf("CPU_PREP on the destroyed vGPU: %+v", r)
	if r.err == nil && r.status != -pvdrm.EIO {
		t.Errorf("CPU_PREP answered %+v on a destroyed vGPU, want EIO or no answer", r)
	}
	checkPasses(t, g, maxChecksPerWait)
}

// A wait past its timeout is answered ETIMEDOUT, woken by its deadline.
func TestPVDRMCPUPrepDeadline(t *testing.T) {
	agg, _ := newTestAggregator(t, 1)
	g := startBlockingPVDRM(t, agg, "vm")
	s := newSemWait(t, g)
	s.submit(t, 1)
	r := answer(t, s.prep(holdFor))
	if r.err != nil {
		t.Fatalf("CPU_PREP: %v", r.err)
	}
	expect(t, "CPU_PREP past its timeout", r.status, -pvdrm.ETIMEDOUT)
	checkPasses(t, g, maxChecksPerWait)
	s.release(1) // the work completes; the buffer goes idle
	r = answer(t, s.prep(10*time.Second))
	if r.err != nil || r.status != 0 {
		t.Errorf("CPU_PREP after the release answered %+v, want 0", r)
	}
}
