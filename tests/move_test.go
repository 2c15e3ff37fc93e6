package tests

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/devmodel"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
	"github.com/gpuvm/gpuvm/hypercall"
	"github.com/gpuvm/gpuvm/ipc"
)

// Moving a running vGPU between boards (docs/design.md, "Moving a vGPU"):
// two boards of one host (two aggregators sharing a registry, as `gpuvm
// serve` builds them).

// twoBoardEnv builds boards a and b of one registry.
func twoBoardEnv(t *testing.T) (a, b *env) {
	t.Helper()
	reg := aggregator.NewRegistry()
	a = newEnvWith(t, envOptions{Modify: func(o *aggregator.Options) { o.Registry, o.BoardName = reg, "a" }})
	b = newEnvWith(t, envOptions{Modify: func(o *aggregator.Options) { o.Registry, o.Board, o.BoardName = reg, 1, "b" }})
	return a, b
}

// residentPages lists page addresses (the board's) of slot that hold data.
func (e *env) residentPages(t *testing.T, slot int) []uint64 {
	t.Helper()
	s := e.layout.Slots[slot].VRAM
	rs, err := e.board.VRAMResidentRanges(s.Base, s.Size)
	if err != nil {
		t.Fatal(err)
	}
	var out []uint64
	for _, r := range rs {
		for p := r.Base; p < r.End(); p += pageSize {
			out = append(out, p)
		}
	}
	return out
}

// moveTo moves v to board to, failing the test on error.
func moveTo(t *testing.T, v *aggregator.VGPU, to *env) aggregator.MoveStats {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := aggregator.Move(ctx, v, to.agg)
	if err != nil {
		t.Fatalf("move vGPU %d: %v", v.ID, err)
	}
	t.Logf("moved vGPU %d: %s/%d -> %s/%d, %d KiB copied, paused %v (copy %v)", v.ID,
		st.FromBoard, st.FromSlot, st.ToBoard, st.ToSlot, st.Bytes>>10, st.Downtime.Round(time.Microsecond), st.Copy.Round(time.Microsecond))
	return st
}

