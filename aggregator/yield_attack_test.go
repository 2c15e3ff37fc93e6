package aggregator

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/gpu/kernels"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
	"github.com/gpuvm/gpuvm/hypercall"
)

// Attacks on YIELD_POINTS (docs/protocol.md §12.3), made by PV guests over
// a real board: every point is a guest-controlled value.

// yieldCall runs a YIELD_POINTS call as the hypercall path does (under the
// VM's lock, from a decoded copy) and returns its value and code.
func yieldCall(t *testing.T, v *VGPU, ch uint32, points ...uint32) (uint32, hypercall.Code) {
	t.Helper()
	enc := hypercall.NewEncoder(false)
	if err := enc.Add(hypercall.Call{Op: hypercall.OpYieldPoints, Channel: ch, Count: uint32(len(points)), Points: points}); err != nil {
		t.Fatalf("encode: %v", err)
	}
	calls, _, top := hypercall.NewDecoder().Decode(enc.Page())
	if top != hypercall.OK {
		return 0, top
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	return hcYieldPoints(v, &calls[0])
}

// blockedChannel opens a PV context whose channel has a semaphore acquire
// nobody has released at GP_GET and two more entries behind it, so that
// entries between GP_GET and GP_PUT are submitted and not done. release
// lets it finish.
func blockedChannel(t *testing.T, g *guestVM) (ctx *gdev.Context, ch int, get, put uint32, release func()) {
	t.Helper()
	ctx, err := gdev.NewContext(g.dev)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctx.Close() })
	sem, err := ctx.MemAllocHost(4096)
	if err != nil {
		t.Fatal(err)
	}
	c := ctx.Channel()
	if err := ctx.Synchronize(); err != nil {
		t.Fatal(err)
	}
	ch = c.ID()
	// The fence passes inside the last entry's work and the GPU publishes
	// GP_GET after it: wait until GP_GET reaches the last doorbell's put,
	// or the snapshot is one entry behind what YIELD_POINTS will read.
	g.v.mu.Lock()
	last := g.v.chans[ch].put
	g.v.mu.Unlock()
	deadline := time.Now().Add(time.Minute) // a hang guard
	get, ok := g.v.shadowGPGet(ch)
	for ok && get != last && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
		get, ok = g.v.shadowGPGet(ch)
	}
	if !ok || get != last {
		t.Fatalf("shadow GP_GET %d (ok %v) never reached the channel's put %d", get, ok, last)
	}
	if err := c.Submit([]uint32{nvc0.Incr(0, nvc0.MthdSemaphoreAddrHi, 4), uint32(sem.VA >> 32), uint32(sem.VA), 1, nvc0.SemaphoreAcquireEqual}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := c.Submit([]uint32{nvc0.Incr(0, nvc0.MthdSemaphoreAddrHi, 4), uint32(sem.VA >> 32), uint32(sem.VA + 16), 7, nvc0.SemaphoreRelease}); err != nil {
			t.Fatal(err)
		}
	}
	return ctx, ch, get, get + 3, func() { sem.Bytes[0] = 1 }
}

// Points the guest may not declare are refused with a clear code, and a
// call with one bad point records none of its points (default deny).
func TestYieldAttackInvalidPoints(t *testing.T) {
	agg := newSchedAggregator(t, "fifo", Options{})
	g := startGuest(t, agg, "attacker", "pv-multicall")
	ctx, ch, get, put, release := blockedChannel(t, g)
	entries := g.v.chans[ch].sh.GPFIFOEntries()
	free := entries - 1 - (put - get)
	for _, tc := range []struct {
		name   string
		ch     uint32
		points []uint32
		want   hypercall.Code
	}{
		{"no points", uint32(ch), nil, hypercall.ErrRange},
		{"channel past the quota", uint32(len(g.v.chans)), []uint32{put}, hypercall.ErrRange},
		{"channel id 2^31", 1 << 31, []uint32{put}, hypercall.ErrRange},
		{"channel not running", uint32(ch + 1), []uint32{put}, hypercall.ErrInval},
		{"index past the ring", uint32(ch), []uint32{entries}, hypercall.ErrRange},
		{"entry at GP_GET (submitted)", uint32(ch), []uint32{get}, hypercall.ErrRange},
		{"entry before GP_PUT (submitted)", uint32(ch), []uint32{put - 1}, hypercall.ErrRange},
		{"slot the ring cannot hold", uint32(ch), []uint32{(put + free) % entries}, hypercall.ErrRange},
		{"out of ring order", uint32(ch), []uint32{put + 2, put + 1}, hypercall.ErrInval},
		{"twice in one call", uint32(ch), []uint32{put + 1, put + 1}, hypercall.ErrInval},
		{"one bad among good", uint32(ch), []uint32{put, put + 1, get}, hypercall.ErrRange},
	} {
		if _, code := yieldCall(t, g.v, tc.ch, tc.points...); code != tc.want {
			t.Errorf("%s: code %v, want %v", tc.name, code, tc.want)
		}
	}
	if n := agg.disp.pointsHeld(g.v, ch); n != 0 {
		t.Fatalf("refused calls left %d points", n)
	}
	// The last slot the ring can hold is fine, as are the next entries.
	if v, code := yieldCall(t, g.v, uint32(ch), put, put+1, (put+free-1)%entries); code != hypercall.OK || v != 3 {
		t.Fatalf("valid points: value %d code %v", v, code)
	}
	if n := agg.disp.pointsHeld(g.v, ch); n != 3 {
		t.Fatalf("held %d points, want 3", n)
	}
	release()
	if err := ctx.Synchronize(); err != nil {
		t.Fatal(err)
	}
}

