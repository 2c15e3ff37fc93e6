package aggregator

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/gpu/hostmem"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
)

// stuckChannel gives the guest a channel whose GPFIFO starts with a
// semaphore acquire nobody releases, then a fenced entry behind it: work
// that runs (holds its channel on the board) until the channel is
// stopped. It returns the channel, the fence of the entry behind, and the
// semaphore page (writing 1 to it would release the wait).
func stuckChannel(t *testing.T, g *guestVM) (*nouveau.Channel, uint32, hostmem.Buffer) {
	t.Helper()
	vm, err := g.dev.NewVM()
	if err != nil {
		t.Fatal(err)
	}
	ch, err := g.dev.NewChannel(vm)
	if err != nil {
		t.Fatal(err)
	}
	sem, err := g.ram.Alloc(nvc0.PageSize)
	if err != nil {
		t.Fatal(err)
	}
	va, err := vm.AllocVA(nvc0.PageSize, nvc0.PageSize)
	if err != nil {
		t.Fatal(err)
	}
	if err := vm.MapHost(va, sem.Bus, nvc0.PageSize); err != nil {
		t.Fatal(err)
	}
	if err := ch.Finish(); err != nil { // the channel's set-up ran
		t.Fatal(err)
	}
	if err := ch.Submit([]uint32{nvc0.Incr(0, nvc0.MthdSemaphoreAddrHi, 4), uint32(va >> 32), uint32(va), 1, nvc0.SemaphoreAcquireEqual}); err != nil {
		t.Fatal(err)
	}
	seq, err := ch.SubmitFenced([]uint32{nvc0.Incr(0, nvc0.MthdSemaphoreAddrHi, 4), uint32(va >> 32), uint32(va + 16), 7, nvc0.SemaphoreRelease})
	if err != nil {
		t.Fatal(err)
	}
	return ch, seq, sem
}

