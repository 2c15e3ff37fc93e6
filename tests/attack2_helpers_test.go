package tests

// Helpers for the watchdog, doorbell, log-flood and identity attacks: a busy
// honest VM, loop kernels and semaphores in the attacker's RAM, what a guest
// can learn about its own channel, a log handler that counts, and heap
// measurements of this process (the aggregator runs in it).

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/gpu/hostmem"
	"github.com/gpuvm/gpuvm/gpu/kernels"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
)

// busyHonestArgs is a longer honest job (madd and copies, verified) for
// attacks that must overlap the honest VM's work: runs measured runs of each.
func busyHonestArgs(runs int) []string {
	return []string{"--workloads", "madd,cpy", "--runs", strconv.Itoa(runs), "--matrix-dim", "64", "--copy-size", "1MiB"}
}

// startBusyHonest starts the honest VM (domid 7) with busyHonestArgs and
// waits until it is submitting work (its doorbells reach the aggregator).
func (e *env) startBusyHonest(t *testing.T, runs int) (*proc, *aggregator.VGPU) {
	t.Helper()
	p := e.startVM(t, "honest", 7, bystanderMode(), busyHonestArgs(runs))
	v := e.waitAttached(t, "honest", p)
	// A hang guard, not a performance bound: CI runs this package beside
	// others that start VM processes of their own on 2 CPUs.
	if !pollUntil(time.Minute, func() bool { return p.exited() || v.Counters().Doorbells >= 8 }) || p.exited() {
		t.Fatalf("the honest VM never got going (exited %v)\nstderr:\n%s", p.exited(), p.stderr())
	}
	return p, v
}

// pgraphBusy reads the board's PGRAPH status (non-zero while a kernel holds
// the compute engine).
func (e *env) pgraphBusy() bool { return e.board.Read32(nvc0.BAR0, nvc0.RegPGRAPHStatus) != 0 }

// waitKernelRunning waits until the compute engine has been busy without a
// break for hold: a kernel that long is the hog's (the honest VM's 64×64
// madd takes microseconds).
func (e *env) waitKernelRunning(within, hold time.Duration) bool {
	var since time.Time
	return pollUntil(within, func() bool {
		if !e.pgraphBusy() {
			since = time.Time{}
			return false
		}
		if since.IsZero() {
			since = time.Now()
		}
		return time.Since(since) >= hold
	})
}

// ---------------------------------------------------------------------------
// Kernels and semaphores in the attacker's RAM.

// kernelPage is one page of the attacker's RAM, mapped in its address
// space, holding the loop kernel's code object, parameter slots, push
// buffers the attacker places by hand, semaphore words and results.
type kernelPage struct {
	buf hostmem.Buffer
	va  uint64
}

const (
	kpCode   = 0x000 // code object (nvc0.KernelObjectSize bytes)
	kpParams = 0x100 // parameter slots of 16 bytes: [iterations, result]
	kpPush   = 0x400 // push buffers of up to 64 words each
	kpSem    = 0xC00 // semaphore words
	kpResult = 0xE00 // 8-byte results
)

func newKernelPage(t *testing.T, a *attacker) *kernelPage {
	t.Helper()
	buf, va := a.hostPage(t)
	clear(buf.Bytes)
	binary.LittleEndian.PutUint32(buf.Bytes[kpCode:], nvc0.KernelMagic)
	binary.LittleEndian.PutUint32(buf.Bytes[kpCode+4:], uint32(nvc0.KernelLoop))
	binary.LittleEndian.PutUint32(buf.Bytes[kpCode+8:], nvc0.KernelVersion)
	return &kernelPage{buf: buf, va: va}
}

// loopLaunch returns the push-buffer words that launch the loop kernel for
// iters iterations with parameter slot slot, storing its final value at the
// GPU virtual address result (0: nowhere).
func (k *kernelPage) loopLaunch(slot int, iters, result uint64) []uint32 {
	off := kpParams + 16*slot
	binary.LittleEndian.PutUint64(k.buf.Bytes[off:], iters)
	binary.LittleEndian.PutUint64(k.buf.Bytes[off+8:], result)
	cb := k.va + uint64(off)
	return []uint32{
		nvc0.Incr(nouveau.SubcCompute, nvc0.ComputeMthdCodeAddrHi, 2), uint32(k.va >> 32), uint32(k.va + kpCode),
		nvc0.Incr(nouveau.SubcCompute, nvc0.ComputeMthdCBSize, 3), 16, uint32(cb >> 32), uint32(cb),
		nvc0.Incr(nouveau.SubcCompute, nvc0.ComputeMthdStartID, 1), 0,
		nvc0.Immd(nouveau.SubcCompute, nvc0.ComputeMthdLaunch, 0),
	}
}

