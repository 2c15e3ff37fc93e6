package tests

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// overcommitEnv is a board at 2× overcommit that evicts quickly (tests want
// turns, not waits).
func overcommitEnv(t *testing.T) *env {
	t.Helper()
	return newEnvWith(t, envOptions{Modify: func(o *aggregator.Options) {
		o.Overcommit, o.EvictIdle, o.MinResidency = 2, time.Millisecond, 20*time.Millisecond
	}})
}

// evictNow parks v, failing the test on error.
func evictNow(t *testing.T, e *env, v *aggregator.VGPU) aggregator.EvictStats {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := e.agg.Evict(ctx, v, "test")
	if err != nil {
		t.Fatalf("evict vGPU %d: %v", v.ID, err)
	}
	return st
}

// TestEvictHostileVM: a VM that floods its doorbell and rewrites its page
// tables (entries naming memory outside its slice, then its own again,
// TLB flushes) is evicted again and again while it does, and each time
// its flood's next trapped access brings it back. Nothing it maps reaches
// another slot (a canary in the free slot; the busy honest VM verifies); it
// comes back to the slot it left, which holds nothing while it is parked;
// its own VRAM comes back with it through every eviction.
func TestEvictHostileVM(t *testing.T) {
	e := overcommitEnv(t)
	honest, _ := e.startBusyHonest(t, 4) // slot 0
	canary := e.plant(t, "free slot", e.layout.Slots[maxVMs-1].VRAM.Base+vramPerVM/2, 0x5E)

	h := newAttacker(t, e, "hostile", 67, "fv-optimized")
	h.controlCopies(t)
	want := bytes.Clone(h.src.Bytes)
	g := h.inspectChannel(t)
	put := h.put(g)
	hv := e.vgpu("hostile")
	outside := []uint64{vramPerVM, canary.phys &^ (pageSize - 1), (canary.phys - e.layout.Slots[0].VRAM.Base) &^ (pageSize - 1)}
	va := h.mapVRAM(t, h.own)

	f := startFlood(h, g, put, va, outside)
	var copied uint64
	for i := range 4 {
		if !f.progress(t) {
			t.Fatalf("eviction %d: the flood stalled", i)
		}
		st := evictNow(t, e, hv)
		copied += st.Bytes
		t.Logf("eviction %d: slot %d, %d KiB out, paused %v", i, st.Slot, st.Bytes>>10, st.Took.Round(time.Microsecond))
		if st.Slot != 1 {
			t.Fatalf("eviction %d: the vGPU was in slot %d, not the slot it came back to (1)", i, st.Slot)
		}
	}
	f.stop()
	// Parked with nothing to bring it back: the slot it left holds nothing.
	st := evictNow(t, e, hv)
	if pages := e.residentPages(t, st.Slot); len(pages) > 0 {
		t.Fatalf("slot %d holds %d pages while its vGPU is parked (first %#x)", st.Slot, len(pages), pages[0])
	}
	t.Logf("%d doorbells and %d page-table rewrites across the evictions", f.rung.Load(), f.remapped.Load())
	if f.remapped.Load() == 0 || copied == 0 {
		t.Fatalf("the attack did not run (%d rewrites) or nothing was copied (%d bytes)", f.remapped.Load(), copied)
	}
	c := hv.Counters()
	if c.Evictions != 5 || c.Restores < 4 {
		t.Fatalf("evictions %d, restores %d: want 5 and at least 4", c.Evictions, c.Restores)
	}
	fillSink(h)
	if err := h.gpuCopy(h.sinkVA, h.ownVA); err != nil {
		t.Fatalf("copy from its own VRAM after the evictions: %v (device: %v)", err, h.dev.Err())
	}
	if !bytes.Equal(h.sink.Bytes, want) {
		t.Fatal("its own VRAM did not come back with it")
	}
	for _, o := range outside {
		evil := h.mapVRAM(t, o)
		expectFault(t, h.gpuCopy(evil, h.srcVA), "a copy through an entry outside its slice, after its evictions")
		h.newChannel(t)
	}
	honest.verified(t)
	e.checkCanary(t, canary)
}

// TestOvercommitTakingTurns: two VM processes in a BAR-remap mode share a
// board of one slot at 2× overcommit, both looping verified madd and cpy.
// They take turns in the slot — each restore evicts the other — and every
// result verifies; a restored vGPU's device model is handed its slice again
// (pages are passed through after a restore, not trapped for good).
func TestOvercommitTakingTurns(t *testing.T) {
	e := newEnvWith(t, envOptions{Modify: func(o *aggregator.Options) {
		o.MaxVMs, o.Overcommit, o.EvictIdle, o.MinResidency = 1, 2, time.Millisecond, 20*time.Millisecond
	}})
	runs := "6"
	if testing.Short() {
		runs = "3"
	}
	job := []string{"--workloads", "madd,cpy", "--runs", runs, "--matrix-dim", "64", "--copy-size", "1MiB"}
	pa := e.startVM(t, "turn-a", 21, "fv-optimized", job)
	va := e.waitAttached(t, "turn-a", pa)
	pb := e.startVM(t, "turn-b", 22, "fv-optimized", job)
	vb := e.waitAttached(t, "turn-b", pb)
	// A restored vGPU passes its aperture through again (the wait is a
	// hang guard only).
	passed := false
	pollUntil(2*time.Minute, func() bool {
		for _, v := range []*aggregator.VGPU{va, vb} {
			if c := v.Counters(); c.Restores > 0 && c.RemappedPages > 0 && !v.Evicted() {
				passed = true
			}
		}
		return passed || (pa.exited() && pb.exited())
	})
	ca, cb := va.Counters(), vb.Counters()
	pa.verified(t)
	pb.verified(t)
	t.Logf("turn-a: %d evictions, %d restores, waited %v; turn-b: %d evictions, %d restores, waited %v",
		ca.Evictions, ca.Restores, time.Duration(ca.RestoreWaitNs), cb.Evictions, cb.Restores, time.Duration(cb.RestoreWaitNs))
	if ca.Evictions+cb.Evictions == 0 {
		t.Fatal("two VMs shared one slot without an eviction")
	}
	if !passed {
		t.Fatal("no restored vGPU had its aperture passed through again")
	}
}

