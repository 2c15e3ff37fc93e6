package tests

import (
	"encoding/binary"
	"testing"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// names them: the next VM's, far ones, and garbage.
var foreignChannels = []uint32{8, 9, 15, 16, 23, 24, 100, 127}

// TestForeignChannels: channel-table words, preempt requests and playlist
// entries naming channel ids beyond the VM's range are denied and counted,
// reads of them leak nothing, and the honest VM's channels keep running.
func TestForeignChannels(t *testing.T) {
	s := newScene(t, "fv-naive")
	e, a := s.e, s.a
	r := a.r
	ramin := nvc0.InstEncode(a.own, nvc0.ChanInstValid|nvc0.ChanInstPollEnable)
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
			r.wr(nvc0.RegPreempt, ch)
			n += 6
		}
		r.wr(nvc0.RegPreempt, 0xFFFFFFFF)
		r.wr(nvc0.RegPreempt, 0x80000008)
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

// TestChannelInstanceOutsideSlice: channel instances (RAMIN) outside the
// slice are refused; a RAMIN inside the slice whose page directory or user
// area lies outside yields a shadow that never names foreign memory and a
// channel that cannot be enabled; writes of the copy engines' channel
// registers and FECS binds of instances that are not the VM's channels are
// denied.
func TestChannelInstanceOutsideSlice(t *testing.T) {
	s := newSceneWith(t, "fv-naive", false)
	e, a, r := s.e, s.a, s.a.r
	cs := s.canaries(t)
	p0 := a.slot.ChanBase
	for _, tg := range hostileVRAM(a, cs) {
		before := e.denied(t, "attacker")
		r.wr(nvc0.ChanInst(0), nvc0.InstEncode(tg.g, nvc0.ChanInstValid|nvc0.ChanInstPollEnable))
		r.wr(nvc0.ChanCtl(0), nvc0.ChanCtlDefault)
		r.wr(nvc0.RegCE0ChanNext, nvc0.InstEncode(tg.g, nvc0.CEChanValid))
		r.wr(nvc0.RegFECSData, nvc0.FECSBindValid|nvc0.InstEncode(tg.g, 0))
		r.wr(nvc0.RegFECSCmd, nvc0.FECSCmdBindPointer)
		r.sync()
		e.expectDenied(t, "attacker", before, 4, "channel instance at "+tg.what)
		inst := e.board.Read32(nvc0.BAR0, uint64(nvc0.ChanInst(p0)))
		ctl := e.board.Read32(nvc0.BAR0, uint64(nvc0.ChanCtl(p0)))
		if inst&nvc0.ChanInstValid != 0 || ctl&nvc0.ChanCtlEnable != 0 {
			t.Errorf("instance at %s: physical channel %d has instance %#x control %#x", tg.what, p0, inst, ctl)
		}
		if got := e.board.Read32(nvc0.BAR0, nvc0.RegCE0ChanCur); nvc0.InstDecode(got) == tg.g&^(pageSize-1) || nvc0.InstDecode(got) == tg.g-a.slot.VRAM.Base {
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
		r.wr(nvc0.ChanInst(ch), nvc0.InstEncode(ramin, nvc0.ChanInstValid|nvc0.ChanInstPollEnable))
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
		// The GPU's user area is the aggregator's own (in the reserve),
		// never an address the guest chose.
		if !e.layout.Reserved.Contains(user, nvc0.UserAreaSize) {
			t.Errorf("%s: shadow RAMIN user area %#x is not a shadow user area in the reserve", c.what, user)
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
