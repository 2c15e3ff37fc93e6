package aggregator

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/gpu/hostmem"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/gpu/sim"
)

// overcommitted is a board of one slot that admits vGPUs for twice its
// VRAM, evicting quickly (tests want turns, not waits).
func overcommitted(t *testing.T, restoreWait time.Duration) (*Aggregator, *sim.Board) {
	t.Helper()
	return newTestAggregatorWith(t, Options{MaxVMs: 1, Overcommit: 2, EvictIdle: time.Millisecond,
		MinResidency: 100 * time.Millisecond, RestoreWait: restoreWait, Timeout: 2 * time.Second})
}

// writeMarker writes words at VRAM address at of v through its own PRAMIN
// window; readMarker reads n words back. Both put the window back where
// the guest driver (which keeps track of it) left it.
func writeMarker(v *VGPU, at uint64, words []uint32) {
	port := vgpuPort{v}
	old := port.Read32(nvc0.BAR0, nvc0.RegPRAMINWindow)
	port.Write32(nvc0.BAR0, nvc0.RegPRAMINWindow, uint32(at>>nvc0.PRAMINWindowShift))
	for i, w := range words {
		port.Write32(nvc0.BAR0, nvc0.PRAMINBase+uint64(4*i), w)
	}
	port.Write32(nvc0.BAR0, nvc0.RegPRAMINWindow, old)
}

func readMarker(v *VGPU, at uint64, n int) []uint32 {
	port := vgpuPort{v}
	old := port.Read32(nvc0.BAR0, nvc0.RegPRAMINWindow)
	port.Write32(nvc0.BAR0, nvc0.RegPRAMINWindow, uint32(at>>nvc0.PRAMINWindowShift))
	out := make([]uint32, n)
	for i := range out {
		out[i] = port.Read32(nvc0.BAR0, nvc0.PRAMINBase+uint64(4*i))
	}
	port.Write32(nvc0.BAR0, nvc0.RegPRAMINWindow, old)
	return out
}

// markerAt is a VRAM address the guest driver does not allocate from in
// these tests (as the reset test's secret).
const markerAt = 8 << 20

// TestEvictTakingTurns: two VMs share a board of one slot (2× overcommit).
// The second's attach evicts the first, which was idle: the first is
// parked (listed, no slot, its VRAM in an image), the slot it left was
// scrubbed before the second got it (the second reads zeros where the
// first's marker was). Then both compute at once and take turns in the
// slot — each restore evicts the other — and every result verifies; the
// first finds its marker intact at the end.
func TestEvictTakingTurns(t *testing.T) {
	agg, board := overcommitted(t, 30*time.Second)
	first := startGuest(t, agg, "first", "fv-optimized")
	verifiedWork(t, first)
	marker := []uint32{0x5EC2E700, 0x5EC2E701, 0x5EC2E702, 0x5EC2E703}
	writeMarker(first.v, markerAt, marker)
	time.Sleep(5 * time.Millisecond) // idle past EvictIdle

	second := startGuest(t, agg, "second", "fv-optimized")
	if !first.v.Evicted() {
		t.Fatal("the second VM attached to a full overcommitted board without evicting the first")
	}
	if got := len(agg.VGPUs()); got != 2 {
		t.Fatalf("the board lists %d vGPUs, want 2 (one parked)", got)
	}
	if info := first.v.Info(); info.Slot != -1 || info.VRAMInUse <= 0 {
		t.Fatalf("the parked vGPU shows slot %d and %d bytes in use, want -1 and its image", info.Slot, info.VRAMInUse)
	}
	for i, w := range readMarker(second.v, markerAt, len(marker)) {
		if w != 0 {
			t.Fatalf("the next tenant of the slot reads %#x at the evicted VM's marker word %d", w, i)
		}
	}
	verifiedWork(t, second)

	want := int64(2)
	if testing.Short() {
		want = 1 // a pass is every workload; under -race one takes a minute
	}
	var loops []workLoop
	for _, g := range []*guestVM{first, second} {
		ctx := openContext(t, g)
		loops = append(loops, func(stop *atomic.Bool, passes *atomic.Int64) error { return workloadLoop(g, ctx, stop, passes) })
	}
	runLoops(t, want, loops...)
	for i, w := range readMarker(first.v, markerAt, len(marker)) {
		if w != marker[i] {
			t.Fatalf("the first VM's marker word %d reads %#x after its turns, want %#x", i, w, marker[i])
		}
	}
	c1, c2 := first.v.Counters(), second.v.Counters()
	t.Logf("first: %d evictions, %d restores, %d KiB out, %d KiB in, waited %v; second: %d evictions, %d restores",
		c1.Evictions, c1.Restores, c1.EvictedBytes>>10, c1.RestoredBytes>>10, time.Duration(c1.RestoreWaitNs), c2.Evictions, c2.Restores)
	if c1.Evictions < 2 || c1.Restores < 2 || c2.Evictions < 1 || c2.Restores < 1 {
		t.Fatalf("the VMs did not take turns: first %d/%d, second %d/%d evictions/restores", c1.Evictions, c1.Restores, c2.Evictions, c2.Restores)
	}
	if c1.EvictedBytes == 0 || c1.RestoredBytes == 0 {
		t.Fatal("evictions copied no VRAM")
	}
	if c1.Denied != 0 || c2.Denied != 0 {
		t.Fatalf("denied accesses: %d, %d", c1.Denied, c2.Denied)
	}
	_ = board
}

