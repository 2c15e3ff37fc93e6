package tests

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"github.com/gpuvm/gpuvm/devmodel"
	"github.com/gpuvm/gpuvm/ipc"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"bytes"
	"fmt"
	"golang.org/x/sys/unix"
	"testing"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// attackModes are the attacker's virtualization modes for the page-table
// attacks: each mode shadows at a different moment (TLB flush, channel
// activation, incremental re-scan).
func attackModes() []string {
	if testing.Short() {
		return []string{"fv-incremental"}
	}
	return []string{"fv-naive", "fv-lazy", "fv-incremental"}
}

// scene is the common setup: the attacker in slot 0, the honest VM (a
// process) in slot 1, an idle victim VM (in this process) in slot 2 that
// stays attached for the whole test, so canaries in its slice stay valid.
type scene struct {
	e      *env
	a      *attacker
	honest *proc
	hv     *aggregator.VGPU
	victim aggregator.Slot
	vdev   *devmodel.Device
}

func newScene(t *testing.T, attackerMode string) *scene {
	return newSceneWith(t, attackerMode, true)
}

// newSceneWith builds the scene; without a driver the attacker is raw MMIO
// only (it may then move the PRAMIN window and BAR instances at will).
func newSceneWith(t *testing.T, attackerMode string, driver bool) *scene {
	t.Helper()
	e := newEnv(t)
	var a *attacker
	if driver {
		a = newAttacker(t, e, "attacker", 66, attackerMode)
	} else {
		dev := e.connect(t, "attacker", 66, attackerMode)
		a = &attacker{e: e, name: "attacker", dev: dev, r: raw{dev}, slot: e.vgpu("attacker").Slot}
		a.src.Bytes = pattern(0xA5, pageSize)
	}
	if a.slot.Index != 0 {
		t.Fatalf("attacker got slot %d, want 0", a.slot.Index)
	}
	p, hv := e.startHonest(t)
	if hv.Slot.Index != 1 {
		t.Fatalf("honest VM got slot %d, want 1", hv.Slot.Index)
	}
	vdev := e.connect(t, "victim", 8, "fv-naive")
	vv := e.vgpu("victim")
	if vv == nil || vv.Slot.Index != 2 {
		t.Fatalf("victim VM not in slot 2")
	}
	return &scene{e: e, a: a, honest: p, hv: hv, victim: vv.Slot, vdev: vdev}
}

// canaries plants pages in the honest VM's and the victim's slices.
func (s *scene) canaries(t *testing.T) []canary {
	H, V := s.hv.Slot.VRAM, s.victim.VRAM
	return []canary{
		s.e.plant(t, "honest slice, first page", H.Base, 0x11),
		s.e.plant(t, "honest slice, last page", H.End()-pageSize, 0x22),
		s.e.plant(t, "victim slice, first page", V.Base, 0x33),
		s.e.plant(t, "victim slice, last page", V.End()-pageSize, 0x44),
	}
}

// checkCanaries checks every canary. The honest VM's slice is scrubbed when
// it exits, so its canaries may also read all zero once it is gone; they
// must never hold anything else (the attacker's data in particular).
func (s *scene) checkCanaries(t *testing.T, cs []canary) {
	t.Helper()
	H := s.hv.Slot.VRAM
	for _, c := range cs {
		if c.phys >= H.Base && c.phys < H.End() {
			got := s.e.readVRAM(t, c.phys, pageSize)
			if bytes.Equal(got, make([]byte, pageSize)) {
				continue // scrubbed at the honest VM's teardown (which starts before it exits)
			}
			if !bytes.Equal(got, c.data) {
				t.Errorf("canary %s at VRAM %#x was modified (attacker data in it: %v)", c.name, c.phys, containsChunk(got, s.a.src.Bytes))
			}
			continue
		}
		s.e.checkCanary(t, c)
	}
}

// target is a hostile guest address and the canary it would reach if the
// aggregator forwarded it untranslated or only shifted.
type target struct {
	what string
	g    uint64
}

// TestPTEOutsideSlice: the attacker's page table maps VRAM outside its slice
// (the honest VM's slice, a free slot), as a shift of its own base, as the
// raw physical address, and as a 40-bit wrap-around. GPU copies through those
// entries must fault without reading or writing the target.
func TestPTEOutsideSlice(t *testing.T) {
	for _, mode := range attackModes() {
		t.Run(mode, func(t *testing.T) {
			s := newScene(t, mode)
			e, a := s.e, s.a
			A := a.slot.VRAM.Base
			canaries := s.canaries(t)
			var targets []target
			for _, c := range canaries {
				targets = append(targets,
					target{c.name + " (shifted)", c.phys - A},
					target{c.name + " (raw physical)", c.phys},
					target{c.name + " (40-bit wrap)", (c.phys - A) | nvc0.VASize},
				)
			}
			targets = append(targets, target{"one page past the slice", a.slot.VRAM.Size},
				target{"top of the 40-bit space", nvc0.VASize - pageSize})

			// Control: the last page of its own slice is legal and works.
			lastOwn := a.mapVRAM(t, a.slot.VRAM.Size-pageSize)
			a.controlCopies(t)
			if err := a.gpuCopy(lastOwn, a.srcVA); err != nil {
				t.Fatalf("copy to the last page of its own slice: %v", err)
			}
			if got := e.readVRAM(t, a.slot.VRAM.End()-pageSize, pageSize); !bytes.Equal(got, a.src.Bytes) {
				t.Fatalf("control copy to the attacker's last page did not land")
			}

			runPTEAttacks(t, s, targets, func(g uint64) uint64 { return a.mapVRAM(t, g) }, canaries)
			s.checkCanaries(t, canaries)
			s.honest.verified(t)
			s.checkCanaries(t, canaries)
		})
	}
}

// runPTEAttacks maps every target and tries a GPU read and a GPU write
// through each, on a fresh channel every time (a fault stops the channel).
func runPTEAttacks(t *testing.T, s *scene, targets []target, mapTarget func(g uint64) uint64, secrets []canary) {
	t.Helper()
	a := s.a
	vas := make([]uint64, len(targets))
	for i, tg := range targets {
		vas[i] = mapTarget(tg.g)
	}
	for i, tg := range targets {
		a.newChannel(t)
		fillSink(a)
		err := a.gpuCopy(a.sinkVA, vas[i])
		expectFault(t, err, fmt.Sprintf("GPU read of %s (guest %#x)", tg.what, tg.g))
		if !sinkUntouched(a) {
			leaked := false
			for _, c := range secrets {
				leaked = leaked || containsChunk(a.sink.Bytes, c.data)
			}
			t.Errorf("GPU read of %s (guest %#x) wrote into the attacker's page (leaked a canary: %v)", tg.what, tg.g, leaked)
		}
		a.newChannel(t)
		err = a.gpuCopy(vas[i], a.srcVA)
		expectFault(t, err, fmt.Sprintf("GPU write of %s (guest %#x)", tg.what, tg.g))
	}
	a.newChannel(t)
	a.controlCopies(t) // the attacker's own memory still works
}

