package tests

import (
	"context"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/devmodel"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
)

// Per-page remap revocation (docs/protocol.md §6.8) against a device model
// that maps remapped pages into its guest (devmodel.Config.MapRemapped: a
// page's entry is read once, then used until revoked by name, as a guest
// mapping would be).

// connectMapped connects a fv-bar-remap device model that maps remapped
// pages into its guest; noAck: it never acknowledges a revocation.
func connectMapped(t *testing.T, e *env, name string, domid uint32, noAck bool) *devmodel.Device {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	d, err := devmodel.Connect(ctx, devmodel.Config{Socket: e.sock, DomID: domid, Name: name, Mode: "fv-bar-remap",
		RAMSize: guestRAM, Logger: testLogger(), MapRemapped: true, RemapNoAck: noAck})
	if err != nil {
		t.Fatalf("connect %s: %v", name, err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// The hand-built BAR3 space: its RAMIN, page directory and page table,
// and two plain pages of the guest's VRAM, x and y, mapped by PTE 0 and 1.
const (
	b3RAMIN = 0x300000
	b3PD    = 0x310000
	b3PT    = 0x340000
	b3X     = 0x400000
	b3Y     = 0x410000
)

func pteWords(pages ...uint64) []uint32 {
	var w []uint32
	for _, p := range pages {
		lo, hi := nvc0.PTE{Present: true, Addr: p, Target: nvc0.TargetVRAM}.Encode()
		w = append(w, lo, hi)
	}
	return w
}

func setupBAR3(t *testing.T, dev *devmodel.Device) raw {
	t.Helper()
	r := raw{dev}
	r.vramWrite64(b3RAMIN+nvc0.RAMINPageDir, b3PD)
	r.vramWrite64(b3RAMIN+nvc0.RAMINAddrLimit, bar3PerVM-1)
	w0, w1 := nvc0.PDE{SmallPresent: true, SmallAddr: b3PT}.Encode()
	r.vramWrite(b3PD, []uint32{w0, w1})
	r.vramWrite(b3PT, pteWords(b3X, b3Y))
	r.vramWrite32(b3X, 0xC0FFEE00)
	r.wr(nvc0.RegBAR3Inst, nvc0.InstEncode(b3RAMIN, nvc0.BARInstModeVM))
	r.flushTLB(t, b3PD, true)
	return r
}

func bar3Writes(v *aggregator.VGPU) uint64 { return v.Counters().BAR3Writes }

// makeYThePageTable writes, through BAR3 page 1 (page y, passed through
// and mapped by the device model), a page table into y — PTE 0 → x, PTE
// 1 → y itself — and then points the BAR3 page directory at it: y becomes
// a page table and its entry is taken back.
func makeYThePageTable(t *testing.T, dev *devmodel.Device, r raw, v *aggregator.VGPU) {
	t.Helper()
	before := bar3Writes(v)
	for i, w := range pteWords(b3X, b3Y) {
		dev.Write32(nvc0.BAR3, pageSize+uint64(i)*4, w)
	}
	if got := bar3Writes(v) - before; got != 0 {
		t.Fatalf("control: %d of the writes to the plain page y trapped, want 0 (passed through)", got)
	}
	w0, w1 := nvc0.PDE{SmallPresent: true, SmallAddr: b3Y}.Encode()
	r.vramWrite(b3PD, []uint32{w0, w1})
	r.flushTLB(t, b3PD, true)
	if v.Counters().RemapRevokes == 0 {
		t.Fatal("y became the BAR3 page table and no revocation was sent")
	}
}

// TestRemapMappedPageBecomesPageTable is the attack on a device model that
// maps remapped pages into its guest: the guest keeps writing a page,
// through its mapping, after the page became a page table. Every such
// write must be seen: the aggregator names the page to the device model,
// which unmaps it and acknowledges, and from then on every write to it
// traps; a PTE written through the stale mapping before that is applied
// at the next TLB flush.
func TestRemapMappedPageBecomesPageTable(t *testing.T) {
	e := newEnv(t)
	dev := connectMapped(t, e, "mapper", 41, false)
	v := e.vgpu("mapper")
	r := setupBAR3(t, dev)
	makeYThePageTable(t, dev, r, v)
	// The stale mapping: PTE 2 → x, written through BAR3 page 1.
	lo, hi := nvc0.PTE{Present: true, Addr: b3X, Target: nvc0.TargetVRAM}.Encode()
	dev.Write32(nvc0.BAR3, pageSize+16, lo)
	dev.Write32(nvc0.BAR3, pageSize+20, hi)
	// After the acknowledgement the page traps: every write is seen.
	deadline := time.Now().Add(5 * time.Second)
	for {
		before := bar3Writes(v)
		dev.Write32(nvc0.BAR3, pageSize+20, hi)
		if bar3Writes(v) > before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("writes to the page table y through its BAR3 page still do not trap 5 s after it became one")
		}
		time.Sleep(time.Millisecond)
	}
	const n = 100
	before := bar3Writes(v)
	for i := range n {
		dev.Write32(nvc0.BAR3, pageSize+24+uint64(i%8)*4, 0)
	}
	if got := bar3Writes(v) - before; got != n {
		t.Fatalf("%d of %d writes to the page table trapped", got, n)
	}
	r.flushTLB(t, b3PD, true)
	if got := dev.Read32(nvc0.BAR3, 2*pageSize); got != 0xC0FFEE00 {
		t.Fatalf("BAR3 page 2 (PTE written through the stale mapping) reads %#x, want x's 0xc0ffee00", got)
	}
	c := v.Counters()
	t.Logf("revokes %d, entries %d", c.RemapRevokes, c.RemapRevokedEntries)
}

// TestRemapMappedNoAck: a device model that never acknowledges a
// revocation, and keeps mapping the page, does not hold the aggregator:
// after the bound its remap is broken (every entry 0), and what it writes
// through the stale mapping is still seen at every use (the page is
// rescanned before each).
func TestRemapMappedNoAck(t *testing.T) {
	e := newEnv(t)
	dev := connectMapped(t, e, "mute", 42, true)
	v := e.vgpu("mute")
	r := setupBAR3(t, dev)
	makeYThePageTable(t, dev, r, v)
	start := time.Now()
	for v.Counters().RemappedPages != 0 {
		if time.Since(start) > 5*time.Second {
			t.Fatalf("%d pages still passed through 5 s after an unacknowledged revocation", v.Counters().RemappedPages)
		}
		time.Sleep(50 * time.Millisecond)
		r.flushTLB(t, b3PD, true) // a use: the revocation is checked
	}
	// Still mapped in the device model: the write does not trap, but the
	// next use sees it.
	lo, hi := nvc0.PTE{Present: true, Addr: b3X, Target: nvc0.TargetVRAM}.Encode()
	before := bar3Writes(v)
	dev.Write32(nvc0.BAR3, pageSize+16, lo)
	dev.Write32(nvc0.BAR3, pageSize+20, hi)
	if bar3Writes(v) != before {
		t.Fatal("control: the mute device model unmapped the page")
	}
	r.flushTLB(t, b3PD, true)
	if got := dev.Read32(nvc0.BAR3, 2*pageSize); got != 0xC0FFEE00 {
		t.Fatalf("BAR3 page 2 (PTE written through the stale mapping) reads %#x, want x's 0xc0ffee00", got)
	}
	t.Logf("remap broken %v after the revocation", time.Since(start).Round(time.Millisecond))
}

// TestRemapMappedDriver: a guest driver starts and runs verified
// workloads on a device model that maps remapped pages into its guest —
// the page tables and RAMINs it writes through BAR1/BAR3 before they
// become ones are revoked by name — and the revoke round trips a driver
// start and each workload cost are logged (docs/performance.md).
func TestRemapMappedDriver(t *testing.T) {
	e := newEnv(t)
	dev := connectMapped(t, e, "driver", 43, false)
	v := e.vgpu("driver")
	bar1, bar3 := dev.BARSizes()
	drv, err := nouveau.Open(dev, dev.RAM(), nouveau.Options{BAR1Size: bar1, BAR3Size: bar3, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("guest driver: %v (device: %v)", err, dev.Err())
	}
	t.Cleanup(func() { drv.Close() })
	c := v.Counters()
	t.Logf("driver start: %d revoke round trips naming %d entries; %d pages passed through", c.RemapRevokes, c.RemapRevokedEntries, c.RemappedPages)
	for _, name := range []string{"madd", "mmul", "cpy", "nn", "srad"} {
		w, err := workloads.New(name, workloads.Params{MatrixDim: 64, CopyBytes: 1 << 20, LoopIterations: 1000, RodiniaScale: 16})
		if err != nil {
			t.Fatal(err)
		}
		before := v.Counters()
		if _, err := w.Run(gdev.Nouveau(drv)); err != nil {
			t.Fatalf("%s: %v (device: %v)", name, err, dev.Err())
		}
		after := v.Counters()
		t.Logf("%s: %d revoke round trips naming %d entries", name, after.RemapRevokes-before.RemapRevokes, after.RemapRevokedEntries-before.RemapRevokedEntries)
	}
}
