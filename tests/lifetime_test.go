package tests

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
)

// Lifetime attacks: the GPU keeps using what the aggregator freed. A channel
// that runs reads its page directory once per run and keeps walking it; the
// MMU caches translations per page directory until a flush names it. No
// shadow structure (page directory, page table, RAMIN) may be freed or
// reused while a channel may still walk it, and no translation the guest
// removed, or that belonged to a departed VM, may still be used.

// lifetimeModes are the modes of the page-directory swap attack: each
// shadows at a different moment (TLB flush, activation, incremental).
func lifetimeModes() []string {
	if testing.Short() {
		return []string{"fv-incremental"}
	}
	return []string{"fv-naive", "fv-optimized", "fv-incremental"}
}

// Ways of moving a running channel to other page tables.
const (
	swapPageDir     = "page-directory"        // rewrite the RAMIN's page-directory field, ring a doorbell
	swapInstance    = "instance"              // point the enabled channel at another RAMIN
	swapDisableInst = "disable-then-instance" // disable the channel, then point it at another RAMIN
)

// Where the stale page directory is walked: a page-directory index in the
// middle of the freed 64 KiB (any index would do once the memory is reused).
const staleIndex = 4096

// Page-directory entries of the attacker's second address space that the
// aggregator shadows after the swap, each with its own 8 KiB shadow table:
// 2 MiB, far more than the shadow memory the swap freed.
const (
	fillFirst = 1024
	fillPDEs  = 256
)

// Entries of the attacker's fake large-page table (indices into it).
const (
	fakeHonest    = 1 // read: the honest VM's VRAM marker
	fakeVictim    = 2 // read: the idle victim's VRAM marker
	fakeRAM       = 3 // read: another VM's RAM
	fakeReserve   = 4 // read: the aggregator's reserve
	fakeCapture   = 5 // 5..8: the attacker's own pages receiving the reads
	fakeOwn       = 9 // the attacker's own page (its data, the source of the writes)
	fakeHonestW   = 10
	fakeVictimW   = 11
	fakeRAMW      = 12
	fakeReadCount = 4
)

// TestPageDirectorySwapUnderRunningChannel (issue 7, attack 1): a channel's
// run is kept alive on the board (its push buffer waits on a semaphore in
// the attacker's RAM); the attacker rewrites that channel's RAMIN
// page-directory field to its second page directory and rings a doorbell,
// so the aggregator refreshes the channel's shadow; then its second address
// space grows by 256 page tables, so the aggregator allocates shadow tables
// (8 KiB, every entry a present PTE to the attacker's large page G). When
// the semaphore is released, the original run continues with copies through
// addresses it translates through the page directory it read at its start.
// If that shadow directory was freed and reused, the board reads shadow PTEs
// as PDEs: page tables in the attacker's VRAM (at G), which map whatever the
// attacker wants. The copies must never read the honest VM's or the victim's
// VRAM marker, a page of another VM's RAM, or the reserve, nor write any of
// them; the honest VM must still verify.
func TestPageDirectorySwapUnderRunningChannel(t *testing.T) {
	for _, mode := range lifetimeModes() {
		t.Run(mode, func(t *testing.T) { runSwapAttack(t, mode, swapPageDir) })
	}
}

// TestInstanceSwapUnderRunningChannel (issue 7, attack 1, second path): as
// above, but the channel is moved to another RAMIN (a copy of its own that
// names the second page directory) through the channel table: while enabled,
// and after disabling it (which does not stop the push buffer the board is
// running).
func TestInstanceSwapUnderRunningChannel(t *testing.T) {
	for _, kind := range []string{swapInstance, swapDisableInst} {
		t.Run(kind, func(t *testing.T) { runSwapAttack(t, "fv-optimized", kind) })
	}
}

