package devmodel_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/bench"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
	"github.com/gpuvm/gpuvm/vgpuimage"
)

// TestXenDeviceModelResumesAfterHandoff: a Xen domain's device model
// started with a resume timeout says so in its Hello, so the daemon may
// hand its vGPU off; held (its VRAM kept in its slot) and committed — the
// handoff's Bye — the device model keeps its ioreq server and BARs and
// sends a resuming Hello to the same socket until the image, registered
// as the new process registers it, gives it back its vGPU; the guest's
// madd verifies before and after, its old context's included. A device
// model without the timeout blocks the handoff.
func TestXenDeviceModelResumesAfterHandoff(t *testing.T) {
	h := newXenHost(t, true)
	const dom = 31
	mem := h.domain(t, dom, 64<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	m, x := h.startXenDM(ctx, t, dom, "xen-handoff", "fv-optimized", mem, time.Minute)
	defer m.Close()
	served, mmio := serveGuest(ctx, t, m, x)
	place := mmio.place
	drv, err := nouveau.Open(mmio, mem, nouveau.Options{BAR1Size: place[nvc0.BAR1].Size, BAR3Size: place[nvc0.BAR3].Size})
	if err != nil {
		t.Fatal(err)
	}
	// Closed at the end, not deferred: after a failure the guest's
	// accesses find no device model, and its teardown would wait out every
	// register poll.
	madd := func(when string) {
		t.Helper()
		w, err := workloads.New("madd", workloads.Params{MatrixDim: 16})
		if err != nil {
			t.Fatal(err)
		}
		if res := bench.RunWorkload(ctx, "fv-optimized", gdev.Nouveau(drv), w, 1, func() map[string]uint64 { return nil }, nil); !res.Verified {
			t.Fatalf("madd %s: %+v", when, res)
		}
	}
	madd("before the handoff")
	gctx, err := gdev.NewContext(drv)
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte("kept across the handoff "), 512)
	buf, err := gctx.MemAlloc(uint64(len(want)))
	if err != nil {
		t.Fatal(err)
	}
	if err := gctx.MemcpyHtoD(buf, want); err != nil {
		t.Fatal(err)
	}

	var v *aggregator.VGPU
	for _, u := range h.agg.VGPUs() {
		if u.Guest.DomID == dom {
			v = u
		}
	}
	if v == nil || !v.Guest.ResumesHandoff || aggregator.HandoffBlocker(v) != "" {
		t.Fatalf("the device model's vGPU %+v: it should say it resumes after a handoff, and not block one", v)
	}
	var img bytes.Buffer
	hold, err := h.agg.Hold(ctx, v, &img, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := hold.Commit(); err != nil {
		t.Fatal(err)
	}
	// The new process registers the image (here: the same aggregator).
	dec, err := vgpuimage.Decode(bytes.NewReader(img.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.agg.RegisterKept(dom, dec, hold.Kept); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); m.Resumes() == 0; time.Sleep(5 * time.Millisecond) {
		select {
		case err := <-served:
			t.Fatalf("the device model ended at the handoff: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the device model did not resume")
		}
	}
	madd("after the handoff")
	got := make([]byte, len(want))
	if err := gctx.MemcpyDtoH(got, buf); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the context opened before the handoff reads its buffer back: equal %v, %v", bytes.Equal(got, want), err)
	}
	if st := m.Stats(); st.HandlerErrors != 0 {
		t.Errorf("ioreq handler errors across the handoff: %+v", st)
	}
	gctx.Close()
	drv.Close()

	// A device model that does not resume blocks a handoff.
	const dom2 = 32
	mem2 := h.domain(t, dom2, 64<<20)
	m2, _ := h.startXenDM(ctx, t, dom2, "xen-stays", "fv-optimized", mem2, 0)
	defer m2.Close()
	for _, u := range h.agg.VGPUs() {
		if u.Guest.DomID == dom2 && aggregator.HandoffBlocker(u) == "" {
			t.Error("a Xen device model without a resume timeout does not block a handoff")
		}
	}
}