// TestMoveRunningVM: a VM process looping verified madd and cpy is moved
// between the boards, back and forth, while it computes. Every one of its
// results verifies; the slot it leaves each time holds nothing afterwards;
// the next tenant of a vacated slot reads zeros where the mover's data
// was; the honest VM on board a verifies and canaries in free slots of
// both boards are untouched.
//
// The boards must run each GPFIFO entry the VMs submitted exactly once (a
// channel re-created without its state re-runs its ring from entry 0, and
// results of idempotent work would still verify): the entries both boards
// ran are counted against the same two jobs run on a board of their own.
func TestMoveRunningVM(t *testing.T) {
	runs := "40"
	if testing.Short() {
		runs = "12"
	}
	job := []string{"--workloads", "madd,cpy", "--runs", runs, "--matrix-dim", "64", "--copy-size", "1MiB"}
	solo := newEnv(t)
	p, _ := solo.startHonest(t)
	p.verified(t)
	honestEntries := solo.board.Stats().GPFIFOEntries
	p = solo.startVM(t, "mover", 12, "fv-optimized", job)
	solo.waitAttached(t, "mover", p)
	p.verified(t)
	moverEntries := solo.board.Stats().GPFIFOEntries - honestEntries

	a, b := twoBoardEnv(t)
	honest, _ := a.startHonest(t) // slot 0 of a
	canaryA := a.plant(t, "board a, free slot", a.layout.Slots[maxVMs-1].VRAM.Base+vramPerVM/2, 0x3C)
	canaryB := b.plant(t, "board b, free slot", b.layout.Slots[maxVMs-1].VRAM.Base+vramPerVM/2, 0x4D)

	mover := a.startVM(t, "mover", 12, "fv-optimized", job)
	v := a.waitAttached(t, "mover", mover)
	id := v.ID
	envs := map[*aggregator.Aggregator]*env{a.agg: a, b.agg: b}
	hops := []*env{b, a, b, a, b}
	var lastLeft []uint64
	lastLeftSlot := -1
	for i, to := range hops {
		// Let it compute on this board first.
		bells := v.Counters().Doorbells
		if !pollUntil(time.Minute, func() bool { return mover.exited() || v.Counters().Doorbells >= bells+8 }) || mover.exited() {
			t.Fatalf("hop %d: the mover stopped computing (exited %v)\nstderr:\n%s", i, mover.exited(), mover.stderr())
		}
		_, name := v.Board()
		from := a
		if name == "b" {
			from = b
		}
		fromSlot := v.Info().Slot
		left := from.residentPages(t, fromSlot)
		st := moveTo(t, v, to)
		if st.Bytes == 0 || len(left) == 0 {
			t.Fatalf("hop %d: nothing was copied (%d pages resident before)", i, len(left))
		}
		if v.ID != id {
			t.Fatalf("hop %d: the vGPU's id changed from %d to %d", i, id, v.ID)
		}
		if n := len(from.residentPages(t, fromSlot)); n != 0 {
			t.Fatalf("hop %d: the slot it left holds %d pages", i, n)
		}
		if got := envs[to.agg].vgpu("mover"); got != v {
			t.Fatalf("hop %d: the target board does not list the vGPU", i)
		}
		if from != to && from.vgpu("mover") != nil {
			t.Fatalf("hop %d: the board it left still lists it", i)
		}
		if from == a {
			lastLeft, lastLeftSlot = left, fromSlot
		}
	}
	if mover.exited() {
		t.Fatalf("the mover finished before its last move: the moves were not under load")
	}
	// The next tenant of the slot the mover last left on board a reads
	// zeros where the mover's data was.
	// Slots are taken lowest first: the honest VM may have finished and
	// freed slot 0 by now, so tenants take the free slots below the one the
	// mover left until one lands in it (the canary's slot is above).
	var next *devmodel.Device
	var nv *aggregator.VGPU
	for k := 0; k < maxVMs; k++ {
		name := fmt.Sprintf("next%d", k)
		next = a.connect(t, name, uint32(30+k), "fv-naive")
		nv = a.vgpu(name)
		if nv.Info().Slot == lastLeftSlot {
			break
		}
	}
	r := raw{next}
	base := a.layout.Slots[nv.Info().Slot].VRAM.Base
	checked := 0
	for i, p := range lastLeft {
		if p < base || p >= base+vramPerVM || i%max(1, len(lastLeft)/64) != 0 {
			continue // another slot's, or not sampled
		}
		for off := uint64(0); off < pageSize; off += 512 {
			if w := r.vramRead32(p - base + off); w != 0 {
				t.Fatalf("the next tenant reads %#x at %#x of its slot, where the moved VM's data was", w, p-base+off)
			}
		}
		checked++
	}
	if checked == 0 {
		t.Fatalf("the next tenant did not land in a slot the mover left (slot %d; %d pages left)", nv.Info().Slot, len(lastLeft))
	}
	t.Logf("the next tenant read zeros in %d pages the mover had used", checked)
	mover.verified(t)
	honest.verified(t)
	a.checkCanary(t, canaryA)
	b.checkCanary(t, canaryB)
	ran := a.board.Stats().GPFIFOEntries + b.board.Stats().GPFIFOEntries
	if want := honestEntries + moverEntries; ran != want {
		t.Errorf("the boards ran %d GPFIFO entries; the two jobs submit %d (%d + %d)", ran, want, honestEntries, moverEntries)
	}
	if c := v.Counters(); c.Moves != uint64(len(hops)) {
		t.Errorf("the mover counts %d moves, want %d", c.Moves, len(hops))
	}
}