func runSwapAttack(t *testing.T, mode, kind string) {
	s := newScene(t, mode)
	e, a := s.e, s.a
	g := &a1Guest{attacker: a}
	cs := s.canaries(t) // honest first/last page, victim first/last page
	R := e.layout.Reserved
	resCanary := e.plant(t, "reserve, last page", R.End()-pageSize, 0x55)
	ram := a1RegisterRegion(t, e, 2*pageSize, 0x60, 0, pageSize)
	ramSecret := map[uint64][]byte{0: a1Secret(0x60), pageSize: a1Secret(0x61)}
	a.controlCopies(t) // the attacker's own page now holds its data

	// The second address space: the page directory the channel is moved
	// to, used by a second channel of the attacker.
	vmB, err := a.drv.NewVM()
	if err != nil {
		t.Fatal(err)
	}
	chB := g.channel(t, vmB)
	// A guest large-page table whose 1024 entries all map the large page
	// G: its shadow is 8 KiB of present PTEs, each naming G's physical
	// address, which a PDE reader takes for "large page table at G".
	G, err := a.drv.AllocVRAM(nvc0.LargePageSize, nvc0.LargePageSize)
	if err != nil {
		t.Fatal(err)
	}
	lt, err := a.drv.AllocVRAM(nvc0.LargePTSize, pageSize)
	if err != nil {
		t.Fatal(err)
	}
	lo, hi := nvc0.PTE{Present: true, Addr: G, Target: nvc0.TargetVRAM}.Encode()
	words := make([]uint32, 0, 2*nvc0.LargePTECount)
	for range nvc0.LargePTECount {
		words = append(words, lo, hi)
	}
	g.vramWords(lt, words...)
	// The fake large-page table at G: raw physical addresses, which a
	// shadow would never let through.
	capture, err := a.drv.AllocVRAM(fakeReadCount*pageSize, pageSize)
	if err != nil {
		t.Fatal(err)
	}
	A := a.slot.VRAM.Base
	V := s.victim.VRAM
	H := s.hv.Slot.VRAM
	fake := map[int]nvc0.PTE{
		fakeHonest:  {Present: true, Addr: H.Base, Target: nvc0.TargetVRAM},
		fakeVictim:  {Present: true, Addr: V.Base, Target: nvc0.TargetVRAM},
		fakeRAM:     {Present: true, Addr: ram.base, Target: nvc0.TargetSysSnooped},
		fakeReserve: {Present: true, Addr: resCanary.phys, Target: nvc0.TargetVRAM},
		fakeOwn:     {Present: true, Addr: A + a.own, Target: nvc0.TargetVRAM},
		fakeHonestW: {Present: true, Addr: H.End() - pageSize, Target: nvc0.TargetVRAM},
		fakeVictimW: {Present: true, Addr: V.End() - pageSize, Target: nvc0.TargetVRAM},
		fakeRAMW:    {Present: true, Addr: ram.base + pageSize, Target: nvc0.TargetSysSnooped},
	}
	for i := range fakeReadCount {
		fake[fakeCapture+i] = nvc0.PTE{Present: true, Addr: A + capture + uint64(i)*pageSize, Target: nvc0.TargetVRAM}
	}
	for j, pte := range fake {
		lo, hi := pte.Encode()
		g.vramWords(G+uint64(j)*nvc0.PTESize, lo, hi)
	}
	va := func(j int) uint64 { return uint64(staleIndex)<<nvc0.PDEShift | uint64(j)<<nvc0.LargePageShift }

	// The run kept alive: it announces itself, waits for the semaphore,
	// then copies through addresses the attacker's first address space
	// never mapped.
	sem, semVA := a.hostPage(t)
	idA := a.ch.ID()
	pb := a1Cat(
		a1SemRelease(semVA+4, 1),
		a1SemAcquire(semVA, 1),
		a1CopyPage(va(fakeCapture+0), va(fakeHonest)),
		a1CopyPage(va(fakeCapture+1), va(fakeVictim)),
		a1CopyPage(va(fakeCapture+2), va(fakeRAM)),
		a1CopyPage(va(fakeCapture+3), va(fakeReserve)),
		a1CopyPage(va(fakeHonestW), va(fakeOwn)),
		a1CopyPage(va(fakeVictimW), va(fakeOwn)),
		a1CopyPage(va(fakeRAMW), va(fakeOwn)),
		a1SemRelease(semVA+8, 1),
	)
	released := false
	release := func() {
		if !released {
			released = true
			a1Put32(sem, 0, 1)
		}
	}
	defer release() // never leave a run waiting
	if err := a.ch.Submit(pb); err != nil {
		t.Fatal(err)
	}
	if !pollUntil(15*time.Second, func() bool { return a1Get32(sem, 4) == 1 }) {
		t.Fatalf("the attacker's channel never started its run (control %#x)", g.ctl(idA))
	}
	honestRunning := !s.honest.exited()

	pdB := vmB.PageDir()
	w0, w1 := nvc0.PDE{LargePresent: true, LargeAddr: lt}.Encode()
	words = words[:0]
	for range fillPDEs {
		words = append(words, w0, w1)
	}
	g.vramWords(pdB+fillFirst*nvc0.PDESize, words...)

	// Move the running channel to the second page directory.
	raminA := g.ramin(idA)
	switch kind {
	case swapPageDir:
		g.vramWords(raminA+nvc0.RAMINPageDir, uint32(pdB), uint32(pdB>>32))
		g.rering(idA)
	case swapInstance, swapDisableInst:
		r2, err := a.drv.AllocVRAM(nvc0.RAMINSize, pageSize)
		if err != nil {
			t.Fatal(err)
		}
		for _, off := range []uint64{nvc0.RAMINUserLo, nvc0.RAMINUserHi, nvc0.RAMINGPFIFOLo, nvc0.RAMINGPFIFOHi,
			nvc0.RAMINAddrLimit, nvc0.RAMINAddrLimit + 4} {
			g.vramWords(r2+off, g.vramWord(raminA+off))
		}
		g.vramWords(r2+nvc0.RAMINPageDir, uint32(pdB), uint32(pdB>>32))
		if kind == swapDisableInst {
			a.r.wr(nvc0.ChanCtl(idA), 0)
		}
		a.r.wr(nvc0.ChanInst(idA), nvc0.InstEncode(r2, nvc0.ChanInstValid|nvc0.ChanInstPollEnable))
		a.r.sync()
	}

	// Grow the second address space right after the swap: fillPDEs new
	// page tables to shadow (the entries are written first, so that the
	// aggregator allocates their shadows as soon as it scans: at the TLB
	// flush in fv-naive, at the next activation in the lazy modes).
	a.r.flushTLB(t, pdB, false)
	g.rering(chB.ID())

	// Let the original run continue.
	release()
	outcome := "was still running 10 s later"
	pollUntil(10*time.Second, func() bool {
		ctl := g.ctl(idA)
		switch {
		case a1Get32(sem, 8) == 1:
			outcome = "completed every copy"
		case a.r.errorReported(idA):
			outcome = "faulted"
		case ctl&nvc0.ChanCtlPending == 0:
			outcome = "ended without completing"
		default:
			return false
		}
		return true
	})
	t.Logf("%s swap (%s): the original run %s; the honest VM was running during the attack: %v", kind, mode, outcome, honestRunning)

	got := e.readVRAM(t, A+capture, fakeReadCount*pageSize)
	secrets := map[string][]byte{
		"the honest VM's VRAM marker":    cs[0].data,
		"the victim VM's VRAM marker":    cs[2].data,
		"a page of another VM's RAM":     ramSecret[0],
		"the aggregator's reserved VRAM": resCanary.data,
	}
	if leaked := a1Leaked(got, secrets); len(leaked) > 0 {
		t.Errorf("after a %s swap under its running channel, the attacker's GPU copies read %s "+
			"(its stale page directory was freed and reused as shadow page tables: issue 7 attack 1)",
			kind, strings.Join(leaked, ", "))
	}
	for off, want := range ramSecret {
		if p := ram.page(off); !bytes.Equal(p, want) {
			t.Errorf("another VM's RAM page at machine %#x was written (attacker data: %v)", ram.base+off, containsChunk(p, a.src.Bytes))
		}
	}
	e.checkCanary(t, resCanary)
	s.checkCanaries(t, cs)
	s.honest.verified(t)
	s.checkCanaries(t, cs)
}