// A guest that declares a point on every free slot of its ring, again and
// again, holds at most one per slot; another VM's channel holds none and
// its work runs; freeing the channel and tearing the VM down free the
// points.
func TestYieldAttackFloodFreeTeardown(t *testing.T) {
	agg := newSchedAggregator(t, "fifo", Options{})
	bad := startGuest(t, agg, "flooder", "pv-multicall")
	good := startGuest(t, agg, "bystander", "pv-multicall")
	gctx, err := gdev.NewContext(good.dev)
	if err != nil {
		t.Fatal(err)
	}
	defer gctx.Close()
	ctx, ch, get, put, release := blockedChannel(t, bad)
	entries := bad.v.chans[ch].sh.GPFIFOEntries()
	free := entries - 1 - (put - get)
	var all []uint32
	for d := range free {
		all = append(all, (put+d)%entries)
	}
	for round := range 3 {
		for i := 0; i < len(all); i += hypercall.MaxYieldPoints {
			if _, code := yieldCall(t, bad.v, uint32(ch), all[i:min(i+hypercall.MaxYieldPoints, len(all))]...); code != hypercall.OK {
				t.Fatalf("round %d: declaring free slots: %v", round, code)
			}
		}
	}
	if n := agg.disp.pointsHeld(bad.v, ch); n != int(free) {
		t.Fatalf("held %d points after the flood, want one per free slot (%d)", n, free)
	}
	if n := agg.disp.pointsHeld(good.v, gctx.Channel().ID()); n != 0 {
		t.Fatalf("the bystander's channel holds %d points", n)
	}
	release()
	if err := maddOnce(gctx, 32); err != nil {
		t.Fatalf("bystander: %v", err)
	}
	if err := ctx.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if err := ctx.Close(); err != nil {
		t.Fatal(err)
	}
	if n := agg.disp.pointsHeld(bad.v, ch); n != 0 {
		t.Fatalf("freeing the channel left %d points", n)
	}
	// Points again, then the VM goes.
	ctx2, ch2, _, put2, release2 := blockedChannel(t, bad)
	if _, code := yieldCall(t, bad.v, uint32(ch2), put2, put2+1); code != hypercall.OK {
		t.Fatalf("points on the new channel: %v", code)
	}
	release2()
	if err := ctx2.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if err := agg.Detach(bad.v); err != nil {
		t.Fatal(err)
	}
	agg.disp.mu.Lock()
	left := len(agg.disp.points)
	agg.disp.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d channels hold points after teardown", left)
	}
	if err := maddOnce(gctx, 32); err != nil {
		t.Fatalf("bystander after the teardown: %v", err)
	}
}

// End to end: a PV guest's LaunchRepeat with yield on is cut at each
// kernel and computes the right result; with it off, or on a guest that
// cannot declare points, nothing is cut.
func TestYieldGuestLaunchRepeat(t *testing.T) {
	agg := newSchedAggregator(t, "band", Options{})
	pv := startGuest(t, agg, "pv", "pv-naive")
	fv := startGuest(t, agg, "fv", "fv-optimized")
	fctx, err := gdev.NewContext(fv.dev)
	if err != nil {
		t.Fatal(err)
	}
	defer fctx.Close()
	if err := fctx.SetYield(true); !errors.Is(err, nouveau.ErrNotSupported) {
		t.Fatalf("SetYield on an FV guest: %v, want ErrNotSupported", err)
	}
	ctx, err := gdev.NewContext(pv.dev)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	splits := func() uint64 { return agg.DispatchStats().Splits }
	launch := func(times int) { launchMaddRepeat(t, ctx, times) }
	before := splits()
	launch(5)
	if got := splits() - before; got != 0 {
		t.Fatalf("yield off: %d splits, want 0", got)
	}
	if err := ctx.SetYield(true); err != nil {
		t.Fatal(err)
	}
	before = splits()
	launch(5)
	if got := splits() - before; got != 4 {
		t.Fatalf("yield on, 5 kernels: %d splits, want 4", got)
	}
	// More kernels than one submission holds with yield: 256, 256 and 88
	// kernels, a point between each two of a submission.
	before = splits()
	launch(600)
	if got := splits() - before; got != 255+255+87 {
		t.Fatalf("yield on, 600 kernels: %d splits, want %d", got, 255+255+87)
	}
	if n := agg.disp.pointsHeld(pv.v, ctx.Channel().ID()); n != 0 {
		t.Fatalf("%d points left after the launches", n)
	}
}

