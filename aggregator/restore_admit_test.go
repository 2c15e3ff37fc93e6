package aggregator

import (
	"bytes"
	"errors"
	"testing"
)

// TestRestoreWaitsWithoutEvicting: an image waiting for a domain is given
// only to a device model the daemon admits, and a refusal that is not the
// image's fault leaves it waiting. On a full board without overcommit the
// restore is refused with ErrNoSlot and evicts no one (the resident VMs
// keep their slots and the honest one its marker); a device model naming
// another guest gets nothing; once a slot is free, the domain's own device
// model gets the vGPU and verifies.
func TestRestoreWaitsWithoutEvicting(t *testing.T) {
	src, dst, honest, marker, s, _ := savedScene(t, "fv-optimized", 7, "waiting")
	img := s.save(t, src)
	filler := startGuestAs(t, dst, 41, "filler", "fv-optimized") // dst's second and last slot
	if _, err := dst.RegisterRestore(7, bytes.NewReader(img)); err != nil {
		t.Fatalf("register: %v", err)
	}

	if _, err := attachRAMErr(dst, s.g, s.ram); !errors.Is(err, ErrNoSlot) {
		t.Fatalf("restore onto a full board without overcommit: %v, want ErrNoSlot", err)
	}
	if honest.v.Evicted() || filler.v.Evicted() || honest.v.Counters().Evictions+filler.v.Counters().Evictions != 0 {
		t.Fatal("the restore evicted a resident vGPU to make room")
	}
	if len(dst.Restores()) != 1 {
		t.Fatal("a refusal for want of room consumed the image")
	}

	if err := dst.Detach(filler.v); err != nil {
		t.Fatal(err)
	}
	other := s.g
	other.Name = "impostor"
	if _, err := attachRAMErr(dst, other, s.ram); !errors.Is(err, ErrImageRefused) {
		t.Fatalf("a device model for another guest of the domain: %v, want ErrImageRefused", err)
	}
	if len(dst.Restores()) != 1 || len(dst.VGPUs()) != 1 {
		t.Fatalf("after the impostor: %d images waiting, %d vGPUs; want 1 and 1", len(dst.Restores()), len(dst.VGPUs()))
	}

	nv := attachRAM(t, dst, s.g, s.ram)
	s.port.v.Store(nv)
	verifiedWork(t, s.guestVM)
	checkHonest(t, honest, marker)
}
