package tests

import (
	"testing"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// TestDeniedRegisters: writes a VM may not make — PMC_ENABLE (engines off for
// everyone), PTIMER, unknown offsets, FECS commands that name no channel of
// its own or act for every VM — are denied and counted and change nothing
// on the board; the honest VM keeps computing.
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
		// Unknown commands; set-channel and bind with an instance that is
		// not one of its channels; halt, register lists and stopping or
		// starting context switching (they act for every VM).
		for _, cmd := range []uint32{0, nvc0.FECSCmdSetChan, nvc0.FECSCmdBindPointer, nvc0.FECSCmdHalt, nvc0.FECSCmdReglistInst,
			nvc0.FECSCmdReglistVA, nvc0.FECSCmdStopCtxsw, nvc0.FECSCmdStartCtxsw, 0xFFFFFFFF} {
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

// TestRegisterTableParity sweeps every BAR0 offset: each one the board
// decodes must have a stated class in the aggregator's register table (an
// explicit decision: emulated, translated, passthrough or denied), and each
// that the table translates or passes through must exist on the board.
// A register added to the board without a virtualization decision fails
// here instead of silently reading as denied.
func TestRegisterTableParity(t *testing.T) {
	e := newEnv(t)
	classes := map[string]int{}
	for off := uint64(0); off < nvc0.BAR0Size; off += 4 {
		onBoard := e.board.Implements(off)
		class, explicit := e.agg.RegisterClass(uint32(off))
		switch {
		case onBoard && !explicit:
			t.Errorf("BAR0 %#07x: the board implements it but the register table states no class", off)
		case explicit && !onBoard && (class == "translated" || class == "passthrough"):
			t.Errorf("BAR0 %#07x: the register table %s it, but the board has no such register", off, class)
		}
		if onBoard || explicit {
			classes[class]++
		}
	}
	if classes["translated"] == 0 || classes["emulated"] == 0 || classes["passthrough"] == 0 {
		t.Fatalf("sweep found classes %v: the sweep is broken", classes)
	}
	t.Logf("BAR0 words the board decodes or the table names, by class: %v", classes)
}
