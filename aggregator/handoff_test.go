package aggregator

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/vgpuimage"
)

// TestHandoffHoldRelease: a vGPU held for a handoff is parked with its
// image written, and its guest's accesses wait while it is held (none may
// run on state the image lacks); released — the handoff called off — it
// comes back on its board at the waiting access and its guest goes on:
// a madd in the context opened before, then madd and cpy, all verified.
func TestHandoffHoldRelease(t *testing.T) {
	src, _, honest, marker, s, ctx := savedScene(t, "fv-optimized", 5, "held")
	var img bytes.Buffer
	hold, err := src.Hold(context.Background(), s.v, &img, false)
	if err != nil {
		t.Fatal(err)
	}
	if !s.v.Evicted() || hold.Stats.Bytes == 0 {
		t.Fatalf("held: parked %v, %d bytes of VRAM in the image", s.v.Evicted(), hold.Stats.Bytes)
	}
	if _, err := vgpuimage.Decode(bytes.NewReader(img.Bytes())); err != nil {
		t.Fatalf("the image does not decode: %v", err)
	}
	read := make(chan uint32, 1)
	go func() { read <- s.port.Read32(0, nvc0.RegBoot0) }()
	select {
	case <-read:
		t.Fatal("a guest access ran while its vGPU was held")
	case <-time.After(200 * time.Millisecond):
	}
	hold.Release()
	select {
	case v := <-read:
		if v == 0xFFFFFFFF {
			t.Fatal("the waiting access read all-ones")
		}
	case <-time.After(time.Minute):
		t.Fatal("the waiting access never ran after the release")
	}
	if s.v.Evicted() {
		t.Fatal("the released vGPU is still parked after its guest's access")
	}
	if err := maddOnce(ctx, 16); err != nil {
		t.Fatalf("madd in the context opened before the hold: %v", err)
	}
	verifiedWork(t, s.guestVM)
	checkHonest(t, honest, marker)
}

// TestHandoffHoldCommit: committed, the held vGPU is gone from its board,
// and its image restores elsewhere (as on the new daemon process) with the
// guest going on there, verified.
func TestHandoffHoldCommit(t *testing.T) {
	src, dst, honest, marker, s, ctx := savedScene(t, "pv-multicall", 6, "moved")
	var img bytes.Buffer
	hold, err := src.Hold(context.Background(), s.v, &img, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := hold.Commit(); err != nil {
		t.Fatal(err)
	}
	if n := len(src.VGPUs()); n != 0 {
		t.Fatalf("%d vGPUs left on the old board", n)
	}
	if _, err := dst.RegisterRestore(6, bytes.NewReader(img.Bytes())); err != nil {
		t.Fatal(err)
	}
	nv := attachRAM(t, dst, s.g, s.ram)
	s.goesOn(t, nv, ctx, "handoff")
	checkHonest(t, honest, marker)
}

// TestHandoffBlocker: pvdrm vGPUs and Xen device models that do not
// resume after a handoff cannot be handed over, and Hold refuses them
// before touching them.
func TestHandoffBlocker(t *testing.T) {
	for _, g := range []Guest{{Name: "p", Mode: "pvdrm"}, {Name: "x", Mode: "fv-optimized", XenRAM: true}} {
		if HandoffBlocker(&VGPU{Guest: g}) == "" {
			t.Errorf("%+v: no blocker", g)
		}
	}
	if why := HandoffBlocker(&VGPU{Guest: Guest{Name: "f", Mode: "fv-optimized"}}); why != "" {
		t.Errorf("an fv-optimized vGPU of a memfd device model is blocked: %s", why)
	}
	if why := HandoffBlocker(&VGPU{Guest: Guest{Name: "x", Mode: "fv-optimized", XenRAM: true, ResumesHandoff: true}}); why != "" {
		t.Errorf("a Xen device model that resumes after a handoff is blocked: %s", why)
	}
	src, _ := newTestAggregator(t, 2)
	v := &VGPU{Guest: Guest{Name: "x", Mode: "fv-optimized", XenRAM: true}} // refused before anything of it is looked at
	if _, err := src.Hold(context.Background(), v, &bytes.Buffer{}, false); !errors.Is(err, ErrSaveUnsupported) || !strings.Contains(err.Error(), "Xen device model") {
		t.Fatalf("hold of a Xen device model's vGPU: %v", err)
	}
}
