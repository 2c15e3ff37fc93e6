package tests

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/devmodel"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
)

// BAR remap across a move (docs/protocol.md §6.7, docs/design.md "BAR remap
// after a move"): the aggregator takes the device model's mapping of the
// old slice away, acknowledged, before it copies, and hands it the new
// slot's slice after the rebuild. The device models here are real
// devmodel.Devices talking to the aggregators over their sockets.

// remapVM is a BAR-remap guest: its device model, its driver, and one page
// of its own VRAM mapped through BAR1.
type remapVM struct {
	dev  *devmodel.Device
	drv  *nouveau.Device
	v    *aggregator.VGPU
	own  uint64 // guest VRAM page
	bar1 uint64 // its BAR1 offset
}

func newRemapVM(t *testing.T, e *env, name string, domid uint32, noAck bool) *remapVM {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	dev, err := devmodel.Connect(ctx, devmodel.Config{Socket: e.sock, DomID: domid, Name: name, Mode: "fv-bar-remap",
		RAMSize: guestRAM, Logger: testLogger(), RemapNoAck: noAck})
	if err != nil {
		t.Fatalf("connect %s: %v", name, err)
	}
	t.Cleanup(func() { dev.Close() })
	bar1, bar3 := dev.BARSizes()
	drv, err := nouveau.Open(dev, dev.RAM(), nouveau.Options{BAR1Size: bar1, BAR3Size: bar3, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("%s: guest driver: %v (device: %v)", name, err, dev.Err())
	}
	t.Cleanup(func() { drv.Close() })
	g := &remapVM{dev: dev, drv: drv, v: e.vgpu(name)}
	if g.own, err = drv.AllocVRAM(pageSize, pageSize); err != nil {
		t.Fatal(err)
	}
	if g.bar1, err = drv.MapBAR1(g.own, pageSize); err != nil {
		t.Fatal(err)
	}
	dev.Write32(nvc0.BAR1, g.bar1, 1)
	if g.v.Counters().RemappedPages == 0 {
		t.Fatalf("%s: no page is passed through", name)
	}
	return g
}

// apertureTraps is the vGPU's trapped BAR1 and BAR3 accesses.
func apertureTraps(v *aggregator.VGPU) uint64 {
	c := v.Counters()
	return c.BAR1Reads + c.BAR1Writes + c.BAR3Reads + c.BAR3Writes
}

// maddTraps runs one verified madd on g and returns how many aperture
// accesses of it trapped.
func (g *remapVM) maddTraps(t *testing.T) uint64 {
	t.Helper()
	w, err := workloads.New("madd", workloads.Params{MatrixDim: 64, CopyBytes: 1 << 20, LoopIterations: 1000, RodiniaScale: 16})
	if err != nil {
		t.Fatal(err)
	}
	before := apertureTraps(g.v)
	if _, err := w.Run(gdev.Nouveau(g.drv)); err != nil {
		t.Fatalf("madd: %v (device: %v)", err, g.dev.Err())
	}
	return apertureTraps(g.v) - before
}

// marker is what the neighbours keep in their own pages: a racer that
// ever reads it reached another VM's memory.
const marker = 0x5EC2E700

// TestMoveRemapRebind: a BAR-remap guest reads and writes a passed-through
// page without pause while it is moved a → b → a → b; beside it, a VM on
// each board keeps the marker in the page at the same guest address of its
// own slice. Every read of the racer returns its own last write and none
// ever returns a marker; after each move its page is passed through again
// (its device model maps the new slot's slice) and its accesses do not
// trap: the trapped-access counters stand still while it makes thousands.
// A verified madd after the moves traps no more aperture accesses than
// before them (before the rebind it trapped each of its ~100 k BAR3 init
// writes).
func TestMoveRemapRebind(t *testing.T) {
	a, b := twoBoardEnv(t)
	canaryA := a.plant(t, "board a, free slot", a.layout.Slots[maxVMs-1].VRAM.Base+vramPerVM/2, 0x3C)
	canaryB := b.plant(t, "board b, free slot", b.layout.Slots[maxVMs-1].VRAM.Base+vramPerVM/2, 0x4D)
	g := newRemapVM(t, a, "racer", 80, false)
	for _, n := range []*attacker{newAttacker(t, a, "neighbour-a", 81, "fv-naive"), newAttacker(t, b, "neighbour-b", 82, "fv-naive")} {
		for i := range uint64(pageSize / 4) {
			n.r.vramWrite32(g.own+4*i, marker|uint32(i&0xFF))
		}
		n.r.sync()
	}
	preMadd := g.maddTraps(t)

	var stop atomic.Bool
	var accesses, wrong, foreign atomic.Int64
	var last [64]uint32
	done := make(chan struct{})
	go func() {
		defer close(done)
		for v := uint32(2); !stop.Load(); v++ {
			w := g.bar1 + uint64(v%64)*4
			g.dev.Write32(nvc0.BAR1, w, v)
			last[v%64] = v
			got := g.dev.Read32(nvc0.BAR1, w)
			if got != v {
				wrong.Add(1)
			}
			// A word it has not written in this loop yet, too.
			if o := g.dev.Read32(nvc0.BAR1, g.bar1+pageSize-4-uint64(v%64)*4); o&0xFFFFFF00 == marker || got&0xFFFFFF00 == marker {
				foreign.Add(1)
			}
			accesses.Add(1)
		}
	}()
	for i, to := range []*env{b, a, b} {
		n := accesses.Load()
		if !pollUntil(time.Minute, func() bool { return accesses.Load() >= n+1000 }) {
			t.Fatalf("hop %d: the racer stalled", i)
		}
		moveTo(t, g.v, to)
		if p := g.v.Counters().RemappedPages; p == 0 {
			t.Fatalf("hop %d: no page passed through after the move", i)
		}
		// Counter-based, not wall clock: the racer's accesses after the
		// rebind do not trap.
		traps, n2 := apertureTraps(g.v), accesses.Load()
		if !pollUntil(time.Minute, func() bool { return accesses.Load() >= n2+2000 }) {
			t.Fatalf("hop %d: the racer stalled after the move", i)
		}
		if d := apertureTraps(g.v) - traps; d > 8 {
			t.Fatalf("hop %d: %d of the racer's aperture accesses after the move trapped", i, d)
		}
	}
	stop.Store(true)
	<-done
	t.Logf("%d BAR1 write/read pairs across 3 moves", accesses.Load())
	if wrong.Load() != 0 || foreign.Load() != 0 {
		t.Fatalf("%d reads did not return the value just written, %d returned another VM's marker", wrong.Load(), foreign.Load())
	}
	page := b.readVRAM(t, b.layout.Slots[g.v.Info().Slot].VRAM.Base+g.own, pageSize)
	for i, want := range last {
		if got := le32(page[i*4:]); want != 0 && got != want {
			t.Fatalf("word %d of its page holds %#x on its board, but it last wrote %#x", i, got, want)
		}
	}
	postMadd := g.maddTraps(t)
	t.Logf("aperture traps of one madd: %d before the moves, %d after", preMadd, postMadd)
	if postMadd > preMadd+preMadd/10+64 {
		t.Fatalf("a madd after the moves trapped %d aperture accesses, %d before them", postMadd, preMadd)
	}
	a.checkCanary(t, canaryA)
	b.checkCanary(t, canaryB)
}

// TestMoveRemapNoAck: a device model that says it handles remap updates
// and never answers them. The move waits for it at most its bound (about
// a second), goes through, and leaves the vGPU trapping every aperture
// access (no page passed through, a madd's BAR3 writes trap) — and its
// work still verifies, before and after a second move, which does not
// wait for it again.
func TestMoveRemapNoAck(t *testing.T) {
	a, b := twoBoardEnv(t)
	g := newRemapVM(t, a, "mute", 83, true)
	pre := g.maddTraps(t)
	t0 := time.Now()
	moveTo(t, g.v, b)
	if d := time.Since(t0); d > 10*time.Second {
		t.Fatalf("the move took %v waiting for a device model that never answers", d)
	}
	if p := g.v.Counters().RemappedPages; p != 0 {
		t.Fatalf("%d pages passed through to a device model that never confirmed its mapping", p)
	}
	post := g.maddTraps(t)
	t.Logf("aperture traps of one madd: %d before the move, %d after (remap off)", pre, post)
	if post <= pre {
		t.Fatalf("a madd after the move trapped %d aperture accesses, %d before: remap is not off", post, pre)
	}
	t1 := time.Now()
	moveTo(t, g.v, a)
	if d := time.Since(t1); d > 800*time.Millisecond+5*time.Second {
		t.Fatalf("the second move took %v", d)
	}
	if p := g.v.Counters().RemappedPages; p != 0 {
		t.Fatalf("%d pages passed through after the second move", p)
	}
	g.maddTraps(t)
}
