package nvc0

import "testing"

func TestPTERoundTrip(t *testing.T) {
	cases := []struct {
		name   string
		pte    PTE
		lo, hi uint32
	}{
		{"vram", PTE{Present: true, Addr: 0x12345000}, 0x00123451, 0x0},
		{"sys-snooped-volatile", PTE{Present: true, Addr: 0x10_0000_1000, Target: TargetSysSnooped, Volatile: true}, 0x10000011, 0x5},
		{"sys-nosnoop", PTE{Present: true, Addr: 0xFF_FFFF_F000, Target: TargetSysNoSnoop, Volatile: true}, 0xFFFFFFF1, 0x7},
		{"readonly-priv-kind", PTE{Present: true, ReadOnly: true, Privileged: true, Addr: 0x1000, Kind: 0xFE}, 0x17, 0xFE0},
		{"absent", PTE{}, 0, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			lo, hi := c.pte.Encode()
			if lo != c.lo || hi != c.hi {
				t.Fatalf("Encode = %#x,%#x want %#x,%#x", lo, hi, c.lo, c.hi)
			}
			if got := DecodePTE(lo, hi); got != c.pte {
				t.Fatalf("DecodePTE = %+v want %+v", got, c.pte)
			}
		})
	}
	if !(PTE{Target: TargetSysNoSnoop}).IsSystem() || (PTE{Target: TargetVRAM}).IsSystem() {
		t.Fatal("IsSystem wrong")
	}
}

func TestPDERoundTrip(t *testing.T) {
	cases := []struct {
		name   string
		pde    PDE
		w0, w1 uint32
	}{
		{"small-vram", PDE{SmallPresent: true, SmallAddr: 0x200000}, 0, 0x2001},
		{"large-vram", PDE{LargePresent: true, LargeAddr: 0x300000}, 0x3001, 0},
		{"both-sys-size", PDE{LargePresent: true, LargeSys: true, LargeAddr: 0x10_0000_0000, Size: 2, SmallPresent: true, SmallAddr: 0x4000}, 0x1000000a, 0x41},
		{"empty", PDE{}, 0, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w0, w1 := c.pde.Encode()
			if w0 != c.w0 || w1 != c.w1 {
				t.Fatalf("Encode = %#x,%#x want %#x,%#x", w0, w1, c.w0, c.w1)
			}
			if got := DecodePDE(w0, w1); got != c.pde {
				t.Fatalf("DecodePDE = %+v want %+v", got, c.pde)
			}
		})
	}
}

func TestVAIndices(t *testing.T) {
	va := uint64(3)<<PDEShift | uint64(5)<<LargePageShift | uint64(7)<<PageShift | 0x123
	if PDEIndex(va) != 3 {
		t.Errorf("PDEIndex = %d", PDEIndex(va))
	}
	if SmallPTEIndex(va) != 5<<(LargePageShift-PageShift)|7 {
		t.Errorf("SmallPTEIndex = %d", SmallPTEIndex(va))
	}
	if LargePTEIndex(va) != 5 {
		t.Errorf("LargePTEIndex = %d", LargePTEIndex(va))
	}
	if PDECount != 8192 || SmallPTECount != 32768 || LargePTECount != 1024 {
		t.Errorf("table sizes %d %d %d", PDECount, SmallPTECount, LargePTECount)
	}
}

func TestGPFIFOEntry(t *testing.T) {
	w0, w1 := GPFIFOEncode(0xAB_1234_5678, 0x1234)
	if w0 != 0x12345678 || w1 != 0xAB|0x1234<<10 {
		t.Fatalf("encode %#x %#x", w0, w1)
	}
	va, n := GPFIFODecodeEntry(w0, w1)
	if va != 0xAB_1234_5678 || n != 0x1234 {
		t.Fatalf("decode %#x %d", va, n)
	}
	lo, hi := uint32(0x1000), GPFIFOHiEncode(0x02_0000_1000, 9)
	rva, entries := GPFIFODecode(lo, hi)
	if rva != 0x02_0000_1000 || entries != 512 {
		t.Fatalf("ring %#x %d", rva, entries)
	}
}