// TestEvictRefusesBeyondOvercommit: a board of one slot at 2× takes two
// vGPUs; a third is refused at once, whatever is idle.
func TestEvictRefusesBeyondOvercommit(t *testing.T) {
	agg, _ := overcommitted(t, 30*time.Second)
	startGuest(t, agg, "one", "fv-optimized")
	time.Sleep(5 * time.Millisecond)
	startGuest(t, agg, "two", "fv-optimized")
	time.Sleep(5 * time.Millisecond)
	f := guestRAMFile(t, "three")
	if _, err := agg.Attach(Guest{DomID: 3, Name: "three", Mode: "fv-optimized"}, f, 64<<20); !errors.Is(err, ErrNoSlot) {
		t.Fatalf("a third vGPU on a one-slot board at 2x: %v, want ErrNoSlot", err)
	}
}

// TestEvictWaitsOutNoLongKernel: a VM whose channel runs work that never
// ends holds the only slot. It is never evicted — its work in flight does
// not end — so a second VM's attach waits RestoreWait and is refused
// (ErrNoRoom); the first VM's channel still runs and its work completes
// once released.
func TestEvictWaitsOutNoLongKernel(t *testing.T) {
	agg, _ := overcommitted(t, 300*time.Millisecond)
	hog := startGuest(t, agg, "hog", "fv-optimized")
	ch, seq, sem := stuckChannel(t, hog)
	waitReleased(t, agg, hog.v, ch.ID())
	time.Sleep(120 * time.Millisecond) // past MinResidency: it may be preempted, if its work ends
	f := guestRAMFile(t, "waiter")
	_, err := agg.Attach(Guest{DomID: 9, Name: "waiter", Mode: "fv-optimized"}, f, 64<<20)
	if !errors.Is(err, ErrNoRoom) {
		t.Fatalf("attach beside a VM whose work never ends: %v, want ErrNoRoom", err)
	}
	if hog.v.Evicted() {
		t.Fatal("the VM with work in flight was evicted")
	}
	sem.Bytes[0] = 1
	if err := ch.WaitFence(seq); err != nil {
		t.Fatalf("the hog's work after the refused attach: %v", err)
	}
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
	verifiedWork(t, hog)
}

