package sim

import (
	"sync/atomic"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// regState is the storage behind the BAR0 registers.
type regState struct {
	pmcEnable    atomic.Uint32
	praminWindow atomic.Uint32
	bar1Inst     atomic.Uint32
	bar3Inst     atomic.Uint32
	bar1VM       barCachePtr
	bar3VM       barCachePtr
	pollArea     atomic.Uint32
	playlistAddr atomic.Uint32
	playlistSub  atomic.Uint32
	preempt      atomic.Uint32
	flushPD      atomic.Uint32
	tlbTrigger   atomic.Uint32
	mmuStatus    atomic.Uint32
	sysmemFlush  atomic.Uint32
	gpcMMUDebug  [2]atomic.Uint32 // write and read debug buffers
	fecs         fecsState
	pgraphBusy   atomic.Int32
}

// reg is one BAR0 register: read returns its value, write (nil for a
// read-only register) takes a new one.
type reg struct {
	read  func() uint32
	write func(v uint32)
}

// regTable maps BAR0 offsets to registers. It is built once by New and only
// read afterwards, so it needs no lock.
type regTable map[uint32]reg

// storage returns a plain read/write register backed by a.
func storage(a *atomic.Uint32) reg {
	return reg{read: a.Load, write: a.Store}
}

// constant returns a read-only register.
func constant(v uint32) reg { return reg{read: func() uint32 { return v }} }

func (b *Board) buildRegs() regTable {
	r := &b.r
	t := regTable{
		nvc0.RegBoot0:        constant(nvc0.Boot0Value),
		nvc0.RegPMCEnable:    storage(&r.pmcEnable),
		nvc0.RegPRAMINWindow: storage(&r.praminWindow),
		nvc0.RegBAR1Inst:     storage(&r.bar1Inst),
		nvc0.RegBAR3Inst:     storage(&r.bar3Inst),
		nvc0.RegPollArea:     storage(&r.pollArea),
		nvc0.RegPlaylistAddr: storage(&r.playlistAddr),
		nvc0.RegPlaylistSubmit: {read: r.playlistSub.Load, write: func(v uint32) {
			r.playlistSub.Store(v)
			b.submitPlaylist(r.playlistAddr.Load(), int(v&nvc0.PlaylistCountMask))
		}},
		// Playlist updates complete synchronously: PlaylistPending never reads set.
		nvc0.RegPlaylistStatus: constant(0),
		nvc0.RegPreempt:        {read: r.preempt.Load, write: b.preempt},
		// Posted writes land in VRAM at once, so a flush is done as soon as it starts.
		nvc0.RegFlush:     {read: func() uint32 { return 0 }, write: func(uint32) {}},
		nvc0.RegTimerLow:  {read: func() uint32 { lo, _ := nvc0.TimerSplit(b.now()); return lo }},
		nvc0.RegTimerHigh: {read: func() uint32 { _, hi := nvc0.TimerSplit(b.now()); return hi }},

		nvc0.RegMemPartCount:    constant(uint32(b.cfg.MemPartitions)),
		nvc0.RegMemPartMask:     constant(0),
		nvc0.RegMemLTCCount:     constant(uint32(b.cfg.MemPartitions)),
		nvc0.RegVRAMPartSizeOld: constant(b.partitionMiB()),

		// sim: the board keeps no L2, so nothing is ever flushed to the
		// host page 0x100C10 names; it is plain storage.
		nvc0.RegSysmemFlushPage: storage(&r.sysmemFlush),
		nvc0.RegMMUStatus:       {read: func() uint32 { return nvc0.MMUStatusFreeSlots | r.mmuStatus.Load() }},
		nvc0.RegTLBFlushPD:      storage(&r.flushPD),
		nvc0.RegTLBFlushTrigger: {read: r.tlbTrigger.Load, write: b.tlbFlush},

		nvc0.RegEngineStatus(nvc0.EngineGR):  {read: b.compute.status(0)},
		nvc0.RegEngineStatus(nvc0.EngineCE0): {read: b.ce[0].status(0)},
		nvc0.RegEngineStatus(nvc0.EngineCE1): {read: b.ce[1].status(0)},

		nvc0.RegPGRAPHStatus: {read: func() uint32 {
			if r.pgraphBusy.Load() != 0 {
				return nvc0.PGRAPHStatusBusy
			}
			return 0
		}},
		// sim: the GPC MMU debug buffers are plain storage; the board
		// never writes debug data to them.
		nvc0.RegGPCMMUDebugWr: storage(&r.gpcMMUDebug[0]),
		nvc0.RegGPCMMUDebugRd: storage(&r.gpcMMUDebug[1]),
	}
	for i := range nvc0.NumCopyEngines {
		e := b.ce[i]
		t[nvc0.RegCEChanCur(i)] = reg{read: func() uint32 {
			if v := e.resident.Load(); v != 0 {
				return v&^(1<<31) | nvc0.CEChanValid
			}
			return 0
		}}
		// The falcon's microcode moves NEXT to CUR; the host never writes
		// either (nouveau only reads CUR): writes are dropped.
		t[nvc0.RegCEChanNext(i)] = reg{read: func() uint32 { return 0 }, write: func(uint32) {}}
	}
	size := b.partitionMiB()
	for i := range nvc0.MaxMemPartitions {
		if i < b.cfg.MemPartitions {
			t[nvc0.MemPartSize(i)] = constant(size)
		} else {
			t[nvc0.MemPartSize(i)] = constant(0)
		}
	}
	for _, c := range b.chans {
		t[nvc0.ChanInst(c.id)] = reg{read: c.readInst, write: c.writeInst}
		t[nvc0.ChanCtl(c.id)] = reg{read: c.readCtl, write: c.writeCtl}
	}
	b.intrRegs(t)
	b.fecsRegs(t)
	return t
}

// partitionMiB is each memory partition's size in MiB.
func (b *Board) partitionMiB() uint32 {
	return uint32(b.cfg.VRAMSize / uint64(b.cfg.MemPartitions) >> nvc0.MemPartSizeShift)
}

// tlbFlush runs a TLB invalidate written to RegTLBFlushTrigger. A page
// directory outside VRAM flushes nothing (the board has none there).
func (b *Board) tlbFlush(v uint32) {
	r := &b.r
	r.tlbTrigger.Store(v)
	if v&nvc0.TLBFlushTrigger == 0 {
		return
	}
	r.mmuStatus.And(^uint32(nvc0.MMUStatusFlushDone))
	pd, target := nvc0.TLBFlushPDDecode(r.flushPD.Load())
	if target == nvc0.MemTargetVRAM || v&nvc0.TLBFlushAllPDB != 0 {
		b.mmu.flush(pd, v)
	}
	r.mmuStatus.Or(nvc0.MMUStatusFlushDone)
}

// praminAddr returns the VRAM address a PRAMIN-window offset reaches; ok is
// false if the window names another memory target (the board refuses it).
func (b *Board) praminAddr(off uint64) (uint64, bool) {
	base, target := nvc0.PRAMINWindowDecode(b.r.praminWindow.Load())
	return base + off - nvc0.PRAMINBase, target == nvc0.MemTargetVRAM
}

func inPRAMIN(off uint64) bool {
	return off >= nvc0.PRAMINBase && off < nvc0.PRAMINBase+nvc0.PRAMINSize
}

func (b *Board) readReg(off uint64) uint32 {
	if off%4 != 0 || off >= nvc0.BAR0Size {
		b.st.unknown.Add(1)
		return 0
	}
	if inPRAMIN(off) {
		addr, ok := b.praminAddr(off)
		var v uint32
		if ok {
			v, ok = b.physRead32(phys{addr: addr})
		}
		if !ok {
			b.st.unknown.Add(1)
		}
		return v
	}
	r, ok := b.regs[uint32(off)]
	if !ok {
		b.st.unknown.Add(1)
		return 0
	}
	return r.read()
}

func (b *Board) writeReg(off uint64, v uint32) {
	if off%4 != 0 || off >= nvc0.BAR0Size {
		b.st.unknown.Add(1)
		return
	}
	if inPRAMIN(off) {
		addr, ok := b.praminAddr(off)
		if !ok || !b.physWrite32(phys{addr: addr}, v) {
			b.st.unknown.Add(1)
		}
		return
	}
	r, ok := b.regs[uint32(off)]
	if !ok {
		b.st.unknown.Add(1)
		return
	}
	if r.write != nil {
		r.write(v)
	}
}

// Implements reports whether the board decodes the BAR0 offset off: a
// register of its table or a word of the PRAMIN window. Everything else
// reads 0 and drops writes.
func (b *Board) Implements(off uint64) bool {
	if off%4 != 0 || off >= nvc0.BAR0Size {
		return false
	}
	if inPRAMIN(off) {
		return true
	}
	_, ok := b.regs[uint32(off)]
	return ok
}
