package aggregator

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/gpu/kernels"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
	"github.com/gpuvm/gpuvm/sched"
)

func newSchedAggregator(t *testing.T, policy string, opts Options) *Aggregator {
	t.Helper()
	p, err := sched.New(policy, sched.Defaults())
	if err != nil {
		t.Fatal(err)
	}
	opts.MaxVMs, opts.Policy = 2, p
	agg, _ := newTestAggregatorWith(t, opts)
	return agg
}

// maddOnce computes one small madd in ctx and checks it.
func maddOnce(ctx *gdev.Context, n int) error {
	fn, err := ctx.LoadFunction(nvc0.KernelMadd)
	if err != nil {
		return err
	}
	a, b := make([]uint32, n*n), make([]uint32, n*n)
	for i := range a {
		a[i], b[i] = uint32(i), uint32(3*i+1)
	}
	var p [3]gdev.DevPtr
	for i := range p {
		if p[i], err = ctx.MemAlloc(uint64(n * n * 4)); err != nil {
			return err
		}
		defer ctx.MemFree(p[i])
	}
	if err := ctx.MemcpyHtoD(p[0], kernels.EncodeU32s(a)); err != nil {
		return err
	}
	if err := ctx.MemcpyHtoD(p[1], kernels.EncodeU32s(b)); err != nil {
		return err
	}
	if err := ctx.Launch(fn, p[0].VA, p[1].VA, p[2].VA, uint64(n)); err != nil {
		return err
	}
	out := make([]byte, n*n*4)
	if err := ctx.MemcpyDtoH(out, p[2]); err != nil {
		return err
	}
	want := kernels.MaddU32(a, b)
	for i, v := range kernels.DecodeU32s(out) {
		if v != want[i] {
			return errors.New("wrong madd result")
		}
	}
	return nil
}

// A VM whose submission never ends (a semaphore acquire nobody releases) has
// its channel killed by the watchdog: it sees a channel error, and the other
// VM, stalled behind it on the non-preemptive GPU meanwhile, carries on.
func TestWatchdogKillsEndlessSubmission(t *testing.T) {
	agg := newSchedAggregator(t, "band", Options{Watchdog: 300 * time.Millisecond})
	hog := startGuest(t, agg, "hog", "fv-naive")
	honest := startGuest(t, agg, "honest", "fv-naive")

	hctx, err := gdev.NewContext(hog.dev)
	if err != nil {
		t.Fatal(err)
	}
	defer hctx.Close()
	sem, err := hctx.MemAllocHost(4096)
	if err != nil {
		t.Fatal(err)
	}
	if err := hctx.Channel().Submit([]uint32{
		nvc0.Incr(0, nvc0.MthdSemaphoreAddrHi, 4), uint32(sem.VA >> 32), uint32(sem.VA), 1, nvc0.SemaphoreAcquireEqual,
	}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var honestErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		ctx, err := gdev.NewContext(honest.dev)
		if err != nil {
			honestErr = err
			return
		}
		defer ctx.Close()
		for range 3 {
			if honestErr = maddOnce(ctx, 32); honestErr != nil {
				return
			}
		}
	}()
	err = hctx.Synchronize()
	if !errors.Is(err, nouveau.ErrChannelFault) {
		t.Fatalf("endless submission: Synchronize = %v, want a channel fault", err)
	}
	wg.Wait()
	if honestErr != nil {
		t.Fatalf("honest VM: %v", honestErr)
	}
	if got := agg.WatchdogKills(hog.v.ID); got != 1 {
		t.Errorf("watchdog kills of the hog = %d, want 1", got)
	}
	if got := agg.WatchdogKills(honest.v.ID); got != 0 {
		t.Errorf("watchdog killed the honest VM %d times", got)
	}
}

// A VM that opens contexts until it is refused exhausts only its own quota:
// the other VM still gets a channel and computes (NEON saw one tenant deny
// the GPU to all after 48 contexts).
func TestChannelQuotaConfinesExhaustion(t *testing.T) {
	agg := newSchedAggregator(t, "fifo", Options{Quota: func(g Guest) Quota {
		if g.Name == "greedy" {
			return Quota{Channels: 3, VRAM: 128 << 20}
		}
		return Quota{}
	}})
	greedy := startGuest(t, agg, "greedy", "fv-naive")
	other := startGuest(t, agg, "other", "fv-naive")
	if got := greedy.dev.VRAMSize(); got != 128<<20 {
		t.Errorf("greedy VM sees %d MiB, want its 128 MiB quota", got>>20)
	}
	var ctxs []*gdev.Context
	defer func() {
		for _, c := range ctxs {
			c.Close()
		}
	}()
	var refusal error
	for range 2 * nvc0.MaxChannels {
		c, err := gdev.NewContext(greedy.dev)
		if err != nil {
			refusal = err
			break
		}
		ctxs = append(ctxs, c)
	}
	if len(ctxs) != 3 || !errors.Is(refusal, nouveau.ErrNoChannel) {
		t.Fatalf("greedy VM got %d contexts then %v; want 3 then ErrNoChannel", len(ctxs), refusal)
	}
	ctx, err := gdev.NewContext(other.dev)
	if err != nil {
		t.Fatalf("other VM refused a context after the greedy one exhausted its quota: %v", err)
	}
	defer ctx.Close()
	if err := maddOnce(ctx, 32); err != nil {
		t.Fatal(err)
	}
	if _, err := greedy.dev.AllocVRAM(200<<20, 4096); err == nil {
		t.Error("greedy VM allocated beyond its VRAM quota")
	}
}