// TestEvictWaitsForSlowWork: the only slot's tenant has work in flight
// that outlasts the eviction's bound (Options.Timeout) when a second VM
// wants the slot. The first eviction attempt times out; the victim is not
// written off for that — its work ends, and the next attempt evicts it —
// so the waiter gets the slot once the work is done, well within its
// RestoreWait, instead of being refused after it.
func TestEvictWaitsForSlowWork(t *testing.T) {
	const bound = 100 * time.Millisecond
	agg, _ := newTestAggregatorWith(t, Options{MaxVMs: 1, Overcommit: 2, EvictIdle: time.Millisecond,
		MinResidency: 100 * time.Millisecond, RestoreWait: time.Minute, Timeout: bound})
	slow := startGuest(t, agg, "slow", "fv-optimized")
	ch, seq, sem := stuckChannel(t, slow)
	waitReleased(t, agg, slow.v, ch.ID())
	time.Sleep(120 * time.Millisecond) // past MinResidency
	attached := make(chan error, 1)
	go func() {
		f := guestRAMFile(t, "waiter")
		_, err := agg.Attach(Guest{DomID: 9, Name: "waiter", Mode: "fv-optimized"}, f, 64<<20)
		attached <- err
	}()
	time.Sleep(5 * bound) // several eviction attempts time out on the work in flight
	select {
	case err := <-attached:
		t.Fatalf("the attach ended while the tenant's work was still in flight: %v", err)
	default:
	}
	sem.Bytes[0] = 1 // the work ends
	if err := ch.WaitFence(seq); err != nil {
		t.Fatalf("the slow VM's work: %v", err)
	}
	if err := <-attached; err != nil {
		t.Fatalf("the waiter, once the work in flight had ended: %v", err)
	}
	// Counted, not Evicted(): once parked, the slow VM's own next access
	// (its driver reading the fence) may already have brought it back in
	// the idle waiter's place.
	if slow.v.Counters().Evictions == 0 {
		t.Fatal("the waiter attached without the slow VM being evicted")
	}
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
	verifiedWork(t, slow) // it takes its turn back
}

// TestEvictedVGPUTornDown: a parked vGPU whose VM goes is torn down without
// a slot: its id and identity are free again and the board takes another
// VM in its place.
func TestEvictedVGPUTornDown(t *testing.T) {
	agg, _ := overcommitted(t, 30*time.Second)
	gone := startGuest(t, agg, "gone", "fv-optimized")
	verifiedWork(t, gone)
	time.Sleep(5 * time.Millisecond)
	stay := startGuest(t, agg, "stay", "fv-optimized")
	if !gone.v.Evicted() {
		t.Fatal("not evicted")
	}
	if err := agg.Destroy(gone.v, "test: its VM went while parked"); err != nil {
		t.Fatalf("destroy a parked vGPU: %v", err)
	}
	if n := len(agg.VGPUs()); n != 1 {
		t.Fatalf("%d vGPUs listed after the parked one went, want 1", n)
	}
	if _, err := Move(context.Background(), gone.v, agg); err == nil {
		t.Fatal("a torn-down parked vGPU was moved")
	}
	time.Sleep(5 * time.Millisecond)
	again := startGuest(t, agg, "gone", "fv-optimized") // the same identity, free again
	verifiedWork(t, again)
	verifiedWork(t, stay)
}

// guestRAMFile is a fresh guest RAM memfd of 64 MiB, closed at the test's
// end.
func guestRAMFile(t *testing.T, name string) *os.File {
	t.Helper()
	ram, err := hostmem.New(name, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ram.Close() })
	f, err := ram.File()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// TestLostBoardRestartsParkedVGPU: board a (one slot, 2× overcommit) holds
