package tests

import (
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// watchdogLimit is the scheduler watchdog of these tests: far above any
// honest submission (a 64×64 madd or a 1 MiB copy takes milliseconds) and
// far below the hog's kernel (2^40 iterations: many minutes).
const watchdogLimit = 300 * time.Millisecond

// TestLongKernelWatchdog: with the scheduler watchdog on, a hog VM launches a
// loop kernel of 2^40 iterations while the honest VM computes. The hog (a)
// just waits, (b) forges its channel's GP_GET (user area +0x88, written
// through the PRAMIN window) to equal its GP_PUT so that the submission
// looks complete, or (c) disables its own channel while the kernel runs.
// Whatever it does: the hog's kernel is what gets stopped (a watchdog kill
// charged to the hog, or its channel faulted/idle), the compute engine
// becomes free again (PGRAPH status reads 0) within a bounded time, no
// submission of the honest VM is killed, and the honest VM's work verifies.
func TestLongKernelWatchdog(t *testing.T) {
	variants := []struct {
		name string
		// during runs while the hog's kernel holds the engine; it returns
		// when the attack is done.
		during func(t *testing.T, e *env, a *attacker, g guestChan, put uint32)
		// disabled: the hog disabled its channel itself, so a channel that
		// is merely idle (not busy) also counts as stopped.
		disabled bool
	}{
		{name: "wait", during: func(*testing.T, *env, *attacker, guestChan, uint32) {}},
		{name: "forged-gp-get", during: func(t *testing.T, e *env, a *attacker, g guestChan, put uint32) {
			// Keep GP_GET equal to GP_PUT for a while: the GPU itself does
			// not advance it (the kernel never ends), so the forgery stays.
			defer a.r.restoreWindow(a.r.saveWindow())
			end := time.Now().Add(3 * watchdogLimit)
			for time.Now().Before(end) {
				a.r.vramWrite32(g.user+nvc0.UserGPGet, put)
				a.r.sync()
				time.Sleep(5 * time.Millisecond)
			}
		}},
		{name: "disable-channel", disabled: true, during: func(t *testing.T, e *env, a *attacker, g guestChan, put uint32) {
			a.r.wr(nvc0.ChanCtl(g.id), nvc0.ChanCtlDefault&^nvc0.ChanCtlEnable)
			a.r.sync()
		}},
	}
	if testing.Short() {
		variants = variants[1:] // the two that fool the dispatcher
	}
	for _, vt := range variants {
		t.Run(vt.name, func(t *testing.T) {
			e := newEnvWith(t, envOptions{Watchdog: watchdogLimit})
			a := newAttacker(t, e, "hog", 66, "fv-naive")
			k := newKernelPage(t, a)
			k.controlKernel(t, a)
			hogID := e.vgpu("hog").ID
			runs := 12
			if testing.Short() {
				runs = 6
			}
			honest, hv := e.startBusyHonest(t, runs)

			g := a.inspectChannel(t)
			if err := a.ch.Submit(k.loopLaunch(1, nvc0.MaxKernelLoopIterations, 0)); err != nil {
				t.Fatalf("hog kernel: submit: %v", err)
			}
			put := a.put(g)
			launched := time.Now()
			// The kernel is on the engine once PGRAPH stays busy for 20 ms
			// (the honest VM's kernels take microseconds).
			if !e.waitKernelRunning(10*time.Second, 20*time.Millisecond) {
				t.Logf("the compute engine never stayed busy for 20 ms after the hog's launch (killed at once?)")
			}
			vt.during(t, e, a, g, put)

			// The hog's kernel is stopped: a watchdog kill charged to the
			// hog, or its channel faulted (or, after disabling it, idle).
			stopped := func() bool {
				ctl := a.chanCtl(g)
				return e.agg.WatchdogKills(hogID) > 0 || a.r.errorReported(g.id) ||
					(vt.disabled && ctl&nvc0.ChanCtlPending == 0)
			}
			if !pollUntil(10*time.Second, stopped) {
				t.Errorf("the hog's channel was not stopped within 10 s of its launch (watchdog %v): watchdog kills of the hog %d, its control word %#x",
					watchdogLimit, e.agg.WatchdogKills(hogID), a.chanCtl(g))
			} else {
				t.Logf("hog stopped %v after its launch: watchdog kills %d, control word %#x",
					time.Since(launched).Round(time.Millisecond), e.agg.WatchdogKills(hogID), a.chanCtl(g))
			}
			// The compute engine is free again.
			if !pollUntil(10*time.Second, func() bool { return !e.pgraphBusy() }) {
				t.Errorf("the compute engine is still busy (PGRAPH status %#x) %v after the hog's launch: the 2^40-iteration kernel was never stopped",
					e.board.Read32(nvc0.BAR0, nvc0.RegPGRAPHStatus), time.Since(launched).Round(time.Millisecond))
			} else {
				t.Logf("compute engine free %v after the hog's launch", time.Since(launched).Round(time.Millisecond))
			}
			honest.wait(t, 3*time.Minute)
			if n := e.agg.WatchdogKills(hv.ID); n != 0 {
				t.Errorf("the watchdog killed %d channel(s) of the honest VM: it charged the honest VM for the hog's kernel", n)
			}
			honest.verified(t)
		})
	}
}
