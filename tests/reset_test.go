package tests

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/gpu/hostmem"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
)

// Resetting one vGPU without restarting its guest (issue 17, item 5): a
// reset while its channels run leaves nothing running and nothing
// readable of the old state; the honest VM beside it verifies and its
// markers are never read or changed; the reset VM's guest re-initialises
// and verifies its work.

// stuckWork is work that runs until its channel is stopped: a semaphore
// acquire nobody releases, and a fenced semaphore release behind it.
type stuckWork struct {
	ch  *nouveau.Channel
	seq uint32
	sem hostmem.Buffer
}

// stick submits stuck work on a new channel of the attacker's VM and, with
// wait, waits until the GPU runs it (the channel's PENDING, from the
// board). The GPU runs one submission at a time: stuck work behind other
// stuck work stays queued.
func stick(t *testing.T, a *attacker, wait bool) stuckWork {
	t.Helper()
	ch, err := a.drv.NewChannel(a.vm)
	if err != nil {
		t.Fatalf("%s: channel: %v", a.name, err)
	}
	sem, va := a.hostPage(t)
	if !wait {
		if err := ch.Submit(a1SemAcquire(va, 1)); err != nil {
			t.Fatal(err)
		}
		seq, err := ch.SubmitFenced(a1SemRelease(va+16, 7))
		if err != nil {
			t.Fatal(err)
		}
		return stuckWork{ch: ch, seq: seq, sem: sem}
	}
	if err := ch.Finish(); err != nil {
		t.Fatal(err)
	}
	if err := ch.Submit(a1SemAcquire(va, 1)); err != nil {
		t.Fatal(err)
	}
	seq, err := ch.SubmitFenced(a1SemRelease(va+16, 7))
	if err != nil {
		t.Fatal(err)
	}
	if !pollUntil(time.Minute, func() bool { return a.r.rd(nvc0.ChanCtl(ch.ID()))&nvc0.ChanCtlPending != 0 }) { // a hang guard
		t.Fatalf("%s: the stuck work never reached the GPU", a.name)
	}
	return stuckWork{ch: ch, seq: seq, sem: sem}
}

// resetVGPU resets the named guest's vGPU through the control API and
// returns the HTTP status.
func resetVGPU(t *testing.T, srv *httptest.Server, id int) int {
	t.Helper()
	resp, err := http.Post(fmt.Sprintf("%s/v1/vgpus/%d/reset", srv.URL, id), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]string
	_ = json.NewDecoder(resp.Body).Decode(&body)
	if resp.StatusCode != http.StatusOK {
		t.Logf("reset of vGPU %d: %s %v", id, resp.Status, body)
	}
	return resp.StatusCode
}

// slotQuietAndZero checks on the physical board that no channel of the
// slot is enabled, has an instance or is loaded on an engine, and that the
// whole slot reads zero. (A stopped channel may still read PENDING: the
// entries it did not finish, which nothing runs.)
func slotQuietAndZero(t *testing.T, e *env, slot aggregator.Slot) {
	t.Helper()
	full := e.layout.Slots[slot.Index]
	for i := range full.Chans {
		p := full.ChanBase + i
		inst := e.board.Read32(nvc0.BAR0, uint64(nvc0.ChanInst(p)))
		ctl := e.board.Read32(nvc0.BAR0, uint64(nvc0.ChanCtl(p)))
		if inst != 0 || ctl&nvc0.ChanCtlEnable != 0 {
			t.Errorf("physical channel %d of the reset vGPU: instance %#x control %#x", p, inst, ctl)
		}
	}
	for _, eng := range []int{nvc0.EngineGR, nvc0.EngineCE0, nvc0.EngineCE1} {
		st := e.board.Read32(nvc0.BAR0, uint64(nvc0.RegEngineStatus(eng)))
		if p := int(st & nvc0.EngineStatusChanMask); st&nvc0.EngineStatusBusy != 0 && p >= full.ChanBase && p < full.ChanBase+full.Chans {
			t.Errorf("engine %d still runs physical channel %d of the reset vGPU", eng, p)
		}
	}
	if zero, at := allZero(t, e, full.VRAM.Base, full.VRAM.Size); !zero {
		t.Errorf("the reset vGPU's slot is not scrubbed: VRAM %#x is non-zero", at)
	}
}

// reinit re-initialises the attacker's driver after a reset and gives it
// a fresh VM, channel, RAM pages and VRAM page (the old ones are orphaned).
func (a *attacker) reinit(t *testing.T) {
	t.Helper()
	if err := a.drv.Reset(); err != nil {
		t.Fatalf("%s: driver re-init: %v (device: %v)", a.name, err, a.dev.Err())
	}
	var err error
	if a.vm, err = a.drv.NewVM(); err != nil {
		t.Fatal(err)
	}
	a.ch = nil
	a.newChannel(t)
	a.sink, a.sinkVA = a.hostPage(t)
	a.src, a.srcVA = a.hostPage(t)
	copy(a.src.Bytes, pattern(0xA5, pageSize))
}