// resultVA is the GPU virtual address of result word i.
func (k *kernelPage) resultVA(i int) uint64 { return k.va + kpResult + 8*uint64(i) }

func (k *kernelPage) result(i int) uint64 {
	return atomic.LoadUint64((*uint64)(unsafe.Pointer(&k.buf.Bytes[kpResult+8*i])))
}

// acquire returns the words of a semaphore acquire that blocks until
// semaphore word i equals want.
func (k *kernelPage) acquire(i int, want uint32) []uint32 {
	va := k.va + kpSem + 4*uint64(i)
	return []uint32{nvc0.Incr(0, nvc0.MthdSemaphoreAddrHi, 4), uint32(va >> 32), uint32(va), want, nvc0.SemaphoreAcquireEqual}
}

// setSem stores v in semaphore word i (the GPU polls it concurrently).
func (k *kernelPage) setSem(i int, v uint32) {
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&k.buf.Bytes[kpSem+4*i])), v)
}

// push places words as push buffer i and returns its GPFIFO entry.
func (k *kernelPage) push(i int, words []uint32) (w0, w1 uint32) {
	off := kpPush + 256*i
	if len(words) > 64 || off+4*len(words) > kpSem {
		panic("kernelPage.push: push buffer too long")
	}
	for j, w := range words {
		binary.LittleEndian.PutUint32(k.buf.Bytes[off+4*j:], w)
	}
	return nvc0.GPFIFOEncode(k.va+uint64(off), uint32(len(words)))
}

// controlKernel proves the kernel machinery works: a short loop kernel on
// the attacker's channel completes and stores the reference value.
func (k *kernelPage) controlKernel(t *testing.T, a *attacker) {
	t.Helper()
	const iters = 1 << 12
	if err := a.ch.Submit(k.loopLaunch(0, iters, k.resultVA(0))); err != nil {
		t.Fatalf("control kernel: submit: %v", err)
	}
	if err := a.ch.Finish(); err != nil {
		t.Fatalf("control kernel: %v", err)
	}
	if got, want := k.result(0), kernels.LoopValue(iters); got != want {
		t.Fatalf("control kernel stored %#x, want %#x: the kernel harness is broken", got, want)
	}
}

// ---------------------------------------------------------------------------
// What a guest can learn about its own channel, by reading its own registers
// and VRAM (no aggregator internals).

// guestChan describes the attacker's current channel as the guest sees it.
type guestChan struct {
	id      int
	ramin   uint64 // guest VRAM address of its RAMIN
	user    uint64 // guest VRAM address of its user area (RAMIN +0x08)
	ringVA  uint64 // GPFIFO ring
	entries uint32
	poll    uint64 // BAR1 offset of the channel's page in the poll area
	// pollBase is the BAR1 offset of the guest's poll area.
	pollBase uint64
}

func (a *attacker) inspectChannel(t *testing.T) guestChan {
	t.Helper()
	defer a.r.restoreWindow(a.r.saveWindow()) // the driver caches its PRAMIN window
	id := a.ch.ID()
	inst := a.r.rd(nvc0.ChanInst(id))
	if inst&nvc0.ChanInstValid == 0 {
		t.Fatalf("channel %d instance reads %#x", id, inst)
	}
	g := guestChan{id: id, ramin: nvc0.InstDecode(inst)}
	g.user = uint64(a.r.vramRead32(g.ramin+nvc0.RAMINUserHi))<<32 | uint64(a.r.vramRead32(g.ramin+nvc0.RAMINUserLo))
	g.ringVA, g.entries = nvc0.GPFIFODecode(a.r.vramRead32(g.ramin+nvc0.RAMINGPFIFOLo), a.r.vramRead32(g.ramin+nvc0.RAMINGPFIFOHi))
	poll := a.r.rd(nvc0.RegPollArea)
	if poll&nvc0.PollAreaEnable == 0 {
		t.Fatalf("the guest's poll area is off (%#x)", poll)
	}
	g.pollBase = uint64(poll&nvc0.PollAreaMask) << nvc0.PageShift
	g.poll = g.pollBase + uint64(id)*nvc0.UserAreaSize
	return g
}

// put is the channel's GP_PUT as the guest reads it through its poll area.
func (a *attacker) put(g guestChan) uint32 {
	return a.dev.Read32(nvc0.BAR1, g.poll+nvc0.UserGPPut)
}

// ring writes GP_PUT through the poll area: the legitimate doorbell.
func (a *attacker) ring(g guestChan, put uint32) {
	a.dev.Write32(nvc0.BAR1, g.poll+nvc0.UserGPPut, put)
}