// budgetPDEs page-directory entries, each needing its own 256 KiB shadow
// page table, need 128 MiB of shadow memory: more than any VM's share of the
// reserve (and more than the whole reserve).
const (
	budgetFirst = 1024
	budgetPDEs  = 512
)

// overBudget writes budgetPDEs entries into the page directory at pd, all
// naming the same (empty) guest page table.
func overBudget(t *testing.T, g *a1Guest, pd uint64) {
	t.Helper()
	pt, err := g.drv.AllocVRAM(nvc0.SmallPTSize, pageSize)
	if err != nil {
		t.Fatal(err)
	}
	w0, w1 := nvc0.PDE{SmallPresent: true, SmallAddr: pt}.Encode()
	words := make([]uint32, 0, 2*budgetPDEs)
	for range budgetPDEs {
		words = append(words, w0, w1)
	}
	g.vramWords(pd+budgetFirst*nvc0.PDESize, words...)
}

// TestShadowBudgetStaleTLB (issue 7, attack 2a): a guest maps a page of its
// RAM and one of its VRAM and uses them through the GPU; its page directory
// then gets more entries than its shadow budget can hold, and it unmaps both
// pages and flushes the TLB, as a driver does before giving memory back. The
// scan that follows fails on the budget after it wrote the unmapping: a GPU
// copy through the old addresses must fault, and must never deliver what the
// pages hold after the guest gave them up (another user's data).
func TestShadowBudgetStaleTLB(t *testing.T) {
	for _, mode := range attackModes() {
		t.Run(mode, func(t *testing.T) {
			s := newScene(t, mode)
			a := s.a
			g := &a1Guest{attacker: a}
			cs := s.canaries(t)
			cv := a1PlantCanaries(t, s.e, s.hv.Slot)
			a.controlCopies(t)

			// One channel per attack copy (a faulted channel stays stopped),
			// made before the pages are used (its mappings flush the TLB).
			chans := []*nouveau.Channel{a.ch, g.channel(t, a.vm)}
			ramPage, ramVA := a.hostPage(t)
			copy(ramPage.Bytes, pattern(0x71, pageSize))
			vramPage, vramVA := g.vramBuf(t, a.vm, pageSize, pageSize)
			if err := a.gpuCopy(vramVA, a.srcVA); err != nil {
				t.Fatal(err)
			}
			pages := []struct {
				what string
				va   uint64
				was  []byte
			}{{"a page of its RAM", ramVA, ramPage.Bytes}, {"a page of its VRAM", vramVA, a.src.Bytes}}
			for _, p := range pages {
				fillSink(a)
				if err := a.gpuCopy(a.sinkVA, p.va); err != nil || !bytes.Equal(a.sink.Bytes, p.was) {
					t.Fatalf("control: GPU read of %s: %v", p.what, err)
				}
			}

			overBudget(t, g, a.vm.PageDir())
			for _, p := range pages {
				if err := a.vm.Unmap(p.va, pageSize); err != nil {
					t.Fatal(err)
				}
			}
			// The pages now belong to another user of the guest.
			secretRAM, secretVRAM := pattern(0x72, pageSize), pattern(0x73, pageSize)
			copy(ramPage.Bytes, secretRAM)
			vw := make([]uint32, pageSize/4)
			for i := range vw {
				vw[i] = le32(secretVRAM[4*i:])
			}
			g.vramWords(vramPage, vw...)
			secrets := map[string][]byte{"the RAM page's new content": secretRAM, "the VRAM page's new content": secretVRAM}
			for i, p := range pages {
				a.ch = chans[i]
				fillSink(a)
				err := a.gpuCopy(a.sinkVA, p.va)
				if err == nil {
					t.Errorf("after unmapping %s (VA %#x) and flushing the TLB, a GPU copy through the old address still "+
						"works: the scan failed on the shadow budget and returned before the TLB flush (issue 7 attack 2)", p.what, p.va)
				}
				if leaked := append(a1Leaked(a.sink.Bytes, secrets), cv.leaks(a.sink.Bytes)...); len(leaked) > 0 {
					t.Errorf("a GPU copy through the unmapped address of %s read %s", p.what, strings.Join(leaked, ", "))
				}
			}
			s.checkCanaries(t, cs)
			cv.check(t)
			s.honest.verified(t)
			s.checkCanaries(t, cs)
			cv.check(t)
		})
	}
}

