package sim

import (
	"testing"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

func BenchmarkMMIORead(b *testing.B) {
	r := newRig(b)
	b.Run("register", func(b *testing.B) {
		for b.Loop() {
			r.b.Read32(nvc0.BAR0, nvc0.RegPMCEnable)
		}
	})
	b.Run("PRAMIN", func(b *testing.B) {
		for b.Loop() {
			r.b.Read32(nvc0.BAR0, nvc0.PRAMINBase+0x100)
		}
	})
	b.Run("BAR1", func(b *testing.B) {
		c := r.newChan(0, nil)
		for b.Loop() {
			r.b.Read32(nvc0.BAR1, c.pollVA()+nvc0.UserGPGet)
		}
	})
	b.Run("register-parallel", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				r.b.Read32(nvc0.BAR0, nvc0.RegPMCEnable)
			}
		})
	})
}

func BenchmarkMMIOWrite(b *testing.B) {
	r := newRig(b)
	b.Run("register", func(b *testing.B) {
		for b.Loop() {
			r.b.Write32(nvc0.BAR0, nvc0.RegPMCEnable, 1)
		}
	})
	b.Run("PRAMIN", func(b *testing.B) {
		for b.Loop() {
			r.b.Write32(nvc0.BAR0, nvc0.PRAMINBase+0x100, 1)
		}
	})
}

func BenchmarkCopyEngine(b *testing.B) {
	const size = 16 << 20
	for _, tc := range []struct {
		name  string
		toSys bool
	}{{"vram-to-vram", false}, {"vram-to-sys", true}} {
		b.Run(tc.name, func(b *testing.B) {
			r := newRig(b)
			c := r.newChan(0, nil)
			c.s.mapVRAM(vramVA, size)
			dst := uint64(vramVA + size)
			if tc.toSys {
				sys := r.newSysMem(size)
				c.s.mapSys(sysVA, sys.base, size)
				dst = sysVA
			} else {
				c.s.mapVRAM(dst, size)
			}
			cmd := cat(bind(0, nvc0.ClassFermiCopy), copyCmd(0, vramVA, dst, nvc0.PageSize, nvc0.PageSize, nvc0.PageSize, size/nvc0.PageSize))
			b.SetBytes(size)
			for b.Loop() {
				c.push(cmd...)
				c.mustFinish()
			}
		})
	}
}

func BenchmarkKernelMadd(b *testing.B) {
	const n = 256
	r := newRig(b)
	c := r.newChan(0, nil)
	_, _, va, vb, vc, _ := maddSetup(r, c, n)
	cmd := kernelLaunch(r, c, nvc0.KernelMadd, nvc0.KernelMagic, va, vb, vc, n)
	b.SetBytes(3 * n * n * 4)
	for b.Loop() {
		c.push(cmd...)
		c.mustFinish()
	}
}

// BenchmarkMMIOWriteBAR1 is a write through the BAR1 aperture (MMU
// translation), the simulator's costliest write path: the Fermi profile's
// write floor must stay above it (see TimingFermi).
func BenchmarkMMIOWriteBAR1(b *testing.B) {
	r := newRig(b)
	c := r.newChan(0, nil)
	for b.Loop() {
		r.b.Write32(nvc0.BAR1, c.pollVA()+0x40, 1)
	}
}
