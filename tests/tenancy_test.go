package tests

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// Tenancy attacks: a VM leaves while its work still runs on the board. Once
// its vGPU is gone, nothing it submitted may still run: not against the next
// tenant of its slot, not against its own RAM (unmapped by then), not as a
// leftover stop of a channel that now belongs to someone else.

// a1NextTenant connects raw device models until one lands in slot (the
// honest VM may have left and freed a lower one meanwhile).
func a1NextTenant(t *testing.T, e *env, slot int, domid uint32) *a1Guest {
	t.Helper()
	for i := range maxVMs {
		name := fmt.Sprintf("next%d", i)
		g := a1ConnectRetry(t, e, name, domid+uint32(i), "fv-naive")
		if g.slot.Index == slot && e.vgpu(name) != nil {
			return g
		}
	}
	t.Fatalf("no new tenant got the freed slot %d", slot)
	return nil
}

// TestGhostChannelNextTenant (issue 7, attack 3): a VM's channel runs a push
// buffer that waits (a semaphore in its own VRAM that only a scrub of its
// slice releases, then one that the next tenant's marker releases) and then
// writes. The VM disables the channel and zeroes its instance, so the
// aggregator believes the channel dead, and disconnects. The next tenant of
// the slot writes a marker: it must never be zeroed or changed by the
// departed VM's work.
func TestGhostChannelNextTenant(t *testing.T) {
	e := newEnv(t)
	G := a1NewGuest(t, e, "ghost", 40, "fv-naive", a1Options{})
	honest, hv := e.startHonest(t)
	cv := a1PlantCanaries(t, e, hv.Slot)
	// A second channel on the same address space keeps its shadow alive
	// until teardown (so the ghost's translations stay what they were).
	G.channel(t, G.vm)
	gS, vaS := G.vramBuf(t, G.vm, pageSize, pageSize)
	gX, vaX := G.vramBuf(t, G.vm, pageSize, pageSize)
	G.vramWords(gS, 1)
	const marker, marker2 = 0x5EC2E7, 0x7E2A47
	id := G.ch.ID()
	if err := G.ch.Submit(a1Cat(
		a1SemRelease(vaX+12, 0xC0FFEE), // the ghost's own page, soon the next tenant's
		a1SemRelease(vaS+4, 1),         // started
		a1SemAcquire(vaS, 0),           // until the slice is scrubbed
		a1SemAcquire(vaX, marker),      // until the next tenant wrote its marker
		a1SemRelease(vaX, 0),
		a1SemRelease(vaX+4, 0x60057),
	)); err != nil {
		t.Fatal(err)
	}
	if !pollUntil(15*time.Second, func() bool { return G.vramWord(gS+4) == 1 }) {
		t.Fatalf("the ghost channel never started (control %#x)", G.ctl(id))
	}
	// Stopped as far as the aggregator can tell: disabled, no instance.
	G.r.wr(nvc0.ChanCtl(id), 0)
	G.r.wr(nvc0.ChanInst(id), 0)
	G.r.sync()
	slot := G.slot
	G.depart()
	e.waitDetached(t, "ghost", 10*time.Second)

	N := a1NextTenant(t, e, slot.Index, 41)
	N.r.vramWrite32(gX, marker)
	N.r.vramWrite32(gX+4, marker2)
	N.r.sync()
	var w0, w1 uint32
	changed := pollUntil(3*time.Second, func() bool {
		w0, w1 = N.r.vramRead32(gX), N.r.vramRead32(gX+4)
		return w0 != marker || w1 != marker2
	})
	if changed {
		time.Sleep(50 * time.Millisecond) // let the departed VM's work finish
		w0, w1 = N.r.vramRead32(gX), N.r.vramRead32(gX+4)
		t.Errorf("the next tenant's marker at guest %#x changed to %#x %#x (wrote %#x %#x): the departed VM's channel, "+
			"disabled and without an instance, kept running on the board after its teardown (issue 7 attack 3)",
			gX, w0, w1, marker, marker2)
	}
	if w := N.r.vramRead32(gX + 12); w != 0 {
		t.Errorf("the next tenant reads %#x at guest %#x, where the departed VM wrote: its slot was not clean", w, gX+12)
	}
	cv.check(t)
	honest.verified(t)
	cv.check(t)
}