// wrap is the 40-bit wrap-around guest address that an unchecked
// "slice base + guest address" would turn into physical address phys.
func wrap(a *attacker, phys uint64) uint64 { return (phys - a.slot.VRAM.Base) & (nvc0.VASize - 1) }

// TestPTEToReservedMemory: the aggregator's reserve (physical BAR tables,
// playlists, every shadow page table and shadow RAMIN) is below every slice,
// so a guest can only name it by wrapping the 40-bit address space. Such
// entries must be dropped; and a raw reserve address (small, hence inside
// the guest's slice) must reach the guest's own slice, never the reserve.
func TestPTEToReservedMemory(t *testing.T) {
	for _, mode := range attackModes() {
		t.Run(mode, func(t *testing.T) {
			s := newScene(t, mode)
			e, a := s.e, s.a
			R := e.layout.Reserved
			resCanary := e.plant(t, "reserve, last page", R.End()-pageSize, 0x55)
			shRAMIN := nvc0.InstDecode(e.board.Read32(nvc0.BAR0, uint64(nvc0.ChanInst(a.physChan()))))
			if !R.Contains(shRAMIN, nvc0.RAMINSize) {
				t.Fatalf("the attacker's physical channel names RAMIN %#x, not a shadow in the reserve %+v", shRAMIN, R)
			}
			shPD := uint64(le32(e.readVRAM(t, shRAMIN+nvc0.RAMINPageDir, 4)))
			before := e.readVRAM(t, R.Base, R.Size)
			targets := []target{
				{"reserve, first page (physical BAR3 RAMIN)", wrap(a, R.Base)},
				{"reserve, last page", wrap(a, resCanary.phys)},
				{"attacker's own shadow RAMIN", wrap(a, shRAMIN)},
				{"attacker's own shadow page directory", wrap(a, shPD)},
			}
			a.controlCopies(t)
			runPTEAttacks(t, s, targets, func(g uint64) uint64 { return a.mapVRAM(t, g) }, []canary{resCanary})
			e.checkCanary(t, resCanary)
			if leakIn(e.readVRAM(t, R.Base, R.Size), a.src.Bytes) {
				t.Errorf("the attacker's data reached the reserve")
			}

			// Raw reserve addresses are guest addresses inside the slice: a
			// write through them lands in the attacker's slice only.
			a.newChannel(t)
			g := shRAMIN &^ (pageSize - 1)
			va := a.mapVRAM(t, g)
			if err := a.gpuCopy(va, a.srcVA); err != nil {
				t.Fatalf("copy to guest %#x (inside its slice): %v", g, err)
			}
			if got := e.readVRAM(t, a.slot.VRAM.Base+g, pageSize); !bytes.Equal(got, a.src.Bytes) {
				t.Errorf("a write to guest %#x did not land at slice base + %#x", g, g)
			}
			if leakIn(e.readVRAM(t, R.Base, R.Size), a.src.Bytes) {
				t.Errorf("a write to guest address %#x (the physical address of a shadow RAMIN) reached the reserve", g)
			}
			_ = before
			s.honest.verified(t)
		})
	}
}

// leakIn reports whether a 64-byte chunk of secret occurs in mem.
func leakIn(mem, secret []byte) bool { return containsChunk(mem, secret) }

// TestPDEOutsideSlice: the attacker's page directory points a page table at
// another VM's memory, where a fake page table (planted host-side) maps a
// page the attacker owns. Following that PDE would let a guest use foreign
// memory as its page table: the copy must fault.
func TestPDEOutsideSlice(t *testing.T) {
	s := newScene(t, "fv-naive")
	e, a := s.e, s.a
	V := s.victim.VRAM
	// A fake small-page table in the victim's slice: entry 0 maps the
	// attacker's own page (a valid mapping, were the table the attacker's).
	fake := make([]byte, pageSize)
	lo, hi := nvc0.PTE{Present: true, Addr: a.own, Target: nvc0.TargetVRAM}.Encode()
	binary.LittleEndian.PutUint32(fake, lo)
	binary.LittleEndian.PutUint32(fake[4:], hi)
	ptPhys := V.Base + 64*pageSize
	e.writeVRAM(t, ptPhys, fake)
	a.controlCopies(t)

	pd := a.vm.PageDir()
	defer a.r.restoreWindow(a.r.saveWindow()) // the driver caches its PRAMIN window
	for i, g := range []uint64{ptPhys - a.slot.VRAM.Base, ptPhys, wrap(a, e.layout.Reserved.Base)} {
		idx := uint64(512 + i) // VA 64 GiB + i*128 MiB: unused by the driver
		w0, w1 := nvc0.PDE{SmallPresent: true, SmallAddr: g}.Encode()
		a.r.vramWrite32(pd+idx*nvc0.PDESize, w0)
		a.r.vramWrite32(pd+idx*nvc0.PDESize+4, w1)
		a.r.flushTLB(t, pd, false)
		a.newChannel(t)
		fillSink(a)
		err := a.gpuCopy(a.sinkVA, idx<<nvc0.PDEShift)
		expectFault(t, err, fmt.Sprintf("copy through a PDE naming guest %#x", g))
		if !sinkUntouched(a) {
			t.Errorf("copy through a PDE naming guest %#x moved data", g)
		}
	}
	s.honest.verified(t)
}