// TestStaleTLBNewTenant (issue 7, attack 2b): tenant A maps a page of its
// RAM and a page of its VRAM at far addresses, uses them, and dies. Another
// VM's RAM (a registered region standing in for it) then takes A's place in
// machine memory, and tenant B gets A's slot; B's first scan fails on the
// shadow budget (so no TLB flush ever follows it). While the honest VM
// computes, B's copies through the addresses A used, which B never mapped,
// must fault: they must never reach A's old translations, i.e. the other
// VM's RAM or memory B never mapped. (The honest VM starts once B is set up,
// so that its own channels, created and freed as it goes, cannot take the
// shadow memory A left between A and B.)
func TestStaleTLBNewTenant(t *testing.T) {
	modes := attackModes()
	if testing.Short() {
		modes = []string{"fv-naive"}
	}
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			A := a1NewGuest(t, e, "tenantA", 30, "fv-naive", a1Options{})
			e.connect(t, "victim", 8, "fv-naive") // a third VM that stays
			farVA := func(i uint64) uint64 { return (3000 << nvc0.PDEShift) + i*pageSize }
			q, err := A.dev.RAM().Alloc(pageSize)
			if err != nil {
				t.Fatal(err)
			}
			copy(q.Bytes, pattern(0x81, pageSize))
			if err := A.vm.MapHost(farVA(0), q.Bus, pageSize); err != nil {
				t.Fatal(err)
			}
			if err := A.vm.MapVRAM(farVA(1), A.own, pageSize); err != nil {
				t.Fatal(err)
			}
			A.controlCopies(t)
			for i := range uint64(2) {
				if err := A.gpuCopy(A.sinkVA, farVA(i)); err != nil {
					t.Fatalf("tenant A's copy through its own far mapping %d: %v", i, err)
				}
			}
			slotA := A.slot
			shadowPD := func(p int) uint64 { // diagnostics only
				inst := e.board.Read32(nvc0.BAR0, uint64(nvc0.ChanInst(p)))
				return uint64(le32(e.readVRAM(t, nvc0.InstDecode(inst)+nvc0.RAMINPageDir, 4)))
			}
			pdA := shadowPD(slotA.ChanBase + A.ch.ID())
			qBus := q.Bus
			A.depart()
			e.waitDetached(t, "tenantA", 10*time.Second)

			// Another VM's RAM, registered where A's was (first fit).
			other := a1RegisterRegion(t, e, guestRAM, 0x60, qBus)
			secret := a1Secret(0x60)

			// Tenant B: its objects at other virtual addresses than A's, and an
			// address space bigger than its shadow budget.
			B := a1ConnectRetry(t, e, "tenantB", 31, mode)
			if err := B.tryUp(t, a1Options{SkipVA: 64 << 20, BeforeChannel: func(g *a1Guest) { overBudget(t, g, g.vm.PageDir()) }}); err != nil {
				// Refusing to run an address space the shadows cannot hold is
				// a safe answer: nothing of B's runs, on stale entries or not.
				t.Logf("tenant B's over-budget address space was refused: %v", err)
				honest, _ := e.startHonest(t)
				honest.verified(t)
				return
			}
			t.Logf("A's RAM page was at guest-physical %#x; another VM's RAM now at machine %#x; B is in slot %d (A was in %d); "+
				"B's shadow page directory %#x (A's was %#x)", qBus, other.base, B.slot.Index, slotA.Index,
				shadowPD(B.slot.ChanBase+B.ch.ID()), pdA)
			honest, hv := e.startHonest(t)
			cv := a1PlantCanaries(t, e, hv.Slot)
			// One channel per copy below (a faulted channel stays stopped).
			chans := []*nouveau.Channel{B.ch}
			for len(chans) < 5 {
				ch, err := B.drv.NewChannel(B.vm)
				if err != nil {
					break
				}
				chans = append(chans, ch)
			}
			B.ch = chans[0]
			if err := B.gpuCopy(B.ownVA, B.srcVA); err != nil {
				t.Logf("tenant B's own copy failed (%v): its over-budget address space does not run", errText(err))
			} else {
				for k, op := range []struct {
					what  string
					write bool
					va    uint64
				}{
					{"read A's RAM page (now another VM's RAM)", false, farVA(0)},
					{"write A's RAM page (now another VM's RAM)", true, farVA(0)},
					{"read A's VRAM page", false, farVA(1)},
					{"write A's VRAM page", true, farVA(1)},
				} {
					B.ch = chans[min(k+1, len(chans)-1)]
					fillSink(B.attacker)
					var err error
					if op.write {
						err = B.gpuCopy(op.va, B.srcVA)
					} else {
						err = B.gpuCopy(B.sinkVA, op.va)
					}
					if err == nil {
						t.Errorf("tenant B's copy to %s through VA %#x, which B never mapped, completed: it used tenant A's stale "+
							"translation (issue 7 attack 2)", op.what, op.va)
					}
					if containsChunk(B.sink.Bytes, secret) {
						t.Errorf("tenant B read another VM's RAM through tenant A's stale translation of VA %#x", op.va)
					}
					if leaked := cv.leaks(B.sink.Bytes); len(leaked) > 0 {
						t.Errorf("tenant B's copy through VA %#x read %s", op.va, strings.Join(leaked, ", "))
					}
				}
			}
			if p := other.page(qBus); !bytes.Equal(p, secret) {
				t.Errorf("another VM's RAM page at machine %#x was written (tenant B's data: %v)", other.base+qBus, containsChunk(p, B.src.Bytes))
			}
			cv.check(t)
			honest.verified(t)
			cv.check(t)
		})
	}
}
