package sim

import (
	"sync"
	"sync/atomic"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// numCopyEngines is the number of PCOPY engines (copy-engine instance
// register pairs at RegCopy0InstLo and RegCopy1InstLo).
const numCopyEngines = 2

// regState is the storage behind the BAR0 registers.
type regState struct {
	pmcEnable    atomic.Uint32
	praminWindow atomic.Uint32
	bar1Inst     atomic.Uint32
	bar3Inst     atomic.Uint32
	bar1VM       barCachePtr
	bar3VM       barCachePtr
	pollArea     atomic.Uint32
	pfifoIntr    atomic.Uint32
	playlistAddr atomic.Uint32
	playlistSub  atomic.Uint32
	preempt      atomic.Uint32
	flushPD      atomic.Uint32
	tlbTrigger   atomic.Uint32
	mmuStatus    atomic.Uint32
	copyInst     [numCopyEngines][2]atomic.Uint32
	fecsData     atomic.Uint32
	fecsCmd      atomic.Uint32
	fecsStatus   atomic.Uint32
	fecsBound    atomic.Uint32 // the context bound by the last FECS bind command
	pgraphBusy   atomic.Int32

	faultMu                                  sync.Mutex
	faultInst, faultLo, faultHi, faultStatus uint32
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

// w1c returns a write-1-to-clear register backed by a.
func w1c(a *atomic.Uint32) reg {
	return reg{read: a.Load, write: func(v uint32) { a.And(^v) }}
}

func (b *Board) buildRegs() regTable {
	r := &b.r
	t := regTable{
		nvc0.RegBoot0:        constant(nvc0.Boot0Value),
		nvc0.RegPMCEnable:    storage(&r.pmcEnable),
		nvc0.RegPRAMINWindow: storage(&r.praminWindow),
		nvc0.RegBAR1Inst:     storage(&r.bar1Inst),
		nvc0.RegBAR3Inst:     storage(&r.bar3Inst),
		nvc0.RegPFIFOIntr:    w1c(&r.pfifoIntr),
		nvc0.RegPollArea:     storage(&r.pollArea),
		nvc0.RegPlaylistAddr: storage(&r.playlistAddr),
		nvc0.RegPlaylistSubmit: {read: r.playlistSub.Load, write: func(v uint32) {
			r.playlistSub.Store(v)
			b.submitPlaylist(uint64(r.playlistAddr.Load())<<nvc0.PageShift, int(v&nvc0.PlaylistCountMask))
		}},
		// Playlist updates complete synchronously: PlaylistPending never reads set.
		nvc0.RegPlaylistStatus: constant(0),
		nvc0.RegPreempt:        {read: r.preempt.Load, write: b.preempt},
		nvc0.RegFaultInst:      b.faultReg(&r.faultInst),
		nvc0.RegFaultAddrLo:    b.faultReg(&r.faultLo),
		nvc0.RegFaultAddrHi:    b.faultReg(&r.faultHi),
		nvc0.RegFaultStatus:    b.faultReg(&r.faultStatus),
		// Posted writes land in VRAM at once, so a flush is done as soon as it starts.
		nvc0.RegFlush:     {read: func() uint32 { return 0 }, write: func(uint32) {}},
		nvc0.RegTimerLow:  {read: func() uint32 { lo, _ := nvc0.TimerSplit(b.now()); return lo }},
		nvc0.RegTimerHigh: {read: func() uint32 { _, hi := nvc0.TimerSplit(b.now()); return hi }},

		nvc0.RegMemPartCount: constant(uint32(b.cfg.MemPartitions)),
		nvc0.RegMemPartMask:  constant(0),
		nvc0.RegMemLTCCount:  constant(uint32(b.cfg.MemPartitions)),

		nvc0.RegMMUStatus:  {read: func() uint32 { return nvc0.MMUStatusFreeSlots | r.mmuStatus.Load() }},
		nvc0.RegTLBFlushPD: storage(&r.flushPD),
		nvc0.RegTLBFlushTrigger: {read: r.tlbTrigger.Load, write: func(v uint32) {
			r.tlbTrigger.Store(v)
			if v&nvc0.TLBFlushTrigger == 0 {
				return
			}
			r.mmuStatus.And(^uint32(nvc0.MMUStatusFlushDone))
			pd := uint64(r.flushPD.Load()) << nvc0.TLBFlushPDShift
			b.mmu.flush(pd, v&nvc0.TLBFlushTypeVM != 0, v&nvc0.TLBFlushTypeBARVM != 0)
			r.mmuStatus.Or(nvc0.MMUStatusFlushDone)
		}},

		nvc0.RegCopy0InstLo: storage(&r.copyInst[0][0]),
		nvc0.RegCopy0InstHi: storage(&r.copyInst[0][1]),
		nvc0.RegCopy1InstLo: storage(&r.copyInst[1][0]),
		nvc0.RegCopy1InstHi: storage(&r.copyInst[1][1]),

		nvc0.RegEngineStatus(nvc0.EngineGR):  {read: b.compute.status(0)},
		nvc0.RegEngineStatus(nvc0.EngineCE0): {read: b.copy.status(0)},
		nvc0.RegEngineStatus(nvc0.EngineCE1): {read: b.copy.status(1)},

		nvc0.RegPGRAPHStatus: {read: func() uint32 {
			if r.pgraphBusy.Load() != 0 {
				return nvc0.PGRAPHStatusBusy
			}
			return 0
		}},

		nvc0.RegFECSData: storage(&r.fecsData),
		nvc0.RegFECSCmd: {read: r.fecsCmd.Load, write: func(v uint32) {
			r.fecsCmd.Store(v)
			if v == nvc0.FECSCmdBindPointer {
				if d := r.fecsData.Load(); d&nvc0.FECSBindValid != 0 {
					r.fecsBound.Store(d)
				}
			}
			r.fecsStatus.Or(nvc0.FECSDone)
		}},
		nvc0.RegFECSStatus: {read: r.fecsStatus.Load},
		nvc0.RegFECSClear:  {read: func() uint32 { return 0 }, write: func(v uint32) { r.fecsStatus.And(^v) }},
	}
	size := uint32(b.cfg.VRAMSize / uint64(b.cfg.MemPartitions) >> nvc0.MemPartSizeShift)
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
	return t
}

// faultReg is one word of the fault report, read under the report's lock.
func (b *Board) faultReg(p *uint32) reg {
	return reg{read: func() uint32 {
		b.r.faultMu.Lock()
		defer b.r.faultMu.Unlock()
		return *p
	}}
}

// praminAddr returns the VRAM address a PRAMIN-window offset reaches.
func (b *Board) praminAddr(off uint64) uint64 {
	return uint64(b.r.praminWindow.Load())<<nvc0.PRAMINWindowShift + off - nvc0.PRAMINBase
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
		v, ok := b.physRead32(phys{addr: b.praminAddr(off)})
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
		if !b.physWrite32(phys{addr: b.praminAddr(off)}, v) {
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

// BoundContext returns the FECS-bound context word (FECSBindValid | RAMIN >>
// 12), or 0 if none was bound.
func (b *Board) BoundContext() uint32 { return b.r.fecsBound.Load() }

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
