package host

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/gpu/kernels"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
)

// busyVM is a guest computing without pause: long matrix multiplications,
// each result checked.
type busyVM struct {
	v      *aggregator.VGPU
	passes atomic.Int64
	stop   atomic.Bool
	done   chan error
}

// startBusy places a guest as Serve would, opens its driver and starts its
// computing; the test's end stops it.
func startBusy(t *testing.T, h *Host, domid uint32, name, mode string) *busyVM {
	t.Helper()
	b, v, ram, d := attachRAM(t, h, domid, name, mode, 64<<20)
	if b == nil {
		t.Fatalf("place %s: %s", name, d.Reason)
	}
	pv := nouveau.PVOff
	if mode == "pv-multicall" {
		pv = nouveau.PVMulticall
	}
	dev, err := nouveau.Open(v.Port(), ram, nouveau.Options{BAR1Size: v.Slot.BAR1.Size, BAR3Size: v.Slot.BAR3.Size, PV: pv})
	if err != nil {
		t.Fatalf("guest driver of %s (%s): %v", name, mode, err)
	}
	t.Cleanup(func() { dev.Close() })
	ctx, err := gdev.NewContext(dev)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctx.Close() })
	vm := &busyVM{v: v, done: make(chan error, 1)}
	go func() { vm.done <- vm.loop(ctx) }()
	t.Cleanup(func() { vm.stop.Store(true); <-vm.done })
	return vm
}

// loop multiplies two matrices, eight times back to back in one
// submission, until stopped, checking every result.
func (vm *busyVM) loop(ctx *gdev.Context) error {
	const n = 48
	fn, err := ctx.LoadFunction(nvc0.KernelMmul)
	if err != nil {
		return err
	}
	a, b := make([]uint32, n*n), make([]uint32, n*n)
	for i := range a {
		a[i], b[i] = uint32(i)+vm.v.Guest.DomID, uint32(3*i+1)
	}
	want := kernels.EncodeU32s(kernels.MmulU32(a, b, n))
	var p [3]gdev.DevPtr
	for i := range p {
		if p[i], err = ctx.MemAlloc(uint64(n * n * 4)); err != nil {
			return err
		}
	}
	if err := ctx.MemcpyHtoD(p[0], kernels.EncodeU32s(a)); err != nil {
		return err
	}
	if err := ctx.MemcpyHtoD(p[1], kernels.EncodeU32s(b)); err != nil {
		return err
	}
	out := make([]byte, n*n*4)
	for !vm.stop.Load() {
		if err := ctx.LaunchRepeat(fn, 8, p[0].VA, p[1].VA, p[2].VA, n); err != nil {
			return fmt.Errorf("mmul: %w", err)
		}
		if err := ctx.MemcpyDtoH(out, p[2]); err != nil {
			return fmt.Errorf("mmul result: %w", err)
		}
		if string(out) != string(want) {
			return errors.New("wrong mmul result")
		}
		vm.passes.Add(1)
	}
	return nil
}