func TestMethodHeader(t *testing.T) {
	cases := []struct {
		name string
		word uint32
		want MethodHeader
	}{
		{"incr", Incr(1, ComputeMthdCodeAddrHi, 2), MethodHeader{MthdTypeIncreasing, 2, 1, ComputeMthdCodeAddrHi}},
		{"nonincr", NonIncr(7, 0x1FFC, 0x1FFF), MethodHeader{MthdTypeNonIncreasing, 0x1FFF, 7, 0x1FFC}},
		{"immd", Immd(4, CopyMthdExec, CopyExecLinear), MethodHeader{MthdTypeImmediate, CopyExecLinear, 4, CopyMthdExec}},
		// nvc0_bo_move_copy's EXEC of 0x0110 on subchannel 4, as an immediate
		{"nouveau-copy-exec", 0x811080C0, MethodHeader{MthdTypeImmediate, 0x110, 4, CopyMthdExec}},
		// the NOP word nouveau pushes NOUVEAU_DMA_SKIPS of
		{"zero", 0, MethodHeader{MthdTypeOldIncreasing, 0, 0, 0}},
		// nouveau's BEGIN_NVC0(chan, 0, 0x10, 4): 0x20040004
		{"nouveau-semaphore", 0x20040004, MethodHeader{MthdTypeIncreasing, 4, 0, MthdSemaphoreAddrHi}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := DecodeMethodHeader(c.word); got != c.want {
				t.Fatalf("decode %#x = %+v want %+v", c.word, got, c.want)
			}
			if got := c.want.Encode(); got != c.word {
				t.Fatalf("encode = %#x want %#x", got, c.word)
			}
		})
	}
}

func TestChannelTable(t *testing.T) {
	if ChanInst(0) != 0x3000 || ChanCtl(0) != 0x3004 || ChanInst(127) != 0x33F8 {
		t.Fatal("channel table offsets")
	}
	for _, c := range []struct {
		off      uint32
		ch, word int
		ok       bool
	}{{0x3000, 0, 0, true}, {0x3004, 0, 1, true}, {0x33FC, 127, 1, true}, {0x3400, 0, 0, false}, {0x2FFC, 0, 0, false}, {0x3002, 0, 0, false}} {
		ch, word, ok := ChanFromTableOffset(c.off)
		if ok != c.ok || (ok && (ch != c.ch || word != c.word)) {
			t.Errorf("ChanFromTableOffset(%#x) = %d,%d,%v", c.off, ch, word, ok)
		}
	}
	if v := InstEncode(0x1234000, ChanInstValid|ChanInstPollEnable); v != 0xC0001234 || InstDecode(v) != 0x1234000 || InstTarget(v|MemTargetSysCoherent<<ChanInstTargetShift) != MemTargetSysCoherent {
		t.Fatalf("InstEncode %#x", v)
	}
	if PlaylistSubmitEncode(3) != 0x01F00003 {
		t.Fatal("playlist submit")
	}
	if MemPartSize(2) != 0x11220C {
		t.Fatal("MemPartSize")
	}
}

func TestSemaphoreTrigger(t *testing.T) {
	// nvc0_fence_emit32 releases with 0x1002 on Kepler and plain 2 on
	// Fermi: 16 bytes unless RELEASE_SIZE (bit 24) asks for 4.
	if op, long := SemaphoreTriggerDecode(SemaphoreRelease); op != SemaphoreRelease || !long {
		t.Fatal("a plain release is 16 bytes")
	}
	if op, long := SemaphoreTriggerDecode(SemaphoreRelease | SemaphoreRelease4Byte); op != SemaphoreRelease || long {
		t.Fatal("RELEASE_SIZE_4BYTE")
	}
	// nvc0_fence_sync32 acquires with 0x1004: ACQ_GEQ | ACQUIRE_SWITCH.
	if op, _ := SemaphoreTriggerDecode(0x1004); op != SemaphoreAcquireGEq {
		t.Fatal("acquire geq with switch")
	}
}

// PMC_BOOT_0 decodes as nouveau decodes it, and the board's identity is
// consistent: a GF100 at stepping A3, the PCI revision the same stepping.
func TestBoot0Decode(t *testing.T) {
	if c, r := Boot0Chipset(Boot0Value), Boot0Revision(Boot0Value); c != ChipsetGF100 || r != RevisionA3 || Boot0Value != 0x0C0C00A3 {
		t.Errorf("Boot0Value %#08x decodes to chipset %#x revision %#x", uint32(Boot0Value), c, r)
	}
	if PCIRevision != Boot0Revision(Boot0Value) {
		t.Errorf("PCI revision %#x differs from the chip revision %#x", PCIRevision, Boot0Revision(Boot0Value))
	}
	for chipset, fermi := range map[uint32]bool{
		0x0C0: true, 0x0C1: true, 0x0C3: true, 0x0C4: true, 0x0C8: true, 0x0CE: true, 0x0CF: true, 0x0D7: true, 0x0D9: true, // GF100..GF119
		0x050: false, 0x0A8: false, 0x0E4: false, 0x0F0: false, 0x108: false, 0x1C0: false, // Tesla, Kepler, Maxwell...
	} {
		if IsFermi(chipset) != fermi {
			t.Errorf("IsFermi(%#x) = %v", chipset, !fermi)
		}
	}
	if Boot0Chipset(0x1C0000A1) != 0x1C0 {
		t.Errorf("a 9-bit chipset is cut: %#x", Boot0Chipset(0x1C0000A1))
	}
}
