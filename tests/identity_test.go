package tests

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/ipc"
)

// TestSecondClaimOfLiveDomain: while a VM computes, a second device model
// claims its identity — the same domid under another name, and the same
// name under another domid. Each claim is refused with an
// ipc.RejectedError whose reason names the contested domid or name; the
// first VM keeps its vGPU and its work verifies; once it has detached, its
// domid and name attach again.
func TestSecondClaimOfLiveDomain(t *testing.T) {
	e := newEnv(t)
	const domid = 4242
	runs := 10
	if testing.Short() {
		runs = 5
	}
	honest := e.startVM(t, "honest", domid, "fv-naive", busyHonestArgs(runs))
	hv := e.waitAttached(t, "honest", honest)
	claims := []struct {
		what, name string
		domid      uint32
		named      string // what the refusal must name
	}{
		{"the same domid under another name", "impostor", domid, strconv.Itoa(domid)},
		{"the same name under another domid", "honest", domid + 1, "honest"},
	}
	for _, c := range claims {
		if honest.exited() {
			t.Fatalf("the honest VM exited before the claims: the test proves nothing\nstderr:\n%s", honest.stderr())
		}
		d, err := e.tryConnect(c.name, c.domid, "fv-naive")
		if err == nil {
			slot := -1
			for _, v := range e.agg.VGPUs() {
				if v != hv && v.Guest.Name == c.name && v.Guest.DomID == c.domid {
					slot = v.Slot.Index
				}
			}
			d.Close()
			t.Errorf("a second device model claiming %s of a live VM (name %q, domid %d) was accepted: it got a vGPU in slot %d beside the VM's own in slot %d",
				c.what, c.name, c.domid, slot, hv.Slot.Index)
			continue
		}
		var rej *ipc.RejectedError
		if !errors.As(err, &rej) {
			t.Errorf("claim of %s: %v, want an ipc.RejectedError", c.what, err)
			continue
		}
		if !strings.Contains(rej.Reason, c.named) {
			t.Errorf("claim of %s refused with reason %q, which does not name %q", c.what, rej.Reason, c.named)
		}
		t.Logf("claim of %s refused: %s", c.what, rej.Reason)
	}
	// The first VM is unaffected: the same vGPU, and its work verifies.
	found := false
	for _, v := range e.agg.VGPUs() {
		found = found || v == hv
	}
	if !found && !honest.exited() {
		t.Errorf("the live VM lost its vGPU to the claims")
	}
	honest.verified(t)
	e.waitDetached(t, "honest", 10*time.Second)
	// Its domid and name are free again.
	for _, c := range []struct {
		name  string
		domid uint32
	}{{"honest", domid}, {"renamed", domid}} {
		d, err := e.tryConnect(c.name, c.domid, "fv-naive")
		if err != nil {
			t.Errorf("after the VM detached, %q (domid %d) cannot attach: %v", c.name, c.domid, err)
			continue
		}
		if v := e.vgpu(c.name); v == nil || v.Guest.DomID != c.domid {
			t.Errorf("after reattaching, the vGPU of %q is %+v", c.name, v)
		}
		d.Close()
		e.waitDetached(t, c.name, 10*time.Second)
	}
}