// TestSysmemPTEOutsideRAM: system-memory PTEs past the guest's RAM — one page
// past its end, at huge addresses, and at every guess of where another
// region of machine memory lies (a host-registered canary region standing in
// for another VM's RAM, named raw and shifted by the attacker's own base) —
// must be dropped.
func TestSysmemPTEOutsideRAM(t *testing.T) {
	for _, mode := range attackModes() {
		t.Run(mode, func(t *testing.T) {
			s := newScene(t, mode)
			e, a := s.e, s.a
			mem, err := unix.Mmap(-1, 0, 16*pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
			if err != nil {
				t.Fatal(err)
			}
			secret := pattern(0x66, len(mem))
			copy(mem, secret)
			base, err := e.board.RegisterSystemMemory(mem)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				e.board.UnregisterSystemMemory(base)
				unix.Munmap(mem)
			})
			targets := []target{
				{"one page past its RAM", guestRAM},
				{"2^39", 1 << 39},
				{"top of the 40-bit space", nvc0.VASize - pageSize},
			}
			for k := uint64(0); k*(1<<30) < base; k++ {
				if gpa := base - k*(1<<30); gpa >= guestRAM {
					targets = append(targets, target{fmt.Sprintf("canary region (machine %#x) - %d GiB", base, k), gpa})
				}
			}
			// Control: the last page of its own RAM is legal.
			last := a.mapSys(t, guestRAM-pageSize)
			a.controlCopies(t)
			if err := a.gpuCopy(last, a.srcVA); err != nil {
				t.Fatalf("copy to the last page of its own RAM: %v", err)
			}
			if !bytes.Equal(a.dev.RAM().Bytes()[guestRAM-pageSize:], a.src.Bytes) {
				t.Fatalf("control copy to the last page of its RAM did not land")
			}
			runPTEAttacks(t, s, targets, func(g uint64) uint64 { return a.mapSys(t, g) },
				[]canary{{name: "canary region", data: secret[:pageSize]}})
			if !bytes.Equal(mem, secret) {
				t.Errorf("the canary region of machine memory was written (attacker data: %v)", containsChunk(mem, a.src.Bytes))
			}
			s.honest.verified(t)
		})
	}
}

// untilDone runs attack rounds while the honest VM computes: at least
// minRounds, then until it exits (for at most 30 s).
func untilDone(p *proc, minRounds int, round func(i int)) int {
	deadline := time.Now().Add(30 * time.Second)
	i := 0
	for ; i < minRounds || (!p.exited() && time.Now().Before(deadline)); i++ {
		round(i)
	}
	return i
}

// foreignChannels are channel ids outside an 8-channel range, as a guest
// names them: the next VM's, far ones, and garbage.
var foreignChannels = []uint32{8, 9, 15, 16, 23, 24, 100, 127}

// TestForeignChannels: channel-table words, kill requests and playlist
// entries naming channel ids beyond the VM's range are denied and counted,
// reads of them leak nothing, and the honest VM's channels keep running.
func TestForeignChannels(t *testing.T) {
	s := newScene(t, "fv-naive")
	e, a := s.e, s.a
	r := a.r
	ramin := nvc0.InstEncode(a.own, nvc0.ChanInstValid|nvc0.ChanInstVRAM)
	plAddr, err := a.drv.AllocVRAM(pageSize, pageSize)
	if err != nil {
		t.Fatal(err)
	}
	playlist := []uint32{8, 0x4, 9, 0x4, 16, 0x4, 127, 0x4, 0xFFFFFFFF, 0x4, 0x80000000, 0x4}
	// Write the playlist through the driver's own path (BAR3 or PRAMIN) so its
	// cached PRAMIN window stays valid.
	plVA := a.mapVRAM(t, plAddr)
	copy(a.src.Bytes, u32bytes(playlist))
	if err := a.gpuCopy(plVA, a.srcVA); err != nil {
		t.Fatal(err)
	}
	copy(a.src.Bytes, pattern(0xA5, pageSize))

	rounds := untilDone(s.honest, 3, func(int) {
		before := e.denied(t, "attacker")
		n := uint64(0)
		for _, ch := range foreignChannels {
			r.wr(nvc0.ChanInst(int(ch)), ramin)
			r.wr(nvc0.ChanCtl(int(ch)), 0)
			r.wr(nvc0.ChanCtl(int(ch)), nvc0.ChanCtlDefault)
			if v := r.rd(nvc0.ChanInst(int(ch))); v != 0 {
				t.Errorf("read of foreign channel %d instance = %#x, want 0", ch, v)
			}
			if v := r.rd(nvc0.ChanCtl(int(ch))); v != 0 {
				t.Errorf("read of foreign channel %d control = %#x, want 0", ch, v)
			}
			r.wr(nvc0.RegChanKill, ch)
			n += 6
		}
		r.wr(nvc0.RegChanKill, 0xFFFFFFFF)
		r.wr(nvc0.RegChanKill, 0x80000008)
		n += 2
		r.wr(nvc0.RegPlaylistAddr, uint32(plAddr>>nvc0.PageShift))
		r.wr(nvc0.RegPlaylistSubmit, nvc0.PlaylistSubmitEncode(len(playlist)/2))
		r.wr(nvc0.RegPlaylistSubmit, nvc0.PlaylistSubmitEncode(nvc0.PlaylistCountMask))
		n += uint64(len(playlist)/2) + 1
		r.sync() // a round trip: every posted write above was handled
		e.expectDenied(t, "attacker", before, n, "foreign channel ids")
	})
	t.Logf("%d rounds of foreign-channel attacks during the honest run", rounds)
	// No physical channel outside the attacker's and the honest VM's ranges
	// was touched (the victim's are idle, the rest unassigned).
	for p := 2 * chansPerVM; p < nvc0.MaxChannels; p++ {
		if inst, ctl := e.board.Read32(nvc0.BAR0, uint64(nvc0.ChanInst(p))), e.board.Read32(nvc0.BAR0, uint64(nvc0.ChanCtl(p))); inst != 0 || ctl&nvc0.ChanCtlEnable != 0 {
			t.Errorf("physical channel %d (not the attacker's) was set up: instance %#x control %#x", p, inst, ctl)
		}
	}
	s.honest.verified(t)
}

func u32bytes(ws []uint32) []byte {
	b := make([]byte, 4*len(ws))
	for i, w := range ws {
		binary.LittleEndian.PutUint32(b[4*i:], w)
	}
	return b
}

// hostileVRAM lists guest VRAM addresses outside the attacker's slice that
// would reach each canary if the aggregator did not bound them.
func hostileVRAM(a *attacker, cs []canary) []target {
	var ts []target
	for _, c := range cs {
		for _, tg := range []target{{c.name + " (shifted)", c.phys - a.slot.VRAM.Base},
			{c.name + " (raw physical)", c.phys}, {c.name + " (40-bit wrap)", wrap(a, c.phys) | nvc0.VASize}} {
			// A raw reserve address is small: inside the slice, legal.
			if tg.g&(nvc0.VASize-1) >= a.slot.VRAM.Size {
				ts = append(ts, tg)
			}
		}
	}
	return append(ts, target{"one page past the slice", a.slot.VRAM.Size})
}