// waitReleased waits until the dispatcher gave the guest's channel ch the
// GPU: its submission is in flight and the channel runs on the board.
func waitReleased(t *testing.T, agg *Aggregator, v *VGPU, ch int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute) // a hang guard
	for time.Now().Before(deadline) {
		agg.disp.mu.Lock()
		n := 0
		for _, s := range agg.disp.inflight {
			if s.v == v && s.ch == ch {
				n++
			}
		}
		agg.disp.mu.Unlock()
		if n > 0 {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("the stuck channel's work was never released to the GPU")
}

// slotQuiet checks, on the physical board, that no channel of v's slot is
// enabled, has an instance or is loaded on an engine, and that nothing of
// the VM is queued or in flight in the dispatcher.
func slotQuiet(t *testing.T, agg *Aggregator, board *sim.Board, v *VGPU) {
	t.Helper()
	full := agg.layout.Slots[v.Slot.Index]
	for i := range full.Chans {
		p := full.ChanBase + i
		inst := board.Read32(nvc0.BAR0, uint64(nvc0.ChanInst(p)))
		ctl := board.Read32(nvc0.BAR0, uint64(nvc0.ChanCtl(p)))
		if inst != 0 || ctl&nvc0.ChanCtlEnable != 0 {
			t.Errorf("physical channel %d of the reset vGPU: instance %#x control %#x", p, inst, ctl)
		}
	}
	for _, e := range []int{nvc0.EngineGR, nvc0.EngineCE0, nvc0.EngineCE1} {
		st := board.Read32(nvc0.BAR0, uint64(nvc0.RegEngineStatus(e)))
		p := int(st & nvc0.EngineStatusChanMask)
		if st&nvc0.EngineStatusBusy != 0 && p >= full.ChanBase && p < full.ChanBase+full.Chans {
			t.Errorf("engine %d still runs physical channel %d of the reset vGPU", e, p)
		}
	}
	agg.disp.mu.Lock()
	defer agg.disp.mu.Unlock()
	for _, s := range agg.disp.inflight {
		if s.v == v && !s.void {
			t.Errorf("a submission of channel %d of the reset vGPU is still in flight", s.ch)
		}
	}
	for _, s := range agg.disp.queues[v.ID] {
		if !s.void {
			t.Errorf("a submission of channel %d of the reset vGPU is still queued", s.ch)
		}
	}
}

// slotZero reports the first non-zero byte of v's whole slot, or -1.
func slotZero(t *testing.T, agg *Aggregator, board *sim.Board, v *VGPU) int64 {
	t.Helper()
	full := agg.layout.Slots[v.Slot.Index].VRAM
	buf := make([]byte, 1<<20)
	for off := uint64(0); off < full.Size; off += uint64(len(buf)) {
		if err := board.ReadVRAM(buf, full.Base+off); err != nil {
			t.Fatal(err)
		}
		for i, b := range buf {
			if b != 0 {
				return int64(off) + int64(i)
			}
		}
	}
	return -1
}

// verifiedWork runs madd and cpy on the guest; both must verify.
func verifiedWork(t *testing.T, g *guestVM) {
	t.Helper()
	for _, name := range []string{"madd", "cpy"} {
		w, err := workloads.New(name, smallParams)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Run(gdev.Nouveau(g.dev)); err != nil {
			t.Fatalf("%s after the reset: %v", name, err)
		}
	}
}

// TestResetWhileChannelsRun: a vGPU whose channel runs work that never
// ends is reset. Afterwards nothing of it runs on the board, nothing of it
// is queued, its whole slot reads zero (also through the guest's own
// PRAMIN window, where its secret was), its registers read their power-on
// values and it has no error report; the guest's wait on the old work
// fails with ErrDeviceReset, and after its driver re-initialises a
// workload verifies. The other VM's work is untouched.
func TestResetWhileChannelsRun(t *testing.T) {
	for _, mode := range []string{"fv-optimized", "pv-multicall"} {
		t.Run(mode, func(t *testing.T) {
			agg, board := newTestAggregator(t, 2)
			g := startGuest(t, agg, "reset-me", mode)
			other := startGuest(t, agg, "bystander", "fv-naive")
			ch, seq, sem := stuckChannel(t, g)
			waitReleased(t, agg, g.v, ch.ID())
			// The guest's secret in its own VRAM, where its driver can read it.
			const secretAt = 8 << 20
			port := vgpuPort{g.v}
			port.Write32(nvc0.BAR0, nvc0.RegPRAMINWindow, secretAt>>nvc0.PRAMINWindowShift)
			for i := range 16 {
				port.Write32(nvc0.BAR0, nvc0.PRAMINBase+uint64(4*i), 0x5EC2E700|uint32(i))
			}
			if got := port.Read32(nvc0.BAR0, nvc0.PRAMINBase); got != 0x5EC2E700 {
				t.Fatalf("the secret did not land (reads %#x): the check below would prove nothing", got)
			}
			before := g.v.Counters()

			if err := agg.Reset(g.v, "test"); err != nil {
				t.Fatalf("reset: %v", err)
			}
			slotQuiet(t, agg, board, g.v)
			if at := slotZero(t, agg, board, g.v); at >= 0 {
				t.Errorf("the reset vGPU's slot is not scrubbed: byte %#x is non-zero", at)
			}
			for _, r := range []struct {
				name string
				off  uint32
			}{{"PMC_ENABLE", nvc0.RegPMCEnable}, {"BAR1 instance", nvc0.RegBAR1Inst}, {"BAR3 instance", nvc0.RegBAR3Inst},
				{"poll area", nvc0.RegPollArea}, {"PRAMIN window", nvc0.RegPRAMINWindow}, {"PFIFO_INTR", nvc0.RegPFIFOIntr},
				{"channel 0 instance", nvc0.ChanInst(0)}, {"channel 0 control", nvc0.ChanCtl(0)}} {
				if got := port.Read32(nvc0.BAR0, uint64(r.off)); got != 0 {
					t.Errorf("after the reset the guest reads %s = %#x, want its power-on value 0", r.name, got)
				}
			}
			port.Write32(nvc0.BAR0, nvc0.RegPRAMINWindow, secretAt>>nvc0.PRAMINWindowShift)
			for i := range 16 {
				if got := port.Read32(nvc0.BAR0, nvc0.PRAMINBase+uint64(4*i)); got != 0 {
					t.Errorf("after the reset the guest reads %#x at its old secret %#x", got, secretAt+4*i)
				}
			}
			port.Write32(nvc0.BAR0, nvc0.RegPRAMINWindow, 0)
			after := g.v.Counters()
			if after.Resets != before.Resets+1 {
				t.Errorf("resets counter %d → %d, want one more", before.Resets, after.Resets)
			}
			if after.Scans < before.Scans || after.PTEsScanned < before.PTEsScanned {
				t.Errorf("shadow counters went backwards over the reset: scans %d → %d, PTEs %d → %d",
					before.Scans, after.Scans, before.PTEsScanned, after.PTEsScanned)
			}
			if err := ch.WaitFence(seq); !errors.Is(err, nouveau.ErrDeviceReset) {
				t.Errorf("the guest's wait on work the reset ended: %v, want ErrDeviceReset", err)
			}
			if err := ch.Close(); err != nil {
				t.Errorf("close of a channel from before the reset: %v", err)
			}
			// Release the old wait: a channel the reset left running would
			// now run the entry behind it, which writes 7 next to the
			// semaphore, while the work below keeps the board busy.
			sem.Bytes[0] = 1
			if err := g.dev.Reset(); err != nil {
				t.Fatalf("driver re-init: %v", err)
			}
			verifiedWork(t, g)
			verifiedWork(t, other)
			if got := sem.Bytes[16]; got != 0 {
				t.Errorf("work submitted before the reset ran after it (its semaphore release wrote %d)", got)
			}
		})
	}
}

// TestResetPVDRMRefused: a pvdrm vGPU's guest state is its back end's
// driver, in the aggregator: it is not reset in place.
func TestResetPVDRMRefused(t *testing.T) {
	agg, _ := newTestAggregator(t, 1)
	ram, err := hostmem.New("pvdrm", 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer ram.Close()
	f, err := ram.File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	v, err := agg.Attach(Guest{DomID: 3, Name: "pvdrm", Mode: "pvdrm"}, f, ram.Size())
	if err != nil {
		t.Fatal(err)
	}
	if err := agg.Reset(v, "test"); !errors.Is(err, ErrResetUnsupported) {
		t.Errorf("reset of a pvdrm vGPU: %v, want ErrResetUnsupported", err)
	}
}

// TestResetRacesGuestAccesses: while the guest floods doorbells, writes
// its page directory through PRAMIN, reads its apertures and asks for
// resets of its own, and the control API lists the vGPUs, the operator resets the vGPU over and over (run it
// with -race). Afterwards one more reset leaves the slot quiet and zero,
// and the re-initialised guest verifies its work.
func TestResetRacesGuestAccesses(t *testing.T) {
	agg, board := newTestAggregator(t, 1)
	g := startGuest(t, agg, "racer", "fv-optimized")
	ch, _, _ := stuckChannel(t, g)
	waitReleased(t, agg, g.v, ch.ID())
	port := vgpuPort{g.v}
	pollBase := uint64(port.Read32(nvc0.BAR0, nvc0.RegPollArea)&nvc0.PollAreaMask) << nvc0.PageShift
	var stop atomic.Bool
	var wg sync.WaitGroup
	race := func(f func(i int)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				f(i)
			}
		}()
	}
	race(func(i int) { // doorbells
		port.Write32(nvc0.BAR1, pollBase+uint64(ch.ID())*nvc0.UserAreaSize+nvc0.UserGPPut, uint32(i%1000))
	})
	race(func(i int) { // page-table writes and channel enables
		port.Write32(nvc0.BAR0, nvc0.RegPRAMINWindow, uint32(1<<20>>nvc0.PRAMINWindowShift))
		port.Write32(nvc0.BAR0, nvc0.PRAMINBase+uint64(i%64)*8, uint32(i))
		port.Write32(nvc0.BAR0, nvc0.RegTLBFlushTrigger, nvc0.TLBFlushTrigger|nvc0.TLBFlushAllPDB)
		port.Write32(nvc0.BAR0, uint64(nvc0.ChanCtl(i%4)), nvc0.ChanCtlDefault)
	})
	race(func(i int) { // aperture reads
		_ = port.Read32(nvc0.BAR3, uint64(i%256)*4)
		_ = port.Read32(nvc0.BAR1, uint64(i%256)*4)
	})
	race(func(int) { // the control API's and the metrics' view of the vGPUs
		_ = agg.Infos()
	})
	race(func(int) { // the guest's own resets
		if _, err := g.v.Call(2, nil); err != nil {
			t.Errorf("reset call: %v", err)
		}
		time.Sleep(time.Millisecond)
	})
	for range 20 {
		if err := agg.Reset(g.v, "operator"); err != nil {
			t.Errorf("reset: %v", err)
		}
	}
	stop.Store(true)
	wg.Wait()
	if err := agg.Reset(g.v, "last"); err != nil {
		t.Fatal(err)
	}
	slotQuiet(t, agg, board, g.v)
	if at := slotZero(t, agg, board, g.v); at >= 0 {
		t.Errorf("slot not scrubbed: byte %#x is non-zero", at)
	}
	if got := g.v.Counters().Resets; got < 21 {
		t.Errorf("resets counter %d, want at least 21", got)
	}
	if err := g.dev.Reset(); err != nil {
		t.Fatalf("driver re-init: %v", err)
	}
	verifiedWork(t, g)
}

