package sim

import (
	"bytes"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/gpu/errreport"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

func TestConfigValidate(t *testing.T) {
	ok := Config{VRAMSize: 6 * mib, Channels: 1, MemPartitions: 6}
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		good bool
	}{
		{"minimal", func(*Config) {}, true},
		{"default", func(c *Config) { *c = DefaultConfig() }, true},
		{"zero VRAM", func(c *Config) { c.VRAMSize = 0 }, false},
		{"VRAM not MiB", func(c *Config) { c.VRAMSize = 6*mib + 4096 }, false},
		{"VRAM not per partition", func(c *Config) { c.VRAMSize = 7 * mib }, false},
		{"no channels", func(c *Config) { c.Channels = 0 }, false},
		{"too many channels", func(c *Config) { c.Channels = nvc0.MaxChannels + 1 }, false},
		{"no partitions", func(c *Config) { c.MemPartitions = 0 }, false},
		{"too many partitions", func(c *Config) { c.MemPartitions = nvc0.MaxMemPartitions + 1 }, false},
		{"negative timing", func(c *Config) { c.Timing.MMIOReadNs = -1 }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.mod(&c)
			if err := c.validate(); (err == nil) != tc.good {
				t.Fatalf("validate(%+v) = %v, want ok=%v", c, err, tc.good)
			}
		})
	}
	if _, err := New(Config{}); err == nil {
		t.Fatal("New accepted an empty config")
	}
}

func TestTimingByName(t *testing.T) {
	for _, name := range TimingNames() {
		tm, err := TimingByName(name)
		if err != nil || tm.Name != name {
			t.Fatalf("TimingByName(%q) = %+v, %v", name, tm, err)
		}
	}
	if !TimingNone().isNone() || TimingFermi().isNone() {
		t.Fatal("isNone wrong")
	}
	if _, err := TimingByName("volta"); err == nil {
		t.Fatal("unknown profile accepted")
	}
	x := TimingFermiXen()
	if x.TrapNs <= 0 || x.isNone() {
		t.Fatalf("fermi-xen has no trap cost: %+v", x)
	}
	if f := TimingFermi(); f.TrapNs != 0 || x.MMIOReadNs != f.MMIOReadNs || x.MMIOWriteNs != f.MMIOWriteNs {
		t.Fatalf("fermi-xen is not fermi plus a trap cost: %+v vs %+v", x, f)
	}
}

// TestTimingFermiX4: the board in a PCIe 2.0 x4 slot is TimingFermi with a
// quarter of its DMA bandwidth (4 of 16 lanes): a copy touching system
// memory takes four times as long, everything else costs the same.
func TestTimingFermiX4(t *testing.T) {
	f, x := TimingFermi(), TimingFermiX4()
	if x.Name != "fermi-x4" || x.DMABytesPerSec != 1.375e9 || x.DMABytesPerSec*4 != f.DMABytesPerSec {
		t.Fatalf("fermi-x4 = %+v: want fermi's DMA rate / 4 (1.375 GB/s)", x)
	}
	g := x
	g.Name, g.DMABytesPerSec = f.Name, f.DMABytesPerSec
	if g != f {
		t.Fatalf("fermi-x4 differs from fermi beyond DMA: %+v vs %+v", x, f)
	}
	const n = 8 << 20
	if got, want := x.copyTime(n, true), 4*f.copyTime(n, true); got < want-time.Microsecond || got > want+time.Microsecond {
		t.Errorf("8 MiB over the bus: %v, want %v (4 × fermi's)", got, want)
	}
	if x.copyTime(n, false) != f.copyTime(n, false) || x.kernelTime(1e9, n) != f.kernelTime(1e9, n) {
		t.Error("fermi-x4 charges VRAM copies or kernels differently from fermi")
	}
	if !slices.Contains(TimingNames(), x.Name) {
		t.Errorf("TimingNames %v lacks %s", TimingNames(), x.Name)
	}
}

