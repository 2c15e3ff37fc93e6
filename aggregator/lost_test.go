package aggregator

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
)

// waitFor polls cond (a hang guard, not a measurement).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// expectLost checks that g's vGPU is a lost device: parked with the
// reason, reading as an absent device, its driver's work failing with
// ErrDeviceGone instead of hanging.
func expectLost(t *testing.T, g *guestVM) {
	t.Helper()
	if lost, why := g.v.Lost(); !lost || !strings.Contains(why, "stopped answering") {
		t.Fatalf("vGPU %d: Lost() = %v %q", g.v.ID, lost, why)
	}
	if info := g.v.Info(); info.Lost == "" || !info.Evicted || info.Slot != -1 {
		t.Errorf("vGPU %d's info: lost %q, evicted %v, slot %d", g.v.ID, info.Lost, info.Evicted, info.Slot)
	}
	for _, off := range []uint64{nvc0.RegBoot0, nvc0.RegPMCEnable} {
		if v, err := g.v.Read32(nvc0.BAR0, off); err != nil || v != 0xFFFFFFFF {
			t.Errorf("a lost device's BAR0 %#x reads %#x, %v; want all ones", off, v, err)
		}
	}
	if err := g.v.Write32(nvc0.BAR0, nvc0.RegPMCEnable, nvc0.PMCEnableAll); err != nil {
		t.Errorf("a write to a lost device: %v (it is dropped, not an error that ends the connection)", err)
	}
	w, err := workloads.New("madd", smallParams)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Run(gdev.Nouveau(g.dev)); !errors.Is(err, nouveau.ErrDeviceGone) {
		t.Errorf("madd on a lost device: %v, want ErrDeviceGone", err)
	}
}

// TestLostDeviceResetAfterRepair: two VMs compute on board a when it falls
// off the bus. Each becomes a lost device (not destroyed: its id and
// connection stay), reads as absent, and costs no slot; a reset while the
// board is still lost, with nowhere else to go, fails and leaves it lost.
// The board comes back (RepairBus), with the VMs' markers still in its
// stale VRAM; Reinit renews every slot — the markers are gone — and puts
// the board back in service. The first VM's reset restores it on board a
// and, after its driver re-initialises, all of its work verifies; the
// second stays lost until it is reset too. An honest VM on board b
// computes throughout.
func TestLostDeviceResetAfterRepair(t *testing.T) {
	modes := []string{"fv-optimized", "pv-multicall"}
	if testing.Short() {
		modes = modes[:1]
	}
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			reg := NewRegistry()
			a, boardA := newTestAggregatorWith(t, Options{MaxVMs: 2, Registry: reg, BoardName: "a", HealthInterval: 5 * time.Millisecond,
				Timeout: time.Hour}) // a stop that waited on the dead board would hang the test
			b, _ := newTestAggregatorWith(t, Options{MaxVMs: 2, Registry: reg, Board: 1, BoardName: "b"})
			first := startGuest(t, a, "first", mode)
			second := startGuest(t, a, "second", mode)
			honest := startGuest(t, b, "honest", "fv-optimized")
			runAllWorkloads(t, first, mode)
			marker := bytes.Repeat([]byte{0x5E}, 4096)
			for _, g := range []*guestVM{first, second} {
				if err := boardA.WriteVRAM(marker, g.v.Slot.VRAM.Base+g.v.Slot.VRAM.Size/2); err != nil {
					t.Fatal(err)
				}
			}
			ids := []int{first.v.ID, second.v.ID}

			boardA.FailBus()
			waitFor(t, "the board's vGPUs to become lost devices", func() bool {
				l1, _ := first.v.Lost()
				l2, _ := second.v.Lost()
				return l1 && l2
			})
			expectLost(t, first)
			expectLost(t, second)
			if reg.Len() != 3 {
				t.Errorf("the registry holds %d ids; the lost devices keep theirs", reg.Len())
			}
			if err := a.Reset(first.v, "test: reset while the board is lost"); !errors.Is(err, ErrNoRoom) {
				t.Errorf("reset of a lost device with its board lost and no other board: %v, want ErrNoRoom", err)
			}
			if lost, _ := first.v.Lost(); !lost {
				t.Fatal("a failed reset made the vGPU stop being lost")
			}
			if err := a.Reinit(); !errors.Is(err, ErrBoardLost) || !strings.Contains(err.Error(), "0xffffffff") {
				t.Errorf("Reinit of a board still off the bus: %v", err)
			}
			runAllWorkloads(t, honest, "fv-optimized")

			if err := boardA.RepairBus(); err != nil {
				t.Fatal(err)
			}
			stale := make([]byte, 4096)
			if err := boardA.ReadVRAM(stale, first.v.Info().VRAMBase); err != nil { // parked: base 0, the board's start
				t.Fatal(err)
			}
			var rerr error
			waitFor(t, "the lost board's vGPUs to be taken off", func() bool {
				rerr = a.Reinit()
				return !errors.Is(rerr, ErrBoardSettling)
			})
			if rerr != nil {
				t.Fatal(rerr)
			}
			if lost, why := a.Lost(); lost || a.Reinits() != 1 {
				t.Fatalf("after Reinit: lost %v %q, reinits %d", lost, why, a.Reinits())
			}
			if oos := a.OutOfService(); len(oos) != 0 {
				t.Errorf("slots out of service after Reinit: %v", oos)
			}
			if err := a.Reinit(); !errors.Is(err, ErrBoardAnswers) {
				t.Errorf("a second Reinit: %v, want ErrBoardAnswers", err)
			}
			for i, s := range a.Layout().Slots {
				got := make([]byte, 4096)
				if err := boardA.ReadVRAM(got, s.VRAM.Base+s.VRAM.Size/2); err != nil {
					t.Fatal(err)
				}
				if bytes.Contains(got, []byte{0x5E, 0x5E, 0x5E, 0x5E}) {
					t.Errorf("slot %d still holds a marker from before the board was lost", i)
				}
			}
			checks := a.HealthChecks()
			waitFor(t, "the health checks to resume", func() bool { return a.HealthChecks() > checks })
			expectLost(t, second) // a lost device waits for its reset, not for the board

			if err := a.Reset(first.v, "test: reset after the repair"); err != nil {
				t.Fatal(err)
			}
			if lost, _ := first.v.Lost(); lost || first.v.Evicted() {
				t.Fatalf("after its reset the vGPU is lost %v, parked %v", lost, first.v.Evicted())
			}
			if info := first.v.Info(); info.BoardName != "a" || info.Slot < 0 || first.v.Resets() != 1 {
				t.Fatalf("after its reset: board %q slot %d, resets %d", info.BoardName, info.Slot, first.v.Resets())
			}
			if err := first.dev.Reset(); err != nil {
				t.Fatalf("the guest driver's re-initialisation: %v", err)
			}
			runAllWorkloads(t, first, mode)
			if err := a.Reset(second.v, "test: reset of the other"); err != nil {
				t.Fatal(err)
			}
			if err := second.dev.Reset(); err != nil {
				t.Fatal(err)
			}
			runAllWorkloads(t, second, mode)
			if got := []int{first.v.ID, second.v.ID}; got[0] != ids[0] || got[1] != ids[1] {
				t.Errorf("ids changed across the loss: %v, were %v", got, ids)
			}
			runAllWorkloads(t, honest, "fv-optimized")
		})
	}
}

