package tests

import (
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// Isolation tests of the Fermi ABI (issue 9): the engine context pointers a
// channel's RAMIN holds, the registers that carry physical addresses
// outside the page tables, and a kill of a busy channel.

// TestEngineContextInRAMIN: copy engines find their context through RAMIN
// +0x230/+0x240 (and GR through +0x210), which the engine loads and saves
// (TestEngineContexts in gpu/sim shows a physical pointer there writes the
// VRAM it names). A guest that points them at another VM's memory — a
// physical address, bit 2 clear — has the channel refused; the copy engines
// never save into that memory; what the copy engines' CHANNEL_CUR shows a
// guest is only ever its own channel.
func TestEngineContextInRAMIN(t *testing.T) {
	s := newScene(t, "fv-naive")
	e, a := s.e, s.a
	cs := s.canaries(t)
	a.controlCopies(t) // the driver's virtual context pointers work

	// CHANNEL_CUR, as the guest reads it: its own instance, or nothing.
	own := a.r.rd(nvc0.ChanInst(a.ch.ID()))
	for i := range 2000 {
		if i%200 == 0 {
			a.controlCopies(t)
		}
		for _, off := range []uint32{nvc0.RegCE0ChanCur, nvc0.RegCE1ChanCur, nvc0.RegFECSChanAddr} {
			v := a.r.rd(off)
			if v != 0 && nvc0.InstDecode(v) != nvc0.InstDecode(own) {
				t.Fatalf("register %#x reads %#x: not the guest's own channel (instance %#x)", off, v, own)
			}
		}
	}
	if phys := e.board.Read32(nvc0.BAR0, nvc0.RegCE0ChanCur); nvc0.InstDecode(phys) < e.layout.Reserved.Base ||
		nvc0.InstDecode(phys) >= e.layout.Reserved.End() {
		t.Errorf("the board's CE0 CHANNEL_CUR %#x does not name a shadow RAMIN in the reserve", phys)
	}

	g := a.inspectChannel(t)
	for _, tg := range hostileVRAM(a, cs) {
		for _, off := range []uint64{nvc0.RAMINEngineCE0, nvc0.RAMINEngineCE1, nvc0.RAMINEngineGR} {
			// The channel is rebuilt for each try: a refused one stays off.
			a.newChannel(t)
			g = a.inspectChannel(t)
			w := a.r.saveWindow()
			a.r.wr(nvc0.ChanCtl(g.id), 0) // disable: a RAMIN change applies at the next enable
			a.r.vramWrite32(g.ramin+off, uint32(tg.g)&nvc0.RAMINEngineAddrMask)
			a.r.vramWrite32(g.ramin+off+4, uint32(tg.g>>32))
			a.r.restoreWindow(w)
			before := e.denied(t, "attacker")
			a.r.wr(nvc0.ChanCtl(g.id), nvc0.ChanCtlDefault)
			a.r.sync()
			e.expectDenied(t, "attacker", before, 1, "enable with a physical context pointer at "+tg.what)
			if ctl := e.board.Read32(nvc0.BAR0, uint64(nvc0.ChanCtl(a.slot.ChanBase+g.id))); ctl&nvc0.ChanCtlEnable != 0 {
				t.Errorf("context pointer +%#x at %s: the physical channel was enabled (%#x)", off, tg.what, ctl)
				// Show the damage: the engine saves its context there.
				_ = a.gpuCopy(a.ownVA, a.srcVA)
				_ = a.ch.Submit(newKernelPage(t, a).loopLaunch(0, 1, 0))
				_ = a.ch.Finish()
			}
		}
	}
	// A running channel whose RAMIN is rewritten keeps the context it was
	// enabled with: the rewrite applies (and is refused) only at the next
	// enable.
	a.newChannel(t)
	g = a.inspectChannel(t)
	a.controlCopies(t)
	w := a.r.saveWindow()
	a.r.vramWrite32(g.ramin+nvc0.RAMINEngineCE0, uint32(cs[2].phys)&nvc0.RAMINEngineAddrMask)
	a.r.vramWrite32(g.ramin+nvc0.RAMINEngineCE0+4, uint32(cs[2].phys>>32))
	a.r.restoreWindow(w)
	a.controlCopies(t)
	s.checkCanaries(t, cs)
	s.honest.verified(t)
}

// TestAddressRegistersConfined: every register that carries a physical
// address outside the page tables (ABI item 10) is translated, emulated or
// denied: a foreign or out-of-slice address a guest writes never reaches
// the board.
func TestAddressRegistersConfined(t *testing.T) {
	s := newScene(t, "fv-naive")
	e, a, r := s.e, s.a, s.a.r
	cs := s.canaries(t)
	rd := func(off uint32) uint32 { return e.board.Read32(nvc0.BAR0, uint64(off)) }
	boardBefore := map[uint32]uint32{}
	for _, off := range []uint32{nvc0.RegSysmemFlushPage, nvc0.RegGPCMMUDebugWr, nvc0.RegGPCMMUDebugRd, nvc0.RegFECSChanNext,
		nvc0.RegFECSReglistData, nvc0.RegCE0ChanNext, nvc0.RegCE1ChanNext} {
		boardBefore[off] = rd(off)
	}
	fecsBefore := e.board.FECSAddresses()
	// The honest VM binds its own channels meanwhile: what FECS holds must
	// only ever be a shadow RAMIN in the reserve (or nothing).
	inReserve := func(inst uint32) bool {
		a := nvc0.InstDecode(inst)
		return inst == 0 || a >= e.layout.Reserved.Base && a < e.layout.Reserved.End()
	}
	checkFECS := func(what string) {
		t.Helper()
		got := e.board.FECSAddresses()
		if !inReserve(got.Bound) || !inReserve(got.Golden) || got.ReglistInst != fecsBefore.ReglistInst ||
			got.ReglistVA != fecsBefore.ReglistVA || got.CtxswOff || got.Halted {
			t.Fatalf("%s reached FECS: %+v (before %+v)", what, got, fecsBefore)
		}
	}

	for _, tg := range hostileVRAM(a, cs) {
		// Emulated: the guest reads back what it wrote; the board keeps its own.
		for _, off := range []uint32{nvc0.RegSysmemFlushPage, nvc0.RegGPCMMUDebugWr, nvc0.RegGPCMMUDebugRd, nvc0.RegFECSReglistData} {
			val := uint32(tg.g >> 8)
			r.wr(off, val)
			if got := r.rd(off); got != val {
				t.Errorf("%#x: the guest reads back %#x after writing %#x", off, got, val)
			}
		}
		// Denied writes: the engines' channel registers.
		before := e.denied(t, "attacker")
		for _, off := range []uint32{nvc0.RegFECSChanAddr, nvc0.RegFECSChanNext, nvc0.RegCE0ChanCur, nvc0.RegCE0ChanNext,
			nvc0.RegCE1ChanCur, nvc0.RegCE1ChanNext} {
			r.wr(off, nvc0.InstEncode(tg.g, nvc0.CEChanValid|nvc0.FECSChanValid))
		}
		r.sync()
		e.expectDenied(t, "attacker", before, 6, "engine channel registers at "+tg.what)

		// FECS commands that carry an instance: only the guest's own
		// channels; every other command that names memory or acts for
		// every VM is denied.
		before = e.denied(t, "attacker")
		for _, cmd := range []uint32{nvc0.FECSCmdSetChan, nvc0.FECSCmdBindPointer, nvc0.FECSCmdWFIGoldenSave,
			nvc0.FECSCmdReglistInst, nvc0.FECSCmdReglistVA, nvc0.FECSCmdHalt, nvc0.FECSCmdStopCtxsw} {
			r.wr(nvc0.RegFECSData, nvc0.InstEncode(tg.g, nvc0.FECSBindValid))
			r.wr(nvc0.RegFECSReglistData, nvc0.InstEncode(tg.g, nvc0.FECSBindValid))
			r.wr(nvc0.RegFECSCmd, cmd)
		}
		r.sync()
		e.expectDenied(t, "attacker", before, 7, "FECS commands at "+tg.what)
		checkFECS("FECS commands with " + tg.what)
	}
	for off, was := range boardBefore {
		if got := rd(off); got != was {
			t.Errorf("board register %#x changed from %#x to %#x", off, was, got)
		}
	}

	// The guest's own channel: a bind names its shadow (in the reserve),
	// and CHAN_ADDR then reads the guest's own instance.
	own := r.rd(nvc0.ChanInst(a.ch.ID()))
	r.wr(nvc0.RegFECSClear, nvc0.FECSDone)
	r.wr(nvc0.RegFECSData, nvc0.InstEncode(nvc0.InstDecode(own), nvc0.FECSBindValid))
	r.wr(nvc0.RegFECSCmd, nvc0.FECSCmdWFIGoldenSave)
	if r.rd(nvc0.RegFECSStatus)&nvc0.FECSDone == 0 {
		t.Error("the golden save of the guest's own channel did not complete")
	}
	if g := nvc0.InstDecode(e.board.FECSAddresses().Golden); g < e.layout.Reserved.Base || g >= e.layout.Reserved.End() {
		t.Errorf("the golden save reached the board with %#x, not a shadow RAMIN in the reserve", g)
	}
	// Size queries get the board's answer; the older VRAM size register
	// reads the slice.
	r.wr(nvc0.RegFECSStatus, 0)
	r.wr(nvc0.RegFECSCmd, nvc0.FECSCmdImageSize)
	if got := r.rd(nvc0.RegFECSStatus); got == 0 {
		t.Error("FECS image-size query answered 0")
	}
	if got := uint64(r.rd(nvc0.RegVRAMPartSizeOld)) * uint64(r.rd(nvc0.RegMemLTCCount)) << 20; got != a.slot.VRAM.Size {
		t.Errorf("0x10f20c × 0x121c74 = %#x, slice is %#x", got, a.slot.VRAM.Size)
	}
	a.controlCopies(t)
	s.checkCanaries(t, cs)
	s.honest.verified(t)
}

// TestKillBusyChannelBeforeReuse: a VM destroyed while its channel runs a
// kernel that would never end on its own: when teardown returns, the GPU
// runs nothing of it — the compute engine is idle, the physical channels
// are off the board — and the next tenant of the slot gets a working GPU.
func TestKillBusyChannelBeforeReuse(t *testing.T) {
	e := newEnv(t)
	a := newAttacker(t, e, "doomed", 70, "fv-naive")
	k := newKernelPage(t, a)
	k.controlKernel(t, a)
	g := a.inspectChannel(t)
	p := a.put(g)
	w0, w1 := k.push(0, k.loopLaunch(1, nvc0.MaxKernelLoopIterations, k.resultVA(1)))
	a.writeGPFIFO(t, g, p, w0, w1)
	a.ring(g, (p+1)%g.entries)
	phys := a.slot.ChanBase + g.id
	onGR := func() bool {
		st := e.board.Read32(nvc0.BAR0, uint64(nvc0.RegEngineStatus(nvc0.EngineGR)))
		return st&nvc0.EngineStatusBusy != 0 && int(st&nvc0.EngineStatusChanMask) == phys
	}
	if !pollUntil(10*time.Second, onGR) {
		t.Fatalf("the endless kernel never reached the compute engine: the harness is broken")
	}
	preempts := e.board.Stats().Preempts
	if err := e.agg.Destroy(e.vgpu("doomed"), "test: destroyed while its kernel runs"); err != nil {
		t.Fatal(err)
	}
	// At once: nothing of the VM runs.
	if onGR() || e.pgraphBusy() {
		t.Fatalf("teardown returned while the compute engine still runs the VM's kernel")
	}
	if e.board.Stats().Preempts == preempts {
		t.Error("teardown did not preempt the busy channel")
	}
	for i := range a.slot.Chans {
		p := a.slot.ChanBase + i
		if inst, ctl := e.board.Read32(nvc0.BAR0, uint64(nvc0.ChanInst(p))), e.board.Read32(nvc0.BAR0, uint64(nvc0.ChanCtl(p))); inst != 0 || ctl&nvc0.ChanCtlEnable != 0 {
			t.Errorf("physical channel %d: instance %#x control %#x after teardown", p, inst, ctl)
		}
	}
	if k.result(1) != 0 {
		t.Errorf("the killed kernel stored a result (%#x)", k.result(1))
	}
	// The next tenant of the slot computes and copies.
	b := newAttacker(t, e, "next", 71, "fv-naive")
	if b.slot.Index != a.slot.Index {
		t.Fatalf("the next tenant got slot %d, not the freed slot %d", b.slot.Index, a.slot.Index)
	}
	b.controlCopies(t)
	newKernelPage(t, b).controlKernel(t, b)
}