// a resident vGPU and a parked one when it falls off the bus. The resident
// one is lost with it; the parked one's image is in the daemon's memory,
// so it is handed to board b (SetRehome, as package host's placement does)
// and its guest's next access restores it there: its workloads verify and
// its marker, written before it was parked, is intact. The VM on b is
// untouched.
func TestLostBoardRestartsParkedVGPU(t *testing.T) {
	reg := NewRegistry()
	a, boardA := newTestAggregatorWith(t, Options{MaxVMs: 1, Registry: reg, BoardName: "a", Overcommit: 2,
		EvictIdle: time.Millisecond, HealthInterval: 5 * time.Millisecond, Timeout: time.Hour})
	b, _ := newTestAggregatorWith(t, Options{MaxVMs: 2, Registry: reg, Board: 1, BoardName: "b"})
	a.SetRehome(func(*VGPU) *Aggregator { return b })

	parked := startGuest(t, a, "parked", "fv-optimized")
	verifiedWork(t, parked)
	marker := []uint32{0xCAFE0001, 0xCAFE0002}
	writeMarker(parked.v, markerAt, marker)
	time.Sleep(5 * time.Millisecond)
	resident := startGuest(t, a, "resident", "fv-optimized") // evicts the idle one
	if !parked.v.Evicted() {
		t.Fatal("the idle vGPU was not parked")
	}
	bystander := startGuest(t, b, "bystander", "fv-optimized")

	boardA.FailBus()
	waitFor(t, "the lost board's vGPUs to be taken off it", func() bool {
		lost, _ := resident.v.Lost()
		cur, _ := parked.v.where()
		return lost && cur == b
	})
	if !parked.v.Evicted() {
		t.Fatal("the parked vGPU was restored on b before its guest's access")
	}
	if lost, _ := parked.v.Lost(); lost {
		t.Fatal("the parked vGPU, whose image was not on the board, is a lost device")
	}
	for i, w := range readMarker(parked.v, markerAt, len(marker)) { // this access restores it on b
		if w != marker[i] {
			t.Fatalf("marker word %d reads %#x after the restart on b, want %#x", i, w, marker[i])
		}
	}
	if cur, slot := parked.v.where(); cur != b || slot.Index < 0 || parked.v.Evicted() {
		t.Fatalf("after its access the vGPU is on %s slot %d (evicted %v)", cur.opts.BoardName, slot.Index, parked.v.Evicted())
	}
	verifiedWork(t, parked)
	verifiedWork(t, bystander)
}

// TestParkedVGPUTornDownWhileWaitingForRoom: a parked vGPU's guest access
// waits for a slot (a VM whose work never ends holds the only one) when
// its VM goes. The teardown does not wait for the restore; the waiting
// access ends without restoring anything, no slot is left held, and the
// hog's work completes once released (the hog may have been evicted for a
// waiter that was already choosing it: harmless, it comes back).
func TestParkedVGPUTornDownWhileWaitingForRoom(t *testing.T) {
	agg, _ := overcommitted(t, 30*time.Second)
	parked := startGuest(t, agg, "parked", "fv-optimized")
	verifiedWork(t, parked)
	time.Sleep(5 * time.Millisecond)
	hog := startGuest(t, agg, "hog", "fv-optimized") // evicts the idle one
	if !parked.v.Evicted() {
		t.Fatal("not parked")
	}
	ch, seq, sem := stuckChannel(t, hog)
	waitReleased(t, agg, hog.v, ch.ID())
	done := make(chan error, 1)
	go func() {
		_, err := parked.v.Read32(nvc0.BAR0, nvc0.RegBoot0) // waits for room
		done <- err
	}()
	time.Sleep(50 * time.Millisecond) // let it wait (not a measurement)
	if err := agg.Destroy(parked.v, "test: its VM went while it waited for a slot"); err != nil {
		t.Fatalf("destroy a parked vGPU waiting for room: %v", err)
	}
	sem.Bytes[0] = 1 // the hog's work ends: its slot could be taken now
	select {
	case <-done:
	case <-time.After(time.Minute): // a hang guard
		t.Fatal("the waiting access never ended")
	}
	if !parked.v.detached() {
		t.Fatal("the parked vGPU is not torn down")
	}
	if err := ch.WaitFence(seq); err != nil {
		t.Fatalf("the hog's work: %v", err)
	}
	if n := len(agg.VGPUs()); n != 1 {
		t.Fatalf("after the teardown: %d vGPUs listed, want the hog alone", n)
	}
	if room := agg.Room(); room != 1 {
		t.Fatalf("room %d after the parked vGPU went, want 1 (a slot left held?)", room)
	}
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
	verifiedWork(t, hog)
}