// TestLostDeviceResetElsewhere: with a way to another board (the host's
// placement, SetRehome), a lost device's reset does not wait for its
// board: it is restored on the other board and its work verifies there.
func TestLostDeviceResetElsewhere(t *testing.T) {
	reg := NewRegistry()
	a, boardA := newTestAggregatorWith(t, Options{MaxVMs: 2, Registry: reg, BoardName: "a", HealthInterval: 5 * time.Millisecond, Timeout: time.Hour})
	b, _ := newTestAggregatorWith(t, Options{MaxVMs: 2, Registry: reg, Board: 1, BoardName: "b"})
	a.SetRehome(func(*VGPU) *Aggregator { return b })
	g := startGuest(t, a, "victim", "fv-optimized")
	runAllWorkloads(t, g, "fv-optimized")
	boardA.FailBus()
	waitFor(t, "the vGPU to become a lost device", func() bool { l, _ := g.v.Lost(); return l })
	expectLost(t, g)
	if err := a.Reset(g.v, "test"); err != nil {
		t.Fatal(err)
	}
	if info := g.v.Info(); info.BoardName != "b" || info.Slot < 0 || info.Lost != "" {
		t.Fatalf("after the reset: board %q slot %d lost %q", info.BoardName, info.Slot, info.Lost)
	}
	if err := g.dev.Reset(); err != nil {
		t.Fatal(err)
	}
	runAllWorkloads(t, g, "fv-optimized")
	if n := len(a.VGPUs()); n != 0 {
		t.Errorf("the lost board still lists %d vGPUs", n)
	}
}

// TestNoMoveOrEvictOffALostBoard: between the loss of a board and the
// moment its vGPUs become lost devices, a move or an eviction (the
// balancer's, the idle evictor's) must not try to save the vGPU from the
// dead board — that would fail and destroy it: it is refused with
// ErrBoardLost and the vGPU is left for loseBoard. The window is made
// here by marking the board lost without taking its vGPUs off.
func TestNoMoveOrEvictOffALostBoard(t *testing.T) {
	reg := NewRegistry()
	a, _ := newTestAggregatorWith(t, Options{MaxVMs: 2, Registry: reg, BoardName: "a", HealthInterval: -1})
	b, _ := newTestAggregatorWith(t, Options{MaxVMs: 2, Registry: reg, Board: 1, BoardName: "b"})
	g := startGuest(t, a, "vm", "fv-optimized")
	runAllWorkloads(t, g, "fv-optimized")
	a.health.lost.Store(true)
	if _, err := Move(context.Background(), g.v, b); !errors.Is(err, ErrBoardLost) {
		t.Errorf("move off a lost board: %v, want ErrBoardLost", err)
	}
	if _, err := a.Evict(context.Background(), g.v, "test"); !errors.Is(err, ErrBoardLost) {
		t.Errorf("eviction on a lost board: %v, want ErrBoardLost", err)
	}
	if g.v.detached() || g.v.Evicted() {
		t.Fatalf("the vGPU was destroyed (%v) or parked (%v)", g.v.detached(), g.v.Evicted())
	}
	a.health.lost.Store(false) // the window closes with nothing changed
	runAllWorkloads(t, g, "fv-optimized")
}
