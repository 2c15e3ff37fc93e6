package sim

import (
	"errors"
	"testing"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

func TestFailBus(t *testing.T) {
	b, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if got := b.Read32(nvc0.BAR0, nvc0.RegBoot0); got != nvc0.Boot0Value {
		t.Fatalf("PMC_BOOT_0 = %#x before the failure", got)
	}
	mem := make([]byte, 1<<20)
	base, err := b.RegisterSystemMemory(mem)
	if err != nil {
		t.Fatal(err)
	}
	b.FailBus()
	b.FailBus() // idempotent
	if !b.BusLost() {
		t.Fatal("BusLost false after FailBus")
	}
	for _, off := range []uint64{nvc0.RegBoot0, uint64(nvc0.ChanCtl(0)), nvc0.RegPreempt} {
		if got := b.Read32(nvc0.BAR0, uint64(off)); got != 0xFFFFFFFF {
			t.Errorf("BAR0 %#x reads %#x after the failure, want all ones", off, got)
		}
	}
	b.Write32(nvc0.BAR0, uint64(nvc0.ChanCtl(0)), nvc0.ChanCtlDefault)
	if got := b.Read32(nvc0.BAR1, 0); got != 0xFFFFFFFF {
		t.Errorf("BAR1 reads %#x", got)
	}
	var p [8]byte
	if err := b.ReadVRAM(p[:], 0); !errors.Is(err, ErrBusLost) {
		t.Errorf("ReadVRAM after the failure: %v", err)
	}
	if err := b.WriteVRAM(p[:], 0); !errors.Is(err, ErrBusLost) {
		t.Errorf("WriteVRAM after the failure: %v", err)
	}
	if err := b.ScrubVRAM(0, 4096); !errors.Is(err, ErrBusLost) {
		t.Errorf("ScrubVRAM after the failure: %v", err)
	}
	// The host still takes a VM's RAM back from the dead board.
	if err := b.UnregisterSystemMemory(base); err != nil {
		t.Errorf("UnregisterSystemMemory after the failure: %v", err)
	}
}

// TestRepairBus: a board back on the bus answers with its identity and
// power-on registers, runs nothing of what it ran before (its channels are
// off), keeps its VRAM's stale contents (the driver scrubs), and works:
// host-side VRAM access and register writes take effect again.
func TestRepairBus(t *testing.T) {
	b, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.RepairBus(); !errors.Is(err, ErrBusAnswers) {
		t.Fatalf("RepairBus of a board on the bus: %v", err)
	}
	stale := []byte{0xDE, 0xAD, 0xBE, 0xEF}
	if err := b.WriteVRAM(stale, 0x10000); err != nil {
		t.Fatal(err)
	}
	b.Write32(nvc0.BAR0, nvc0.RegPMCEnable, nvc0.PMCEnableAll)
	b.Write32(nvc0.BAR0, uint64(nvc0.ChanInst(3)), nvc0.ChanInstValid|0x20)
	b.Write32(nvc0.BAR0, uint64(nvc0.ChanCtl(3)), nvc0.ChanCtlEnable)
	b.FailBus()
	if err := b.RepairBus(); err != nil {
		t.Fatal(err)
	}
	if b.BusLost() {
		t.Fatal("BusLost after RepairBus")
	}
	for _, r := range []struct {
		off  uint64
		want uint32
	}{{nvc0.RegBoot0, nvc0.Boot0Value}, {nvc0.RegPMCEnable, 0}, {uint64(nvc0.ChanInst(3)), 0}, {uint64(nvc0.ChanCtl(3)), 0}} {
		if got := b.Read32(nvc0.BAR0, r.off); got != r.want {
			t.Errorf("BAR0 %#x reads %#x after the repair, want %#x", r.off, got, r.want)
		}
	}
	got := make([]byte, 4)
	if err := b.ReadVRAM(got, 0x10000); err != nil || string(got) != string(stale) {
		t.Errorf("VRAM after the repair: %x, %v (the sim keeps stale contents)", got, err)
	}
	b.Write32(nvc0.BAR0, nvc0.RegPMCEnable, nvc0.PMCEnableAll)
	if got := b.Read32(nvc0.BAR0, nvc0.RegPMCEnable); got != nvc0.PMCEnableAll {
		t.Errorf("PMC_ENABLE written after the repair reads %#x", got)
	}
	if err := b.ScrubVRAM(0x10000, 4096); err != nil {
		t.Errorf("ScrubVRAM after the repair: %v", err)
	}
}