// ramOffset walks the attacker's own page tables (read through PRAMIN) and
// returns where GPU virtual address va lies in its RAM.
func (a *attacker) ramOffset(t *testing.T, va uint64) uint64 {
	t.Helper()
	defer a.r.restoreWindow(a.r.saveWindow())
	pd := a.vm.PageDir()
	i := nvc0.PDEIndex(va)
	pde := nvc0.DecodePDE(a.r.vramRead32(pd+i*nvc0.PDESize), a.r.vramRead32(pd+i*nvc0.PDESize+4))
	if !pde.SmallPresent || pde.SmallSys || pde.Size != 0 {
		t.Fatalf("VA %#x: PDE %d is %+v", va, i, pde)
	}
	j := nvc0.SmallPTEIndex(va)
	pte := nvc0.DecodePTE(a.r.vramRead32(pde.SmallAddr+j*nvc0.PTESize), a.r.vramRead32(pde.SmallAddr+j*nvc0.PTESize+4))
	if !pte.Present || !pte.IsSystem() {
		t.Fatalf("VA %#x: PTE %+v does not map system memory", va, pte)
	}
	off := pte.Addr - a.dev.RAM().BusBase() + va%pageSize
	if off+nvc0.GPFIFOEntrySize > a.dev.RAM().Size() {
		t.Fatalf("VA %#x maps %#x, outside the guest's RAM", va, pte.Addr)
	}
	return off
}

// writeGPFIFO writes a GPFIFO entry into slot i of the channel's ring (in
// the attacker's RAM) by hand, without ringing anything.
func (a *attacker) writeGPFIFO(t *testing.T, g guestChan, i uint32, w0, w1 uint32) {
	t.Helper()
	off := a.ramOffset(t, g.ringVA+uint64(i%g.entries)*nvc0.GPFIFOEntrySize)
	ram := a.dev.RAM().Bytes()
	binary.LittleEndian.PutUint32(ram[off:], w0)
	binary.LittleEndian.PutUint32(ram[off+4:], w1)
}

// chanCtl is the channel's control word as the guest reads it.
func (a *attacker) chanCtl(g guestChan) uint32 { return a.r.rd(nvc0.ChanCtl(g.id)) }

// ---------------------------------------------------------------------------
// Log volume.

// logCounter counts what the aggregator logs: records, lines and bytes of
// their text form. It keeps the first few lines to show in failures.
type logCounter struct {
	records, lines, bytes atomic.Int64

	mu      sync.Mutex
	samples []string
}

type logSnapshot struct{ records, lines, bytes int64 }

func (c *logCounter) snapshot() logSnapshot {
	return logSnapshot{c.records.Load(), c.lines.Load(), c.bytes.Load()}
}

func (s logSnapshot) sub(o logSnapshot) logSnapshot {
	return logSnapshot{s.records - o.records, s.lines - o.lines, s.bytes - o.bytes}
}

func (s logSnapshot) String() string {
	return fmt.Sprintf("%d records, %d lines, %d bytes", s.records, s.lines, s.bytes)
}

// Write counts the text handler's output (one call per record).
func (c *logCounter) Write(p []byte) (int, error) {
	c.bytes.Add(int64(len(p)))
	n := int64(0)
	for _, b := range p {
		if b == '\n' {
			n++
		}
	}
	c.lines.Add(n)
	c.mu.Lock()
	if len(c.samples) < 8 {
		s := string(p)
		if len(s) > 300 {
			s = s[:300] + fmt.Sprintf("… (%d bytes)", len(p))
		}
		c.samples = append(c.samples, s)
	}
	c.mu.Unlock()
	return len(p), nil
}

func (c *logCounter) sampleText() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := ""
	for _, s := range c.samples {
		out += "  " + s
	}
	return out
}

// countingHandler is a slog handler at level Info (the aggregator's default)
// that formats records as text into a logCounter.
type countingHandler struct {
	slog.Handler
	c *logCounter
}

func (h countingHandler) Handle(ctx context.Context, r slog.Record) error {
	h.c.records.Add(1)
	return h.Handler.Handle(ctx, r)
}

func (h countingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return countingHandler{h.Handler.WithAttrs(as), h.c}
}

func (h countingHandler) WithGroup(name string) slog.Handler {
	return countingHandler{h.Handler.WithGroup(name), h.c}
}

// newCountingLogger returns a logger at level Info that counts into c (and
// also writes to w, if not nil).
func newCountingLogger(c *logCounter, w io.Writer) *slog.Logger {
	var out io.Writer = c
	if w != nil {
		out = io.MultiWriter(c, w)
	}
	return slog.New(countingHandler{slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelInfo}), c})
}

// ---------------------------------------------------------------------------
// Memory of this process (the aggregator's).

// heapInUse collects garbage and returns the bytes of live heap spans.
func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

func inMiB(b uint64) float64 { return float64(b) / (1 << 20) }