// TestHostAccessCost: the aggregator's host-side VRAM access is charged
// like a guest's: one uncached bus access per 32-bit word (partial words
// count whole), reads and writes at their own cost.
func TestHostAccessCost(t *testing.T) {
	f := TimingFermi()
	for _, c := range []struct {
		n     int
		write bool
		want  time.Duration
	}{
		{4, false, time.Duration(f.MMIOReadNs)},
		{4096, false, 1024 * time.Duration(f.MMIOReadNs)},
		{4096, true, 1024 * time.Duration(f.MMIOWriteNs)},
		{6, true, 2 * time.Duration(f.MMIOWriteNs)},
		{0, false, 0},
	} {
		if got := f.hostAccess(c.n, c.write); got != c.want {
			t.Errorf("hostAccess(%d, write %v) = %v, want %v", c.n, c.write, got, c.want)
		}
	}
	if TimingNone().hostAccess(1<<20, false) != 0 {
		t.Error("timing none charges host access")
	}
}

func TestRegisters(t *testing.T) {
	r := newRig(t)
	b := r.b
	rd := func(off uint64) uint32 { return b.Read32(nvc0.BAR0, off) }
	wr := func(off uint64, v uint32) { b.Write32(nvc0.BAR0, off, v) }

	if got := rd(nvc0.RegBoot0); got != nvc0.Boot0Value {
		t.Errorf("BOOT_0 = %#x", got)
	}
	wr(nvc0.RegPMCEnable, 0x1234)
	if got := rd(nvc0.RegPMCEnable); got != 0x1234 {
		t.Errorf("PMC_ENABLE = %#x", got)
	}
	// Memory partitions describe the VRAM size.
	parts := rd(nvc0.RegMemPartCount)
	if parts != 4 || rd(nvc0.RegMemLTCCount) != 4 || rd(nvc0.RegMemPartMask) != 0 {
		t.Errorf("partition count %d", parts)
	}
	var total uint64
	for i := range int(parts) {
		total += uint64(rd(uint64(nvc0.MemPartSize(i)))) * mib
	}
	if total != b.VRAMSize() {
		t.Errorf("partitions sum to %#x, VRAM is %#x", total, b.VRAMSize())
	}
	// PTIMER is monotonic.
	t0 := uint64(rd(nvc0.RegTimerHigh))<<32 | uint64(rd(nvc0.RegTimerLow))
	t1 := uint64(rd(nvc0.RegTimerHigh))<<32 | uint64(rd(nvc0.RegTimerLow))
	if t1 < t0 || t1 == 0 {
		t.Errorf("PTIMER went %d -> %d", t0, t1)
	}
	// PFIFO_INTR: latched bits are write-1-to-clear; the MMU-fault bit
	// follows the fault records and is not cleared by a write.
	b.intr.SchedError(1)
	b.intr.AddFault(nvc0.FaultUnitGR, errreport.Fault{Inst: 1})
	wr(nvc0.RegPFIFOIntr, nvc0.PFIFOIntrSchedError|nvc0.PFIFOIntrMMUFault)
	if got := rd(nvc0.RegPFIFOIntr); got != nvc0.PFIFOIntrMMUFault {
		t.Errorf("PFIFO_INTR after w1c = %#x", got)
	}
	wr(nvc0.RegFaultUnitMask, 1<<nvc0.FaultUnitGR)
	if got := rd(nvc0.RegPFIFOIntr); got != 0 {
		t.Errorf("PFIFO_INTR after the record's release = %#x", got)
	}
	// Flush completes at once.
	wr(nvc0.RegFlush, nvc0.FlushTrigger)
	if rd(nvc0.RegFlush)&nvc0.FlushBusy != 0 {
		t.Error("flush stays busy")
	}
	// MMU status: free slots; flush done only after a flush.
	if st := rd(nvc0.RegMMUStatus); st&nvc0.MMUStatusFreeSlots == 0 || st&nvc0.MMUStatusFlushDone != 0 {
		t.Errorf("MMU status before flush %#x", st)
	}
	r.flushTLB(r.bar1.pd, true)
	if st := rd(nvc0.RegMMUStatus); st&nvc0.MMUStatusFlushDone == 0 {
		t.Errorf("MMU status after flush %#x", st)
	}
	// FECS bind.
	ctx := nvc0.InstEncode(0x5000, nvc0.FECSBindValid)
	wr(nvc0.RegFECSData, ctx)
	wr(nvc0.RegFECSCmd, nvc0.FECSCmdBindPointer)
	if rd(nvc0.RegFECSStatus)&nvc0.FECSDone == 0 || b.BoundContext() != ctx {
		t.Errorf("FECS bind: status %#x bound %#x", rd(nvc0.RegFECSStatus), b.BoundContext())
	}
	wr(nvc0.RegFECSClear, nvc0.FECSDone)
	if rd(nvc0.RegFECSStatus)&nvc0.FECSDone != 0 {
		t.Error("FECS done not cleared")
	}
	// FECS size queries answer in the mailbox; address-carrying commands
	// are recorded.
	wr(nvc0.RegFECSStatus, 0)
	wr(nvc0.RegFECSCmd, nvc0.FECSCmdImageSize)
	if rd(nvc0.RegFECSStatus) != fecsImageSize {
		t.Errorf("FECS image size %#x", rd(nvc0.RegFECSStatus))
	}
	wr(nvc0.RegFECSData, ctx|0x10)
	wr(nvc0.RegFECSCmd, nvc0.FECSCmdWFIGoldenSave)
	wr(nvc0.RegFECSReglistData, 0x1234)
	wr(nvc0.RegFECSCmd, nvc0.FECSCmdReglistVA)
	if rec := b.FECSAddresses(); rec.Golden != ctx|0x10 || rec.ReglistVA != 0x1234 {
		t.Errorf("FECS record %+v", rec)
	}
	// The copy engines' CHANNEL_CUR shows no channel until one runs; the
	// host cannot write it.
	wr(uint64(nvc0.RegCEChanCur(1)), nvc0.InstEncode(0x3000, nvc0.CEChanValid))
	if rd(uint64(nvc0.RegCEChanCur(1))) != 0 || rd(nvc0.RegFECSChanAddr) != 0 {
		t.Error("CE CHANNEL_CUR or FECS CHAN_ADDR set while idle")
	}
	// Old nouveau sized VRAM from 0x10f20c × 0x121c74.
	if got := uint64(rd(nvc0.RegVRAMPartSizeOld)) * uint64(rd(nvc0.RegMemLTCCount)) * mib; got != b.VRAMSize() {
		t.Errorf("0x10f20c × 0x121c74 = %#x", got)
	}
	// Item-10 registers are storage.
	for _, off := range []uint64{nvc0.RegSysmemFlushPage, nvc0.RegGPCMMUDebugWr, nvc0.RegGPCMMUDebugRd} {
		wr(off, 0xabc00)
		if rd(off) != 0xabc00 {
			t.Errorf("%#x not stored", off)
		}
	}
	if rd(nvc0.RegPGRAPHStatus) != 0 {
		t.Error("PGRAPH busy while idle")
	}
}