// verifiedWorkloads runs madd and cpy on the attacker's driver: both must
// verify.
func (a *attacker) verifiedWorkloads(t *testing.T) {
	t.Helper()
	for _, name := range []string{"madd", "cpy"} {
		w, err := workloads.New(name, workloads.Params{MatrixDim: 32, CopyBytes: 1 << 20, LoopIterations: 1000, RodiniaScale: 16})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Run(gdev.Nouveau(a.drv)); err != nil {
			t.Errorf("%s: %s after the reset: %v", a.name, name, err)
		}
	}
}

// TestResetWhileChannelsRun: a VM whose two channels run work that never
// ends is reset by the operator. No channel of it runs on the board, its
// slot is zero, and what it held is unreadable through PRAMIN, BAR1, BAR3
// and a DMA copy; its waits on the old work fail with ErrDeviceReset; the
// old work never completes even once its semaphore is released; its guest
// re-initialises and verifies madd and cpy. The honest VM beside it
// verifies and its markers are never read or changed.
func TestResetWhileChannelsRun(t *testing.T) {
	e := newEnv(t)
	honest, hv := e.startHonest(t)
	a := newAttacker(t, e, "resetme", 30, "fv-optimized")
	canaries := a1PlantCanaries(t, e, hv.Slot)
	a.controlCopies(t) // its own VRAM page holds the source pattern now
	secret := pattern(0xA5, pageSize)
	bar1, err := a.drv.MapBAR1(a.own, pageSize)
	if err != nil {
		t.Fatal(err)
	}
	if got := a.dev.Read32(nvc0.BAR1, bar1); got != le32(secret) {
		t.Fatalf("BAR1 reads %#x of the secret page, want %#x: the checks below would prove nothing", got, le32(secret))
	}
	const bar3 = 0                                              // the BAR3 aperture's first page: the driver's own kernel objects
	works := []stuckWork{stick(t, a, true), stick(t, a, false)} // one runs, one waits for the GPU
	v := e.vgpu("resetme")
	srv := httptest.NewServer(e.agg.ControlHandler())
	defer srv.Close()

	if code := resetVGPU(t, srv, v.Slot.Index); code != http.StatusOK {
		t.Fatalf("reset through the control API: HTTP %d", code)
	}
	slotQuietAndZero(t, e, v.Slot)
	if got := v.Counters().Resets; got != 1 {
		t.Errorf("resets counter %d, want 1", got)
	}
	if e.vgpu("resetme") != v || v.Slot.Index != a.slot.Index {
		t.Errorf("the reset vGPU did not keep its slot")
	}
	// Through its own eyes, before it re-initialises: registers at their
	// power-on values, the old apertures and PRAMIN read zero.
	if got := a.r.rd(nvc0.RegPMCEnable); got != 0 {
		t.Errorf("PMC_ENABLE reads %#x after the reset, want its power-on 0", got)
	}
	for k := uint64(0); k < 4; k++ {
		if got := a.dev.Read32(nvc0.BAR1, bar1+4*k); got != 0 {
			t.Errorf("BAR1 reads %#x of the old secret after the reset", got)
		}
		if got := a.dev.Read32(nvc0.BAR3, bar3+4*k); got != 0 {
			t.Errorf("BAR3 reads %#x of the old kernel objects after the reset", got)
		}
		if got := a.r.vramRead32(a.own + 4*k); got != 0 {
			t.Errorf("PRAMIN reads %#x of the old secret after the reset", got)
		}
	}
	for _, w := range works {
		if err := w.ch.WaitFence(w.seq); !errors.Is(err, nouveau.ErrDeviceReset) {
			t.Errorf("a wait on work the reset ended: %v, want ErrDeviceReset", err)
		}
		if err := w.ch.Close(); err != nil {
			t.Errorf("close of a channel from before the reset: %v", err)
		}
		w.sem.Bytes[0] = 1 // a channel still running would now go on
	}
	a.reinit(t)
	// DMA: the copy engine moves the old secret's page to RAM. (The new
	// driver may have put an object of its own there since: not zero
	// then, but never the secret.)
	fillSink(a)
	ownVA := a.mapVRAM(t, a.own)
	if err := a.gpuCopy(a.sinkVA, ownVA); err != nil {
		t.Fatalf("copy of the old secret's page: %v", err)
	}
	if containsChunk(a.sink.Bytes, secret) {
		t.Errorf("a DMA copy reads the old secret after the reset")
	}
	if l := canaries.leaks(a.sink.Bytes); len(l) > 0 {
		t.Errorf("the reset VM read %v", l)
	}
	a.verifiedWorkloads(t)
	for _, w := range works {
		if got := w.sem.Bytes[16]; got != 0 {
			t.Errorf("work submitted before the reset ran after it (its release wrote %d)", got)
		}
	}
	honest.verified(t)
	canaries.check(t)
}