// TestVRAMQuotaWithRemap: a [[vm]] VRAM quota smaller than the slot, with
// fv-optimized (BAR remap). The guest attaches (with remap on), sees only the
// quota's VRAM (the welcome and the memory-size registers its driver probes
// say so), and reaches nothing of its slot past the quota — through BAR1
// (remapped pages included), the PRAMIN window, or GPU copies — while its
// own memory works; a VM process under the same quota runs a workload that
// verifies, beside the honest VM.
func TestVRAMQuotaWithRemap(t *testing.T) {
	const quota = 128 << 20 // half the slot
	e := newEnvWith(t, envOptions{Quota: func(g aggregator.Guest) aggregator.Quota {
		if strings.HasPrefix(g.Name, "quota") {
			return aggregator.Quota{VRAM: quota}
		}
		return aggregator.Quota{}
	}})
	d, err := e.tryConnect("quota-probe", 61, "fv-optimized")
	if err != nil {
		t.Fatalf("a guest with a [[vm]] VRAM quota of %d MiB (slot %d MiB) in fv-optimized was refused: %v", quota>>20, vramPerVM>>20, err)
	}
	w := d.Welcome()
	d.Close()
	if w.Params[ipc.ParamRemap] != "1" {
		t.Errorf("fv-optimized under a quota: BAR remap is off (params %v)", w.Params)
	}
	if w.VRAMSize != quota {
		t.Errorf("the welcome gives %d MiB of VRAM, want the quota's %d MiB", w.VRAMSize>>20, quota>>20)
	}
	e.waitDetached(t, "quota-probe", 10*time.Second)

	a := newAttacker(t, e, "quota-probe", 61, "fv-optimized")
	if got := a.drv.VRAMSize(); got != quota {
		t.Errorf("the guest driver probed %d MiB of VRAM, want the quota's %d MiB", got>>20, quota>>20)
	}
	full := e.layout.Slots[a.slot.Index].VRAM
	if full.Size <= quota {
		t.Fatalf("slot %d has %d MiB: the quota narrows nothing", a.slot.Index, full.Size>>20)
	}
	cs := []canary{
		e.plant(t, "slot, first page past the quota", full.Base+quota, 0x61),
		e.plant(t, "slot, last page", full.End()-pageSize, 0x62),
	}
	// Control: the last page of its quota works through BAR1 and lands in
	// its slot.
	lastOwn := uint64(quota - pageSize)
	off, err := a.drv.MapBAR1(lastOwn, pageSize)
	if err != nil {
		t.Fatal(err)
	}
	a.dev.Write32(nvc0.BAR1, off, 0xC0FFEE)
	if got := a.dev.Read32(nvc0.BAR1, off); got != 0xC0FFEE {
		t.Fatalf("control: the last page of its quota reads %#x through BAR1, want 0xc0ffee", got)
	}
	a.r.sync()
	if got := le32(e.readVRAM(t, full.Base+lastOwn, 4)); got != 0xC0FFEE {
		t.Errorf("control: a BAR1 write to guest %#x landed elsewhere (slot word reads %#x)", lastOwn, got)
	}
	if a.e.vgpu("quota-probe").Counters().RemappedPages == 0 {
		t.Errorf("no aperture page is remapped: the test does not exercise BAR remap")
	}
	a.controlCopies(t)

	for _, g := range []uint64{quota, quota + 64*pageSize, full.Size - pageSize} {
		what := fmt.Sprintf("guest VRAM %#x (past the %d MiB quota)", g, quota>>20)
		off, err := a.drv.MapBAR1(g, pageSize)
		if err != nil {
			t.Fatal(err)
		}
		if got := a.dev.Read32(nvc0.BAR1, off); got != 0 {
			t.Errorf("BAR1 read of %s = %#x, want 0", what, got)
		}
		a.dev.Write32(nvc0.BAR1, off+8, 0xBAD)
		win := a.r.saveWindow()
		if got := a.r.vramRead32(g); got != 0 {
			t.Errorf("PRAMIN read of %s = %#x, want 0", what, got)
		}
		a.r.vramWrite32(g+12, 0xBAD)
		a.r.restoreWindow(win)
		va := a.mapVRAM(t, g)
		a.newChannel(t)
		fillSink(a)
		expectFault(t, a.gpuCopy(a.sinkVA, va), "GPU read of "+what)
		if !sinkUntouched(a) {
			t.Errorf("GPU read of %s moved data into the guest's page", what)
		}
		a.newChannel(t)
		expectFault(t, a.gpuCopy(va, a.srcVA), "GPU write of "+what)
	}
	a.newChannel(t)
	a.controlCopies(t)
	a.r.sync()
	for _, c := range cs {
		e.checkCanary(t, c)
	}

	// A VM process under the same quota computes beside the honest VM.
	q := e.startVM(t, "quota-vm", 62, "fv-optimized", honestArgs())
	honest, _ := e.startHonest(t)
	q.verified(t)
	honest.verified(t)
	for _, c := range cs {
		e.checkCanary(t, c)
	}
}