func TestUnknownRegistersCounted(t *testing.T) {
	r := newRig(t)
	b := r.b
	for _, tc := range []struct {
		name string
		bar  int
		off  uint64
	}{
		{"hole", nvc0.BAR0, 0x000204},
		{"unaligned", nvc0.BAR0, nvc0.RegBoot0 + 2},
		{"beyond BAR0", nvc0.BAR0, nvc0.BAR0Size},
		{"channel beyond config", nvc0.BAR0, uint64(nvc0.ChanCtl(nvc0.MaxChannels - 1))},
		{"PRAMIN beyond VRAM", nvc0.BAR0, nvc0.PRAMINBase}, // window set beyond VRAM below
		{"no such BAR", 2, 0},
		{"negative BAR", -1, 0},
		{"beyond BAR5", nvc0.BAR5, nvc0.BAR5Size},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.off == nvc0.PRAMINBase {
				b.Write32(nvc0.BAR0, nvc0.RegPRAMINWindow, uint32(b.VRAMSize()>>nvc0.PRAMINWindowShift))
				defer b.Write32(nvc0.BAR0, nvc0.RegPRAMINWindow, 0)
			}
			before := b.Stats().UnknownRegisters
			if v := b.Read32(tc.bar, tc.off); v != 0 {
				t.Errorf("read %#x", v)
			}
			b.Write32(tc.bar, tc.off, 0xdeadbeef)
			if v := b.Read32(tc.bar, tc.off); v != 0 {
				t.Errorf("read after write %#x", v)
			}
			if got := b.Stats().UnknownRegisters - before; got != 3 {
				t.Errorf("counted %d unknown accesses, want 3", got)
			}
		})
	}
	if b.Read32(nvc0.BAR5, 0) != 0 {
		t.Error("BAR5 reads non-zero")
	}
}

