package sim

import (
	"sync"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// FECS, PGRAPH's context-switch microcontroller, as seen through its host
// mailbox (nvkm/engine/gr/gf100.c): the driver writes data to RegFECSData
// (RegFECSReglistData for the register-list commands), then a command to
// RegFECSCmd, and waits on RegFECSStatus. Several commands carry the
// physical instance address of a channel, which FECS then reads and writes
// directly; the board records what it was given (FECSAddresses) but, since
// it has no context-switch firmware, does nothing more with it. Size
// queries answer with the board's own sizes in RegFECSStatus; every other
// command sets nvc0.FECSDone there.

// Sizes the board reports for FECS's size queries (sim: its own choices;
// a GF100's depend on the floorsweeping).
const (
	fecsImageSize   = 0x20000
	fecsZcullSize   = 0x1000
	fecsPMSize      = 0x1000
	fecsReglistSize = 0x1000
)

// FECSRecord is what FECS was last told by the commands that carry
// addresses.
type FECSRecord struct {
	Bound       uint32 // FECSCmdSetChan / FECSCmdBindPointer: instance word
	Golden      uint32 // FECSCmdWFIGoldenSave: instance word
	ReglistInst uint32 // FECSCmdReglistInst: instance word
	ReglistVA   uint32 // FECSCmdReglistVA: VA >> 8
	CtxswOff    bool   // FECSCmdStopCtxsw without a later FECSCmdStartCtxsw
	Halted      bool   // FECSCmdHalt
}

type fecsState struct {
	mu       sync.Mutex
	data     uint32
	cmd      uint32
	status   uint32
	reglist  uint32
	chanNext uint32
	rec      FECSRecord
}

// command runs a FECS command.
func (s *fecsState) command(cmd uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cmd = cmd
	result := uint32(0)
	switch cmd {
	case nvc0.FECSCmdSetChan, nvc0.FECSCmdBindPointer:
		if s.data&nvc0.FECSBindValid != 0 {
			s.rec.Bound = s.data
		}
	case nvc0.FECSCmdWFIGoldenSave:
		s.rec.Golden = s.data
	case nvc0.FECSCmdReglistInst:
		s.rec.ReglistInst = s.reglist
	case nvc0.FECSCmdReglistVA:
		s.rec.ReglistVA = s.reglist
	case nvc0.FECSCmdStopCtxsw:
		s.rec.CtxswOff = true
	case nvc0.FECSCmdStartCtxsw:
		s.rec.CtxswOff = false
	case nvc0.FECSCmdHalt:
		s.rec.Halted = true
	case nvc0.FECSCmdImageSize:
		result = fecsImageSize
	case nvc0.FECSCmdZcullSize:
		result = fecsZcullSize
	case nvc0.FECSCmdPMSize:
		result = fecsPMSize
	case nvc0.FECSCmdReglistSize:
		result = fecsReglistSize
	}
	if result != 0 {
		s.status = result
	} else {
		s.status |= nvc0.FECSDone
	}
}

// field returns a register of the mailbox backed by p.
func (s *fecsState) field(p *uint32) reg {
	return reg{
		read:  func() uint32 { s.mu.Lock(); defer s.mu.Unlock(); return *p },
		write: func(v uint32) { s.mu.Lock(); *p = v; s.mu.Unlock() },
	}
}

// fecsRegs adds the FECS registers to t.
func (b *Board) fecsRegs(t regTable) {
	s := &b.r.fecs
	t[nvc0.RegFECSData] = s.field(&s.data)
	t[nvc0.RegFECSCmd] = reg{read: s.field(&s.cmd).read, write: s.command}
	t[nvc0.RegFECSStatus] = s.field(&s.status)
	t[nvc0.RegFECSReglistData] = s.field(&s.reglist)
	t[nvc0.RegFECSClear] = reg{read: func() uint32 { return 0 }, write: func(v uint32) {
		s.mu.Lock()
		s.status &^= v
		s.mu.Unlock()
	}}
	// CHAN_ADDR: the channel whose GR context is loaded (the hub firmware
	// sets it at a context load; host writes are dropped).
	t[nvc0.RegFECSChanAddr] = reg{read: func() uint32 {
		if v := b.compute.resident.Load(); v != 0 {
			return v | nvc0.FECSChanValid
		}
		return 0
	}, write: func(uint32) {}}
	// CHAN_NEXT: the hub firmware's; the board stores a host write and
	// does nothing with it.
	t[nvc0.RegFECSChanNext] = s.field(&s.chanNext)
}

// BoundContext returns the FECS-bound context word (FECSBindValid | RAMIN >>
// 12), or 0 if none was bound.
func (b *Board) BoundContext() uint32 { return b.FECSAddresses().Bound }

// FECSAddresses returns what the FECS commands that carry addresses were
// last given.
func (b *Board) FECSAddresses() FECSRecord {
	s := &b.r.fecs
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rec
}
