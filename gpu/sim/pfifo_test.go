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
	if r.r32(pa+4) != 0 || r.r32(pa+8) != 0 {
		t.Fatal("a 4-byte release wrote more than 4 bytes")
	}
	// A plain release (bit 24 clear, as nvc0_fence emits) writes 16 bytes:
	// payload, 0, 64-bit timestamp.
	r.w32(pa+0x14, 0xffff)
	c.push(nvc0.Incr(0, nvc0.MthdSemaphoreAddrHi, 4), 0, chanDataVA+0x10, 7, nvc0.SemaphoreRelease)
	c.mustFinish()
	stamp := uint64(r.r32(pa+0x18)) | uint64(r.r32(pa+0x1c))<<32
	if r.r32(pa+0x10) != 7 || r.r32(pa+0x14) != 0 || stamp == 0 {
		t.Fatalf("long release wrote %d %d %d", r.r32(pa+0x10), r.r32(pa+0x14), stamp)
	}
	// ACQUIRE_SWITCH (0x1000) is an acquire flag, not a release size.
	c.push(nvc0.Incr(0, nvc0.MthdSemaphoreAddrHi, 4), 0, chanDataVA+0x10, 7, nvc0.SemaphoreAcquireEqual|nvc0.SemaphoreAcquireSwitch)
	c.mustFinish()
	if r.b.Stats().GPFIFOEntries != 3 {
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
		// immediate: trigger a release of 4 at +0x100 (16 bytes)
		nvc0.Immd(0, nvc0.MthdSemaphoreTrigger, nvc0.SemaphoreRelease),
		// zero words are no-ops (NOUVEAU_DMA_SKIPS)
		0, 0, 0,
		// increase-once: address high, then low twice (the last wins) -> +0x200
		nvc0.MethodHeader{Type: nvc0.MthdTypeIncreaseOnce, Count: 3, Method: nvc0.MthdSemaphoreAddrHi}.Encode(),
		0, chanDataVA+0x180, chanDataVA+0x200,
		nvc0.Immd(0, nvc0.MthdSemaphorePayload, 5),
		nvc0.Immd(0, nvc0.MthdNonStall, 0),
		nvc0.Immd(0, nvc0.MthdNop, 0),
		nvc0.Immd(0, nvc0.MthdFBFlush, 0),
		nvc0.Immd(0, nvc0.MthdSetReference, 0x77),
		nvc0.Immd(0, nvc0.MthdSemaphoreTrigger, nvc0.SemaphoreRelease),
		// END_PB_SEGMENT: what follows is not executed
		nvc0.MethodHeader{Type: nvc0.MthdTypeEndSegment}.Encode(),
		nvc0.Immd(0, nvc0.MthdSemaphorePayload, 9),
		nvc0.Immd(0, nvc0.MthdSemaphoreTrigger, nvc0.SemaphoreRelease),
	)
	c.mustFinish()
	if got := r.r32(c.user + nvc0.UserRef); got != 0x77 {
		t.Errorf("SET_REFERENCE: user area +0x48 = %#x", got)
	}
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

// TestDMAGet: the user area's DMA_GET (and high word) follow the push-buffer
// fetch, as nouveau's space check polls them.
func TestDMAGet(t *testing.T) {
	r := newRig(t)
	c := r.newChan(0, nil)
	c.semPage()
	c.push(semRelease(chanDataVA, 1)...)
	c.mustFinish()
	end := c.pbVA() + 5*4
	if lo, hi := r.r32(c.user+nvc0.UserDMAGet), r.r32(c.user+nvc0.UserDMAGetHi); lo != uint32(end) || hi != uint32(end>>32) {
		t.Fatalf("DMA_GET %#x:%#x, want %#x", hi, lo, end)
	}
}

