package tests

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"golang.org/x/sys/unix"
)

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
