package aggregator

import (
	"testing"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
	"github.com/gpuvm/gpuvm/pvdrm"
)

// Cooperative yield on pvdrm (docs/pvdrm.md, PUSHBUF's PushYield).

// A file whose front end was not granted FeatureYield cannot flag a
// segment: the PUSHBUF is refused whole and nothing runs; unflagged, the
// same segment runs.
func TestPVDRMYieldNeedsFeature(t *testing.T) {
	agg, _ := newTestAggregator(t, 2)
	g := startPVDRMFeatures(t, agg, "nofeature", "pvdrm", 0, nil)
	if g.c.Features&pvdrm.FeatureYield != 0 {
		t.Fatal("FeatureYield granted though not asked for")
	}
	f := g.open(t)
	rsp, st := g.do(t, pvdrm.Request{Op: pvdrm.OpChannelAlloc, File: f})
	if st != 0 {
		t.Fatal(st)
	}
	ch := rsp.Results["channel"]
	nop := []uint32{nvc0.Incr(nouveau.SubcCompute, nvc0.MthdSetObject, 1), nvc0.ClassFermiCompute}
	pb := g.pushbuf(t, f, nop)
	// Doorbells, not completions: the channel's set-up may still be
	// completing asynchronously, but a submission rings its doorbell
	// before its request is answered.
	bells := func() uint64 { return g.b.VGPU().Counters().Doorbells }
	before := bells()
	push := func(flags uint32) int32 {
		_, st := g.do(t, pvdrm.Request{Op: pvdrm.OpPushbuf, File: f, Args: map[string]uint64{"channel": ch}, Buffers: []uint32{pb},
			Push: []pvdrm.PushEntry{{Handle: pb, Length: 8, Flags: flags}, {Handle: pb, Length: 8}}})
		return st
	}
	expect(t, "PushYield without FeatureYield", push(pvdrm.PushYield), -pvdrm.EINVAL)
	if bells() != before {
		t.Error("a refused PUSHBUF reached the GPU")
	}
	expect(t, "the same PUSHBUF unflagged", push(0), 0)
	if bells() == before {
		t.Error("the accepted PUSHBUF rang no doorbell: the check above proves nothing")
	}
	if agg.DispatchStats().Splits != 0 {
		t.Errorf("splits = %d without points", agg.DispatchStats().Splits)
	}
}

// A pvdrm guest with yield on has its LaunchRepeat cut after each kernel
// (one segment each, four to a PUSHBUF) and computes the right result; a
// guest beside it computes too.
func TestPVDRMYieldLaunchRepeat(t *testing.T) {
	agg, _ := newTestAggregator(t, 2)
	g := startPVDRM(t, agg, "yielder", "pvdrm")
	other := startPVDRM(t, agg, "other", "pvdrm-pooling")
	if g.c.Features&pvdrm.FeatureYield == 0 {
		t.Fatal("FeatureYield not granted")
	}
	ctx, err := gdev.NewContextOn(g.driver())
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	if err := ctx.SetYield(true); err != nil {
		t.Fatal(err)
	}
	before := agg.DispatchStats().Splits
	launchMaddRepeat(t, ctx, 6)
	if got := agg.DispatchStats().Splits - before; got != 5 {
		t.Errorf("6 kernels with yield: %d splits, want 5", got)
	}
	other.honestRun(t)
}