// TestPRAMINWindowOutsideSlice: the BAR0 PRAMIN window moved past the slice
// reads 0 and drops writes (each counted as denied); a window straddling the
// slice end works below it and stops exactly there.
func TestPRAMINWindowOutsideSlice(t *testing.T) {
	s := newSceneWith(t, "fv-naive", false)
	e, a, r := s.e, s.a, s.a.r
	cs := s.canaries(t)
	const word = 0xDEADBEEF
	// Control: its own VRAM works through the window.
	r.vramWrite32(0x100000, 0x12345678)
	if got := r.vramRead32(0x100000); got != 0x12345678 {
		t.Fatalf("PRAMIN read-back of its own VRAM = %#x: the harness is broken", got)
	}
	targets := hostileVRAM(a, cs)
	targets = append(targets, target{"window register all-ones", 0xFFFFFFFF << nvc0.PRAMINWindowShift})
	rounds := untilDone(s.honest, 1, func(int) {
		for _, tg := range targets {
			before := e.denied(t, "attacker")
			off := r.window(tg.g)
			for k := uint32(0); k < 4; k++ {
				if v := r.rd(off + 4*k); v != 0 {
					t.Errorf("PRAMIN read at %s (guest %#x) = %#x, want 0", tg.what, tg.g+uint64(4*k), v)
				}
				r.wr(off+4*k, word)
			}
			r.sync()
			e.expectDenied(t, "attacker", before, 8, "PRAMIN at "+tg.what)
		}
		// Straddling the end of the slice: the last 64 KiB is its own, the
		// next byte is the honest VM's first page.
		S := a.slot.VRAM.Size
		r.wr(nvc0.RegPRAMINWindow, uint32((S-0x10000)>>nvc0.PRAMINWindowShift))
		r.wr(nvc0.PRAMINBase+0xFFFC, word)
		if got := r.rd(nvc0.PRAMINBase + 0xFFFC); got != word {
			t.Errorf("the last word of its own slice reads %#x through PRAMIN, want %#x", got, uint32(word))
		}
		before := e.denied(t, "attacker")
		r.wr(nvc0.PRAMINBase+0x10000, word)
		if got := r.rd(nvc0.PRAMINBase + 0x10000); got != 0 {
			t.Errorf("the first word past its slice reads %#x through PRAMIN, want 0", got)
		}
		r.sync()
		e.expectDenied(t, "attacker", before, 2, "PRAMIN one word past the slice")
	})
	t.Logf("%d rounds", rounds)
	s.checkCanaries(t, cs)
	s.honest.verified(t)
	s.checkCanaries(t, cs)
}

// TestChannelInstanceOutsideSlice: channel instances (RAMIN) outside the
// slice are refused; a RAMIN inside the slice whose page directory or user
// area lies outside yields a shadow that never names foreign memory and a
// channel that cannot be enabled; copy-engine and FECS binds of instances
// that are not the VM's channels are denied.
func TestChannelInstanceOutsideSlice(t *testing.T) {
	s := newSceneWith(t, "fv-naive", false)
	e, a, r := s.e, s.a, s.a.r
	cs := s.canaries(t)
	p0 := a.slot.ChanBase
	for _, tg := range hostileVRAM(a, cs) {
		before := e.denied(t, "attacker")
		r.wr(nvc0.ChanInst(0), nvc0.InstEncode(tg.g, nvc0.ChanInstValid|nvc0.ChanInstVRAM))
		r.wr(nvc0.ChanCtl(0), nvc0.ChanCtlDefault)
		r.wr(nvc0.RegCopy0InstLo, nvc0.InstEncode(tg.g, nvc0.CopyInstValid))
		r.wr(nvc0.RegFECSData, nvc0.FECSBindValid|nvc0.InstEncode(tg.g, 0))
		r.wr(nvc0.RegFECSCmd, nvc0.FECSCmdBindPointer)
		r.sync()
		e.expectDenied(t, "attacker", before, 4, "channel instance at "+tg.what)
		inst := e.board.Read32(nvc0.BAR0, uint64(nvc0.ChanInst(p0)))
		ctl := e.board.Read32(nvc0.BAR0, uint64(nvc0.ChanCtl(p0)))
		if inst&nvc0.ChanInstValid != 0 || ctl&nvc0.ChanCtlEnable != 0 {
			t.Errorf("instance at %s: physical channel %d has instance %#x control %#x", tg.what, p0, inst, ctl)
		}
		if got := e.board.Read32(nvc0.BAR0, nvc0.RegCopy0InstLo); nvc0.InstDecode(got) == tg.g&^(pageSize-1) || nvc0.InstDecode(got) == tg.g-a.slot.VRAM.Base {
			t.Errorf("copy engine 0 bound to %#x after a bind to %s", got, tg.what)
		}
	}

	// A RAMIN in its own slice with hostile fields.
	const ramin, pdAddr = 0x200000, 0x210000
	honestShift := s.hv.Slot.VRAM.Base - a.slot.VRAM.Base
	victimShift := s.victim.VRAM.Base - a.slot.VRAM.Base
	cases := []struct {
		what     string
		pd, user uint64
	}{
		{"page directory in the honest slice, user area in the victim's", honestShift, victimShift},
		{"page directory wrapped into the reserve", wrap(a, e.layout.Reserved.Base), 0x300000},
		{"own page directory, user area in the honest slice", pdAddr, honestShift + 0x1000},
		{"own page directory, user area at the slice end", pdAddr, a.slot.VRAM.Size},
	}
	for i, c := range cases {
		ch := 1 + i
		r.vramWrite64(ramin+nvc0.RAMINPageDir, c.pd)
		r.vramWrite64(ramin+nvc0.RAMINAddrLimit, nvc0.VASize-1)
		r.vramWrite32(ramin+nvc0.RAMINUserLo, uint32(c.user))
		r.vramWrite32(ramin+nvc0.RAMINUserHi, uint32(c.user>>32))
		before := e.denied(t, "attacker")
		r.wr(nvc0.ChanInst(ch), nvc0.InstEncode(ramin, nvc0.ChanInstValid|nvc0.ChanInstVRAM))
		r.wr(nvc0.ChanCtl(ch), nvc0.ChanCtlDefault)
		r.sync()
		e.expectDenied(t, "attacker", before, 1, c.what+": enable")
		p := a.slot.ChanBase + ch
		if ctl := e.board.Read32(nvc0.BAR0, uint64(nvc0.ChanCtl(p))); ctl&nvc0.ChanCtlEnable != 0 {
			t.Errorf("%s: physical channel %d enabled (control %#x)", c.what, p, ctl)
		}
		inst := e.board.Read32(nvc0.BAR0, uint64(nvc0.ChanInst(p)))
		if inst&nvc0.ChanInstValid == 0 {
			continue // refused outright: nothing on the board
		}
		sh := nvc0.InstDecode(inst)
		if !e.layout.Reserved.Contains(sh, nvc0.RAMINSize) {
			t.Errorf("%s: physical channel %d names RAMIN %#x outside the reserve", c.what, p, sh)
			continue
		}
		blk := e.readVRAM(t, sh, nvc0.RAMINSize)
		user := uint64(le32(blk[nvc0.RAMINUserHi:]))<<32 | uint64(le32(blk[nvc0.RAMINUserLo:]))
		if !a.slot.VRAM.Contains(user, nvc0.UserAreaSize) {
			t.Errorf("%s: shadow RAMIN user area %#x is outside the attacker's slice %+v", c.what, user, a.slot.VRAM)
		}
		pd := binary.LittleEndian.Uint64(blk[nvc0.RAMINPageDir:])
		if !e.layout.Reserved.Contains(pd, nvc0.PageDirSize) {
			t.Errorf("%s: shadow RAMIN page directory %#x is outside the reserve", c.what, pd)
		}
		r.wr(nvc0.ChanInst(ch), 0)
	}
	s.checkCanaries(t, cs)
	s.honest.verified(t)
}

