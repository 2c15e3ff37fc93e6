package sim

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

func TestMMUTranslate(t *testing.T) {
	r := newRig(t)
	sys := r.newSysMem(4 << 20)
	s := r.newSpace(0x80_0000_0000 - 1)
	// A second space whose page tables live in system memory.
	ss := r.newSpace(testLimit)
	ss.sysPT, ss.sys, ss.sysNext = true, sys, 1<<20

	vramSmall := r.alloc(nvc0.PageSize, nvc0.PageSize)
	vramLarge := r.alloc(nvc0.LargePageSize, nvc0.LargePageSize)
	s.mapPage(0x1000, vramSmall, nvc0.TargetVRAM, false, false)
	s.mapPage(0x2000, sys.base+0x3000, nvc0.TargetSysSnooped, false, false)
	s.mapPage(0x3000, vramSmall, nvc0.TargetVRAM, false, true)
	s.mapPage(0x4000, r.b.VRAMSize(), nvc0.TargetVRAM, false, false)
	s.mapPage(0x5000, sys.base+uint64(len(sys.mem)), nvc0.TargetSysNoSnoop, false, false)
	s.mapPage(0x6000, 0x1000, 1, false, false) // reserved target
	// Large pages in another PDE, with a small-page override in the same PDE.
	s.mapPage(0x8000000, vramLarge, nvc0.TargetVRAM, true, false)
	s.mapPage(0x8020000, sys.base+0x100000, nvc0.TargetSysSnooped, true, false)
	s.mapPage(0x8001000, vramSmall, nvc0.TargetVRAM, false, false)
	ss.mapPage(0x1000, vramSmall, nvc0.TargetVRAM, false, false)
	ss.mapPage(0x8000000, sys.base, nvc0.TargetSysSnooped, true, false)

	for _, tc := range []struct {
		name   string
		s      *space
		va     uint64
		write  bool
		want   phys
		reason uint32
	}{
		{"small vram", s, 0x1234, false, phys{addr: vramSmall + 0x234}, 0},
		{"small sys", s, 0x2ff8, true, phys{sys: true, addr: sys.base + 0x3ff8}, 0},
		{"read-only read", s, 0x3010, false, phys{addr: vramSmall + 0x10}, 0},
		{"read-only write", s, 0x3010, true, phys{}, nvc0.FaultReasonReadOnly},
		{"vram beyond size", s, 0x4000, false, phys{}, nvc0.FaultReasonNoMemory},
		{"sys outside regions", s, 0x5000, false, phys{}, nvc0.FaultReasonNoMemory},
		{"reserved target", s, 0x6000, false, phys{}, nvc0.FaultReasonNoMemory},
		{"no PTE", s, 0x7000, false, phys{}, nvc0.FaultReasonPageNotPresent},
		{"no PDE", s, 0x10000000, false, phys{}, nvc0.FaultReasonPTNotPresent},
		{"large vram", s, 0x8005678, true, phys{addr: vramLarge + 0x5678}, 0},
		{"large sys", s, 0x803ffff, false, phys{sys: true, addr: sys.base + 0x11ffff}, 0},
		{"small overrides large", s, 0x8001004, false, phys{addr: vramSmall + 4}, 0},
		{"large page not mapped", s, 0x8040000, false, phys{}, nvc0.FaultReasonPageNotPresent},
		{"beyond limit", s, 0x80_0000_0000, false, phys{}, nvc0.FaultReasonVMLimit},
		{"sys page tables small", ss, 0x1008, false, phys{addr: vramSmall + 8}, 0},
		{"sys page tables large", ss, 0x8000010, false, phys{sys: true, addr: sys.base + 0x10}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, _ := r.b.vmFromRAMIN(tc.s.ramin, false)
			got, err := r.b.translate(v, tc.va, tc.write)
			if tc.want == (phys{}) {
				var fe *faultError
				if !errors.As(err, &fe) || fe.reason != tc.reason || fe.va != tc.va || fe.write != tc.write {
					t.Fatalf("translate(%#x) = %+v, %v; want fault reason %d", tc.va, got, err, tc.reason)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("translate(%#x) = %+v, %v; want %+v", tc.va, got, err, tc.want)
			}
		})
	}
}

// bar3 sets up the BAR3 aperture over a fresh address space.
func (r *rig) bar3() *space {
	s := r.newSpace(nvc0.BAR3Size - 1)
	r.b.Write32(nvc0.BAR0, nvc0.RegBAR3Inst, nvc0.InstEncode(s.ramin, nvc0.BARInstModeVM))
	return s
}