func TestSemaphoreAcquireKinds(t *testing.T) {
	for _, tc := range []struct {
		op, have, want uint32
		pass           bool
	}{
		{nvc0.SemaphoreAcquireGEq, 0x80000001, 0x7fffffff, true},  // wraps: still ahead
		{nvc0.SemaphoreAcquireGEq, 0x7fffffff, 0x80000001, false}, // behind
		{nvc0.SemaphoreAcquireGEq, 5, 5, true},
		{nvc0.SemaphoreAcquireAnd, 6, 2, true},
		{nvc0.SemaphoreAcquireAnd, 6, 1, false},
		{nvc0.SemaphoreAcquireEqual, 6, 6, true},
	} {
		if got := semaphoreSatisfied(tc.op, tc.have, tc.want); got != tc.pass {
			t.Errorf("op %d: have %#x want %#x: %v", tc.op, tc.have, tc.want, got)
		}
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
		if a.gpGet() != 0 || a.ctl()&nvc0.ChanCtlPending == 0 || r.r32(pa+8) != 0 {
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
	rp := a.mustFaultReason(nvc0.FaultReasonPageNotPresent)
	b.mustFinish()
	if got := r.r32(bpa); got != 10 {
		t.Fatalf("other channel's semaphore = %d", got)
	}
	if got := r.r32(apa); got != 1 {
		t.Fatalf("faulting channel's semaphore = %d, want 1 (work before the fault only)", got)
	}
	rd := func(off uint32) uint32 { return r.b.Read32(nvc0.BAR0, uint64(off)) }
	// The PFIFO unit's record: the channel's instance, the VA, and the type
	// word (reason, write, hub client PFIFO).
	wantType := uint32(nvc0.FaultReasonPageNotPresent | nvc0.FaultTypeWrite | nvc0.FaultTypeHub | nvc0.FaultClientPFIFO<<nvc0.FaultTypeClientShift)
	if rp.unit != nvc0.FaultUnitPFIFO || rp.inst != nvc0.InstEncode(a.ramin, 0) || rp.va != bad+0x44 || rp.typ != wantType {
		t.Errorf("%v, want unit PFIFO type %#x", rp, wantType)
	}
	if rd(nvc0.RegPFIFOIntr)&nvc0.PFIFOIntrMMUFault == 0 || rd(nvc0.RegFaultUnitMask) != 1<<nvc0.FaultUnitPFIFO {
		t.Error("PFIFO_INTR MMU fault or the unit mask not set")
	}
	if a.ctl()&nvc0.ChanCtlPending == 0 || a.gpGet() != 0 {
		t.Errorf("faulted channel: ctl %#x GP_GET %d", a.ctl(), a.gpGet())
	}
	// Releasing the record clears the interrupt; the channel stays stopped.
	r.ack()
	if rd(nvc0.RegPFIFOIntr) != 0 || rd(nvc0.RegFaultUnitMask) != 0 {
		t.Errorf("after release: PFIFO_INTR %#x mask %#x", rd(nvc0.RegPFIFOIntr), rd(nvc0.RegFaultUnitMask))
	}
	// Doorbells do nothing now; the channel stays stopped.
	a.ring()
	time.Sleep(time.Millisecond)
	if r.r32(apa) != 1 {
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
	if a.ctl()&nvc0.ChanCtlPending != 0 || a.gpGet() != 0 {
		t.Fatalf("re-enabled channel: ctl %#x GP_GET %d", a.ctl(), a.gpGet())
	}
	a.put = 0
	a.push(semRelease(chanDataVA, 77)...)
	a.mustFinish()
	if r.r32(apa) != 77 {
		t.Fatal("fresh channel did not run")
	}
}

func TestMethodErrors(t *testing.T) {
	copyExec := func(subc, exec uint32) []uint32 {
		return []uint32{nvc0.Incr(subc, nvc0.CopyMthdXCount, 2), 16, 1, nvc0.Immd(subc, nvc0.CopyMthdExec, exec)}
	}
	for _, tc := range []struct {
		name  string
		words []uint32
		pbdma int
		intr  uint32
		mthd  uint32 // the method the PBDMA reports (with the error's subchannel)
	}{
		{"unknown host method", []uint32{nvc0.Immd(0, 0x30, 0)}, nvc0.PBDMAGR, nvc0.PBDMAIntrIllegalMthd, 0x30},
		{"ILLEGAL method", []uint32{nvc0.Immd(0, nvc0.MthdIllegal, 0)}, nvc0.PBDMAGR, nvc0.PBDMAIntrIllegalMthd, nvc0.MthdIllegal},
		{"unknown class", bind(0, 0x9097), nvc0.PBDMAGR, nvc0.PBDMAIntrIllegalMthd, nvc0.MthdSetObject},
		{"unbound subchannel", []uint32{nvc0.Immd(2, nvc0.CopyMthdExec, 0)}, nvc0.PBDMAGR, nvc0.PBDMAIntrEmptySubc, 2<<16 | nvc0.CopyMthdExec},
		{"unknown copy method", cat(bind(1, nvc0.ClassFermiCopy), []uint32{nvc0.Immd(1, 0x500, 0)}), nvc0.PBDMACE0, nvc0.PBDMAIntrIllegalMthd, 1<<16 | 0x500},
		{"Kepler copy method", cat(bind(1, nvc0.ClassFermiCopy), []uint32{nvc0.Immd(1, 0x400, 0)}), nvc0.PBDMACE0, nvc0.PBDMAIntrIllegalMthd, 1<<16 | 0x400},
		{"copy bitfield", cat(bind(1, nvc0.ClassFermiDecompress), []uint32{nvc0.Incr(1, nvc0.CopyMthdYCount, 1), 0x2000}), nvc0.PBDMACE1, nvc0.PBDMAIntrIllegalMthd, 1<<16 | nvc0.CopyMthdYCount},
		{"copy FORMAT", cat(bind(1, nvc0.ClassFermiCopy), copyExec(1, nvc0.CopyExecLinear|nvc0.CopyExecFormat)), nvc0.PBDMACE0, nvc0.PBDMAIntrIllegalMthd, 1<<16 | nvc0.CopyMthdExec},
		{"copy tiled", cat(bind(1, nvc0.ClassFermiCopy), copyExec(1, nvc0.CopyExecSrcLinear)), nvc0.PBDMACE0, nvc0.PBDMAIntrIllegalMthd, 1<<16 | nvc0.CopyMthdExec},
		{"unknown compute method", cat(bind(1, nvc0.ClassFermiCompute), []uint32{nvc0.Immd(1, 0x500, 0)}), nvc0.PBDMAGR, nvc0.PBDMAIntrIllegalMthd, 1<<16 | 0x500},
		{"data past the end", []uint32{nvc0.Incr(0, nvc0.MthdSemaphoreAddrHi, 4), 0, 0}, nvc0.PBDMAGR, nvc0.PBDMAIntrIllegalCmd, 0},
		{"reserved header type", []uint32{0x2<<nvc0.MthdTypeShift | 1<<nvc0.MthdCountShift}, nvc0.PBDMAGR, nvc0.PBDMAIntrIllegalCmd, 0},
		{"old format with data", []uint32{nvc0.MethodHeader{Type: nvc0.MthdTypeOldIncreasing, Count: 1}.Encode(), 0}, nvc0.PBDMAGR, nvc0.PBDMAIntrIllegalCmd, 0},
		{"bad semaphore op", []uint32{nvc0.Immd(0, nvc0.MthdSemaphoreTrigger, 0)}, nvc0.PBDMAGR, nvc0.PBDMAIntrIllegalSem, nvc0.MthdSemaphoreTrigger},
		{"unaligned semaphore", semRelease(chanDataVA+2, 1), nvc0.PBDMAGR, nvc0.PBDMAIntrIllegalSem, nvc0.MthdSemaphoreTrigger},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			c := r.newChan(5, nil)
			c.semPage()
			c.push(tc.words...)
			rp := c.mustMethodError(tc.intr)
			if rp.unit != tc.pbdma || rp.chid != 5|nvc0.PBDMAChanActive {
				t.Fatalf("%v, want PBDMA %d channel 5", rp, tc.pbdma)
			}
			if tc.mthd != 0 && rp.mthd != nvc0.PBDMAMethodValid|tc.mthd {
				t.Fatalf("method cache %#x, want %#x", rp.mthd, nvc0.PBDMAMethodValid|tc.mthd)
			}
			rd := func(off uint32) uint32 { return r.b.Read32(nvc0.BAR0, uint64(off)) }
			if rd(nvc0.RegPFIFOIntr)&nvc0.PFIFOIntrPBDMA == 0 || rd(nvc0.RegPBDMAIntrSource) != 1<<tc.pbdma {
				t.Fatal("PFIFO_INTR PBDMA bit or the PBDMA source mask not set")
			}
			// nouveau's clear: NOP into the method cache, INTR written back.
			r.b.Write32(nvc0.BAR0, uint64(nvc0.RegPBDMAMethod(tc.pbdma)), 0x80600008)
			r.b.Write32(nvc0.BAR0, uint64(nvc0.RegPBDMAIntr(tc.pbdma)), rp.intr)
			if rd(nvc0.RegPFIFOIntr) != 0 || rd(nvc0.RegPBDMAIntrSource) != 0 {
				t.Fatalf("after the clear: PFIFO_INTR %#x source %#x", rd(nvc0.RegPFIFOIntr), rd(nvc0.RegPBDMAIntrSource))
			}
		})
	}
	t.Run("zero-length push buffer", func(t *testing.T) {
		r := newRig(t)
		c := r.newChan(0, nil)
		c.queueEntry(c.pbVA(), 0)
		c.ring()
		c.mustMethodError(nvc0.PBDMAIntrIBEntryInvalid)
	})
	t.Run("GP_PUT beyond the ring", func(t *testing.T) {
		r := newRig(t)
		c := r.newChan(0, nil)
		r.b.Write32(nvc0.BAR1, c.pollVA()+nvc0.UserGPPut, 1<<chanLog2)
		c.mustMethodError(nvc0.PBDMAIntrIBPutOverflow)
	})
	t.Run("bad signature", func(t *testing.T) {
		r := newRig(t)
		c := r.newChan(0, nil)
		c.semPage()
		r.w32(c.ramin+nvc0.RAMINSignature, 0xbeef)
		c.push(semRelease(chanDataVA, 1)...)
		c.mustMethodError(nvc0.PBDMAIntrSigMismatch)
	})
	t.Run("push buffer unmapped", func(t *testing.T) {
		r := newRig(t)
		c := r.newChan(0, nil)
		c.queueEntry(chanPBVA+0x4000000, 4)
		c.ring()
		if rp := c.mustFaultReason(nvc0.FaultReasonPageNotPresent); rp.typ&nvc0.FaultTypeWrite != 0 {
			t.Fatalf("%v: a fetch reported as a write", rp)
		}
	})
}

// TestMemoryTargets: structures outside VRAM are refused explicitly, never
// read as VRAM.
func TestMemoryTargets(t *testing.T) {
	rd := func(r *rig, off uint32) uint32 { return r.b.Read32(nvc0.BAR0, uint64(off)) }
	t.Run("channel instance", func(t *testing.T) {
		r := newRig(t)
		c := r.newChan(0, nil)
		r.b.Write32(nvc0.BAR0, uint64(nvc0.ChanInst(c.id)), nvc0.InstEncode(c.ramin, nvc0.ChanInstValid)|nvc0.MemTargetSysCoherent<<nvc0.ChanInstTargetShift)
		if rd(r, nvc0.ChanInst(c.id))&nvc0.ChanInstValid != 0 || rd(r, nvc0.RegPFIFOIntr)&nvc0.PFIFOIntrChanTableError == 0 ||
			rd(r, nvc0.RegChanTableError) != nvc0.ChanTableErrInvalidTarget {
			t.Fatalf("instance word %#x, PFIFO_INTR %#x, error %#x", rd(r, nvc0.ChanInst(c.id)), rd(r, nvc0.RegPFIFOIntr), rd(r, nvc0.RegChanTableError))
		}
	})
	for _, tc := range []struct {
		name string
		off  uint64
	}{{"USERD", nvc0.RAMINUserLo}, {"page directory", nvc0.RAMINPageDir}} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			c := r.newChan(0, nil)
			c.semPage()
			r.w32(c.ramin+tc.off, r.r32(c.ramin+tc.off)|nvc0.MemTargetSysNonCoherent)
			c.push(semRelease(chanDataVA, 1)...)
			c.mustFaultReason(nvc0.FaultReasonTargetUnsupported)
		})
	}
	t.Run("playlist", func(t *testing.T) {
		r := newRig(t)
		c := r.newChan(0, nil)
		r.b.Write32(nvc0.BAR0, nvc0.RegPlaylistAddr, nvc0.PlaylistAddrEncode(r.pl)|nvc0.MemTargetSysCoherent<<nvc0.PlaylistAddrTargetShift)
		r.b.Write32(nvc0.BAR0, nvc0.RegPlaylistSubmit, nvc0.PlaylistSubmitEncode(0))
		if rd(r, nvc0.RegPFIFOIntr)&nvc0.PFIFOIntrSchedError == 0 {
			t.Fatal("no scheduler error")
		}
		c.semPage()
		c.push(semRelease(chanDataVA, 1)...)
		c.mustFinish() // the refused playlist changed nothing
	})
	t.Run("PRAMIN window", func(t *testing.T) {
		r := newRig(t)
		r.w32(0x10000, 0x1234)
		r.b.Write32(nvc0.BAR0, nvc0.RegPRAMINWindow, nvc0.PRAMINWindowEncode(0x10000)|nvc0.MemTargetSysCoherent<<nvc0.PRAMINWindowTargetShift)
		before := r.b.Stats().UnknownRegisters
		if got := rd(r, nvc0.PRAMINBase); got != 0 || r.b.Stats().UnknownRegisters != before+1 {
			t.Fatalf("system-memory PRAMIN window read %#x", got)
		}
	})
}