// hostileMoveScene is two boards, the honest VM computing on b (slot 0),
// a canary in a free slot of each, and the hostile VM on a, its own page
// holding src's pattern (want), its channel inspected.
type hostileMoveScene struct {
	a, b             *env
	honest           *proc
	canaryA, canaryB canary
	h                *attacker
	hv               *aggregator.VGPU
	want             []byte
	g                guestChan
	put              uint32
	// outside are targets outside its slice: the canary's page as a
	// slice offset and as a raw address, one page past its slice.
	outside []uint64
}

func newHostileMoveScene(t *testing.T, mode string) *hostileMoveScene {
	t.Helper()
	s := &hostileMoveScene{}
	s.a, s.b = twoBoardEnv(t)
	s.honest, _ = s.b.startBusyHonest(t, 8) // slot 0 of b
	s.canaryA = s.a.plant(t, "board a, free slot", s.a.layout.Slots[maxVMs-1].VRAM.Base+vramPerVM/2, 0x3C)
	s.canaryB = s.b.plant(t, "board b, free slot", s.b.layout.Slots[maxVMs-1].VRAM.Base+vramPerVM/2, 0x4D)
	s.h = newAttacker(t, s.a, "hostile", 66, mode)
	s.h.controlCopies(t) // its own page holds the pattern from src
	s.want = bytes.Clone(s.h.src.Bytes)
	s.g = s.h.inspectChannel(t)
	s.put = s.h.put(s.g)
	s.hv = s.a.vgpu("hostile")
	s.outside = []uint64{vramPerVM, s.canaryA.phys &^ (pageSize - 1), (s.canaryA.phys - s.a.layout.Slots[0].VRAM.Base) &^ (pageSize - 1)}
	return s
}

// ownCameAlong checks that a copy from its own page through va returns
// the pattern it held before the moves.
func (s *hostileMoveScene) ownCameAlong(t *testing.T, va uint64) {
	t.Helper()
	fillSink(s.h)
	if err := s.h.gpuCopy(s.h.sinkVA, va); err != nil {
		t.Fatalf("copy from its own VRAM at %#x after the moves: %v (device: %v)", va, err, s.h.dev.Err())
	}
	if !bytes.Equal(s.h.sink.Bytes, s.want) {
		t.Fatalf("its own VRAM read through %#x did not move with it", va)
	}
}

// innocent checks the honest VM verified and both canaries are intact.
func (s *hostileMoveScene) innocent(t *testing.T) {
	t.Helper()
	s.honest.verified(t)
	s.a.checkCanary(t, s.canaryA)
	s.b.checkCanary(t, s.canaryB)
}

// TestMoveHostileVM: a VM that floods its doorbell and rewrites its page
// tables (entries naming memory outside its slice, then its own again,
// TLB flushes) while it is moved between the boards. The moves complete;
// nothing it maps reaches another slot (canaries in the free slots of both
// boards, the honest VM on board b verifies); its own VRAM moved with it.
func TestMoveHostileVM(t *testing.T) {
	s := newHostileMoveScene(t, "fv-optimized")
	a, b, h, g, put, hv, outside := s.a, s.b, s.h, s.g, s.put, s.hv, s.outside
	va := h.mapVRAM(t, h.own)

	f := startFlood(h, g, put, va, outside)
	for i, to := range []*env{b, a, b, a} {
		if !f.progress(t) {
			t.Fatalf("hop %d: the flood stalled", i)
		}
		moveTo(t, hv, to)
	}
	f.stop()
	t.Logf("%d doorbells and %d page-table rewrites during the moves", f.rung.Load(), f.remapped.Load())
	if f.remapped.Load() == 0 {
		t.Fatal("no page-table rewrite happened: the attack did not run")
	}
	// Its own VRAM moved with it, and its channel still works.
	s.ownCameAlong(t, h.ownVA)
	// A hostile entry installed after the moves still reaches nothing.
	for _, o := range outside {
		evil := h.mapVRAM(t, o)
		expectFault(t, h.gpuCopy(evil, h.srcVA), "a copy through an entry outside its slice, after its moves")
		h.newChannel(t)
	}
	s.innocent(t)
}