// ran waits until vm made more passes, failing on an error or a hang.
func (vm *busyVM) ran(t *testing.T, more int64) {
	t.Helper()
	want := vm.passes.Load() + more
	deadline := time.Now().Add(2 * time.Minute) // a hang guard
	for vm.passes.Load() < want {
		select {
		case err := <-vm.done:
			t.Fatalf("vGPU %d (%s) stopped computing: %v", vm.v.ID, vm.v.Guest.Name, err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("vGPU %d (%s) made no progress", vm.v.ID, vm.v.Guest.Name)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitFor polls cond until it holds (a hang guard fails the test).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// fastBalance is a balancer looking every 20 ms, moving above a 5 % gap,
// holding a moved vGPU for an hour (the test's whole life).
func fastBalance(looks *atomic.Int64) BalanceOptions {
	return BalanceOptions{Policy: BalanceLoad, Interval: 20 * time.Millisecond, Threshold: 0.05, Hold: time.Hour,
		Looked: func(BalanceLook) { looks.Add(1) }}
}

// Three VMs computing on one board, none on the other: the balancer moves
// one (then perhaps another) to the idle board; each VM's results verify
// throughout, and with the hold no vGPU moves twice or back.
func TestBalanceMovesOffBusyBoard(t *testing.T) {
	var looks atomic.Int64
	h := newTestHost(t, Options{Balance: fastBalance(&looks)}, 3, 3)
	if err := h.SetState("slow", StateCordoned); err != nil {
		t.Fatal(err)
	}
	var vms []*busyVM
	for i, name := range []string{"a", "b", "c"} {
		vms = append(vms, startBusy(t, h, uint32(i+1), name, "fv-optimized"))
	}
	for _, vm := range vms {
		vm.ran(t, 2)
	}
	if n := h.BalanceMoves(); n != 0 {
		t.Fatalf("%d moves with no board to move to", n)
	}
	if err := h.SetState("slow", StateActive); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the balancer moves a vGPU", func() bool { return h.BalanceMoves() > 0 })
	// Every VM keeps computing, and verifying, after the move; the
	// balancer keeps looking meanwhile (well past the settling).
	for _, vm := range vms {
		vm.ran(t, 3)
	}
	for from := looks.Load(); looks.Load() < from+int64(2*loadWindow/(20*time.Millisecond)); {
		time.Sleep(5 * time.Millisecond)
	}
	for _, vm := range vms {
		vm.ran(t, 1)
	}
	moved := map[string]int{}
	for _, d := range h.Decisions() {
		if d.Kind != KindBalance {
			continue
		}
		if d.Board != "slow" || !strings.Contains(d.Reason, "moved by the load balancer") {
			t.Errorf("balance decision %+v: want a move to slow", d)
		}
		moved[d.Name]++
	}
	if len(moved) == 0 || len(moved) == len(vms) {
		t.Errorf("moved %v: want some but not every VM", moved)
	}
	for name, n := range moved {
		if n > 1 {
			t.Errorf("%s moved %d times within its hold", name, n)
		}
	}
	st := h.BalanceStatus()
	if st.Policy != BalanceLoad || st.Moves != uint64(len(moved)) || len(st.Held) != len(moved) {
		t.Errorf("status: policy %s, %d moves, held %+v; decisions moved %v", st.Policy, st.Moves, st.Held, moved)
	}
	for _, vm := range vms {
		b, v := h.Lookup(vm.v.ID)
		if v != vm.v || (moved[vm.v.Guest.Name] > 0) != (b.Name == "slow") {
			t.Errorf("vGPU %d (%s) is on %s", vm.v.ID, vm.v.Guest.Name, b.Name)
		}
	}
	t.Logf("looks %d, moves %d; last look %+v", looks.Load(), st.Moves, st.Looks[len(st.Looks)-1])
}

// PV vGPUs move like any other (their page tables are carried in guest
// terms): a board busy with two of them sheds one to an idle board, and
// both keep computing and verifying.
func TestBalanceMovesPV(t *testing.T) {
	var looks atomic.Int64
	h := newTestHost(t, Options{Balance: fastBalance(&looks)}, 3, 3)
	if err := h.SetState("slow", StateCordoned); err != nil {
		t.Fatal(err)
	}
	vms := []*busyVM{startBusy(t, h, 1, "pv1", "pv-multicall"), startBusy(t, h, 2, "pv2", "pv-multicall")}
	for _, vm := range vms {
		vm.ran(t, 2)
	}
	if err := h.SetState("slow", StateActive); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the balancer moves a PV vGPU", func() bool { return h.BalanceMoves() > 0 })
	for _, vm := range vms {
		vm.ran(t, 2)
	}
	on := map[string]int{}
	for _, vm := range vms {
		b, _ := h.Lookup(vm.v.ID)
		on[b.Name]++
	}
	if on["slow"] != 1 || on["fast"] != 1 {
		t.Errorf("PV vGPUs per board after balancing: %v, want one on each", on)
	}
}

// decideHarness drives the balancer's decision over figures the test
// writes, on a clock the test steps.
type decideHarness struct {
	bl    *balancer
	now   time.Time
	fast  *Board
	slow  *Board
	vgpus map[string]*aggregator.VGPU
}

func newDecideHarness(t *testing.T) *decideHarness {
	t.Helper()
	bl, err := newBalancer(BalanceOptions{Policy: BalanceLoad, Threshold: 0.25, Hold: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return &decideHarness{bl: bl, now: time.Unix(1e9, 0), fast: &Board{Index: 0, Name: "fast"}, slow: &Board{Index: 1, Name: "slow"},
		vgpus: map[string]*aggregator.VGPU{}}
}

// vgpu is a named vGPU with load, on a board; why says it cannot move.
type vgpuFig struct {
	name string
	load float64
	why  string
}

// look decides at the harness' clock (then a second later) with fast
// carrying on and slow off, each vGPU's load as told; the boards' loads are
// their vGPUs' sums.
func (hh *decideHarness) look(on, off []vgpuFig) (BalanceLook, *aggregator.VGPU) {
	view := func(b *Board, figs []vgpuFig) balanceView {
		bv := balanceView{board: b, cand: Candidate{Board: b.Name, State: StateActive, Free: 1}}
		for _, f := range figs {
			v := hh.vgpus[f.name]
			if v == nil {
				v = &aggregator.VGPU{ID: len(hh.vgpus) + 1, Guest: aggregator.Guest{Name: f.name}}
				hh.vgpus[f.name] = v
			}
			bv.vgpus = append(bv.vgpus, balanceVGPU{v: v, load: f.load, why: f.why})
			bv.cand.Load += f.load
		}
		return bv
	}
	look, v, _ := hh.bl.decide([]balanceView{view(hh.fast, on), view(hh.slow, off)}, hh.now)
	hh.now = hh.now.Add(time.Second)
	if v != nil {
		hh.bl.moved(v, true, hh.now)
	}
	return look, v
}

// A gap above the threshold moves a vGPU only once seen at two looks in a
// row, and then the one whose load best halves it; a gap within the
// threshold, or one that comes and goes, moves nothing.
func TestBalanceDecideHysteresis(t *testing.T) {
	hh := newDecideHarness(t)
	busy := []vgpuFig{{"a", 0.35, ""}, {"b", 0.25, ""}, {"c", 0.15, ""}} // 75 % against 0
	calm := []vgpuFig{{"a", 0.1, ""}, {"b", 0.1, ""}}                    // 20 %: within 25 %
	for i := range 10 {
		if l, v := hh.look(calm, nil); v != nil || l.Outcome != LookBalanced {
			t.Fatalf("look %d within the threshold: %s (%s)", i, l.Outcome, l.Reason)
		}
	}
	for i := range 10 { // oscillating: above, within, above, ...
		figs := busy
		if i%2 == 1 {
			figs = calm
		}
		if l, v := hh.look(figs, nil); v != nil {
			t.Fatalf("look %d of oscillating loads moved vGPU %d (%s)", i, v.ID, l.Reason)
		}
	}
	// A gap that persists: the second look moves the best fit. The gap
	// is 75 %: a (35 %) leaves 5 %, b (25 %) 25 %, c (15 %) 45 %.
	if l, v := hh.look(busy, nil); v != nil || l.Outcome != LookWaiting {
		t.Fatalf("first look at a gap: %s, moved %v", l.Outcome, v)
	}
	l, v := hh.look(busy, nil)
	if v == nil || v.Guest.Name != "a" || l.Outcome != LookMoved || l.From != "fast" || l.To != "slow" {
		t.Fatalf("second look: %s moved %v (%s), want a", l.Outcome, v, l.Reason)
	}
	// The figures settle for loadWindow after a move: nothing moves,
	// whatever they say.
	after := []vgpuFig{{"b", 0.25, ""}, {"c", 0.15, ""}}
	for range int(loadWindow / time.Second) {
		if l, v := hh.look(after, nil); v != nil || l.Outcome != LookWaiting && l.Outcome != LookBalanced {
			t.Fatalf("while settling: %s, moved %v", l.Outcome, v)
		}
	}
	// Now a is the busy one on slow (its figures swung): it is held, and
	// there is nothing else on slow to move back.
	for i := range 6 {
		look, v := hh.look([]vgpuFig{{"b", 0.05, ""}, {"c", 0.05, ""}}, []vgpuFig{{"a", 0.3, ""}, {"pinned", 0.6, "pinned to board slow"}})
		if v != nil {
			t.Fatalf("look %d moved vGPU %s back within its hold (%s)", i, v.Guest.Name, look.Reason)
		}
		if i > 0 && (look.Outcome != LookStuck || !strings.Contains(look.Reason, "within the hold")) {
			t.Fatalf("look %d: %s (%s), want stuck on the hold", i, look.Outcome, look.Reason)
		}
	}
	// A vGPU that cannot move, one whose load is the gap or more, and an
	// idle one are never chosen.
	hh2 := newDecideHarness(t)
	stuck := []vgpuFig{{"pinned", 0.3, "pinned to board fast"}, {"hog", 0.6, ""}, {"idle", 0, ""}}
	for i := range 4 {
		l, v := hh2.look(stuck, []vgpuFig{{"other", 0.35, ""}}) // gap 55 %
		if v != nil {
			t.Fatalf("look %d moved %s (%s)", i, v.Guest.Name, l.Reason)
		}
		if i > 0 && (l.Outcome != LookStuck || !strings.Contains(l.Reason, "pinned to board fast") ||
			!strings.Contains(l.Reason, "not below the gap") || !strings.Contains(l.Reason, "idle")) {
			t.Fatalf("look %d: %s (%s)", i, l.Outcome, l.Reason)
		}
	}
}

// The hold ends: a vGPU moved long enough ago can move again.
func TestBalanceHoldEnds(t *testing.T) {
	hh := newDecideHarness(t)
	busy := []vgpuFig{{"a", 0.4, ""}, {"b", 0.3, ""}, {"c", 0.1, ""}} // gap 80 %: a leaves none
	hh.look(busy, nil)
	if _, v := hh.look(busy, nil); v == nil || v.Guest.Name != "a" {
		t.Fatalf("moved %v, want a", v)
	}
	movedAt := hh.now
	// slow now carries a and a pinned vGPU, fast b alone, lightly: the
	// gap persists, and only a could shrink it.
	for range 30 {
		now := hh.now
		l, v := hh.look([]vgpuFig{{"b", 0.05, ""}}, []vgpuFig{{"a", 0.4, ""}, {"pinned", 0.3, "pinned to board slow"}})
		if v == nil {
			continue
		}
		if v.Guest.Name != "a" || l.From != "slow" || now.Before(movedAt.Add(hh.bl.opts.Hold)) {
			t.Fatalf("moved %s from %s at %v, %v after the first move (hold %v)", v.Guest.Name, l.From, now, now.Sub(movedAt), hh.bl.opts.Hold)
		}
		return
	}
	t.Fatal("a never moved back once its hold ended")
}

func TestBalanceOptions(t *testing.T) {
	for _, o := range []BalanceOptions{{Policy: "random"}, {Policy: BalanceLoad, Threshold: 1}, {Policy: BalanceLoad, Interval: -1}} {
		if _, err := newBalancer(o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
	bl, err := newBalancer(BalanceOptions{})
	if err != nil || bl.opts.Policy != BalanceOff || bl.opts.Interval != DefaultBalanceInterval || bl.opts.Hold != DefaultBalanceHold {
		t.Fatalf("defaults: %+v %v", bl.opts, err)
	}
}