// TestBARPageTableOutsideSlice: the guest's BAR3 page table (built by hand
// through PRAMIN) maps foreign VRAM and system memory past its RAM; CPU reads
// through those aperture pages return 0 and writes never land. Aperture
// offsets beyond the VM's BAR slices are denied. Run with and without BAR
// remap (remapped pages bypass the trap).
func TestBARPageTableOutsideSlice(t *testing.T) {
	modes := []string{"fv-naive", "fv-optimized"}
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			s := newSceneWith(t, mode, false)
			e, a, r := s.e, s.a, s.a.r
			cs := s.canaries(t)
			resCanary := e.plant(t, "reserve, last page", e.layout.Reserved.End()-pageSize, 0x77)
			cs = append(cs, resCanary)
			const ramin, pd, pt, own = 0x300000, 0x310000, 0x340000, 0x400000
			targets := hostileVRAM(a, cs)
			r.vramWrite64(ramin+nvc0.RAMINPageDir, pd)
			r.vramWrite64(ramin+nvc0.RAMINAddrLimit, bar3PerVM-1)
			w0, w1 := nvc0.PDE{SmallPresent: true, SmallAddr: pt}.Encode()
			r.vramWrite(pd, []uint32{w0, w1})
			var ptes []uint32
			add := func(p nvc0.PTE) {
				lo, hi := p.Encode()
				ptes = append(ptes, lo, hi)
			}
			add(nvc0.PTE{Present: true, Addr: own, Target: nvc0.TargetVRAM})
			for _, tg := range targets {
				add(nvc0.PTE{Present: true, Addr: tg.g &^ (pageSize - 1), Target: nvc0.TargetVRAM})
			}
			for _, gpa := range []uint64{guestRAM, 1 << 39} {
				add(nvc0.PTE{Present: true, Addr: gpa, Target: nvc0.TargetSysSnooped})
			}
			r.vramWrite(pt, ptes)
			r.vramWrite32(own, 0xC0FFEE00)
			r.wr(nvc0.RegBAR3Inst, nvc0.InstEncode(ramin, nvc0.BARInstValid|nvc0.BARInstBAR3Bit))
			r.flushTLB(t, pd, true)
			bar := func(off uint64) uint32 { return a.dev.Read32(nvc0.BAR3, off) }
			if got := bar(0); got != 0xC0FFEE00 {
				t.Fatalf("control: BAR3 page 0 maps its own page and reads %#x, want 0xc0ffee00", got)
			}
			pages := uint64(len(ptes) / 2)
			rounds := untilDone(s.honest, 1, func(int) {
				for i := uint64(1); i < pages; i++ {
					for _, off := range []uint64{0, 4, pageSize - 4} {
						if got := bar(i*pageSize + off); got != 0 {
							t.Errorf("BAR3 page %d (hostile PTE %d) reads %#x at +%#x, want 0", i, i, got, off)
						}
						a.dev.Write32(nvc0.BAR3, i*pageSize+off, 0xBADC0DE)
					}
				}
				// Offsets beyond its BAR slices.
				before := e.denied(t, "attacker")
				for _, b := range []struct {
					bar  int
					size uint64
				}{{nvc0.BAR1, bar1PerVM}, {nvc0.BAR3, bar3PerVM}} {
					for _, off := range []uint64{b.size, b.size + pageSize, 2*b.size - 4} {
						if got := a.dev.Read32(b.bar, off); got != 0 {
							t.Errorf("BAR%d offset %#x (past its %d MiB slice) reads %#x", b.bar, off, b.size>>20, got)
						}
						a.dev.Write32(b.bar, off, 0xBADC0DE)
					}
				}
				r.sync()
				e.expectDenied(t, "attacker", before, 12, "aperture offsets past the BAR slices")
			})
			t.Logf("%d rounds", rounds)
			// A BAR instance outside the slice maps nothing.
			for _, tg := range targets {
				r.wr(nvc0.RegBAR3Inst, nvc0.InstEncode(tg.g, nvc0.BARInstValid|nvc0.BARInstBAR3Bit))
				r.flushTLB(t, tg.g, true)
				if got := bar(0); got != 0 {
					t.Errorf("BAR3 instance at %s: page 0 reads %#x, want 0", tg.what, got)
				}
			}
			s.checkCanaries(t, cs)
			s.honest.verified(t)
			s.checkCanaries(t, cs)
		})
	}
}

// TestDeniedRegisters: writes a VM may not make — PMC_ENABLE (engines off for
// everyone), PTIMER, unknown offsets, FECS commands other than a bind of its
// own channel — are denied and counted and change nothing on the board; the
// honest VM keeps computing.
func TestDeniedRegisters(t *testing.T) {
	s := newSceneWith(t, "fv-naive", false)
	e, r := s.e, s.a.r
	unknown := []uint32{0x000004, 0x000140, 0x001000, 0x00C000, 0x022400, 0x100000, 0x610000, 0x1FFFFFC}
	rounds := untilDone(s.honest, 2, func(int) {
		before := e.denied(t, "attacker")
		n := uint64(0)
		r.wr(nvc0.RegPMCEnable, 0) // emulated per VM: must not reach the board
		r.wr(nvc0.RegTimerLow, 0)
		r.wr(nvc0.RegTimerHigh, 0xFFFFFFFF)
		n += 2
		for _, off := range unknown {
			r.wr(off, 0xFFFFFFFF)
			if v := r.rd(off); v != 0 {
				t.Errorf("read of unknown register %#x = %#x, want 0", off, v)
			}
			n += 2
		}
		for _, cmd := range []uint32{0, 1, 2, 4, 0xFFFFFFFF} {
			r.wr(nvc0.RegFECSData, nvc0.FECSBindValid|0x1234)
			r.wr(nvc0.RegFECSCmd, cmd)
			n++
		}
		r.sync()
		e.expectDenied(t, "attacker", before, n, "denied registers")
		if v := e.board.Read32(nvc0.BAR0, nvc0.RegPMCEnable); v != 0xFFFFFFFF {
			t.Errorf("board PMC_ENABLE = %#x after a guest wrote 0", v)
		}
		if hi := e.board.Read32(nvc0.BAR0, nvc0.RegTimerHigh); hi == 0xFFFFFFFF {
			t.Errorf("a guest PTIMER write reached the board (timer high word %#x)", hi)
		}
		if st := r.rd(nvc0.RegFECSStatus); st&nvc0.FECSDone != 0 {
			r.wr(nvc0.RegFECSClear, st)
			t.Errorf("a denied FECS command reported done")
		}
	})
	t.Logf("%d rounds", rounds)
	s.honest.verified(t)
}