// TestEngineContexts: engines load the context the channel's RAMIN points
// at and save their state there; a never-bound engine faults NO_CHANNEL; a
// physical pointer (bit 2 clear) reaches VRAM directly.
func TestEngineContexts(t *testing.T) {
	const src, dst = chanDataVA, chanDataVA + 0x1000
	r := newRig(t)
	c := r.newChan(2, nil)
	c.s.mapVRAM(chanDataVA, 2*nvc0.PageSize)
	c.push(cat(bind(4, nvc0.ClassFermiCopy), copyCmd(4, src, dst, 0, 0, 64, 1))...)
	c.mustFinish()
	if got := r.r32(c.ctxPA + nvc0.EngineContextSize + 6*4); got != 64 { // CE0's saved XCOUNT
		t.Fatalf("CE0 context XCOUNT %d", got)
	}
	if got := r.b.Read32(nvc0.BAR0, uint64(nvc0.RegCEChanCur(0))); got != nvc0.InstEncode(c.ramin, nvc0.CEChanValid) {
		t.Fatalf("CE0 CHANNEL_CUR %#x", got)
	}
	// FERMI_DECOMPRESS runs on CE1, with the +0x240 context.
	c.push(cat(bind(5, nvc0.ClassFermiDecompress), copyCmd(5, src, dst, 0, 0, 32, 1))...)
	c.mustFinish()
	if got := r.r32(c.ctxPA + 2*nvc0.EngineContextSize + 6*4); got != 32 {
		t.Fatalf("CE1 context XCOUNT %d", got)
	}
	// A physical pointer: the save lands in VRAM at that address.
	phys := r.alloc(nvc0.PageSize, nvc0.PageSize)
	r.w32(c.ramin+nvc0.RAMINEngineCE0, uint32(phys))
	r.w32(c.ramin+nvc0.RAMINEngineCE0+4, 0)
	c.push(copyCmd(4, src, dst, 0, 0, 48, 1)...)
	c.mustFinish()
	if got := r.r32(phys + 6*4); got != 48 {
		t.Fatalf("physical context XCOUNT %d", got)
	}
	// Unbound: NO_CHANNEL on the engine's unit.
	r.w32(c.ramin+nvc0.RAMINEngineCE0, 0)
	c.push(copyCmd(4, src, dst, 0, 0, 48, 1)...)
	if rp := c.mustFaultReason(nvc0.FaultReasonNoChannel); rp.unit != nvc0.FaultUnitCE0 {
		t.Fatalf("%v, want unit CE0", rp)
	}
}