// TestMoveRemapRace: a BAR-remap guest reads and writes its own VRAM through
// a passed-through BAR1 page without pause while it is moved between the
// boards: every read returns what it last wrote (its own page, wherever it
// now is), and a device model that kept its mapping of the old slice
// reaches nothing of the slot's next tenant, nor the tenant anything of
// it.
func TestMoveRemapRace(t *testing.T) {
	a, b := twoBoardEnv(t)
	canaryA := a.plant(t, "board a, free slot", a.layout.Slots[maxVMs-1].VRAM.Base+vramPerVM/2, 0x3C)
	canaryB := b.plant(t, "board b, free slot", b.layout.Slots[maxVMs-1].VRAM.Base+vramPerVM/2, 0x4D)
	h := newAttacker(t, a, "racer", 70, "fv-bar-remap")
	hv := a.vgpu("racer")
	off, err := h.drv.MapBAR1(h.own, pageSize)
	if err != nil {
		t.Fatal(err)
	}
	h.dev.Write32(nvc0.BAR1, off, 1)
	if hv.Counters().RemappedPages == 0 {
		t.Fatal("no page is passed through: the race is not with remap")
	}
	var stop atomic.Bool
	var accesses, wrong atomic.Int64
	var lastWrong atomic.Value
	var last [64]uint32 // what it last wrote in each word (read after done)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for v := uint32(2); !stop.Load(); v++ {
			w := off + uint64(v%64)*4
			h.dev.Write32(nvc0.BAR1, w, v)
			last[v%64] = v
			if got := h.dev.Read32(nvc0.BAR1, w); got != v {
				wrong.Add(1)
				lastWrong.Store([2]uint32{v, got})
			}
			accesses.Add(1)
		}
	}()
	for i, to := range []*env{b, a, b} {
		n := accesses.Load()
		if !pollUntil(time.Minute, func() bool { return accesses.Load() >= n+1000 }) {
			t.Fatalf("hop %d: the racer stalled", i)
		}
		moveTo(t, hv, to)
	}
	n := accesses.Load()
	pollUntil(time.Minute, func() bool { return accesses.Load() >= n+1000 })
	stop.Store(true)
	<-done
	t.Logf("%d BAR1 write/read pairs across 3 moves", accesses.Load())
	if wrong.Load() != 0 {
		t.Fatalf("%d reads did not return the value just written (last: wrote %v)", wrong.Load(), lastWrong.Load())
	}
	// What it wrote is in its slot on the board it is on now, not only in
	// whatever its device model's mapping reaches.
	on := a
	if _, name := hv.Board(); name == "b" {
		on = b
	}
	page := on.readVRAM(t, on.layout.Slots[hv.Info().Slot].VRAM.Base+h.own, pageSize)
	for i, want := range last {
		if got := le32(page[i*4:]); want != 0 && got != want {
			t.Fatalf("word %d of its page holds %#x on its board, but it last wrote %#x", i, got, want)
		}
	}
	a.checkCanary(t, canaryA)
	b.checkCanary(t, canaryB)
}