// TestMMIOFlood: an attacker posting writes and reads as fast as it can does
// not stop the honest VM, and the aggregator keeps serving: a new VM attaches
// and gets answers while the flood runs.
func TestMMIOFlood(t *testing.T) {
	s := newSceneWith(t, "fv-naive", false)
	e, a := s.e, s.a
	s.vdev.Close() // free a slot for the probe VM
	e.waitDetached(t, "victim", 10*time.Second)
	n := 200000
	limit := 15 * time.Second
	if testing.Short() {
		n, limit = 50000, 5*time.Second
	}
	type result struct {
		sent int
		took time.Duration
	}
	done := make(chan result, 1)
	before := e.vgpu("attacker").Counters()
	go func() {
		start := time.Now()
		i := 0
		for ; (i < n || !s.honest.exited()) && time.Since(start) < limit; i++ {
			switch i % 8 {
			case 7:
				a.dev.Read32(nvc0.BAR0, nvc0.RegBoot0)
			case 3:
				a.dev.Write32(nvc0.BAR0, nvc0.PRAMINBase+uint64(i%0x1000)*4, uint32(i))
			default:
				a.dev.Write32(nvc0.BAR0, 0x001000, uint32(i)) // denied
			}
		}
		a.dev.Read32(nvc0.BAR0, nvc0.RegBoot0)
		done <- result{i, time.Since(start)}
	}()
	// The aggregator stays responsive during the flood.
	probeStart := time.Now()
	probe := e.connect(t, "probe", 9, "fv-naive")
	if v := probe.Read32(nvc0.BAR0, nvc0.RegBoot0); v != nvc0.Boot0Value {
		t.Errorf("a VM attached during the flood reads BOOT0 %#x", v)
	}
	if d := time.Since(probeStart); d > 5*time.Second {
		t.Errorf("attaching a VM during the flood took %v", d)
	}
	t.Logf("a new VM attached and answered in %v during the flood", time.Since(probeStart).Round(time.Millisecond))
	probe.Close()
	res := <-done
	after := e.vgpu("attacker").Counters()
	t.Logf("flood: %d accesses in %v (%.0f/s); attacker BAR0 writes %d, denied %d", res.sent, res.took.Round(time.Millisecond),
		float64(res.sent)/res.took.Seconds(), after.BAR0Writes-before.BAR0Writes, after.Denied-before.Denied)
	if after.BAR0Writes-before.BAR0Writes < uint64(res.sent*6/8) {
		t.Errorf("the aggregator handled %d of the flood's ~%d writes", after.BAR0Writes-before.BAR0Writes, res.sent*6/8)
	}
	if err := a.dev.Err(); err != nil {
		t.Errorf("the flooding VM's own connection failed: %v", err)
	}
	s.honest.verified(t)
}

// TestVMBeyondCapacity: with every slot taken, another VM is refused with a
// clear reason (and nothing else changes).
func TestVMBeyondCapacity(t *testing.T) {
	e := newEnv(t)
	for i := range maxVMs {
		e.connect(t, fmt.Sprintf("vm%d", i), uint32(10+i), "fv-naive")
	}
	_, err := e.tryConnect("one-too-many", 20, "fv-naive")
	var rej *ipc.RejectedError
	if !errors.As(err, &rej) {
		t.Fatalf("VM beyond capacity: %v, want an ipc.RejectedError", err)
	}
	if !strings.Contains(rej.Reason, "slot") {
		t.Errorf("refusal reason %q does not say that no slot is free", rej.Reason)
	}
	if n := len(e.agg.VGPUs()); n != maxVMs {
		t.Errorf("%d vGPUs after the refusal, want %d", n, maxVMs)
	}
	_, err = e.tryConnect("bad-mode", 21, "fv-warp")
	if !errors.As(err, &rej) || !strings.Contains(rej.Reason, "fv-warp") {
		t.Errorf("unknown mode: %v, want a refusal naming the mode", err)
	}
}

// helloBytes encodes a Hello (docs/protocol.md §4.1).
func helloBytes(version uint16, transport uint32, ramSize uint64, name, mode string, nExtra byte) []byte {
	b := make([]byte, 128)
	binary.LittleEndian.PutUint32(b, 0x4D565047)
	binary.LittleEndian.PutUint16(b[4:], 1)
	binary.LittleEndian.PutUint16(b[6:], version)
	binary.LittleEndian.PutUint32(b[8:], 42)
	binary.LittleEndian.PutUint32(b[12:], transport)
	binary.LittleEndian.PutUint64(b[16:], ramSize)
	b[24], b[25], b[26] = byte(len(name)), byte(len(mode)), nExtra
	copy(b[32:], name)
	copy(b[96:], mode)
	return b
}

// rawConn is a hand-made device-model connection.
type rawConn struct {
	c   *net.UnixConn
	ram *os.File
}

func rawDial(t *testing.T, e *env) *rawConn {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: e.sock, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ram, err := ipc.CreateMemfd("raw-ram", guestRAM)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ram.Close() })
	return &rawConn{c: c, ram: ram}
}

func (rc *rawConn) send(t *testing.T, b []byte, files ...*os.File) {
	t.Helper()
	var oob []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := rc.c.WriteMsgUnix(b, oob, nil); err != nil {
		t.Fatalf("send: %v", err)
	}
}

// recv reads one message: its type, reason (Reject/Bye), fds; eof when closed.
func (rc *rawConn) recv(t *testing.T) (typ uint16, reason string, fds []int, eof bool) {
	t.Helper()
	rc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf, oob := make([]byte, 4096), make([]byte, 1024)
	n, oobn, _, _, err := rc.c.ReadMsgUnix(buf, oob)
	if err != nil || n == 0 {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("the server neither answered nor closed the connection within 10 s")
		}
		return 0, "", nil, true
	}
	if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for _, m := range msgs {
			if f, err := unix.ParseUnixRights(&m); err == nil {
				fds = append(fds, f...)
			}
		}
	}
	typ = binary.LittleEndian.Uint16(buf[4:])
	if (typ == 3 || typ == 4) && n >= 16 {
		l := int(binary.LittleEndian.Uint16(buf[8:]))
		reason = string(buf[16 : 16+min(l, n-16)])
	}
	return typ, reason, fds, false
}