func TestPRAMIN(t *testing.T) {
	r := newRig(t)
	addr := uint64(0x3210000 + 0x1234*4)
	r.w32(addr, 0xcafef00d)
	if got := r.hostRead(addr, 4); !bytes.Equal(got, []byte{0x0d, 0xf0, 0xfe, 0xca}) {
		t.Fatalf("VRAM holds % x", got)
	}
	if got := r.r32(addr); got != 0xcafef00d {
		t.Fatalf("PRAMIN reads %#x", got)
	}
}

func TestSparseVRAM(t *testing.T) {
	b, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, off := range []uint64{0, 1 << 30, 3 << 30, b.VRAMSize() - nvc0.PageSize} {
		if err := b.WriteVRAM([]byte{1, 2, 3, 4}, off); err != nil {
			t.Fatal(err)
		}
	}
	b.Write32(nvc0.BAR0, nvc0.RegPRAMINWindow, uint32((5<<30)>>nvc0.PRAMINWindowShift))
	b.Write32(nvc0.BAR0, nvc0.PRAMINBase, 7)
	var st unix.Stat_t
	if err := unix.Fstat(b.VRAMFd(), &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != int64(b.VRAMSize()) {
		t.Fatalf("memfd size %d", st.Size)
	}
	if used := st.Blocks * 512; used > 16<<20 {
		t.Fatalf("6 GiB board with 5 touched pages uses %d bytes", used)
	}
	// Scrubbing gives the pages back.
	if err := b.ScrubVRAM(0, b.VRAMSize()); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fstat(b.VRAMFd(), &st); err != nil {
		t.Fatal(err)
	}
	if st.Blocks != 0 {
		t.Fatalf("after scrub %d blocks allocated", st.Blocks)
	}
}

func TestScrubVRAM(t *testing.T) {
	r := newRig(t)
	data := bytes.Repeat([]byte{0xAA}, 5*nvc0.PageSize)
	r.hostWrite(0x10000, data)
	if err := r.b.ScrubVRAM(0x10000+100, 3*nvc0.PageSize+200); err != nil {
		t.Fatal(err)
	}
	got := r.hostRead(0x10000, len(data))
	for i, v := range got {
		want := byte(0xAA)
		if i >= 100 && i < 100+3*nvc0.PageSize+200 {
			want = 0
		}
		if v != want {
			t.Fatalf("byte %d = %#x, want %#x", i, v, want)
		}
	}
	if err := r.b.ScrubVRAM(r.b.VRAMSize()-4, 8); err == nil {
		t.Fatal("scrub beyond VRAM accepted")
	}
}

func TestSystemMemoryRegistration(t *testing.T) {
	r := newRig(t)
	b := r.b
	a := r.newSysMem(3 << 30 >> 10) // 3 MiB
	c := r.newSysMem(nvc0.PageSize)
	if a.base%sysRegionAlign != 0 || c.base%sysRegionAlign != 0 || a.base == c.base || a.base == 0 {
		t.Fatalf("bases %#x %#x", a.base, c.base)
	}
	if _, err := b.RegisterSystemMemory(make([]byte, 100)); err == nil {
		t.Error("unaligned size accepted")
	}
	if _, err := b.RegisterSystemMemory(a.mem[1 : 1+nvc0.PageSize]); err == nil {
		t.Error("unaligned start accepted")
	}
	if err := b.UnregisterSystemMemory(0x1234); err == nil {
		t.Error("unregistering nothing succeeded")
	}
	if m, ok := b.sys.lookup(a.base+nvc0.PageSize, 8); !ok || &m[0] != &a.mem[nvc0.PageSize] {
		t.Error("lookup inside region failed")
	}
	if _, ok := b.sys.lookup(a.base+uint64(len(a.mem))-4, 8); ok {
		t.Error("lookup straddling the end succeeded")
	}
	// A freed slot is reused, and never overlaps.
	if err := b.UnregisterSystemMemory(a.base); err != nil {
		t.Fatal(err)
	}
	if _, ok := b.sys.lookup(a.base, 4); ok {
		t.Error("unregistered region still reachable")
	}
	base, err := b.RegisterSystemMemory(a.mem)
	if err != nil || base != a.base {
		t.Fatalf("re-register: %#x, %v", base, err)
	}
}

func TestCloseIdempotent(t *testing.T) {
	b, err := New(Config{VRAMSize: 16 * mib, Channels: 2, MemPartitions: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if b.Read32(nvc0.BAR0, nvc0.RegBoot0) != 0 {
		t.Fatal("closed board answers")
	}
	b.Write32(nvc0.BAR0, nvc0.RegPMCEnable, 1)
	if err := b.WriteVRAM([]byte{1}, 0); err == nil {
		t.Fatal("write to closed board succeeded")
	}
}

// A segmented VRAM is one address space for the board, but each segment can
// be handed out alone: writes through either view are seen by the other, and
// the segment cannot be resized by whoever holds it.
func TestVRAMSegments(t *testing.T) {
	cfg := DefaultConfig()
	cfg.VRAMSize, cfg.MemPartitions = 256<<20, 1
	cfg.VRAMSegments = []uint64{64 << 20, 128 << 20, 64 << 20}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	f, err := b.VRAMSegmentFile(64<<20, 128<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	seg, err := unix.Mmap(int(f.Fd()), 0, 128<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(seg)
	if err := b.WriteVRAM([]byte{1, 2, 3, 4}, 64<<20+8); err != nil {
		t.Fatal(err)
	}
	if seg[8] != 1 || seg[11] != 4 {
		t.Fatalf("board write not seen in the segment: % x", seg[8:12])
	}
	seg[4096] = 0xEE
	got := make([]byte, 1)
	if err := b.ReadVRAM(got, 64<<20+4096); err != nil || got[0] != 0xEE {
		t.Fatalf("segment write not seen by the board: %x %v", got, err)
	}
	// Scrub across a segment boundary.
	if err := b.WriteVRAM([]byte{9}, 64<<20-1); err != nil {
		t.Fatal(err)
	}
	if err := b.ScrubVRAM(64<<20-4096, 2*4096); err != nil {
		t.Fatal(err)
	}
	if err := b.ReadVRAM(got, 64<<20-1); err != nil || got[0] != 0 || seg[8] != 0 {
		t.Fatalf("scrub across segments left data: %x %x", got, seg[8])
	}
	if err := unix.Ftruncate(int(f.Fd()), 4096); err == nil {
		t.Fatal("a holder of the segment could shrink it")
	}
	if _, err := b.VRAMSegmentFile(0, 128<<20); err == nil {
		t.Fatal("handed out a range that is not a segment")
	}
	bad := cfg
	bad.VRAMSegments = []uint64{64 << 20}
	if _, err := New(bad); err == nil {
		t.Fatal("segments not adding up to VRAMSize accepted")
	}
}

// Renewing a segment revokes outside mappings: a process that mapped the old
// segment sees none of the new contents and its writes no longer reach VRAM.
func TestRenewVRAMSegment(t *testing.T) {
	cfg := DefaultConfig()
	cfg.VRAMSize, cfg.MemPartitions = 128<<20, 1
	cfg.VRAMSegments = []uint64{64 << 20, 64 << 20}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	f, err := b.VRAMSegmentFile(64<<20, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	old, err := unix.Mmap(int(f.Fd()), 0, 64<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(old)
	old[0] = 0x11
	if err := b.RenewVRAMSegment(64<<20, 64<<20); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 1)
	if err := b.ReadVRAM(got, 64<<20); err != nil || got[0] != 0 {
		t.Fatalf("renewed segment not zero: %x %v", got, err)
	}
	if err := b.WriteVRAM([]byte{0x22}, 64<<20+1); err != nil {
		t.Fatal(err)
	}
	old[2] = 0x33
	if old[1] == 0x22 {
		t.Fatal("the old mapping sees the renewed segment")
	}
	if err := b.ReadVRAM(got, 64<<20+2); err != nil || got[0] != 0 {
		t.Fatal("a write through the old mapping reached VRAM")
	}
	if err := b.RenewVRAMSegment(0, 4096); err == nil {
		t.Fatal("renewed a range that is not a segment")
	}
}