// TestGhostCopyFromRAMDuringTeardown (issue 7, attack 3, second part): a VM
// whose channel copies from its RAM (1 GiB per launch, out of a 4 MiB
// buffer) disables the channel, zeroes its instance and disconnects while
// the copy runs; its RAM is unmapped at teardown. The aggregator must
// survive (it runs as a `gpuvm serve` process here, since a fault in the
// copy engine kills the whole process), keep serving the honest VM, which
// must verify, and attach and serve a new VM afterwards. (The board lives in
// the daemon, so there are no host-side canaries here: the honest VM's
// verified results are the check.) The crash is a race with the copy, so
// the VM leaves several times.
func TestGhostCopyFromRAMDuringTeardown(t *testing.T) {
	d := a1StartDaemon(t)
	de := d.env()
	honest := de.startVM(t, "honest", 7, "fv-naive", []string{"--workloads", "madd,cpy", "--runs", "3", "--matrix-dim", "64", "--copy-size", "4MiB"})
	rounds := 6
	if testing.Short() {
		rounds = 3
	}
	const bufSize = 4 << 20
	for r := range rounds {
		if d.exited() {
			t.Fatalf("before round %d: the aggregator died: %v\n%s", r, d.err, d.crash())
		}
		name := fmt.Sprintf("ghost%d", r)
		G := a1NewGuest(t, de, name, uint32(50+r), "fv-naive", a1Options{})
		G.channel(t, G.vm) // keeps the address space's shadow until teardown
		src, srcVA := G.hostBuf(t, G.vm, bufSize)
		for i := 0; i < len(src.Bytes); i += pageSize {
			copy(src.Bytes[i:i+pageSize], pattern(byte(i>>12), pageSize))
		}
		_, dstVA := G.vramBuf(t, G.vm, bufSize, pageSize)
		sem, semVA := G.hostPage(t)
		launch := a1Copy(dstVA, srcVA, bufSize, (1<<30)/bufSize, 0, 0) // the same 4 MiB, 256 times
		if err := G.ch.Submit(a1Cat(a1SemRelease(semVA, 1), launch, launch, launch, launch, a1SemRelease(semVA+8, 1))); err != nil {
			t.Fatal(err)
		}
		id := G.ch.ID()
		if !pollUntil(15*time.Second, func() bool { return a1Get32(sem, 0) == 1 }) {
			t.Fatalf("%s: the copy never started (control %#x)", name, G.ctl(id))
		}
		time.Sleep(20 * time.Millisecond) // the copy is under way
		if a1Get32(sem, 8) == 1 {
			t.Fatalf("%s: the copies finished before the VM left: the machine is too fast for this test", name)
		}
		G.r.wr(nvc0.ChanCtl(id), 0)
		G.r.wr(nvc0.ChanInst(id), 0)
		G.r.sync()
		G.depart()
		// Its teardown runs now; the copy engine may still be in its RAM.
		pollUntil(time.Second, d.exited)
		if d.exited() {
			t.Fatalf("round %d: the aggregator died after a VM left while its channel copied from its RAM "+
				"(issue 7 attack 3: RAM unmapped while an engine still used it): %v\n%s", r, d.err, d.crash())
		}
	}
	// The aggregator still serves: a new VM attaches and its copies work.
	N := a1NewGuest(t, de, "after", 60, "fv-naive", a1Options{})
	N.controlCopies(t)
	honest.verified(t)
	if d.exited() {
		t.Fatalf("the aggregator exited: %v\n%s", d.err, d.crash())
	}
	if l := d.log(); strings.Contains(l, "panic") || strings.Contains(l, "fatal error") {
		t.Errorf("the aggregator's log shows a crash:\n%s", l)
	}
}

