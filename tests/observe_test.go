package tests

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
)

// Information isolation (issue 20): nothing a VM reads depends on another
// VM.

// observable lists what observer A can read: every BAR0 offset the
// register table lets it read, except the documented shared ones (PTIMER)
// and the PRAMIN window (its own VRAM), plus the user-area words of its
// channels through its poll area.
type observable struct {
	bar0 []uint32
	poll []uint64 // BAR1 offsets
}

func observables(t *testing.T, e *env, a *attacker) observable {
	t.Helper()
	var o observable
	for off := uint32(0); off < nvc0.PRAMINBase; off += 4 {
		vis, _, readable := e.agg.RegisterVisibility(off)
		if readable && vis != "shared" {
			o.bar0 = append(o.bar0, off)
		}
	}
	g := a.inspectChannel(t)
	for _, w := range []uint64{nvc0.UserDMAGet, nvc0.UserRef, nvc0.UserDMAGetHi, nvc0.UserGPGet, nvc0.UserGPPut} {
		o.poll = append(o.poll, g.poll+w)
	}
	return o
}

// sample is what the observer saw: per location, the values and how often.
type sample map[string]map[uint32]int

func (o observable) read(a *attacker, into sample) {
	note := func(k string, v uint32) {
		if into[k] == nil {
			into[k] = map[uint32]int{}
		}
		into[k][v]++
	}
	for _, off := range o.bar0 {
		note(fmt.Sprintf("BAR0 %#07x", off), a.r.rd(off))
	}
	for _, off := range o.poll {
		note(fmt.Sprintf("BAR1 %#x", off), a.dev.Read32(nvc0.BAR1, off))
	}
}

// actorStates are what the other VM does while the observer reads.
var actorStates = []string{"idle", "computing", "copying", "faulting", "torn down"}

// TestObservabilitySweep: while VM B idles, computes, copies, faults and is
// torn down, VM A (idle, with a channel of its own) reads every register
// and user-area word it can, many times. Every value A sees must be
// distributed alike in all of B's states; an idle A's values are in fact
// fixed. Run twice, with A and B swapped (so each sits in either slot).
func TestObservabilitySweep(t *testing.T) {
	for _, swapped := range []bool{false, true} {
		t.Run(fmt.Sprintf("swapped=%v", swapped), func(t *testing.T) {
			e := newEnv(t)
			x := newAttacker(t, e, "x", 81, "fv-optimized")
			y := newAttacker(t, e, "y", 82, "fv-optimized")
			a, b := x, y
			if swapped {
				a, b = y, x
			}
			a.controlCopies(t) // A's own channel has done work before
			o := observables(t, e, a)
			rounds := 40
			if testing.Short() {
				rounds = 15
			}
			seen := map[string]sample{}
			for _, st := range actorStates {
				stop := actB(t, e, b, st)
				s := sample{}
				for range rounds {
					o.read(a, s)
				}
				stop()
				seen[st] = s
			}
			base := seen["idle"]
			for _, st := range actorStates[1:] {
				for k, want := range base {
					if got := seen[st][k]; !maps.Equal(got, want) {
						t.Errorf("%s: A read %v while B was idle, %v while B was %s", k, values(want), values(got), st)
					}
				}
			}
			for k, vals := range base {
				if len(vals) != 1 {
					t.Errorf("%s: an idle A read %d different values: %v", k, len(vals), values(vals))
				}
			}
			t.Logf("%d locations read %d times in each of %d states of B", len(base), rounds, len(actorStates))
		})
	}
}

func values(m map[uint32]int) []string {
	var out []string
	for _, v := range slices.Sorted(maps.Keys(m)) {
		out = append(out, fmt.Sprintf("%#x×%d", v, m[v]))
	}
	return out
}