// TestRestoreWaitsForItsSlotsRenewal: a guest access that arrives while
// the eviction is still scrubbing the slot its vGPU left (the vGPU is
// parked, the slot not yet free) waits for that slot rather than taking a
// free one beside it: the vGPU comes back where it was. The scrub is
// stretched here by holding the slot as Evict's last step does.
func TestRestoreWaitsForItsSlotsRenewal(t *testing.T) {
	agg, _ := newTestAggregatorWith(t, Options{MaxVMs: 2, Overcommit: 2, EvictIdle: time.Millisecond,
		MinResidency: time.Millisecond, RestoreWait: 30 * time.Second, Timeout: 2 * time.Second})
	g := startGuest(t, agg, "renewed", "fv-optimized")
	verifiedWork(t, g)
	home := g.v.Slot.Index
	if _, err := agg.Evict(context.Background(), g.v, "test"); err != nil {
		t.Fatal(err)
	}
	agg.mu.Lock()
	if agg.vgpus[home] != nil {
		agg.mu.Unlock()
		t.Fatalf("slot %d not freed after the eviction", home)
	}
	agg.vgpus[home] = g.v // as between Evict's parking and its releaseMoved
	agg.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		_, err := g.v.Read32(nvc0.BAR0, nvc0.RegBoot0) // brings it back
		done <- err
	}()
	time.Sleep(20 * time.Millisecond) // the scrub takes a while (not a measurement)
	select {
	case err := <-done:
		t.Fatalf("the access came back (err %v) while its slot was still being renewed: slot %d", err, g.v.Info().Slot)
	default:
	}
	agg.mu.Lock()
	agg.vgpus[home] = nil // the scrub is done
	agg.mu.Unlock()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("restore: %v", err)
		}
	case <-time.After(time.Minute): // a hang guard
		t.Fatal("the access never ended")
	}
	if got := g.v.Info().Slot; got != home {
		t.Fatalf("the vGPU came back to slot %d, not the slot it left (%d)", got, home)
	}
	verifiedWork(t, g)
}

// workLoop is a workload loop (workloadLoop) bound to its guest.
type workLoop func(stop *atomic.Bool, passes *atomic.Int64) error

// runLoops runs the loops at once until each made want passes (or two
// minutes went by: a hang guard), then stops them; an error of any fails
// the test.
func runLoops(t *testing.T, want int64, loops ...workLoop) {
	t.Helper()
	var stop atomic.Bool
	passes := make([]atomic.Int64, len(loops))
	errs := make(chan error, len(loops))
	for i, l := range loops {
		go func() { errs <- l(&stop, &passes[i]) }()
	}
	behind := func() bool {
		for i := range passes {
			if passes[i].Load() < want {
				return true
			}
		}
		return false
	}
	// A loop ends early only with an error: then the others are stopped.
	var failed []error
	ended := 0
	for deadline := time.Now().Add(2 * time.Minute); behind() && ended == 0 && time.Now().Before(deadline); {
		select {
		case err := <-errs:
			ended++
			failed = append(failed, err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	stop.Store(true)
	// Every loop ends before the test may: its guest's RAM and driver are
	// closed by the test's cleanup.
	for ; ended < len(loops); ended++ {
		if err := <-errs; err != nil {
			failed = append(failed, err)
		}
	}
	if len(failed) > 0 {
		t.Fatalf("workloads on an overcommitted board: %v", errors.Join(failed...))
	}
}