// TestResetByFLR: the guest resets its own vGPU by the function-level reset
// of its PCI Express capability while its channel runs: the config write
// returns once the vGPU is reset, nothing of it runs, its slot is zero, and
// its driver re-initialises and verifies its work. The honest VM verifies.
func TestResetByFLR(t *testing.T) {
	e := newEnv(t)
	honest, hv := e.startHonest(t)
	a := newAttacker(t, e, "flr", 31, "pv-multicall")
	canaries := a1PlantCanaries(t, e, hv.Slot)
	a.controlCopies(t)
	w := stick(t, a, true)
	v := e.vgpu("flr")
	if err := a.drv.FunctionReset(); err != nil {
		t.Fatalf("function-level reset: %v (device: %v)", err, a.dev.Err())
	}
	if got := v.Counters().Resets; got != 1 {
		t.Errorf("resets counter %d after the FLR, want 1", got)
	}
	slotQuietAndZero(t, e, v.Slot)
	if err := w.ch.WaitFence(w.seq); !errors.Is(err, nouveau.ErrDeviceReset) {
		t.Errorf("a wait on work the FLR ended: %v, want ErrDeviceReset", err)
	}
	w.sem.Bytes[0] = 1
	a.ch = nil
	var err error
	if a.vm, err = a.drv.NewVM(); err != nil { // FunctionReset re-initialised the driver
		t.Fatal(err)
	}
	a.newChannel(t)
	a.verifiedWorkloads(t)
	if got := w.sem.Bytes[16]; got != 0 {
		t.Errorf("work submitted before the FLR ran after it (its release wrote %d)", got)
	}
	honest.verified(t)
	canaries.check(t)
}

// TestResetRacesDoorbellFlood: the guest floods doorbells and channel
// enables while the operator resets its vGPU over and over. Every reset
// completes; after the last one nothing of it runs and its slot is zero;
// the guest re-initialises and verifies; the honest VM verifies.
func TestResetRacesDoorbellFlood(t *testing.T) {
	e := newEnv(t)
	honest, hv := e.startHonest(t)
	a := newAttacker(t, e, "flood", 32, "fv-optimized")
	canaries := a1PlantCanaries(t, e, hv.Slot)
	w := stick(t, a, true)
	v := e.vgpu("flood")
	srv := httptest.NewServer(e.agg.ControlHandler())
	defer srv.Close()
	g := a.inspectChannel(t)
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := uint32(0); !stop.Load(); i++ {
			a.ring(g, i%1000)
			a.r.wr(nvc0.ChanCtl(w.ch.ID()), nvc0.ChanCtlDefault)
		}
	}()
	for range 10 {
		if code := resetVGPU(t, srv, v.Slot.Index); code != http.StatusOK {
			t.Errorf("reset during a doorbell flood: HTTP %d", code)
		}
	}
	stop.Store(true)
	wg.Wait()
	if code := resetVGPU(t, srv, v.Slot.Index); code != http.StatusOK {
		t.Fatalf("last reset: HTTP %d", code)
	}
	slotQuietAndZero(t, e, v.Slot)
	if got := v.Counters().Resets; got != 11 {
		t.Errorf("resets counter %d, want 11", got)
	}
	_ = w.ch.Close()
	a.reinit(t)
	a.verifiedWorkloads(t)
	honest.verified(t)
	canaries.check(t)
}

// TestResetOfVGPUBeingDestroyed: a reset racing the vGPU's destruction
// either completes first or finds the vGPU gone; either way the vGPU ends
// destroyed, its slot free, in service and scrubbed, its guest told. The
// honest VM verifies.
func TestResetOfVGPUBeingDestroyed(t *testing.T) {
	e := newEnv(t)
	honest, hv := e.startHonest(t)
	canaries := a1PlantCanaries(t, e, hv.Slot)
	srv := httptest.NewServer(e.agg.ControlHandler())
	defer srv.Close()
	for round := range 3 {
		name := fmt.Sprintf("doomed%d", round)
		a := newAttacker(t, e, name, uint32(40+round), "fv-optimized")
		stick(t, a, true)
		v := e.vgpu(name)
		var code int
		var derr error
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); code = resetVGPU(t, srv, v.Slot.Index) }()
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(round) * time.Millisecond) // vary who goes first
			derr = e.agg.Destroy(v, "destroyed while being reset")
		}()
		wg.Wait()
		if code != http.StatusOK && code != http.StatusNotFound {
			t.Errorf("round %d: reset racing destroy: HTTP %d", round, code)
		}
		if derr != nil {
			t.Errorf("round %d: destroy racing reset: %v", round, derr)
		}
		if e.vgpu(name) != nil {
			t.Errorf("round %d: the destroyed vGPU is still attached", round)
		}
		if oos := e.agg.OutOfService(); len(oos) != 0 {
			t.Errorf("round %d: slots out of service: %v", round, oos)
		}
		if zero, at := allZero(t, e, e.layout.Slots[v.Slot.Index].VRAM.Base, e.layout.Slots[v.Slot.Index].VRAM.Size); !zero {
			t.Errorf("round %d: slot not scrubbed: VRAM %#x is non-zero", round, at)
		}
		if !pollUntil(10*time.Second, func() bool { return a.dev.Err() != nil }) {
			t.Errorf("round %d: the destroyed VM's device model was not told", round)
		}
	}
	honest.verified(t)
	canaries.check(t)
}