// TestResetRacesDetach: a reset racing the vGPU's teardown either runs
// first (and the teardown then finishes the vGPU) or finds it gone
// (ErrDetached); the slot ends free, in service and scrubbed.
func TestResetRacesDetach(t *testing.T) {
	for i := range 4 {
		agg, board := newTestAggregator(t, 1)
		g := startGuest(t, agg, "leaving", "fv-optimized")
		ch, _, _ := stuckChannel(t, g)
		waitReleased(t, agg, g.v, ch.ID())
		var rerr, derr error
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); rerr = agg.Reset(g.v, "racing") }()
		go func() {
			defer wg.Done()
			if i%2 == 1 {
				time.Sleep(time.Duration(i) * time.Millisecond)
			}
			derr = agg.Detach(g.v)
		}()
		wg.Wait()
		if rerr != nil && !errors.Is(rerr, ErrDetached) {
			t.Errorf("round %d: reset racing detach: %v", i, rerr)
		}
		if derr != nil {
			t.Errorf("round %d: detach racing reset: %v", i, derr)
		}
		if len(agg.VGPUs()) != 0 || len(agg.OutOfService()) != 0 {
			t.Errorf("round %d: %d vGPUs, slots out of service %v", i, len(agg.VGPUs()), agg.OutOfService())
		}
		if at := slotZero(t, agg, board, g.v); at >= 0 {
			t.Errorf("round %d: slot not scrubbed: byte %#x is non-zero", i, at)
		}
		if _, err := g.v.Read32(nvc0.BAR0, nvc0.RegBoot0); !errors.Is(err, ErrDetached) {
			t.Errorf("round %d: the detached vGPU still answers: %v", i, err)
		}
	}
}

