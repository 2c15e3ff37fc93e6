package sim

import (
	"errors"
	"time"

	"sync/atomic"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/internal/spin"
)

// chargeFrom makes an access that began at start last at least ns: the
// timing model's cost is a floor, not an addition, so the simulator's own
// work (register decode, software MMU) does not inflate it.
func (b *Board) chargeFrom(start time.Time, ns int64) {
	if ns > 0 {
		spin.Until(start.Add(time.Duration(ns)))
	}
}

// Read32 reads a 32-bit word from a BAR (gpu.MMIO). Accesses the board does
// not decode read 0 and are counted in Stats.
func (b *Board) Read32(bar int, off uint64) uint32 {
	if !b.enter() {
		return 0
	}
	defer b.leave()
	if b.busLost.Load() {
		return 0xFFFFFFFF // nobody answers: the master aborts with all ones
	}
	defer b.chargeFrom(time.Now(), b.timing.MMIOReadNs)
	return b.read32(bar, off)
}

// read32 is Read32 without the timing model.
func (b *Board) read32(bar int, off uint64) uint32 {
	if bar < 0 || bar >= numBARs {
		b.st.unknown.Add(1)
		return 0
	}
	b.st.reads[bar].Add(1)
	switch bar {
	case nvc0.BAR0:
		return b.readReg(off)
	case nvc0.BAR1, nvc0.BAR3:
		return b.barRead(bar, off)
	case nvc0.BAR5:
		if off >= nvc0.BAR5Size || off%4 != 0 {
			b.st.unknown.Add(1)
		}
		return 0
	}
	b.st.unknown.Add(1)
	return 0
}

// Write32 writes a 32-bit word to a BAR (gpu.MMIO). Accesses the board does
// not decode are dropped and counted in Stats.
func (b *Board) Write32(bar int, off uint64, v uint32) {
	if !b.enter() {
		return
	}
	defer b.leave()
	if b.busLost.Load() {
		return
	}
	defer b.chargeFrom(time.Now(), b.timing.MMIOWriteNs)
	b.write32(bar, off, v)
}

// write32 is Write32 without the timing model.
func (b *Board) write32(bar int, off uint64, v uint32) {
	if bar < 0 || bar >= numBARs {
		b.st.unknown.Add(1)
		return
	}
	b.st.writes[bar].Add(1)
	switch bar {
	case nvc0.BAR0:
		b.writeReg(off, v)
	case nvc0.BAR1, nvc0.BAR3:
		b.barWrite(bar, off, v)
	case nvc0.BAR5:
		if off >= nvc0.BAR5Size || off%4 != 0 {
			b.st.unknown.Add(1)
		}
	default:
		b.st.unknown.Add(1)
	}
}

// barCache remembers the vm of a BAR aperture for as long as its instance
// register, page directory and limit stay the same.
type barCache struct {
	inst      uint32
	pd, limit uint64
	vm        *vm
}

// barMapping is how a BAR reaches memory: through the address space of its
// instance block (vm), or, with the instance register's MODE bit clear, as
// a window straight onto VRAM (direct) — how a GF100 comes out of reset.
type barMapping struct {
	vm     *vm
	direct bool
	inst   uint32 // the instance register
}

// barMap returns how BAR1 or BAR3 maps. The RAMIN is read at every access,
// so a rewrite of its page directory or limit takes effect at once. ok is
// false if the instance register names memory the board refuses (not VRAM).
func (b *Board) barMap(bar int) (m barMapping, ok bool) {
	inst, cache := &b.r.bar1Inst, &b.r.bar1VM
	if bar == nvc0.BAR3 {
		inst, cache = &b.r.bar3Inst, &b.r.bar3VM
	}
	reg := inst.Load()
	m.inst = reg
	if reg&nvc0.BARInstModeVM == 0 {
		m.direct = true
		return m, true
	}
	if nvc0.InstTarget(reg) != nvc0.MemTargetVRAM {
		return m, false
	}
	ramin := nvc0.InstDecode(reg)
	pd, target := nvc0.RAMINAddrDecode(b.vramRead32(ramin+nvc0.RAMINPageDir), b.vramRead32(ramin+nvc0.RAMINPageDir+4))
	if target != nvc0.MemTargetVRAM {
		return m, false
	}
	limit := b.vramRead64(ramin + nvc0.RAMINAddrLimit)
	if c := cache.Load(); c != nil && c.inst == reg && c.pd == pd && c.limit == limit {
		m.vm = c.vm
		return m, true
	}
	m.vm = &vm{as: b.mmu.space(pd, true), pd: pd, limit: limit}
	cache.Store(&barCache{inst: reg, pd: pd, limit: limit, vm: m.vm})
	return m, true
}

func barSize(bar int) uint64 {
	if bar == nvc0.BAR1 {
		return nvc0.BAR1Size
	}
	return nvc0.BAR3Size
}

// barFault counts a failed BAR access and, for a translation fault, files
// an MMU fault record for the BAR's unit as a GF100 does.
func (b *Board) barFault(bar int, m barMapping, err error) {
	b.st.barFaults.Add(1)
	var fe *faultError
	if !errors.As(err, &fe) {
		return
	}
	unit, client := nvc0.FaultUnitBAR1, uint32(nvc0.FaultClientBARRead)
	if bar == nvc0.BAR3 {
		unit = nvc0.FaultUnitBAR3
	}
	if fe.write {
		client = nvc0.FaultClientBARWrite
	}
	fe.src = &faultSource{unit: unit, client: client, hub: true}
	b.reportFault(m.inst&nvc0.ChanInstMask, fe)
}

func (b *Board) barRead(bar int, off uint64) uint32 {
	if off >= barSize(bar) || off%4 != 0 {
		b.st.barFaults.Add(1)
		return 0
	}
	m, ok := b.barMap(bar)
	switch {
	case !ok:
		b.st.barFaults.Add(1)
		return 0
	case m.direct:
		val, ok := b.physRead32(phys{addr: off})
		if !ok {
			b.st.barFaults.Add(1)
		}
		return val
	}
	val, err := b.vmRead32(m.vm, off)
	if err != nil {
		b.barFault(bar, m, err)
		return 0
	}
	return val
}

func (b *Board) barWrite(bar int, off uint64, val uint32) {
	if off >= barSize(bar) || off%4 != 0 {
		b.st.barFaults.Add(1)
		return
	}
	m, ok := b.barMap(bar)
	switch {
	case !ok:
		b.st.barFaults.Add(1)
	case m.direct:
		if !b.physWrite32(phys{addr: off}, val) {
			b.st.barFaults.Add(1)
		}
	default:
		if err := b.vmWrite32(m.vm, off, val); err != nil {
			b.barFault(bar, m, err)
		}
	}
	if bar != nvc0.BAR1 {
		return
	}
	poll := b.r.pollArea.Load()
	if poll&nvc0.PollAreaEnable == 0 {
		return
	}
	base := uint64(poll&nvc0.PollAreaMask) << nvc0.PageShift
	if off < base || off >= base+nvc0.MaxChannels*nvc0.UserAreaSize {
		return
	}
	if (off-base)%nvc0.UserAreaSize == nvc0.UserGPPut {
		b.doorbell(int((off - base) / nvc0.UserAreaSize))
	}
}

// barCachePtr is the type of the BAR vm caches in regState.
type barCachePtr = atomic.Pointer[barCache]