// actB puts B into state st and returns what ends it. The activity must
// be under way (B's work on the GPU) before the observer reads.
func actB(t *testing.T, e *env, b *attacker, st string) (stop func()) {
	t.Helper()
	var done atomic.Bool
	var wg sync.WaitGroup
	loop := func(step func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !done.Load() {
				if err := step(); err != nil && !errors.Is(err, nouveau.ErrChannelFault) {
					return
				}
			}
		}()
	}
	stop = func() { done.Store(true); wg.Wait() }
	switch st {
	case "idle":
	case "computing":
		k := newKernelPage(t, b)
		loop(func() error {
			if err := b.ch.Submit(k.loopLaunch(0, 1<<16, k.resultVA(0))); err != nil {
				return err
			}
			return b.ch.Finish()
		})
		if !pollUntil(10*time.Second, e.pgraphBusy) {
			t.Fatal("B's kernels never ran")
		}
	case "copying":
		loop(func() error { return b.gpuCopy(b.ownVA, b.srcVA) })
		before := e.board.Stats().CopiesRun
		if !pollUntil(10*time.Second, func() bool { return e.board.Stats().CopiesRun > before+10 }) {
			t.Fatal("B's copies never ran")
		}
	case "faulting":
		unmapped, err := b.vm.AllocVA(nvc0.PageSize, nvc0.PageSize) // reserved, never mapped
		if err != nil {
			t.Fatal(err)
		}
		var faults atomic.Int64
		loop(func() error {
			err := b.gpuCopy(b.ownVA, unmapped)
			if errors.Is(err, nouveau.ErrChannelFault) {
				faults.Add(1)
				ch, nerr := b.drv.NewChannel(b.vm)
				if nerr != nil {
					return nerr
				}
				old := b.ch
				b.ch = ch
				old.Close()
			}
			return err
		})
		if !pollUntil(10*time.Second, func() bool { return faults.Load() >= 3 }) {
			t.Fatal("B never faulted")
		}
	case "torn down":
		if err := e.agg.Destroy(e.vgpu(b.name), "observability sweep"); err != nil {
			t.Fatal(err)
		}
	}
	return stop
}

// TestSimultaneousFaults: two VMs fault at once, many times, each at
// addresses of its own: each sees exactly its own faults, with its own
// guest addresses, none lost or misattributed.
func TestSimultaneousFaults(t *testing.T) {
	e := newEnv(t)
	vms := []*attacker{newAttacker(t, e, "p", 91, "fv-optimized"), newAttacker(t, e, "q", 92, "fv-optimized")}
	n := 25
	if testing.Short() {
		n = 10
	}
	var wg sync.WaitGroup
	errs := make([]error, len(vms))
	for k, a := range vms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[k] = faultMany(a, n, uint64(k+1)<<32)
		}()
	}
	wg.Wait()
	for k, err := range errs {
		if err != nil {
			t.Errorf("VM %s: %v", vms[k].name, err)
		}
	}
	for _, a := range vms {
		if c := e.vgpu(a.name).Counters(); c.ReportsDropped != 0 {
			t.Errorf("%s: %d reports dropped", a.name, c.ReportsDropped)
		}
	}
}

// faultMany makes a's copy engine read n unmapped addresses (in a range of
// its own, at base) one after another, each on a fresh channel, and checks
// that each fault report names exactly that address.
func faultMany(a *attacker, n int, base uint64) error {
	for i := range n {
		va := base + uint64(i)*nvc0.PageSize + uint64(i%7)*0x40
		err := a.gpuCopy(a.ownVA, va)
		var fe *nouveau.FaultError
		switch {
		case !errors.As(err, &fe):
			return fmt.Errorf("fault %d: got %v, want a fault at %#x", i, err, va)
		case !fe.MMU || fe.Addr != va || fe.Write || fe.Unit != nvc0.FaultUnitCE0 || fe.Channel != a.ch.ID():
			return fmt.Errorf("fault %d at %#x reported as %v", i, va, fe)
		}
		ch, err := a.drv.NewChannel(a.vm)
		if err != nil {
			return err
		}
		old := a.ch
		a.ch = ch
		old.Close()
	}
	return nil
}