// wedgingGPU is the board with one channel whose preempt never completes.
type wedgingGPU struct {
	*sim.Board
	wedged atomic.Int32 // physical channel + 1 (0: none)
}

func (w *wedgingGPU) Read32(bar int, off uint64) uint32 {
	v := w.Board.Read32(bar, off)
	if bar == nvc0.BAR0 && off == nvc0.RegPreempt {
		if p := int(w.wedged.Load()) - 1; p >= 0 && int(v&nvc0.PreemptChanMask) == p {
			v |= nvc0.PreemptPending
		}
	}
	return v
}

// TestResetWedgedChannel: a reset whose channel stop never completes is a
// failed teardown: the vGPU is destroyed, its VM told, its slot taken out
// of service — not left half-reset.
func TestResetWedgedChannel(t *testing.T) {
	cfg := sim.DefaultConfig()
	cfg.VRAMSize, cfg.MemPartitions = 1<<30, 4
	board, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { board.Close() })
	gpu := &wedgingGPU{Board: board}
	agg, err := New(gpu, Options{MaxVMs: 2, Partition: testPartition(), Channels: cfg.Channels, Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { agg.Close() })
	g := startGuest(t, agg, "wedged", "fv-optimized")
	var told atomic.Value
	g.v.onHangup(func(reason string) { told.Store(reason) })
	ch, _, _ := stuckChannel(t, g)
	waitReleased(t, agg, g.v, ch.ID())
	gpu.wedged.Store(int32(g.v.Slot.ChanBase + ch.ID() + 1))
	err = agg.Reset(g.v, "test")
	if !errors.Is(err, ErrResetDestroyed) {
		t.Fatalf("reset with a wedged channel: %v, want ErrResetDestroyed", err)
	}
	if len(agg.VGPUs()) != 0 {
		t.Errorf("the vGPU whose reset failed is still attached")
	}
	if _, ok := agg.OutOfService()[g.v.Slot.Index]; !ok {
		t.Errorf("slot %d is not out of service after a reset that could not stop a channel", g.v.Slot.Index)
	}
	if r, _ := told.Load().(string); r == "" {
		t.Errorf("the VM was not told its vGPU went away")
	}
	if err := g.v.Write32(nvc0.BAR0, nvc0.RegPMCEnable, 1); !errors.Is(err, ErrDetached) {
		t.Errorf("the destroyed vGPU still takes writes: %v", err)
	}
}