// launchMaddRepeat runs a small madd times over in one LaunchRepeat on ctx
// and checks the result.
func launchMaddRepeat(t *testing.T, ctx *gdev.Context, times int) {
	t.Helper()
	fn, err := ctx.LoadFunction(nvc0.KernelMadd)
	if err != nil {
		t.Fatal(err)
	}
	const n = 16
	a, b := make([]uint32, n*n), make([]uint32, n*n)
	for i := range a {
		a[i], b[i] = uint32(i), uint32(5*i+2)
	}
	var p [3]gdev.DevPtr
	for i := range p {
		if p[i], err = ctx.MemAlloc(n * n * 4); err != nil {
			t.Fatal(err)
		}
		defer ctx.MemFree(p[i])
	}
	if err := ctx.MemcpyHtoD(p[0], kernels.EncodeU32s(a)); err != nil {
		t.Fatal(err)
	}
	if err := ctx.MemcpyHtoD(p[1], kernels.EncodeU32s(b)); err != nil {
		t.Fatal(err)
	}
	if err := ctx.LaunchRepeat(fn, times, p[0].VA, p[1].VA, p[2].VA, n); err != nil {
		t.Fatal(err)
	}
	out := make([]byte, n*n*4)
	if err := ctx.MemcpyDtoH(out, p[2]); err != nil {
		t.Fatal(err)
	}
	if got, want := kernels.DecodeU32s(out), kernels.MaddU32(a, b); !slices.Equal(got, want) {
		t.Fatalf("%d kernels: wrong madd result", times)
	}
}

// A PV guest frees its channel while the remainder of a cut submission is
// queued behind a first part that never ends: the stop voids the
// remainder, the dispatcher holds nothing of the channel afterwards, and
// a bystander VM computes.
func TestYieldAttackFreeWithRemainderQueued(t *testing.T) {
	agg := newSchedAggregator(t, "fifo", Options{})
	bad := startGuest(t, agg, "freer", "pv-multicall")
	good := startGuest(t, agg, "bystander", "pv-multicall")
	ctx, err := gdev.NewContext(bad.dev)
	if err != nil {
		t.Fatal(err)
	}
	sem, err := ctx.MemAllocHost(4096)
	if err != nil {
		t.Fatal(err)
	}
	if err := ctx.Synchronize(); err != nil {
		t.Fatal(err)
	}
	c := ctx.Channel()
	block := []uint32{nvc0.Incr(0, nvc0.MthdSemaphoreAddrHi, 4), uint32(sem.VA >> 32), uint32(sem.VA), 1, nvc0.SemaphoreAcquireEqual}
	nop := []uint32{nvc0.Incr(nouveau.SubcCompute, nvc0.MthdSetObject, 1), nvc0.ClassFermiCompute}
	before := agg.DispatchStats().Splits
	if _, err := c.SubmitFencedParts([][]uint32{block, nop, nop}, true); err != nil {
		t.Fatal(err)
	}
	k := chanKey{bad.v.ID, c.ID()}
	queued := func() bool {
		agg.disp.mu.Lock()
		defer agg.disp.mu.Unlock()
		s := agg.disp.pending[k]
		return s != nil && !s.void
	}
	// The release is the dispatcher's; wait for it (a hang guard only).
	for deadline := time.Now().Add(time.Minute); agg.DispatchStats().Splits == before || !queued(); {
		if time.Now().After(deadline) {
			t.Fatal("the submission was not cut at its first point")
		}
		time.Sleep(time.Millisecond)
	}
	if n := agg.disp.pointsHeld(bad.v, c.ID()); n != 1 {
		t.Fatalf("%d points held with the remainder queued, want the second", n)
	}
	if err := ctx.Close(); err != nil {
		t.Logf("close of the blocked context: %v", err) // the stop ends blocked work; what the guest hears is its own
	}
	agg.disp.mu.Lock()
	s := agg.disp.pending[k]
	held := len(agg.disp.points)
	agg.disp.mu.Unlock()
	if s != nil && !s.void {
		t.Fatal("the remainder is still queued, live, after the channel was freed")
	}
	if held != 0 {
		t.Fatalf("%d channels hold points after the free", held)
	}
	gctx, err := gdev.NewContext(good.dev)
	if err != nil {
		t.Fatal(err)
	}
	defer gctx.Close()
	if err := maddOnce(gctx, 32); err != nil {
		t.Fatalf("bystander: %v", err)
	}
	agg.disp.mu.Lock()
	n, pending := agg.disp.nqueued, len(agg.disp.pending)
	agg.disp.mu.Unlock()
	if n != 0 || pending != 0 {
		t.Fatalf("after the bystander's work: %d queued, %d pending submissions, want none", n, pending)
	}
}
