package shadow

import (
	"errors"
	"testing"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

func testTranslator(t *testing.T) (*Translator, Layout) {
	t.Helper()
	l := Layout{
		SliceBase: 0x4000_0000, SliceSize: 0x1000_0000, // 1 GiB .. 1.25 GiB
		RAMBase: 0x2_0000_0000, RAMSize: 0x4000_0000,
		Reserved: []Range{{0, 0x1000_0000}, {0x5000_0000, 0x100_0000}},
	}
	tr, err := NewTranslator(l)
	if err != nil {
		t.Fatal(err)
	}
	return tr, l
}

func TestTranslatorPTE(t *testing.T) {
	tr, l := testTranslator(t)
	vram := func(a uint64) nvc0.PTE { return nvc0.PTE{Present: true, Addr: a, Target: nvc0.TargetVRAM} }
	sys := func(a uint64, tgt uint32) nvc0.PTE {
		return nvc0.PTE{Present: true, Addr: a, Target: tgt, Volatile: true}
	}
	const sp, lp = nvc0.PageSize, nvc0.LargePageSize
	cases := []struct {
		name  string
		large bool
		in    nvc0.PTE
		want  nvc0.PTE
		ok    bool
	}{
		{"not present", false, nvc0.PTE{Addr: 0x1000, Kind: 0xfe}, nvc0.PTE{}, true},
		{"vram first page", false, vram(0), vram(l.SliceBase), true},
		{"vram middle", false, vram(0x123000), vram(l.SliceBase + 0x123000), true},
		{"vram last page", false, vram(l.SliceSize - sp), vram(l.SliceBase + l.SliceSize - sp), true},
		{"vram just past end", false, vram(l.SliceSize), nvc0.PTE{}, false},
		{"vram far beyond (reserved region after slice)", false, vram(0x1000_0000 + 0x10000), nvc0.PTE{}, false},
		{"vram top of PTE range", false, vram(0xFF_FFFF_F000), nvc0.PTE{}, false},
		{"flags preserved", false,
			nvc0.PTE{Present: true, ReadOnly: true, Volatile: true, Kind: 0xdb, Addr: 0x5000},
			nvc0.PTE{Present: true, ReadOnly: true, Volatile: true, Kind: 0xdb, Addr: l.SliceBase + 0x5000}, true},
		{"privileged cleared", false,
			nvc0.PTE{Present: true, Privileged: true, Addr: 0x5000},
			nvc0.PTE{Present: true, Addr: l.SliceBase + 0x5000}, true},
		{"unknown target dropped", false, nvc0.PTE{Present: true, Addr: 0x5000, Target: 1}, nvc0.PTE{}, false},
		{"sys snooped in RAM", false, sys(0x7000, nvc0.TargetSysSnooped), sys(l.RAMBase+0x7000, nvc0.TargetSysSnooped), true},
		{"sys non-snooped in RAM", false, sys(0x7000, nvc0.TargetSysNoSnoop), sys(l.RAMBase+0x7000, nvc0.TargetSysNoSnoop), true},
		{"sys last page", false, sys(l.RAMSize-sp, nvc0.TargetSysSnooped), sys(l.RAMBase+l.RAMSize-sp, nvc0.TargetSysSnooped), true},
		{"sys past RAM", false, sys(l.RAMSize, nvc0.TargetSysSnooped), nvc0.PTE{}, false},
		{"sys machine address of another VM", false, sys(l.RAMBase+0x1000, nvc0.TargetSysSnooped), nvc0.PTE{}, false},
		{"large first", true, vram(0), vram(l.SliceBase), true},
		{"large last", true, vram(l.SliceSize - lp), vram(l.SliceBase + l.SliceSize - lp), true},
		{"large straddling end", true, vram(l.SliceSize - sp), nvc0.PTE{}, false},
		{"large misaligned", true, vram(lp + sp), nvc0.PTE{}, false},
		{"large sys straddling RAM end", true, sys(l.RAMSize-lp+sp, nvc0.TargetSysSnooped), nvc0.PTE{}, false},
		{"large sys in RAM", true, sys(lp, nvc0.TargetSysSnooped), sys(l.RAMBase+lp, nvc0.TargetSysSnooped), true},
		{"small page at last page fits as small", false, vram(l.SliceSize - sp), vram(l.SliceBase + l.SliceSize - sp), true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := tr.PTE
			if c.large {
				f = tr.LargePTE
			}
			got, ok := f(c.in)
			if got != c.want || ok != c.ok {
				t.Fatalf("got %+v ok=%v, want %+v ok=%v", got, ok, c.want, c.ok)
			}
		})
	}
}