// TestMoveRevokesOldSlice: a remap-mode device model keeps its mapping of
// the slice it was given; its vGPU is moved and a new tenant takes the
// vacated slot. The old mapping reads nothing the new tenant writes and
// writes nothing the new tenant (or the moved vGPU) reads.
func TestMoveRevokesOldSlice(t *testing.T) {
	a, b := twoBoardEnv(t)
	ram, err := ipc.CreateMemfd("evil-ram", guestRAM)
	if err != nil {
		t.Fatal(err)
	}
	defer ram.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, w, extra, err := ipc.Dial(ctx, a.sock, ipc.Hello{DomID: 50, Name: "evil", Mode: "fv-bar-remap", RAMSize: guestRAM, Transport: ipc.TransportShm}, ram, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if w.Params[ipc.ParamRemap] != "1" || len(extra) != 2 {
		t.Fatalf("remap mode: params %v, %d extra files", w.Params, len(extra))
	}
	v := a.vgpu("evil")
	slot := v.Info().Slot
	slice, err := unix.Mmap(int(extra[1].Fd()), 0, vramPerVM, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	for _, f := range extra {
		f.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(slice)
	const g = 0x500000
	binary.LittleEndian.PutUint32(slice[g:], 0x0CC0) // its own data, before the move
	moveTo(t, v, b)
	mine := raw{clientMMIO{c}}
	if got := mine.vramRead32(g); got != 0x0CC0 {
		t.Fatalf("the moved vGPU reads %#x at %#x, want its own 0xcc0", got, g)
	}

	next := a.connect(t, "next", 51, "fv-naive")
	if nv := a.vgpu("next"); nv == nil || nv.Info().Slot != slot {
		t.Fatalf("the next tenant did not get slot %d", slot)
	}
	r := raw{next}
	if got := r.vramRead32(g); got != 0 {
		t.Fatalf("the next tenant reads %#x where the moved vGPU's data was", got)
	}
	r.vramWrite32(g, 0x5EC2E7)
	r.sync()
	readByOld := binary.LittleEndian.Uint32(slice[g:])
	binary.LittleEndian.PutUint32(slice[g+4:], 0xBAD)
	if readByOld == 0x5EC2E7 || r.vramRead32(g+4) == 0xBAD || mine.vramRead32(g+4) == 0xBAD {
		t.Fatalf("the moved vGPU's old slice mapping still reaches the slot it left: read %#x of the next tenant's write", readByOld)
	}
}

// clientMMIO is an ipc client as gpu.MMIO (errors read as 0: the test
// checks the connection's own error elsewhere).
type clientMMIO struct{ c *ipc.Client }

func (m clientMMIO) Read32(bar int, off uint64) uint32 {
	v, _ := m.c.Read32(bar, off)
	return v
}

func (m clientMMIO) Write32(bar int, off uint64, v uint32) { _ = m.c.Write32(bar, off, v) }

// TestMoveWaitsForWorkInFlight: a VM whose channel is blocked in a
// semaphore acquire (a submission that does not end: a kernel that runs
// forever, as far as the move can tell). Without a watchdog a move waits
// for it at most as long as its context allows, then gives up having
// changed nothing; once the guest releases the semaphore the move goes
// through and the channel's work is done exactly once. With a watchdog the
// move waits for the watchdog's verdict, which it carries out: the guest
// sees its channel stopped, as it would without the move.
func TestMoveWaitsForWorkInFlight(t *testing.T) {
	t.Run("no watchdog", func(t *testing.T) {
		a, b := twoBoardEnv(t)
		h := newAttacker(t, a, "blocker", 71, "fv-naive")
		hv := a.vgpu("blocker")
		semVA := h.mapVRAM(t, h.own)
		if err := h.ch.Submit(a1SemAcquire(semVA, 0x1234)); err != nil {
			t.Fatal(err)
		}
		if err := h.ch.Submit(a1SemRelease(semVA+8, 0x77)); err != nil { // after the acquire
			t.Fatal(err)
		}
		// Released to the board (in flight), not merely queued: a queued
		// submission moves with the vGPU.
		inFlight := func() bool {
			return a.board.Read32(nvc0.BAR0, uint64(nvc0.ChanCtl(h.physChan())))&nvc0.ChanCtlPending != 0
		}
		if !pollUntil(time.Minute, inFlight) {
			t.Fatal("the blocked submission never reached the board")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		if _, err := aggregator.Move(ctx, hv, b.agg); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("move of a VM with work blocked in flight: %v, want the context's deadline", err)
		}
		if _, name := hv.Board(); name != "a" || a.vgpu("blocker") != hv || b.vgpu("blocker") != nil {
			t.Fatalf("a move that gave up left the vGPU on board %q", name)
		}
		// The guest releases its semaphore: the work ends, the move goes.
		h.r.vramWrite32(h.own, 0x1234)
		if err := h.ch.Finish(); err != nil {
			t.Fatalf("the blocked work after the failed move: %v", err)
		}
		moveTo(t, hv, b)
		if got := le32(b.readVRAM(t, b.layout.Slots[hv.Info().Slot].VRAM.Base+h.own+8, 4)); got != 0x77 {
			t.Fatalf("the release after the acquire wrote %#x on the new board", got)
		}
		h.controlCopies(t)
	})
	t.Run("watchdog", func(t *testing.T) {
		reg := aggregator.NewRegistry()
		a := newEnvWith(t, envOptions{Watchdog: 100 * time.Millisecond, Modify: func(o *aggregator.Options) { o.Registry, o.BoardName = reg, "a" }})
		b := newEnvWith(t, envOptions{Modify: func(o *aggregator.Options) { o.Registry, o.Board, o.BoardName = reg, 1, "b" }})
		h := newAttacker(t, a, "blocker", 71, "fv-naive")
		hv := a.vgpu("blocker")
		semVA := h.mapVRAM(t, h.own)
		if err := h.ch.Submit(a1SemAcquire(semVA, 0x1234)); err != nil {
			t.Fatal(err)
		}
		if !pollUntil(time.Minute, func() bool {
			return a.board.Read32(nvc0.BAR0, uint64(nvc0.ChanCtl(h.physChan())))&nvc0.ChanCtlPending != 0
		}) {
			t.Fatal("the blocked submission never reached the board")
		}
		moveTo(t, hv, b)
		if err := h.ch.Finish(); !errors.Is(err, nouveau.ErrChannelFault) {
			t.Fatalf("the channel the watchdog stopped: %v, want its fault", err)
		}
		if hv.Counters().WatchdogStops != 1 {
			t.Fatalf("watchdog stops: %d", hv.Counters().WatchdogStops)
		}
		h.newChannel(t)
		h.controlCopies(t)
	})
}

// flood is a hostile guest's attack loop: doorbell floods (64 rings of its
// channel g at put at a time) and page-table rewrites (va's entry naming
// memory outside its slice, then its own page again; its driver flushes the
// TLB), counting both, until stop.
type flood struct {
	halt           atomic.Bool
	wg             sync.WaitGroup
	rung, remapped atomic.Int64
}

// startFlood starts the attack loop of h.
func startFlood(h *attacker, g guestChan, put uint32, va uint64, outside []uint64) *flood {
	f := &flood{}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for i := 0; !f.halt.Load(); i++ {
			for range 64 {
				h.ring(g, put)
			}
			f.rung.Add(64)
			if err := h.vm.MapVRAM(va, outside[i%len(outside)], pageSize); err == nil {
				_ = h.vm.MapVRAM(va, h.own, pageSize)
				f.remapped.Add(1)
			}
		}
	}()
	return f
}

// progress waits until the flood rang 256 more doorbells (false: it
// stalled for a minute, a hang guard).
func (f *flood) progress(t *testing.T) bool {
	t.Helper()
	n := f.rung.Load()
	return pollUntil(time.Minute, func() bool { return f.rung.Load() >= n+256 })
}

// stop ends the loop and waits for it.
func (f *flood) stop() {
	f.halt.Store(true)
	f.wg.Wait()
}

// TestMovePVHostileVM: a PV VM rings its doorbell without pause and churns
// its aggregator-owned page tables by hypercall — maps entries outside its
// slice (each refused), maps its own page again, allocates page tables,
// links them into its page directory, fills them with its own pages, frees
// them — while it is moved between the boards. The moves carry its tables
// (rebuilt from the guest's terms on each new slot); nothing it maps
// reaches another slot (canaries in the free slots of both boards, the
// honest VM on b verifies); its own VRAM comes with it, and the table it
// built before the moves still maps it; an entry outside its slice is
// still refused afterwards.
func TestMovePVHostileVM(t *testing.T) {
	s := newHostileMoveScene(t, "pv-multicall")
	a, b, h, g, put, hv, outside := s.a, s.b, s.h, s.g, s.put, s.hv, s.outside
	va := h.mapVRAM(t, h.own)
	p := newPVRaw(t, h, 1)
	kept, keptVA := p.pvTable(t, 8000) // built before the moves, used after
	if code, _ := p.one(hypercall.Call{Op: hypercall.OpMapBatch, PT: kept, Count: 4, PTE: vramPTE(h.own)}); code != hypercall.OK {
		t.Fatal(code)
	}
	p.flush(t)

	var halt atomic.Bool
	var rung, refused, churned atomic.Int64
	done := make(chan error, 1)
	go func() {
		var live []uint32
		for i := 0; !halt.Load(); i++ {
			for range 64 {
				h.ring(g, put)
			}
			rung.Add(64)
			if err := h.vm.MapVRAM(va, outside[i%len(outside)], pageSize); !errors.Is(err, hypercall.ErrFault) {
				done <- fmt.Errorf("map of %#x outside its slice: %v, want ErrFault", outside[i%len(outside)], err)
				return
			}
			refused.Add(1)
			if err := h.vm.MapVRAM(va, h.own, pageSize); err != nil {
				done <- fmt.Errorf("map of its own page: %w", err)
				return
			}
			code, pt := p.one(hypercall.Call{Op: hypercall.OpMemAlloc, Kind: hypercall.KindSmallTable})
			if code != hypercall.OK {
				done <- fmt.Errorf("allocate a table: %v", code)
				return
			}
			pde := uint32(8001 + i%4)
			if code, _ := p.one(hypercall.Call{Op: hypercall.OpMapPGT, PD: h.vm.PVPageDir(), PDE: pde, Small: pt}); code != hypercall.OK {
				done <- fmt.Errorf("link a table at %d: %v", pde, code)
				return
			}
			if code, _ := p.one(hypercall.Call{Op: hypercall.OpMapBatch, PT: pt, Count: 64, PTE: vramPTE(h.own)}); code != hypercall.OK {
				done <- fmt.Errorf("fill a table: %v", code)
				return
			}
			if len(live) >= 4 { // the one linked at this entry before: unlinked by the link above
				if code, _ := p.one(hypercall.Call{Op: hypercall.OpMemFree, Handle: live[0]}); code != hypercall.OK {
					done <- fmt.Errorf("free a table: %v", code)
					return
				}
				live = live[1:]
			}
			live = append(live, pt)
			churned.Add(1)
		}
		done <- nil
	}()
	progress := func() bool {
		n := churned.Load()
		return pollUntil(time.Minute, func() bool { return churned.Load() >= n+4 || len(done) > 0 })
	}
	for i, to := range []*env{b, a, b, a} {
		if !progress() || len(done) > 0 {
			t.Fatalf("hop %d: the churn stalled or ended", i)
		}
		moveTo(t, hv, to)
	}
	halt.Store(true)
	if err := <-done; err != nil {
		t.Fatalf("the churn: %v", err)
	}
	t.Logf("%d doorbells, %d refused maps, %d tables churned during the moves", rung.Load(), refused.Load(), churned.Load())
	// Its own VRAM moved with it, through its driver's tables and the one
	// it built itself before the moves.
	s.ownCameAlong(t, h.ownVA)
	s.ownCameAlong(t, keptVA)
	for _, o := range outside {
		if err := h.vm.MapVRAM(va, o, pageSize); !errors.Is(err, hypercall.ErrFault) {
			t.Fatalf("map of %#x outside its slice after the moves: %v, want ErrFault", o, err)
		}
	}
	if c := hv.Counters(); c.Moves != 4 {
		t.Fatalf("%d moves counted, want 4", c.Moves)
	}
	s.innocent(t)
}