// boardHolds reports whether any page of the board in use (every slot and
// the aggregator's reserve) holds a 64-byte chunk of secret.
func (e *env) boardHolds(t *testing.T, secret []byte) bool {
	t.Helper()
	regions := []aggregator.Region{e.layout.Reserved}
	for _, s := range e.layout.Slots {
		regions = append(regions, s.VRAM)
	}
	for _, r := range regions {
		rs, err := e.board.VRAMResidentRanges(r.Base, r.Size)
		if err != nil {
			t.Fatal(err)
		}
		for _, rg := range rs {
			if containsChunk(e.readVRAM(t, rg.Base, rg.Size), secret) {
				return true
			}
		}
	}
	return false
}

// TestEvictedImageUnreadable: a VM's VRAM, once it is parked, is nowhere
// on the board — not in the slot it left, not in the reserve, not in any
// other slot — and the next tenant of that slot reads zeros where it was;
// the VM's next access brings it all back to it alone. A VM whose kernel
// never ends cannot be evicted (the eviction waits for work in flight and
// gives up, changing nothing) until the watchdog has stopped it. The honest
// VM verifies throughout.
func TestEvictedImageUnreadable(t *testing.T) {
	e := newEnvWith(t, envOptions{Watchdog: 2 * time.Second, Modify: func(o *aggregator.Options) {
		o.Overcommit, o.EvictIdle, o.MinResidency = 2, time.Millisecond, 20*time.Millisecond
	}})
	honest, _ := e.startBusyHonest(t, 4) // slot 0
	secretDev := e.connect(t, "secret", 81, "fv-optimized")
	sv := e.vgpu("secret")
	const at = 3 << 20 // a page of the secret VM's VRAM
	secret := pattern(0xA7, pageSize)
	words := make([]uint32, pageSize/4)
	for i := range words {
		words[i] = le32(secret[4*i:])
	}
	r := raw{secretDev}
	r.vramWrite(at, words)
	r.sync()
	home := sv.Info().Slot
	if !e.boardHolds(t, secret) {
		t.Fatal("the secret never reached the board")
	}
	evictNow(t, e, sv)
	if !sv.Evicted() {
		t.Fatal("not parked")
	}
	if e.boardHolds(t, secret) {
		t.Fatal("a page of the board holds the parked VM's VRAM")
	}
	// The next tenant lands in the slot it left and reads zeros there.
	prober := e.connect(t, "prober", 82, "fv-naive")
	if got := e.vgpu("prober").Info().Slot; got != home {
		t.Fatalf("the prober landed in slot %d, not the vacated slot %d", got, home)
	}
	pr := raw{prober}
	for off := uint64(0); off < pageSize; off += 4 {
		if w := pr.vramRead32(at + off); w != 0 {
			t.Fatalf("the next tenant reads %#x at %#x, where the parked VM's secret was", w, at+off)
		}
	}
	// Its next access brings the secret back, to it.
	for i := range words {
		if w := r.vramRead32(at + uint64(4*i)); w != words[i] {
			t.Fatalf("after its restore the secret VM reads %#x at word %d, want %#x", w, i, words[i])
		}
	}
	if sv.Evicted() || sv.Info().Slot == home {
		t.Fatalf("restored: evicted %v, slot %d (its old slot %d is the prober's)", sv.Evicted(), sv.Info().Slot, home)
	}

	// A VM whose kernel never ends is not evicted.
	hog := newAttacker(t, e, "hog", 83, "fv-naive")
	k := newKernelPage(t, hog)
	k.controlKernel(t, hog)
	if err := hog.ch.Submit(k.loopLaunch(1, nvc0.MaxKernelLoopIterations, 0)); err != nil {
		t.Fatalf("hog kernel: %v", err)
	}
	if !e.waitKernelRunning(10*time.Second, 20*time.Millisecond) {
		t.Logf("the compute engine never stayed busy for 20 ms after the hog's launch")
	}
	hv := e.vgpu("hog")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err := e.agg.Evict(ctx, hv, "test: a kernel that never ends")
	cancel()
	if err == nil || hv.Evicted() {
		t.Fatalf("a vGPU whose kernel never ends was evicted (err %v)", err)
	}
	t.Logf("eviction of the hog: %v", err)
	if c := hv.Counters(); c.Evictions != 0 {
		t.Fatalf("the hog counts %d evictions", c.Evictions)
	}
	// Once the watchdog stopped its kernel it can be parked like any other.
	if !pollUntil(time.Minute, func() bool { return e.agg.WatchdogKills(hv.ID) > 0 }) {
		t.Fatal("the watchdog never stopped the hog's kernel")
	}
	evictNow(t, e, hv)
	honest.verified(t)
}