// TestTranslatorReservedUnreachable sweeps guest VRAM addresses around the
// slice and checks no translation reaches a reserved range.
func TestTranslatorReservedUnreachable(t *testing.T) {
	tr, l := testTranslator(t)
	for _, large := range []bool{false, true} {
		size := uint64(nvc0.PageSize)
		f := tr.PTE
		if large {
			size, f = nvc0.LargePageSize, tr.LargePTE
		}
		for a := uint64(0); a < 0x8000_0000; a += size {
			s, ok := f(nvc0.PTE{Present: true, Addr: a})
			if ok != (a+size <= l.SliceSize) {
				t.Fatalf("guest %#x large=%v: ok=%v", a, large, ok)
			}
			if ok {
				if err := checkSafePTE(l, s, size); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

func TestTranslatorAddrs(t *testing.T) {
	tr, l := testTranslator(t)
	for _, c := range []struct {
		a, n uint64
		ok   bool
	}{
		{0, 1, true}, {0, l.SliceSize, true}, {0, l.SliceSize + 1, false}, {l.SliceSize - 1, 1, true},
		{l.SliceSize - 1, 2, false}, {l.SliceSize, 1, false}, {5, 0, false}, {^uint64(0) - 10, 100, false},
		{1, ^uint64(0), false},
	} {
		p, ok := tr.VRAMAddr(c.a, c.n)
		if ok != c.ok || (ok && p != l.SliceBase+c.a) {
			t.Errorf("VRAMAddr(%#x, %#x) = %#x, %v; want ok=%v", c.a, c.n, p, ok, c.ok)
		}
		if ok {
			if g, ok := tr.GuestVRAMAddr(p); !ok || g != c.a {
				t.Errorf("GuestVRAMAddr(%#x) = %#x, %v", p, g, ok)
			}
		}
	}
	if _, ok := tr.GuestVRAMAddr(l.SliceBase - 1); ok {
		t.Error("GuestVRAMAddr below slice succeeded")
	}
	if _, ok := tr.GuestVRAMAddr(l.SliceBase + l.SliceSize); ok {
		t.Error("GuestVRAMAddr past slice succeeded")
	}
	if m, ok := tr.RAMAddr(0x1000, 0x1000); !ok || m != l.RAMBase+0x1000 {
		t.Errorf("RAMAddr = %#x, %v", m, ok)
	}
	if _, ok := tr.RAMAddr(l.RAMSize-0x800, 0x1000); ok {
		t.Error("RAMAddr straddling RAM end succeeded")
	}
}

func TestNewTranslatorRejects(t *testing.T) {
	for name, l := range map[string]Layout{
		"empty slice":          {SliceBase: 0x10000, SliceSize: 0},
		"unaligned slice":      {SliceBase: 0x10800, SliceSize: 0x10000},
		"unaligned RAM":        {SliceBase: 0x10000, SliceSize: 0x10000, RAMBase: 0x100, RAMSize: 0x1000},
		"slice beyond PTE":     {SliceBase: 1 << 40, SliceSize: 0x10000},
		"RAM beyond PTE":       {SliceBase: 0x10000, SliceSize: 0x10000, RAMBase: 1<<40 - 0x1000, RAMSize: 0x2000},
		"overlaps reserved":    {SliceBase: 0x10000, SliceSize: 0x10000, Reserved: []Range{{0x1f000, 0x1000}}},
		"reserved overflowing": {SliceBase: 0x10000, SliceSize: 0x10000, Reserved: []Range{{^uint64(0), 2}}},
	} {
		if _, err := NewTranslator(l); !errors.Is(err, ErrLayout) {
			t.Errorf("%s: err = %v, want ErrLayout", name, err)
		}
	}
	// Adjacent reserved ranges are fine.
	if _, err := NewTranslator(Layout{SliceBase: 0x10000, SliceSize: 0x10000, Reserved: []Range{{0, 0x10000}, {0x20000, 0x1000}}}); err != nil {
		t.Error(err)
	}
}
