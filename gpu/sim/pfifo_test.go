package sim

import (
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/gpu/hwseq"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// semPage maps a page of VRAM for semaphores in c's space and returns its VRAM address.
func (c *tchan) semPage() uint64 { return c.s.mapVRAM(chanDataVA, nvc0.PageSize) }

func TestSemaphoreRelease(t *testing.T) {
	r := newRig(t)
	c := r.newChan(0, nil)
	pa := c.semPage()
	c.push(semRelease(chanDataVA, 42)...)
	c.mustFinish()
	if got := r.r32(pa); got != 42 {
		t.Fatalf("semaphore = %d", got)
	}
	// Long release: payload, 0, 64-bit timestamp.
	r.w32(pa+4, 0xffff)
	c.push(nvc0.Incr(0, nvc0.MthdSemaphoreAddrHi, 4), 0, chanDataVA+0x10, 7, nvc0.SemaphoreRelease|nvc0.SemaphoreReleaseLong)
	c.mustFinish()
	stamp := uint64(r.r32(pa+0x18)) | uint64(r.r32(pa+0x1c))<<32
	if r.r32(pa+0x10) != 7 || r.r32(pa+0x14) != 0 || stamp == 0 {
		t.Fatalf("long release wrote %d %d %d", r.r32(pa+0x10), r.r32(pa+0x14), stamp)
	}
	if r.b.Stats().GPFIFOEntries != 2 {
		t.Fatalf("GPFIFO entries %d", r.b.Stats().GPFIFOEntries)
	}
}

func TestMethodHeaderTypes(t *testing.T) {
	r := newRig(t)
	c := r.newChan(1, nil)
	pa := c.semPage()
	c.push(
		// increasing: address and payload
		nvc0.Incr(0, nvc0.MthdSemaphoreAddrHi, 3), 0, chanDataVA+0x100, 1,
		// non-increasing: the payload method three times; the last wins
		nvc0.NonIncr(0, nvc0.MthdSemaphorePayload, 3), 2, 3, 4,
		// immediate: trigger a release of 4 at +0x100
		nvc0.Immd(0, nvc0.MthdSemaphoreTrigger, nvc0.SemaphoreRelease),
		// increase-once: address high, then low twice (the last wins) -> +0x200
		nvc0.MethodHeader{Type: nvc0.MthdTypeIncreaseOnce, Count: 3, Method: nvc0.MthdSemaphoreAddrHi}.Encode(),
		0, chanDataVA+0x180, chanDataVA+0x200,
		nvc0.Immd(0, nvc0.MthdSemaphorePayload, 5),
		nvc0.Immd(0, nvc0.MthdNonStall, 0),
		nvc0.Immd(0, nvc0.MthdSemaphoreTrigger, nvc0.SemaphoreRelease),
	)
	c.mustFinish()
	if got := r.r32(pa + 0x100); got != 4 {
		t.Errorf("+0x100 = %d, want 4", got)
	}
	if got := r.r32(pa + 0x180); got != 0 {
		t.Errorf("+0x180 = %d, want 0", got)
	}
	if got := r.r32(pa + 0x200); got != 5 {
		t.Errorf("+0x200 = %d, want 5", got)
	}
}

func TestSemaphoreAcquireReleasedByOtherChannel(t *testing.T) {
	for _, op := range []uint32{nvc0.SemaphoreAcquireEqual, nvc0.SemaphoreAcquireGEq} {
		r := newRig(t)
		shared := r.newSpace(testLimit)
		a := r.newChan(0, shared)
		b := r.newChan(1, shared)
		pa := a.semPage()
		// a waits for sem >= / == 3, then writes 1 at +8.
		a.push(cat(semAcquire(chanDataVA, 3, op), semRelease(chanDataVA+8, 1))...)
		// b first writes 2 (not enough), then does other work, then 3.
		b.push(semRelease(chanDataVA, 2)...)
		b.mustFinish()
		if a.gpGet() != 0 || a.ctl()&nvc0.ChanCtlBusy == 0 || r.r32(pa+8) != 0 {
			t.Fatalf("acquire passed early: GP_GET %d ctl %#x", a.gpGet(), a.ctl())
		}
		b.push(semRelease(chanDataVA, 3)...)
		b.mustFinish()
		a.mustFinish()
		if r.r32(pa+8) != 1 {
			t.Fatalf("op %d: a did not continue after the acquire", op)
		}
	}
}

func TestFaultStopsOnlyFaultingChannel(t *testing.T) {
	r := newRig(t)
	a := r.newChan(2, nil)
	b := r.newChan(3, nil)
	bpa := b.semPage()
	apa := a.semPage()
	const bad = chanDataVA + 0x100000 // unmapped, in a mapped PDE
	a.push(cat(semRelease(chanDataVA, 1), semRelease(bad+0x44, 9))...)
	a.push(semRelease(chanDataVA, 2)...) // never runs
	for i := range 10 {
		b.push(semRelease(chanDataVA, uint32(i+1))...)
	}
	a.mustFault()
	b.mustFinish()
	if got := r.r32(bpa); got != 10 {
		t.Fatalf("other channel's semaphore = %d", got)
	}
	if got := r.r32(apa); got != 1 {
		t.Fatalf("faulting channel's semaphore = %d, want 1 (work before the fault only)", got)
	}
	rd := func(off uint64) uint32 { return r.b.Read32(nvc0.BAR0, off) }
	if got := rd(nvc0.RegFaultInst); got != nvc0.InstEncode(a.ramin, nvc0.FaultValid) {
		t.Errorf("fault inst %#x", got)
	}
	if lo, hi := rd(nvc0.RegFaultAddrLo), rd(nvc0.RegFaultAddrHi); lo != bad+0x44 || hi != 0 {
		t.Errorf("fault addr %#x:%#x", hi, lo)
	}
	wantStatus := uint32(nvc0.FaultReasonPTE | 2<<nvc0.FaultChanShift | nvc0.FaultWrite)
	if got := rd(nvc0.RegFaultStatus); got != wantStatus {
		t.Errorf("fault status %#x, want %#x", got, wantStatus)
	}
	if rd(nvc0.RegPFIFOIntr)&nvc0.PFIFOIntrMMUFault == 0 {
		t.Error("PFIFO_INTR MMU fault not set")
	}
	if a.ctl()&nvc0.ChanCtlFaulted == 0 || a.gpGet() != 0 {
		t.Errorf("faulted channel: ctl %#x GP_GET %d", a.ctl(), a.gpGet())
	}
	// Doorbells do nothing now; the channel stays stopped.
	a.ring()
	if a.ctl()&nvc0.ChanCtlFaulted == 0 || r.r32(apa) != 1 {
		t.Fatal("faulted channel restarted")
	}
	if r.b.Stats().ChannelFaults != 1 {
		t.Errorf("channel faults %d", r.b.Stats().ChannelFaults)
	}
	// Stop + re-enable gives a fresh channel.
	if err := hwseq.StopChannel(r.b, a.id, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := rd(nvc0.RegPreempt); got != uint32(a.id) {
		t.Fatalf("preempt reads %#x", got)
	}
	r.b.Write32(nvc0.BAR0, uint64(nvc0.ChanCtl(a.id)), nvc0.ChanCtlDefault)
	if a.ctl()&nvc0.ChanCtlFaulted != 0 || a.gpGet() != 0 {
		t.Fatalf("re-enabled channel: ctl %#x GP_GET %d", a.ctl(), a.gpGet())
	}
	a.put = 0
	a.push(semRelease(chanDataVA, 77)...)
	a.mustFinish()
	if r.r32(apa) != 77 {
		t.Fatal("fresh channel did not run")
	}
}

func TestMethodFaults(t *testing.T) {
	for _, tc := range []struct {
		name  string
		words []uint32
	}{
		{"unknown fifo method", []uint32{nvc0.Immd(0, 0x24, 0)}},
		{"unknown class", bind(0, 0x9097)},
		{"unbound subchannel", []uint32{nvc0.Immd(2, nvc0.CopyMthdLaunchDMA, 0)}},
		{"unknown copy method", cat(bind(1, nvc0.ClassFermiCopy), []uint32{nvc0.Immd(1, 0x500, 0)})},
		{"unknown compute method", cat(bind(1, nvc0.ClassFermiCompute), []uint32{nvc0.Immd(1, 0x500, 0)})},
		{"data past the end", []uint32{nvc0.Incr(0, nvc0.MthdSemaphoreAddrHi, 4), 0, 0}},
		{"bad header type", []uint32{0x2 << nvc0.MthdTypeShift}},
		{"bad semaphore op", []uint32{nvc0.Immd(0, nvc0.MthdSemaphoreTrigger, 0)}},
		{"unaligned semaphore", semRelease(chanDataVA+2, 1)},
		{"copy too big", cat(bind(0, nvc0.ClassFermiCopy), copyCmd(0, chanDataVA, chanDataVA, 0, 0, 1<<16, 1<<15))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			c := r.newChan(0, nil)
			c.semPage()
			c.push(tc.words...)
			c.mustFault()
			st := r.b.Read32(nvc0.BAR0, nvc0.RegFaultStatus)
			if st&nvc0.FaultReasonMask != nvc0.FaultReasonMethod {
				t.Fatalf("fault status %#x", st)
			}
			if r.b.Read32(nvc0.BAR0, nvc0.RegPFIFOIntr)&nvc0.PFIFOIntrChanErr == 0 {
				t.Fatal("PFIFO_INTR channel error not set")
			}
		})
	}
	t.Run("zero-length push buffer", func(t *testing.T) {
		r := newRig(t)
		c := r.newChan(0, nil)
		c.queueEntry(c.pbVA(), 0)
		c.ring()
		c.mustFault()
		if st := r.b.Read32(nvc0.BAR0, nvc0.RegFaultStatus); st&nvc0.FaultReasonMask != nvc0.FaultReasonMethod {
			t.Fatalf("fault status %#x", st)
		}
	})
	t.Run("push buffer unmapped", func(t *testing.T) {
		r := newRig(t)
		c := r.newChan(0, nil)
		c.queueEntry(chanPBVA+0x4000000, 4)
		c.ring()
		c.mustFault()
		if st := r.b.Read32(nvc0.BAR0, nvc0.RegFaultStatus); st&nvc0.FaultReasonMask != nvc0.FaultReasonPTE || st&nvc0.FaultWrite != 0 {
			t.Fatalf("fault status %#x", st)
		}
	})
}

func TestPlaylistAndEnableRules(t *testing.T) {
	r := newRig(t)
	c := r.newChan(4, nil)
	pa := c.semPage()
	// Out of the playlist: a doorbell leaves the work pending.
	r.list = nil
	r.submitPlaylist()
	c.push(semRelease(chanDataVA, 1)...)
	if c.ctl()&nvc0.ChanCtlBusy == 0 || c.gpGet() != 0 {
		t.Fatalf("channel off the playlist ran: ctl %#x GP_GET %d", c.ctl(), c.gpGet())
	}
	if r.b.Read32(nvc0.BAR0, nvc0.RegPlaylistStatus)&nvc0.PlaylistPending != 0 {
		t.Fatal("playlist update pending")
	}
	r.addToPlaylist(c.id)
	c.mustFinish()
	if r.r32(pa) != 1 {
		t.Fatal("work not done after adding to the playlist")
	}
	// Disabled (enable bit clear): nothing runs; enabling resets GP_GET to 0.
	r.b.Write32(nvc0.BAR0, uint64(nvc0.ChanCtl(c.id)), 0)
	c.push(semRelease(chanDataVA, 2)...)
	if r.r32(pa) != 1 || c.gpGet() != 1 {
		t.Fatalf("disabled channel ran: sem %d GP_GET %d", r.r32(pa), c.gpGet())
	}
	r.b.Write32(nvc0.BAR0, uint64(nvc0.ChanCtl(c.id)), nvc0.ChanCtlDefault)
	if c.gpGet() != 0 || c.ctl()&nvc0.ChanCtlBusy != 0 {
		t.Fatalf("enable did not reset: GP_GET %d ctl %#x", c.gpGet(), c.ctl())
	}
	// Invalid instance: not schedulable.
	r.b.Write32(nvc0.BAR0, uint64(nvc0.ChanInst(c.id)), 0)
	c.put = 0
	c.push(semRelease(chanDataVA, 3)...)
	if r.r32(pa) != 1 {
		t.Fatal("channel without a valid instance ran")
	}
	r.b.Write32(nvc0.BAR0, uint64(nvc0.ChanInst(c.id)), nvc0.InstEncode(c.ramin, nvc0.ChanInstValid|nvc0.ChanInstVRAM))
	c.mustFinish()
	if r.r32(pa) != 3 {
		t.Fatalf("sem %d after validating the instance", r.r32(pa))
	}
}

func TestRAMINReadAtDoorbell(t *testing.T) {
	r := newRig(t)
	c := r.newChan(0, nil)
	pa := c.semPage()
	c.push(semRelease(chanDataVA, 1)...)
	c.mustFinish()
	// Point the channel at a different address space: the next doorbell uses it.
	s2 := r.newSpace(testLimit)
	s2.mapPage(c.ringVA(), c.ringPA, nvc0.TargetVRAM, false, false)
	for o := uint64(0); o < chanPBSize; o += nvc0.PageSize {
		s2.mapPage(c.pbVA()+o, c.pbPA+o, nvc0.TargetVRAM, false, false)
	}
	pa2 := s2.mapVRAM(chanDataVA, nvc0.PageSize)
	s2.writeRAMIN(c.ramin)
	c.push(semRelease(chanDataVA, 2)...)
	c.mustFinish()
	if r.r32(pa) != 1 || r.r32(pa2) != 2 {
		t.Fatalf("old space %d, new space %d", r.r32(pa), r.r32(pa2))
	}
}

func TestStopBlockedChannel(t *testing.T) {
	r := newRig(t)
	c := r.newChan(5, nil)
	pa := c.semPage()
	c.push(cat(semAcquire(chanDataVA, 1, nvc0.SemaphoreAcquireEqual), semRelease(chanDataVA+4, 2))...)
	for r.b.chans[c.id].readCtl()&nvc0.ChanCtlBusy == 0 {
	}
	if err := hwseq.StopChannel(r.b, c.id, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := r.b.Read32(nvc0.BAR0, nvc0.RegPreempt); got != uint32(c.id) {
		t.Fatalf("preempt register %#x after the preempt", got)
	}
	if ctl := c.ctl(); ctl&nvc0.ChanCtlEnable != 0 || ctl&nvc0.ChanCtlFaulted != 0 {
		t.Fatalf("stopped channel ctl %#x", ctl)
	}
	// The semaphore it waited for is released: a stopped channel goes no further.
	r.w32(pa, 1)
	c.ring()
	time.Sleep(10 * time.Millisecond)
	if r.r32(pa+4) != 0 {
		t.Fatal("the stopped channel went on")
	}
	if r.b.Stats().Preempts != 1 || r.b.Stats().ChannelFaults != 0 {
		t.Fatalf("stats %+v", r.b.Stats())
	}
}

func TestPreemptOfIdleAndInvalidChannels(t *testing.T) {
	r := newRig(t)
	c := r.newChan(3, nil)
	for _, v := range []uint32{uint32(c.id), 127, 0x80, 0xFFFFFFFF} {
		r.b.Write32(nvc0.BAR0, nvc0.RegPreempt, v)
		if got := r.b.Read32(nvc0.BAR0, nvc0.RegPreempt); got&nvc0.PreemptPending != 0 {
			t.Errorf("preempt %#x reads %#x: pending on an idle or invalid channel", v, got)
		}
	}
}

func TestManyChannelsConcurrently(t *testing.T) {
	r := newRig(t)
	shared := r.newSpace(testLimit)
	pa := shared.mapVRAM(chanDataVA, nvc0.PageSize)
	var chans []*tchan
	for i := range 8 {
		chans = append(chans, r.newChan(i, shared))
	}
	done := make(chan struct{})
	for _, c := range chans {
		go func() {
			defer func() { done <- struct{}{} }()
			for n := range 20 {
				c.push(semRelease(chanDataVA+uint64(c.id)*4, uint32(n+1))...)
			}
		}()
	}
	for range chans {
		<-done
	}
	for _, c := range chans {
		c.mustFinish()
		if got := r.r32(pa + uint64(c.id)*4); got != 20 {
			t.Errorf("channel %d: %d", c.id, got)
		}
	}
}
