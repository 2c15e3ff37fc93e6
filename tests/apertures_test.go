package tests

import (
	"testing"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// TestPRAMINWindowOutsideSlice: the BAR0 PRAMIN window moved past the slice
// reads 0 and drops writes (each counted as denied); a window straddling the
// slice end works below it and stops exactly there.
func TestPRAMINWindowOutsideSlice(t *testing.T) {
	s := newSceneWith(t, "fv-naive", false)
	e, a, r := s.e, s.a, s.a.r
	cs := s.canaries(t)
	const word = 0xDEADBEEF
	// Control: its own VRAM works through the window.
	r.vramWrite32(0x100000, 0x12345678)
	if got := r.vramRead32(0x100000); got != 0x12345678 {
		t.Fatalf("PRAMIN read-back of its own VRAM = %#x: the harness is broken", got)
	}
	targets := hostileVRAM(a, cs)
	targets = append(targets, target{"window register all-ones", 0xFFFFFFFF << nvc0.PRAMINWindowShift})
	rounds := untilDone(s.honest, 1, func(int) {
		for _, tg := range targets {
			before := e.denied(t, "attacker")
			off := r.window(tg.g)
			for k := uint32(0); k < 4; k++ {
				if v := r.rd(off + 4*k); v != 0 {
					t.Errorf("PRAMIN read at %s (guest %#x) = %#x, want 0", tg.what, tg.g+uint64(4*k), v)
				}
				r.wr(off+4*k, word)
			}
			r.sync()
			e.expectDenied(t, "attacker", before, 8, "PRAMIN at "+tg.what)
		}
		// Straddling the end of the slice: the last 64 KiB is its own, the
		// next byte is the honest VM's first page.
		S := a.slot.VRAM.Size
		r.wr(nvc0.RegPRAMINWindow, uint32((S-0x10000)>>nvc0.PRAMINWindowShift))
		r.wr(nvc0.PRAMINBase+0xFFFC, word)
		if got := r.rd(nvc0.PRAMINBase + 0xFFFC); got != word {
			t.Errorf("the last word of its own slice reads %#x through PRAMIN, want %#x", got, uint32(word))
		}
		before := e.denied(t, "attacker")
		r.wr(nvc0.PRAMINBase+0x10000, word)
		if got := r.rd(nvc0.PRAMINBase + 0x10000); got != 0 {
			t.Errorf("the first word past its slice reads %#x through PRAMIN, want 0", got)
		}
		r.sync()
		e.expectDenied(t, "attacker", before, 2, "PRAMIN one word past the slice")
	})
	t.Logf("%d rounds", rounds)
	s.checkCanaries(t, cs)
	s.honest.verified(t)
	s.checkCanaries(t, cs)
}

// TestBARPageTableOutsideSlice: the guest's BAR3 page table (built by hand
// through PRAMIN) maps foreign VRAM and system memory past its RAM; CPU reads
// through those aperture pages return 0 and writes never land. Aperture
// offsets beyond the VM's BAR slices are denied. Run with and without BAR
// remap (remapped pages bypass the trap).
func TestBARPageTableOutsideSlice(t *testing.T) {
	modes := []string{"fv-naive", "fv-optimized"}
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			s := newSceneWith(t, mode, false)
			e, a, r := s.e, s.a, s.a.r
			cs := s.canaries(t)
			resCanary := e.plant(t, "reserve, last page", e.layout.Reserved.End()-pageSize, 0x77)
			cs = append(cs, resCanary)
			const ramin, pd, pt, own = 0x300000, 0x310000, 0x340000, 0x400000
			targets := hostileVRAM(a, cs)
			r.vramWrite64(ramin+nvc0.RAMINPageDir, pd)
			r.vramWrite64(ramin+nvc0.RAMINAddrLimit, bar3PerVM-1)
			w0, w1 := nvc0.PDE{SmallPresent: true, SmallAddr: pt}.Encode()
			r.vramWrite(pd, []uint32{w0, w1})
			var ptes []uint32
			add := func(p nvc0.PTE) {
				lo, hi := p.Encode()
				ptes = append(ptes, lo, hi)
			}
			add(nvc0.PTE{Present: true, Addr: own, Target: nvc0.TargetVRAM})
			for _, tg := range targets {
				add(nvc0.PTE{Present: true, Addr: tg.g &^ (pageSize - 1), Target: nvc0.TargetVRAM})
			}
			for _, gpa := range []uint64{guestRAM, 1 << 39} {
				add(nvc0.PTE{Present: true, Addr: gpa, Target: nvc0.TargetSysSnooped})
			}
			r.vramWrite(pt, ptes)
			r.vramWrite32(own, 0xC0FFEE00)
			r.wr(nvc0.RegBAR3Inst, nvc0.InstEncode(ramin, nvc0.BARInstModeVM))
			r.flushTLB(t, pd, true)
			bar := func(off uint64) uint32 { return a.dev.Read32(nvc0.BAR3, off) }
			if got := bar(0); got != 0xC0FFEE00 {
				t.Fatalf("control: BAR3 page 0 maps its own page and reads %#x, want 0xc0ffee00", got)
			}
			pages := uint64(len(ptes) / 2)
			rounds := untilDone(s.honest, 1, func(int) {
				for i := uint64(1); i < pages; i++ {
					for _, off := range []uint64{0, 4, pageSize - 4} {
						if got := bar(i*pageSize + off); got != 0 {
							t.Errorf("BAR3 page %d (hostile PTE %d) reads %#x at +%#x, want 0", i, i, got, off)
						}
						a.dev.Write32(nvc0.BAR3, i*pageSize+off, 0xBADC0DE)
					}
				}
				// Offsets beyond its BAR slices.
				before := e.denied(t, "attacker")
				for _, b := range []struct {
					bar  int
					size uint64
				}{{nvc0.BAR1, bar1PerVM}, {nvc0.BAR3, bar3PerVM}} {
					for _, off := range []uint64{b.size, b.size + pageSize, 2*b.size - 4} {
						if got := a.dev.Read32(b.bar, off); got != 0 {
							t.Errorf("BAR%d offset %#x (past its %d MiB slice) reads %#x", b.bar, off, b.size>>20, got)
						}
						a.dev.Write32(b.bar, off, 0xBADC0DE)
					}
				}
				r.sync()
				e.expectDenied(t, "attacker", before, 12, "aperture offsets past the BAR slices")
			})
			t.Logf("%d rounds", rounds)
			// A BAR instance outside the slice maps nothing.
			for _, tg := range targets {
				r.wr(nvc0.RegBAR3Inst, nvc0.InstEncode(tg.g, nvc0.BARInstModeVM))
				r.flushTLB(t, tg.g, true)
				if got := bar(0); got != 0 {
					t.Errorf("BAR3 instance at %s: page 0 reads %#x, want 0", tg.what, got)
				}
			}
			s.checkCanaries(t, cs)
			s.honest.verified(t)
			s.checkCanaries(t, cs)
		})
	}
}
