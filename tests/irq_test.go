package tests

import (
	"errors"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/bench"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
)

// Virtual interrupts (aggregator/irq.go, docs/protocol.md §6.6). The
// guests here never poll: their safety-net interval and their timeout are
// an hour, so a fence wait returns within the hang guard only if the
// aggregator's interrupt (or the connection's end) woke it.

// irqHangGuard bounds what must happen promptly; it is no performance
// threshold (without the interrupt the waits below last an hour).
const irqHangGuard = 30 * time.Second

// sleeper is a guest whose fence waits sleep on the interrupt only.
func newSleeper(t *testing.T, e *env, name string, domid uint32, mode string) *attacker {
	t.Helper()
	dev := e.connect(t, name, domid, mode)
	if _, ok := dev.IRQCount(); !ok {
		t.Fatalf("%s: the vGPU delivers no interrupts", name)
	}
	bar1, bar3 := dev.BARSizes()
	drv, err := nouveau.Open(dev, dev.RAM(), nouveau.Options{BAR1Size: bar1, BAR3Size: bar3, PV: bench.DriverPVMode(mode),
		Timeout: time.Hour, IRQPoll: time.Hour})
	if err != nil {
		t.Fatalf("%s: guest driver: %v (device: %v)", name, err, dev.Err())
	}
	t.Cleanup(func() { drv.Close() })
	a := &attacker{e: e, name: name, dev: dev, r: raw{dev}, drv: drv, slot: e.vgpu(name).Slot}
	if a.vm, err = drv.NewVM(); err != nil {
		t.Fatal(err)
	}
	a.newChannel(t)
	return a
}

// blockedFence submits a semaphore acquire of word 1 == 1 and a fence
// after it, and waits for the fence in a goroutine.
func blockedFence(t *testing.T, a *attacker, k *kernelPage) <-chan error {
	t.Helper()
	k.setSem(1, 0)
	seq, err := a.ch.SubmitFenced(k.acquire(1, 1))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.ch.WaitFence(seq) }()
	return done
}

func waitFenceResult(t *testing.T, done <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(irqHangGuard):
		t.Fatalf("%s: the fence wait is still asleep: no interrupt woke it", what)
	}
	return nil
}

// asleep gives the waiter time to get past its spin into the sleep, so
// that what follows tests the wake-up. (Whether it slept is not what the
// tests assert: they assert it woke, which it does either way only if the
// interrupt came.)
func asleep() { time.Sleep(20 * time.Millisecond) }

// ownInterrupts checks that a VM's interrupt count is explained by its own
// work: at most one per doorbell (each ends at most one submission) and
// per fault report. Its setup's submissions may still be ending when a
// test starts, so the count is bounded, not compared with a snapshot.
func ownInterrupts(t *testing.T, e *env, a *attacker) {
	t.Helper()
	n, _ := a.dev.IRQCount()
	c := e.vgpu(a.name).Counters()
	if uint64(n) > c.Doorbells+c.ErrorReports {
		t.Errorf("%s: %d interrupts for %d doorbells and %d fault reports of its own: another VM's work raised it", a.name, n, c.Doorbells, c.ErrorReports)
	}
}