func TestPlaylistAndEnableRules(t *testing.T) {
	r := newRig(t)
	c := r.newChan(4, nil)
	pa := c.semPage()
	// Out of the playlist: a doorbell leaves the work pending.
	r.list = nil
	r.submitPlaylist()
	c.push(semRelease(chanDataVA, 1)...)
	if c.ctl()&nvc0.ChanCtlPending == 0 || c.gpGet() != 0 {
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
	if c.gpGet() != 0 || c.ctl()&nvc0.ChanCtlPending != 0 {
		t.Fatalf("enable did not reset: GP_GET %d ctl %#x", c.gpGet(), c.ctl())
	}
	// Invalid instance: not schedulable.
	r.b.Write32(nvc0.BAR0, uint64(nvc0.ChanInst(c.id)), 0)
	c.put = 0
	c.push(semRelease(chanDataVA, 3)...)
	if r.r32(pa) != 1 {
		t.Fatal("channel without a valid instance ran")
	}
	r.b.Write32(nvc0.BAR0, uint64(nvc0.ChanInst(c.id)), nvc0.InstEncode(c.ramin, nvc0.ChanInstValid|nvc0.ChanInstPollEnable))
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
	for r.b.chans[c.id].readCtl()&nvc0.ChanCtlPending == 0 {
	}
	if err := hwseq.StopChannel(r.b, c.id, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := r.b.Read32(nvc0.BAR0, nvc0.RegPreempt); got != uint32(c.id) {
		t.Fatalf("preempt register %#x after the preempt", got)
	}
	if ctl := c.ctl(); ctl&nvc0.ChanCtlEnable != 0 {
		t.Fatalf("stopped channel ctl %#x", ctl)
	}
	if rp, ok := c.report(); ok {
		t.Fatalf("a stop reported an error: %v", rp)
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