// TestResetBetweenFenceAndReadBack: the operator resets a vGPU after the
// guest's kernel passed its fence and before the guest reads the result
// back through BAR1. The read-back reads the fresh GPU, so the run fails
// verification without any wait having seen the reset; the driver must
// then read as reset (ResetDetected) — the sign a caller uses to make the
// run again (bench's Recover) rather than report a wrong result — and
// after its Reset the same workload verifies.
func TestResetBetweenFenceAndReadBack(t *testing.T) {
	agg, _ := newTestAggregator(t, 1)
	g := startGuest(t, agg, "reset-me", "fv-optimized")
	w, err := workloads.New("madd", smallParams)
	if err != nil {
		t.Fatal(err)
	}
	resets := 0
	drv := workloads.Observe(gdev.Nouveau(g.dev), func(phase string) {
		if phase == workloads.PhaseLaunch && resets == 0 {
			resets++
			if err := agg.Reset(g.v, "test: between fence and read-back"); err != nil {
				t.Errorf("reset: %v", err)
			}
		}
	})
	_, err = w.Run(drv)
	if resets != 1 {
		t.Fatalf("the run never ended its launch phase (%v): the reset was not made where the test needs it", err)
	}
	switch {
	case err == nil:
		t.Fatal("a result read back after the reset verified: the read-back did not read the reset GPU")
	case errors.Is(err, nouveau.ErrDeviceReset):
		// A driver that notices at read-back is as good.
		t.Logf("the run noticed the reset itself: %v", err)
	case errors.Is(err, workloads.ErrVerify):
		if !g.dev.ResetDetected() {
			t.Fatalf("the run failed verification (%v) but the driver does not read the GPU as reset: a caller would report a wrong result", err)
		}
		t.Logf("the run failed verification and the GPU reads as reset: %v", err)
	default:
		t.Fatalf("run across the reset: %v, want a verification failure or ErrDeviceReset", err)
	}
	if err := g.dev.Reset(); err != nil {
		t.Fatalf("driver re-init: %v", err)
	}
	if g.dev.ResetDetected() {
		t.Error("the driver still reads the GPU as reset after re-initialising it")
	}
	verifiedWork(t, g)
}