// TestIRQWakesFenceWait: a guest sleeping on its fence is woken by the
// completion of its work, with no fault-register polling while it waits;
// another VM's interrupt count does not move.
func TestIRQWakesFenceWait(t *testing.T) {
	e := newEnv(t)
	a := newSleeper(t, e, "sleeper", 31, "fv-optimized")
	other := newSleeper(t, e, "other", 32, "fv-optimized")
	k := newKernelPage(t, a)
	v := e.vgpu("sleeper")

	done := blockedFence(t, a, k)
	asleep()
	// A polling wait traps a fault-register read every FaultPoll (1 ms):
	// about 100 here. The sleeping one traps none (a starved poller
	// could pass too, but a sleeper cannot fail).
	before := v.Counters().BAR0Reads
	time.Sleep(100 * time.Millisecond)
	polled := v.Counters().BAR0Reads - before
	k.setSem(1, 1)
	if err := waitFenceResult(t, done, "completion"); err != nil {
		t.Fatalf("fence wait: %v", err)
	}
	if polled > 2 {
		t.Errorf("the sleeping guest trapped %d BAR0 reads while it waited: it polls", polled)
	}
	// The other VM had no part in this (it runs the same work below).
	ownInterrupts(t, e, other)
	// It still computes, and waits, normally afterwards.
	for range 50 {
		if err := a.ch.Finish(); err != nil {
			t.Fatal(err)
		}
		if _, err := a.ch.SubmitFenced(nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.ch.Finish(); err != nil {
		t.Fatal(err)
	}
	ownInterrupts(t, e, other)
	ownInterrupts(t, e, a)
}

// TestIRQFault: a fault wakes a sleeping fence wait, which reports it.
func TestIRQFault(t *testing.T) {
	e := newEnv(t)
	a := newSleeper(t, e, "faulty", 33, "fv-optimized")
	_, srcVA := a.hostPage(t)
	unmapped, err := a.vm.AllocVA(nvc0.PageSize, nvc0.PageSize) // reserved, never mapped
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.gpuCopy(unmapped, srcVA) }()
	err = waitFenceResult(t, done, "fault")
	if !errors.Is(err, nouveau.ErrChannelFault) {
		t.Fatalf("copy to an unmapped page: %v, want a channel fault", err)
	}
}

// TestIRQFaultBeforeWait: a fault whose interrupt came before the guest
// began to wait (so no interrupt is still to come) is still reported: the
// wait looks at the fault registers before it sleeps.
func TestIRQFaultBeforeWait(t *testing.T) {
	e := newEnv(t)
	a := newSleeper(t, e, "early", 37, "fv-optimized")
	_, srcVA := a.hostPage(t)
	unmapped, err := a.vm.AllocVA(nvc0.PageSize, nvc0.PageSize) // reserved, never mapped
	if err != nil {
		t.Fatal(err)
	}
	if err := a.submitCopy(unmapped, srcVA); err != nil {
		t.Fatal(err)
	}
	seq, err := a.ch.Fence()
	if err != nil {
		t.Fatal(err)
	}
	v := e.vgpu("early")
	if !pollUntil(irqHangGuard, func() bool { return v.Counters().ErrorReports > 0 }) {
		t.Fatal("the copy to an unmapped page was never reported to the VM: the harness is broken")
	}
	n, _ := a.dev.IRQCount()
	if n == 0 {
		t.Fatal("the fault report raised no interrupt")
	}
	done := make(chan error, 1)
	go func() { done <- a.ch.WaitFence(seq) }()
	if err := waitFenceResult(t, done, "fault before the wait"); !errors.Is(err, nouveau.ErrChannelFault) {
		t.Fatalf("fence wait after the fault: %v, want a channel fault", err)
	}
}

// TestIRQTeardown: a guest asleep on its fence returns promptly with an
// error when its vGPU is destroyed, the aggregator shuts down, or its
// channel is freed.
func TestIRQTeardown(t *testing.T) {
	t.Run("vGPU destroyed", func(t *testing.T) {
		e := newEnv(t)
		a := newSleeper(t, e, "doomed", 34, "fv-optimized")
		k := newKernelPage(t, a)
		done := blockedFence(t, a, k)
		asleep()
		if err := e.agg.Destroy(e.vgpu("doomed"), "destroyed by the test"); err != nil {
			t.Fatal(err)
		}
		if err := waitFenceResult(t, done, "destroy"); !errors.Is(err, nouveau.ErrDeviceGone) {
			t.Fatalf("fence wait after destroy: %v, want ErrDeviceGone", err)
		}
	})
	t.Run("aggregator shuts down", func(t *testing.T) {
		e := newEnv(t)
		a := newSleeper(t, e, "orphan", 35, "fv-optimized")
		k := newKernelPage(t, a)
		done := blockedFence(t, a, k)
		asleep()
		e.agg.Close()
		if err := waitFenceResult(t, done, "shutdown"); !errors.Is(err, nouveau.ErrDeviceGone) {
			t.Fatalf("fence wait after shutdown: %v, want ErrDeviceGone", err)
		}
	})
	t.Run("channel freed", func(t *testing.T) {
		e := newEnv(t)
		a := newSleeper(t, e, "closer", 36, "fv-optimized")
		k := newKernelPage(t, a)
		done := blockedFence(t, a, k)
		asleep()
		closed := make(chan error, 1)
		go func() { closed <- a.ch.Close() }()
		if err := waitFenceResult(t, done, "channel free"); !errors.Is(err, nouveau.ErrClosed) {
			t.Fatalf("fence wait after the channel's free: %v, want ErrClosed", err)
		}
		if err := <-closed; err != nil {
			t.Fatalf("close: %v", err)
		}
	})
}

// TestIRQFlood: a guest flooding small fenced submissions, each waited for
// on the interrupt, next to an idle VM whose interrupt count does not
// move with them (ownInterrupts), and which then waits on its own fence normally.
func TestIRQFlood(t *testing.T) {
	e := newEnv(t)
	flood := newSleeper(t, e, "flood", 37, "fv-optimized")
	quiet := newSleeper(t, e, "quiet", 38, "fv-optimized")
	n := 2000
	if testing.Short() {
		n = 300
	}
	for i := range n {
		seq, err := flood.ch.SubmitFenced(nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := flood.ch.WaitFence(seq); err != nil {
			t.Fatalf("flood fence %d: %v", i, err)
		}
	}
	ownInterrupts(t, e, quiet)
	ownInterrupts(t, e, flood)
	if c, _ := flood.dev.IRQCount(); c == 0 {
		t.Errorf("the flooder's %d fences raised no interrupt", n)
	}
	if err := quiet.ch.Finish(); err != nil {
		t.Fatal(err)
	}
}