func TestBARApertures(t *testing.T) {
	r := newRig(t)
	sys := r.newSysMem(1 << 20)
	s := r.bar3()
	pa := s.mapVRAM(0x4000, nvc0.PageSize)
	s.mapSys(0x5000, sys.base+0x2000, nvc0.PageSize)
	r.b.Write32(nvc0.BAR3, 0x4010, 0x11223344)
	if got := r.r32(pa + 0x10); got != 0x11223344 {
		t.Fatalf("BAR3 write landed as %#x", got)
	}
	r.b.Write32(nvc0.BAR3, 0x5ffc, 0x55667788)
	if got := binary.LittleEndian.Uint32(sys.mem[0x2ffc:]); got != 0x55667788 {
		t.Fatalf("BAR3 sys write landed as %#x", got)
	}
	if got := r.b.Read32(nvc0.BAR3, 0x5ffc); got != 0x55667788 {
		t.Fatalf("BAR3 sys read %#x", got)
	}
	before := r.b.Stats().BARFaults
	r.b.Write32(nvc0.BAR3, 0x9000, 1)        // unmapped
	_ = r.b.Read32(nvc0.BAR3, 0x9000)        // unmapped
	_ = r.b.Read32(nvc0.BAR3, nvc0.BAR3Size) // beyond the BAR
	_ = r.b.Read32(nvc0.BAR3, 0x4002)        // unaligned
	if got := r.b.Stats().BARFaults - before; got != 4 {
		t.Fatalf("%d BAR faults counted, want 4", got)
	}
	// The two translation faults were filed for the BAR3 unit.
	rp := r.reports()
	if len(rp) != 1 || !rp[0].fault || rp[0].unit != nvc0.FaultUnitBAR3 || rp[0].va != 0x9000 ||
		rp[0].inst != nvc0.InstEncode(s.ramin, 0) || rp[0].typ != nvc0.FaultReasonPageNotPresent|nvc0.FaultTypeWrite|nvc0.FaultTypeHub|nvc0.FaultClientBARWrite<<nvc0.FaultTypeClientShift {
		t.Fatalf("reports %v", rp)
	}
	r.ack()
	if rp := r.reports(); len(rp) != 1 || rp[0].typ != nvc0.FaultReasonPageNotPresent|nvc0.FaultTypeHub|nvc0.FaultClientBARRead<<nvc0.FaultTypeClientShift {
		t.Fatalf("second report %v", rp)
	}
	r.ack()
	// With MODE clear the BAR is a window straight onto VRAM (as out of
	// reset): offset = VRAM address.
	r.w32(0x4010, 0x600DF00D)
	r.b.Write32(nvc0.BAR0, nvc0.RegBAR3Inst, 0)
	if got := r.b.Read32(nvc0.BAR3, 0x4010); got != 0x600DF00D {
		t.Fatalf("direct-mode BAR3 read %#x", got)
	}
}

func TestTLBStaleUntilFlush(t *testing.T) {
	r := newRig(t)
	s := r.bar3()
	a := r.alloc(nvc0.PageSize, nvc0.PageSize)
	b := r.alloc(nvc0.PageSize, nvc0.PageSize)
	r.w32(a, 0xAAAA)
	r.w32(b, 0xBBBB)
	s.mapPage(0x1000, a, nvc0.TargetVRAM, false, false)
	if got := r.b.Read32(nvc0.BAR3, 0x1000); got != 0xAAAA {
		t.Fatalf("before remap: %#x", got)
	}
	s.mapPage(0x1000, b, nvc0.TargetVRAM, false, false)
	if got := r.b.Read32(nvc0.BAR3, 0x1000); got != 0xAAAA {
		t.Fatalf("remap visible without a flush: %#x", got)
	}
	// A flush of another page directory changes nothing.
	r.flushTLB(r.bar1.pd, true)
	if got := r.b.Read32(nvc0.BAR3, 0x1000); got != 0xAAAA {
		t.Fatalf("remap visible after unrelated flushes: %#x", got)
	}
	r.flushTLB(s.pd, true)
	if got := r.b.Read32(nvc0.BAR3, 0x1000); got != 0xBBBB {
		t.Fatalf("after flush: %#x", got)
	}
	// Unmapping: stale until flushed, then a fault.
	s.unmapPage(0x1000, false)
	if got := r.b.Read32(nvc0.BAR3, 0x1000); got != 0xBBBB {
		t.Fatalf("unmap visible without a flush: %#x", got)
	}
	r.flushTLB(s.pd, true)
	before := r.b.Stats().BARFaults
	if got := r.b.Read32(nvc0.BAR3, 0x1000); got != 0 || r.b.Stats().BARFaults != before+1 {
		t.Fatalf("after unmap+flush: %#x", got)
	}
}

func TestTLBBounded(t *testing.T) {
	r := newRig(t)
	s := r.newSpace(testLimit)
	pa := r.alloc(nvc0.PageSize, nvc0.PageSize)
	for i := range uint64(tlbMaxEntries + 10) {
		s.mapPage(i*nvc0.PageSize, pa, nvc0.TargetVRAM, false, false)
	}
	v, _ := r.b.vmFromRAMIN(s.ramin, false)
	for i := range uint64(tlbMaxEntries + 10) {
		if _, err := r.b.translate(v, i*nvc0.PageSize, false); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(v.as.tlb); n > tlbMaxEntries {
		t.Fatalf("TLB holds %d entries", n)
	}
}
