package sim

import (
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
	defer b.chargeFrom(time.Now(), b.timing.MMIOReadNs)
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
	defer b.chargeFrom(time.Now(), b.timing.MMIOWriteNs)
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

// barVM returns the address space behind BAR1 or BAR3, or nil if its
// instance register is not valid. The RAMIN is read at every access, so a
// rewrite of its page directory or limit takes effect at once.
func (b *Board) barVM(bar int) *vm {
	inst, cache := &b.r.bar1Inst, &b.r.bar1VM
	if bar == nvc0.BAR3 {
		inst, cache = &b.r.bar3Inst, &b.r.bar3VM
	}
	reg := inst.Load()
	if reg&nvc0.BARInstValid == 0 {
		return nil
	}
	ramin := nvc0.InstDecode(reg)
	pd := b.vramRead64(ramin + nvc0.RAMINPageDir)
	limit := b.vramRead64(ramin + nvc0.RAMINAddrLimit)
	if c := cache.Load(); c != nil && c.inst == reg && c.pd == pd && c.limit == limit {
		return c.vm
	}
	v := &vm{as: b.mmu.space(pd, true), pd: pd, limit: limit}
	cache.Store(&barCache{inst: reg, pd: pd, limit: limit, vm: v})
	return v
}

func barSize(bar int) uint64 {
	if bar == nvc0.BAR1 {
		return nvc0.BAR1Size
	}
	return nvc0.BAR3Size
}

func (b *Board) barRead(bar int, off uint64) uint32 {
	if off >= barSize(bar) || off%4 != 0 {
		b.st.barFaults.Add(1)
		return 0
	}
	v := b.barVM(bar)
	if v == nil {
		b.st.barFaults.Add(1)
		return 0
	}
	val, err := b.vmRead32(v, off)
	if err != nil {
		b.st.barFaults.Add(1)
		return 0
	}
	return val
}

func (b *Board) barWrite(bar int, off uint64, val uint32) {
	if off >= barSize(bar) || off%4 != 0 {
		b.st.barFaults.Add(1)
		return
	}
	if v := b.barVM(bar); v == nil {
		b.st.barFaults.Add(1)
	} else if err := b.vmWrite32(v, off, val); err != nil {
		b.st.barFaults.Add(1)
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
