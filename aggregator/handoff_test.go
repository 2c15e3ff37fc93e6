package aggregator

import (
	"bytes"
	"context"
	"errors"
	"github.com/gpuvm/gpuvm/pvdrm"
	"io"
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

// fixedTransport is a pvdrm transport that crosses a handoff if crosses
// says so (its other methods are never called).
type fixedTransport struct {
	pvdrm.Transport
	crosses bool
}

func (f fixedTransport) ResumesHandoff() bool { return f.crosses }

// TestHandoffBlocker: pvdrm vGPUs whose transport does not cross a handoff
// or with no back end yet, and Xen device models that do not resume after
// a handoff, cannot be handed over, and Hold refuses them before touching
// them; a pvdrm vGPU of the local or the xen transport can.
func TestHandoffBlocker(t *testing.T) {
	for _, g := range []Guest{{Name: "p", Mode: "pvdrm"}, {Name: "x", Mode: "fv-optimized", XenRAM: true}} {
		if HandoffBlocker(&VGPU{Guest: g}) == "" {
			t.Errorf("%+v: no blocker", g)
		}
	}
	for _, tr := range []pvdrm.Transport{fixedTransport{crosses: false}, struct{ pvdrm.Transport }{}} {
		pv := &VGPU{Guest: Guest{Name: "px", Mode: "pvdrm-pooling"}}
		pv.pvdrm = &PVDRMBackend{t: tr}
		if why := HandoffBlocker(pv); !strings.Contains(why, "does not cross a handoff") {
			t.Errorf("a pvdrm vGPU of transport %T: blocker %q", tr, why)
		}
	}
	for _, tr := range []pvdrm.Transport{&pvdrm.Local{}, &pvdrm.XenBack{}, fixedTransport{crosses: true}} {
		pv := &VGPU{Guest: Guest{Name: "pl", Mode: "pvdrm"}}
		pv.pvdrm = &PVDRMBackend{t: tr}
		if why := HandoffBlocker(pv); why != "" {
			t.Errorf("a pvdrm vGPU of transport %T is blocked: %s", tr, why)
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

// TestHandoffOfPVDRM: a pvdrm vGPU of the local transport is handed over
// as a save is — its back end stops between two requests, the image
// carries its files, channels, GEM objects and pooled buffers, and its
// VRAM objects even when the board's VRAM is kept (a restore re-creates
// them through the new back end's driver, which places them anew) — and
// the front end goes on on the new daemon with the context it opened
// before; the honest VM beside is never read or changed.
func TestHandoffOfPVDRM(t *testing.T) {
	for _, mode := range []string{"pvdrm", "pvdrm-pooling"} {
		t.Run(mode, func(t *testing.T) {
			s := savePVDRMSceneBy(t, mode, func(src *Aggregator, v *VGPU, w io.Writer) (SaveStats, error) {
				h, err := src.Hold(context.Background(), v, w, true)
				if err != nil {
					return SaveStats{}, err
				}
				if h.Kept != -1 {
					t.Errorf("a pvdrm vGPU's VRAM was kept in slot %d", h.Kept)
				}
				return h.Stats, h.Commit()
			})
			s.restoreVerified(t)
		})
	}
}

// TestPVDRMOfXenStays: a pvdrm vGPU whose front end does not dial again
// after a saved Bye (the xen transport's: its device is this daemon's)
// is refused by a migration before anything of it is touched — its guest
// would lose its state to a stream no front end takes — while a save,
// whose image its front end waits for on this daemon (docs/pvdrm.md §8,
// "A device across a save"), and a handoff, whose new process takes the
// device over, are not refused.
func TestPVDRMOfXenStays(t *testing.T) {
	src, _ := newTestAggregator(t, 2)
	v := &VGPU{Guest: Guest{Name: "px", Mode: "pvdrm", DomID: 9}}
	v.pvdrm = &PVDRMBackend{t: &pvdrm.XenBack{}}
	if err := pvdrmSaves(v); err != nil {
		t.Errorf("save refused: %v", err)
	}
	if _, err := src.Migrate(context.Background(), v, io.Discard, MigrateOptions{}, nil); !errors.Is(err, ErrSaveUnsupported) || !strings.Contains(err.Error(), "xen transport") {
		t.Errorf("migrate: %v", err)
	}
	if why := HandoffBlocker(v); why != "" {
		t.Errorf("handoff blocked: %s", why)
	}
}
