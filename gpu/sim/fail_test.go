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