// expectClosedWith checks the server answered typ (Reject 3 / Bye 4) with a
// reason and then closed the connection.
func (rc *rawConn) expectClosedWith(t *testing.T, what string, typ uint16) string {
	t.Helper()
	got, reason, fds, eof := rc.recv(t)
	for _, fd := range fds {
		unix.Close(fd)
	}
	if eof {
		t.Errorf("%s: the server closed without a Reject/Bye", what)
		return ""
	}
	if got != typ || reason == "" {
		t.Errorf("%s: got message type %d reason %q, want type %d with a reason", what, got, reason, typ)
	}
	if _, _, _, eof := rc.recv(t); !eof {
		t.Errorf("%s: the connection stayed open after the refusal", what)
	}
	return reason
}

// TestMalformedIPC: garbage, truncated, oversized and inconsistent hellos,
// and hostile traffic after the handshake (shm ring indices, garbage ring
// entries, truncated and oversized socket frames) end only that connection;
// its vGPU (if any) is torn down; the honest VM is unaffected and the
// aggregator keeps accepting VMs.
func TestMalformedIPC(t *testing.T) {
	e := newEnv(t)
	honest, _ := e.startHonest(t)
	valid := func() []byte { return helloBytes(1, 1, guestRAM, "evil", "fv-naive", 0) }
	garbage := pattern(0x99, 128)
	oversized := append(valid(), make([]byte, 64<<10)...)
	wrongVersion := helloBytes(7, 1, guestRAM, "evil", "fv-naive", 0)
	badReserved := valid()
	badReserved[30] = 1
	tooBig := helloBytes(1, 1, 2*guestRAM, "evil", "fv-naive", 0)
	extraMissing := helloBytes(1, 1, guestRAM, "evil", "fv-naive", 3)
	badName := helloBytes(1, 1, guestRAM, "ev/il\x01", "fv-naive", 0)
	unsealed, err := os.CreateTemp("", "not-a-memfd")
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(unsealed.Name())
	unsealed.Truncate(guestRAM)
	cases := []struct {
		name  string
		msg   []byte
		files func(rc *rawConn) []*os.File
	}{
		{"garbage hello", garbage, nil},
		{"truncated hello", valid()[:40], nil},
		{"oversized packet", oversized, nil},
		{"wrong version", wrongVersion, nil},
		{"non-zero reserved byte", badReserved, nil},
		{"RAM size beyond the memfd", tooBig, nil},
		{"fewer fds than announced", extraMissing, nil},
		{"bad name", badName, nil},
		{"no fd", valid(), func(*rawConn) []*os.File { return nil }},
		{"RAM not a memfd", valid(), func(*rawConn) []*os.File { return []*os.File{unsealed} }},
	}
	for _, c := range cases {
		rc := rawDial(t, e)
		files := []*os.File{rc.ram}
		if c.files != nil {
			files = c.files(rc)
		}
		rc.send(t, c.msg, files...)
		reason := rc.expectClosedWith(t, c.name, 3)
		t.Logf("%s: refused: %s", c.name, reason)
	}
	// A client that connects and hangs up.
	rc := rawDial(t, e)
	rc.c.Close()

	// Hostile traffic after a valid handshake.
	welcome := func(transport uint32) (*rawConn, []int) {
		rc := rawDial(t, e)
		rc.send(t, helloBytes(1, transport, guestRAM, "evil", "fv-naive", 0), rc.ram)
		typ, reason, fds, eof := rc.recv(t)
		if eof || typ != 2 {
			t.Fatalf("valid hello: type %d reason %q eof %v, want a Welcome", typ, reason, eof)
		}
		e.waitAttached(t, "evil", nil)
		return rc, fds
	}
	shmCase := func(what string, evil func(ring []byte)) {
		rc, fds := welcome(1)
		if len(fds) < 1 {
			t.Fatalf("shm Welcome without a ring fd")
		}
		var st unix.Stat_t
		unix.Fstat(fds[0], &st)
		ring, err := unix.Mmap(fds[0], 0, int(st.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		for _, fd := range fds {
			unix.Close(fd)
		}
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Munmap(ring)
		evil(ring)
		// Wake the server (it also re-checks every 250 ms).
		unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(&ring[0x140])), 1, 1<<30, 0, 0, 0)
		reason := rc.expectClosedWith(t, what, 4)
		t.Logf("%s: Bye: %s", what, reason)
		e.waitDetached(t, "evil", 10*time.Second)
	}
	shmCase("ring producer index far ahead", func(ring []byte) {
		n := binary.LittleEndian.Uint32(ring[0x10:])
		atomic.StoreUint32((*uint32)(unsafe.Pointer(&ring[0x40])), n+5)
	})
	shmCase("garbage ring entry", func(ring []byte) {
		copy(ring[0x1000:0x1040], pattern(0x31, 64))
		atomic.StoreUint32((*uint32)(unsafe.Pointer(&ring[0x40])), 1)
	})
	shmCase("ring entry with BAR 2", func(ring []byte) {
		ent := make([]byte, 64)
		binary.LittleEndian.PutUint16(ent, 1)
		binary.LittleEndian.PutUint16(ent[2:], 2)
		copy(ring[0x1000:], ent)
		atomic.StoreUint32((*uint32)(unsafe.Pointer(&ring[0x40])), 1)
	})
	for _, c := range []struct {
		what  string
		frame []byte
	}{
		{"truncated socket frame", make([]byte, 10)},
		{"oversized socket frame", make([]byte, 4096)},
		{"socket frame with an unknown kind", append([]byte{0x77, 0x77}, make([]byte, 62)...)},
	} {
		rc, fds := welcome(2)
		for _, fd := range fds {
			unix.Close(fd)
		}
		rc.send(t, c.frame)
		reason := rc.expectClosedWith(t, c.what, 4)
		t.Logf("%s: Bye: %s", c.what, reason)
		e.waitDetached(t, "evil", 10*time.Second)
	}
	// Still accepting, with every slot but the honest VM's free again.
	for i := range maxVMs - 1 {
		d := e.connect(t, fmt.Sprintf("after%d", i), uint32(30+i), "fv-naive")
		if v := d.Read32(nvc0.BAR0, nvc0.RegBoot0); v != nvc0.Boot0Value {
			t.Errorf("a VM attached after the hostile clients reads BOOT0 %#x", v)
		}
	}
	honest.verified(t)
}