// TestDetachDuringLongKernel (issue 7, attack 8): a VM is detached (its
// device model closes, or the operator destroys its vGPU through the control
// API) while its channel runs a long loop kernel, whose result goes to a
// page of its VRAM. The next tenant of the slot then creates its first
// channel and computes: that channel must not be stopped by anything left
// over from the previous tenant, its results must verify, and it must read
// zeros where the previous tenant had data (its kernel's result included,
// once that kernel is over). The physical register timeout is 1 s, so a
// stop that waits for the kernel gives up long before it ends.
func TestDetachDuringLongKernel(t *testing.T) {
	hows := []string{"device-model-closes", "control-api-delete"}
	if testing.Short() {
		hows = hows[:1]
	}
	for _, how := range hows {
		t.Run(how, func(t *testing.T) {
			e := newEnvWith(t, envOptions{Modify: func(o *aggregator.Options) { o.Timeout = time.Second }})
			O := a1NewGuest(t, e, "old", 70, "fv-naive", a1Options{})
			honest, hv := e.startHonest(t)
			cv := a1PlantCanaries(t, e, hv.Slot)
			// O's data and its kernel's result page, near the end of its slice
			// (far from what the next tenant's driver allocates for itself).
			gD, gR := O.slot.VRAM.Size-8*pageSize, O.slot.VRAM.Size-4*pageSize
			vaD, vaR := O.mapVRAM(t, gD), O.mapVRAM(t, gR)
			if err := O.gpuCopy(vaD, O.srcVA); err != nil {
				t.Fatal(err)
			}
			k := O.newKernel(t, O.vm)
			const iters = 1 << 31 // ~2.5 s of the board's only compute engine
			id := O.ch.ID()
			if err := O.ch.Submit(a1Cat(a1SemRelease(vaR+8, 1), k.launch(0, iters, vaR))); err != nil {
				t.Fatal(err)
			}
			if !pollUntil(15*time.Second, func() bool { return O.vramWord(gR+8) == 1 }) {
				t.Fatalf("the old tenant's kernel never started (control %#x)", O.ctl(id))
			}
			time.Sleep(50 * time.Millisecond) // the kernel is running
			slot := O.slot
			detached := time.Now()
			switch how {
			case "device-model-closes":
				O.depart()
			case "control-api-delete":
				srv := httptest.NewServer(e.agg.ControlHandler())
				defer srv.Close()
				req, _ := http.NewRequest(http.MethodDelete, fmt.Sprintf("%s/v1/vgpus/%d", srv.URL, slot.Index), nil)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				t.Logf("DELETE /v1/vgpus/%d: %s after %v", slot.Index, resp.Status, time.Since(detached).Round(time.Millisecond))
				O.depart()
			}
			e.waitDetached(t, "old", 15*time.Second)
			t.Logf("old tenant detached %v after the request", time.Since(detached).Round(time.Millisecond))

			// The next tenant: its first channel is the old one's physical channel.
			N := a1NextTenant(t, e, slot.Index, 71)
			N.up(t, a1Options{})
			if N.ch.ID() != id {
				t.Logf("the next tenant's first channel is %d (the old tenant's was %d)", N.ch.ID(), id)
			}
			k2 := N.newKernel(t, N.vm)
			res, resVA := N.hostPage(t)
			const small = 100000
			err := N.ch.Submit(k2.launch(0, small, resVA))
			if err == nil {
				err = N.ch.Finish()
			}
			if err != nil {
				t.Errorf("the next tenant's first channel failed: %v (the previous tenant's leftover stop hit it: issue 7 attack 8)", errText(err))
			} else if got, want := binary.LittleEndian.Uint64(res.Bytes), a1LoopValue(small); got != want {
				t.Errorf("the next tenant's kernel result is %#x, want %#x", got, want)
			}
			fillSink(N.attacker)
			if err := N.gpuCopy(N.sinkVA, N.srcVA); err != nil {
				t.Errorf("the next tenant's copy failed: %v", errText(err))
			} else if !bytes.Equal(N.sink.Bytes, N.src.Bytes) {
				t.Errorf("the next tenant's copy did not move its data")
			}
			if leaked := cv.leaks(N.sink.Bytes); len(leaked) > 0 {
				t.Errorf("the next tenant's memory holds %s", strings.Join(leaked, ", "))
			}

			// Wait for the old kernel to be over (whoever stopped it), then look
			// at the old tenant's pages.
			if !pollUntil(20*time.Second, func() bool { return e.board.Read32(nvc0.BAR0, nvc0.RegPGRAPHStatus) == 0 }) {
				t.Errorf("the compute engine is still busy 20 s after the old tenant left")
			}
			for _, g := range []uint64{gD, gD + 0x800, gR, gR + 8} {
				if w := N.vramWord(g); w != 0 {
					t.Errorf("the next tenant reads %#x at guest %#x, where the previous tenant had data", w, g)
				}
			}
			cv.check(t)
			honest.verified(t)
			cv.check(t)
		})
	}
}
