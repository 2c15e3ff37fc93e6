package hwseq

import (
	"errors"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// regFunc is an MMIO whose BAR0 reads come from a function.
type regFunc func() uint32

func (f regFunc) Read32(bar int, off uint64) uint32     { return f() }
func (f regFunc) Write32(bar int, off uint64, v uint32) {}

// TestWaitDeviceGone: a device that reads all-ones is found gone within
// milliseconds, not at the end of the timeout; a register that reads
// all-ones for a moment and then meets the condition is not.
func TestWaitDeviceGone(t *testing.T) {
	start := time.Now()
	gone := regFunc(func() uint32 { return nvc0.ReadAllOnes })
	err := Wait(gone, "preempt", nvc0.RegPreempt, 10*time.Second, func(v uint32) bool { return v&nvc0.PreemptPending == 0 })
	if !errors.Is(err, ErrDeviceGone) {
		t.Fatalf("Wait on an all-ones device = %v, want ErrDeviceGone", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Wait took %v to find the device gone", d)
	}
	// StopChannel, as a driver's teardown runs it, is as quick.
	start = time.Now()
	if err := StopChannel(gone, 3, 10*time.Second); !errors.Is(err, ErrDeviceGone) || time.Since(start) > time.Second {
		t.Errorf("StopChannel on a gone device = %v after %v", err, time.Since(start))
	}

	glitch := time.Now().Add(GoneAfter / 4)
	flaky := regFunc(func() uint32 {
		if time.Now().Before(glitch) {
			return nvc0.ReadAllOnes
		}
		return 0
	})
	if err := Wait(flaky, "preempt", nvc0.RegPreempt, 10*time.Second, func(v uint32) bool { return v&nvc0.PreemptPending == 0 }); err != nil {
		t.Errorf("Wait through a short all-ones glitch = %v", err)
	}

	busy := regFunc(func() uint32 { return nvc0.PreemptPending })
	if err := Wait(busy, "preempt", nvc0.RegPreempt, 20*time.Millisecond, func(v uint32) bool { return v&nvc0.PreemptPending == 0 }); !errors.Is(err, ErrTimeout) {
		t.Errorf("Wait on a busy register = %v, want ErrTimeout", err)
	}
}