// allZero reports whether VRAM [base, base+size) reads all zero (host-side),
// and the first non-zero address otherwise.
func allZero(t *testing.T, e *env, base, size uint64) (bool, uint64) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for off := uint64(0); off < size; off += uint64(len(buf)) {
		if err := e.board.ReadVRAM(buf, base+off); err != nil {
			t.Fatal(err)
		}
		for i, b := range buf {
			if b != 0 {
				return false, base + off + uint64(i)
			}
		}
	}
	return true, 0
}

// TestKilledDeviceModel: a VM process SIGKILLed while it computes loses its
// vGPU (gone from the aggregator and the control API), its channels are off
// the board, and its slice is scrubbed: the next tenant of the slot reads
// zeros where the killed VM had data. The honest VM keeps computing.
func TestKilledDeviceModel(t *testing.T) {
	e := newEnv(t)
	honest, _ := e.startHonest(t)
	victim := e.startVM(t, "doomed", 12, "fv-naive", []string{"--workloads", "madd,cpy", "--runs", "100000", "--matrix-dim", "64", "--copy-size", "1MiB"})
	v := e.waitAttached(t, "doomed", victim)
	slot := v.Slot
	deadline := time.Now().Add(20 * time.Second)
	for v.Counters().Doorbells < 20 && time.Now().Before(deadline) && !victim.exited() {
		time.Sleep(5 * time.Millisecond)
	}
	if victim.exited() || v.Counters().Doorbells < 20 {
		t.Fatalf("the doomed VM never got going (exited %v)\nstderr:\n%s", victim.exited(), victim.stderr())
	}
	// Its own data, plus a known pattern at the top of its slice.
	secret := pattern(0xE7, 64<<10)
	secretAt := slot.VRAM.End() - 1<<20
	e.writeVRAM(t, secretAt, secret)
	if zero, _ := allZero(t, e, slot.VRAM.Base, slot.VRAM.Size-1<<20); zero {
		t.Fatalf("the doomed VM wrote nothing to its slice: the scrub check below would prove nothing")
	}
	victim.cmd.Process.Signal(syscall.SIGKILL)
	<-victim.done
	killed := time.Now()
	e.waitDetached(t, "doomed", 10*time.Second)
	t.Logf("vGPU torn down %v after SIGKILL", time.Since(killed).Round(time.Millisecond))

	srv := httptest.NewServer(e.agg.ControlHandler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/v1/vgpus")
	if err != nil {
		t.Fatal(err)
	}
	var infos []aggregator.VGPUInfo
	err = json.NewDecoder(resp.Body).Decode(&infos)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range infos {
		if in.Name == "doomed" {
			t.Errorf("the control API still lists the killed VM: %+v", in)
		}
	}
	for i := range slot.Chans {
		p := slot.ChanBase + i
		if inst, ctl := e.board.Read32(nvc0.BAR0, uint64(nvc0.ChanInst(p))), e.board.Read32(nvc0.BAR0, uint64(nvc0.ChanCtl(p))); inst != 0 || ctl&nvc0.ChanCtlEnable != 0 {
			t.Errorf("physical channel %d of the killed VM: instance %#x control %#x", p, inst, ctl)
		}
	}
	if zero, at := allZero(t, e, slot.VRAM.Base, slot.VRAM.Size); !zero {
		t.Errorf("the killed VM's slice is not scrubbed: VRAM %#x is non-zero", at)
	}
	// The next tenant gets the same slot and sees zeros.
	// The next tenant of the slot (the honest VM may have finished and freed
	// another slot meanwhile: attach until one lands in the killed VM's).
	var next *devmodel.Device
	for i := 0; i < maxVMs && next == nil; i++ {
		name := fmt.Sprintf("next%d", i)
		d := e.connect(t, name, uint32(13+i), "fv-naive")
		if nv := e.vgpu(name); nv != nil && nv.Slot.Index == slot.Index {
			next = d
		}
	}
	if next == nil {
		t.Fatalf("no new tenant got the freed slot %d", slot.Index)
	}
	r := raw{next}
	for _, g := range []uint64{secretAt - slot.VRAM.Base, secretAt - slot.VRAM.Base + 0x8000, 1 << 20, 2 << 20, 8 << 20} {
		for k := uint64(0); k < 4; k++ {
			if got := r.vramRead32(g + 4*k); got != 0 {
				t.Errorf("the next tenant reads %#x at guest %#x: the killed VM's data", got, g+4*k)
			}
		}
	}
	honest.verified(t)
}

// TestStaleRemapMapping: with BAR remap, a device model receives its VRAM
// slice's memfd and maps it. After it disconnects (its vGPU torn down, the
// slot given to the next VM), that mapping must not reach the next tenant's
// VRAM.
func TestStaleRemapMapping(t *testing.T) {
	e := newEnv(t)
	ram, err := ipc.CreateMemfd("evil-ram", guestRAM)
	if err != nil {
		t.Fatal(err)
	}
	defer ram.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, w, extra, err := ipc.Dial(ctx, e.sock, ipc.Hello{DomID: 50, Name: "evil", Mode: "fv-bar-remap", RAMSize: guestRAM, Transport: ipc.TransportShm}, ram, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if w.Params[ipc.ParamRemap] != "1" || len(extra) != 2 {
		t.Fatalf("remap mode: params %v, %d extra files", w.Params, len(extra))
	}
	slot := e.vgpu("evil").Slot
	slice, err := unix.Mmap(int(extra[1].Fd()), 0, int(slot.VRAM.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	for _, f := range extra {
		f.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(slice)
	c.Close()
	e.waitDetached(t, "evil", 10*time.Second)

	next := e.connect(t, "next", 51, "fv-naive")
	if nv := e.vgpu("next"); nv == nil || nv.Slot.Index != slot.Index {
		t.Fatalf("the next tenant did not get slot %d", slot.Index)
	}
	r := raw{next}
	const g = 0x500000
	r.vramWrite32(g, 0x5EC2E7)
	r.sync()
	readByOld := binary.LittleEndian.Uint32(slice[g:])
	binary.LittleEndian.PutUint32(slice[g+4:], 0xBAD)
	writtenByOld := r.vramRead32(g + 4)
	if readByOld == 0x5EC2E7 || writtenByOld == 0xBAD {
		t.Fatalf("a disconnected remap-mode device model keeps read-write access to its old VRAM slice: "+
			"the next tenant's write of 0x5ec2e7 at guest %#x read %#x through the stale mapping, and the stale mapping's "+
			"write reads back %#x in the next tenant (aggregator/serve.go sliceFile + gpu/sim ScrubVRAM: the segment memfd "+
			"is reused across tenants; scrubbing punches holes but does not revoke other processes' mappings)",
			g, readByOld, writtenByOld)
	}
}
