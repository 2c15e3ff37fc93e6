package tests

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/hypercall"
)

// Para-virtualization attacks. Every test runs beside the honest VM (a
// process in pv-multicall that must verify its madd and cpy) and the idle
// victim (pv-naive), with canaries in both slices.

// TestPVMapOutsideVM: the attacker's driver maps, by hypercall, VRAM outside
// its slice (the honest VM's and the victim's pages, shifted, raw, wrapped
// around 40 bits; one page past the slice; the aggregator's reserve by
// wrap-around) and system memory outside its RAM. Every call is refused
// with ErrFault and counted, nothing is installed (a GPU copy through the
// address faults), and the attacker's own memory still works.
func TestPVMapOutsideVM(t *testing.T) {
	for _, mode := range pvModes() {
		t.Run(mode, func(t *testing.T) {
			s := newPVScene(t, mode)
			e, a := s.e, s.a
			canaries := s.canaries(t)
			R := e.layout.Reserved
			resCanary := e.plant(t, "reserve, last page", R.End()-pageSize, 0x55)
			targets := append(hostileVRAM(a, canaries),
				target{"reserve, first page (wrapped)", wrap(a, R.Base)},
				target{"reserve, last page (wrapped)", wrap(a, resCanary.phys)})
			a.controlCopies(t)
			av := e.vgpu("attacker")
			rej0, _ := pvCounters(av)
			try := func(what string, mapIt func(va uint64) error) {
				va, err := a.vm.AllocVA(pageSize, pageSize)
				if err != nil {
					t.Fatal(err)
				}
				if err := mapIt(va); !errors.Is(err, hypercall.ErrFault) {
					t.Errorf("%s: map returned %v, want ErrFault", what, err)
				}
				a.newChannel(t)
				fillSink(a)
				expectFault(t, a.gpuCopy(a.sinkVA, va), "GPU read of "+what)
				if !sinkUntouched(a) {
					t.Errorf("GPU read of %s wrote into the attacker's page", what)
				}
				a.newChannel(t)
				expectFault(t, a.gpuCopy(va, a.srcVA), "GPU write of "+what)
			}
			for _, tg := range targets {
				try(fmt.Sprintf("%s (guest %#x)", tg.what, tg.g), func(va uint64) error { return a.vm.MapVRAM(va, tg.g, pageSize) })
			}
			for _, gpa := range []uint64{guestRAM, guestRAM + 16*pageSize, 1 << 32, nvc0.VASize - pageSize} {
				try(fmt.Sprintf("system memory at guest-physical %#x", gpa), func(va uint64) error { return a.vm.MapHost(va, gpa, pageSize) })
			}
			rej, _ := pvCounters(av)
			if n := uint64(len(targets) + 4); rej-rej0 < n {
				t.Errorf("pv_rejected grew by %d for %d refused maps", rej-rej0, n)
			}
			a.newChannel(t)
			a.controlCopies(t)
			s.checkCanaries(t, canaries)
			e.checkCanary(t, resCanary)
			s.honest.verified(t)
			s.checkCanaries(t, canaries)
		})
	}
}

// TestPVHandles: handles are per VM. The victim holds 64 tables; the
// attacker, holding few, names the victim's handle numbers (and 0, and
// numbers no one holds) in every operation: each is refused with
// ErrHandle, and the victim's tables still serve it. Kind confusion (a
// page directory where a table goes), a double free and a table linked in
// two places are refused too.
func TestPVHandles(t *testing.T) {
	s := newPVScene(t, "pv-multicall")
	a := s.a
	canaries := s.canaries(t)
	victim := &attacker{e: s.e, name: "victim", dev: s.vdev}
	vp := newPVRaw(t, victim, 0)
	var vh []uint32
	for range 64 {
		code, h := vp.one(hypercall.Call{Op: hypercall.OpMemAlloc, Kind: hypercall.KindLargeTable})
		if code != hypercall.OK {
			t.Fatalf("victim allocation: %v", code)
		}
		vh = append(vh, h)
	}
	p := newPVRaw(t, a, 1)
	own, _ := p.pvTable(t, 8000)
	pd := a.vm.PVPageDir()
	foreign := []uint32{0, 0xFFFFFFFF, 4096}
	for _, h := range vh[len(vh)-16:] {
		if h > own+8 { // numbers the attacker does not hold
			foreign = append(foreign, h)
		}
	}
	good := vramPTE(a.own)
	for _, h := range foreign {
		for _, c := range []hypercall.Call{
			{Op: hypercall.OpMemFree, Handle: h},
			{Op: hypercall.OpMap, PT: h, PTE: good},
			{Op: hypercall.OpMapBatch, PT: h, Count: 4, PTE: good},
			{Op: hypercall.OpMapSGBatch, PT: h, Count: 1, PTEs: []uint64{good}},
			{Op: hypercall.OpUnmapBatch, PT: h, Count: 4},
			{Op: hypercall.OpVMFlush, PD: h},
			{Op: hypercall.OpMapPGT, PD: h, PDE: 1},
			{Op: hypercall.OpMapPGT, PD: pd, PDE: 8001, Large: h},
			{Op: hypercall.OpSetPGD, RAMIN: 0x100000, PD: h},
		} {
			if h == 0 && (c.Op == hypercall.OpMapPGT && c.PD == pd || c.Op == hypercall.OpSetPGD) {
				continue // 0 means "none" there: legal
			}
			if code, _ := p.one(c); code != hypercall.ErrHandle {
				t.Errorf("%v with handle %d: %v, want ErrHandle", c.Op, h, code)
			}
		}
	}
	for _, c := range []hypercall.Call{
		{Op: hypercall.OpMap, PT: pd, PTE: good},                // a directory as a table
		{Op: hypercall.OpMapPGT, PD: own, PDE: 0},               // a table as a directory
		{Op: hypercall.OpMapPGT, PD: pd, PDE: 8002, Small: pd},  // a directory linked as a table
		{Op: hypercall.OpMapPGT, PD: pd, PDE: 8003, Large: own}, // a small table as a large one
	} {
		if code, _ := p.one(c); code != hypercall.ErrHandle {
			t.Errorf("kind confusion %+v: %v, want ErrHandle", c, code)
		}
	}
	if code, _ := p.one(hypercall.Call{Op: hypercall.OpMapPGT, PD: pd, PDE: 8004, Small: own}); code != hypercall.ErrBusy {
		t.Errorf("a table linked in a second entry: %v, want ErrBusy", code)
	}
	if code, _ := p.one(hypercall.Call{Op: hypercall.OpMemFree, Handle: own}); code != hypercall.OK {
		t.Fatalf("free of its own table: %v", code)
	}
	if code, _ := p.one(hypercall.Call{Op: hypercall.OpMemFree, Handle: own}); code != hypercall.ErrHandle {
		t.Errorf("double free: %v, want ErrHandle", code)
	}
	// The victim's tables are untouched and still its own.
	for _, h := range vh {
		if code, _ := vp.one(hypercall.Call{Op: hypercall.OpMap, PT: h, Index: 3, PTE: vramPTE(0)}); code != hypercall.OK {
			t.Errorf("victim's table %d after the attacks: %v", h, code)
		}
	}
	a.newChannel(t)
	a.controlCopies(t)
	s.honest.verified(t)
	s.checkCanaries(t, canaries)
}

// TestPVLimits: counts beyond their limits, index + count overflowing the
// table, lengths beyond the page, malformed and unknown calls, kinds and
// BARs that do not exist; the page-table budget; slots outside guest RAM.
// Each is refused with its code, nothing is installed, and the honest VM
// verifies.
func TestPVLimits(t *testing.T) {
	s := newPVScene(t, "pv-multicall")
	a := s.a
	canaries := s.canaries(t)
	p := newPVRaw(t, a, 1)
	pt, va := p.pvTable(t, 8000)
	good := vramPTE(a.own)
	for _, tc := range []struct {
		what string
		c    hypercall.Call
		want hypercall.Code
	}{
		{"MAP_BATCH of 0 entries", hypercall.Call{Op: hypercall.OpMapBatch, PT: pt, PTE: good}, hypercall.ErrRange},
		{"MAP_BATCH of 2^32-1 entries", hypercall.Call{Op: hypercall.OpMapBatch, PT: pt, Count: 0xFFFFFFFF, PTE: good}, hypercall.ErrRange},
		{"MAP_BATCH past the table", hypercall.Call{Op: hypercall.OpMapBatch, PT: pt, Index: nvc0.SmallPTECount - 1, Count: 2, PTE: good}, hypercall.ErrRange},
		{"MAP_BATCH index + count wrapping 32 bits", hypercall.Call{Op: hypercall.OpMapBatch, PT: pt, Index: 0xFFFFFFFF, Count: 2, PTE: good}, hypercall.ErrRange},
		{"MAP_BATCH running past the slice", hypercall.Call{Op: hypercall.OpMapBatch, PT: pt, Count: 4, PTE: vramPTE(vramPerVM - 2*pageSize)}, hypercall.ErrFault},
		{"MAP_BATCH running past the PTE address space", hypercall.Call{Op: hypercall.OpMapBatch, PT: pt, Count: 4, PTE: sysPTE(1<<40 - 2*pageSize)}, hypercall.ErrRange},
		{"MAP past the table", hypercall.Call{Op: hypercall.OpMap, PT: pt, Index: nvc0.SmallPTECount, PTE: good}, hypercall.ErrRange},
		{"UNMAP_BATCH of 2^32-1 entries", hypercall.Call{Op: hypercall.OpUnmapBatch, PT: pt, Count: 0xFFFFFFFF}, hypercall.ErrRange},
		{"MAP_PGT beyond the directory", hypercall.Call{Op: hypercall.OpMapPGT, PD: a.vm.PVPageDir(), PDE: nvc0.PDECount}, hypercall.ErrRange},
		{"MEM_ALLOC of an unknown kind", hypercall.Call{Op: hypercall.OpMemAlloc, Kind: 9}, hypercall.ErrInval},
		{"BAR_MAP of BAR 2", hypercall.Call{Op: hypercall.OpBARMap, BAR: 2, Count: 1, PTE: good}, hypercall.ErrInval},
		{"BAR_MAP beyond the aperture", hypercall.Call{Op: hypercall.OpBARMap, BAR: 1, Index: bar1PerVM/pageSize - 1, Count: 2, PTE: good}, hypercall.ErrRange},
		{"BAR_MAP of 2^32-1 pages", hypercall.Call{Op: hypercall.OpBARMap, BAR: 3, Count: 0xFFFFFFFF, PTE: good}, hypercall.ErrRange},
		{"BAR_MAP outside the slice", hypercall.Call{Op: hypercall.OpBARMap, BAR: 1, Index: 100, Count: 1, PTE: vramPTE(vramPerVM)}, hypercall.ErrFault},
		{"SET_PGD of an instance block outside the slice", hypercall.Call{Op: hypercall.OpSetPGD, RAMIN: vramPerVM, PD: a.vm.PVPageDir()}, hypercall.ErrFault},
		{"SET_PGD of an unaligned instance block", hypercall.Call{Op: hypercall.OpSetPGD, RAMIN: 0x100008, PD: a.vm.PVPageDir()}, hypercall.ErrInval},
	} {
		if code, _ := p.one(tc.c); code != tc.want {
			t.Errorf("%s: %v, want %v", tc.what, code, tc.want)
		}
	}
	for _, tc := range []struct {
		what string
		page []byte
		want hypercall.Code
	}{
		{"length 2^32-1", rawPage(hypercall.OpMemFree, 0xFFFFFFFF), hypercall.ErrRange},
		{"length one byte past the page", rawPage(hypercall.OpMemFree, hypercall.MaxArgs+1), hypercall.ErrRange},
		{"unknown op", rawPage(77, 8), hypercall.ErrNoSys},
		{"reserved field set", rawPage(hypercall.OpMemFree, 8, 1, 1), hypercall.ErrInval},
		{"MAP_SG_BATCH of 129 entries", rawPage(hypercall.OpMapSGBatch, 16+129*8, pt, 0, 129, 0), hypercall.ErrRange},
		{"multicall entry running off the page", rawPage(hypercall.OpMulticall, 32, uint32(hypercall.OpMapSGBatch), 4000), hypercall.ErrInval},
	} {
		if code := p.sendPage(tc.page); code != tc.want {
			t.Errorf("%s: %v, want %v", tc.what, code, tc.want)
		}
	}
	// A multicall inside a multicall fails alone.
	nested := rawPage(hypercall.OpMulticall, 40, uint32(hypercall.OpMulticall), 0, 0, 0,
		uint32(hypercall.OpVMFlush), 8, 0, 0, a.vm.PVPageDir(), 0)
	p.sendPage(nested)
	if c0, _ := hypercall.Result(p.page.Bytes, 16); c0 != hypercall.ErrNoSys {
		t.Errorf("nested multicall: %v, want ErrNoSys", c0)
	}
	if c1, _ := hypercall.Result(p.page.Bytes, 32); c1 != hypercall.OK {
		t.Errorf("the call after a nested multicall: %v", c1)
	}
	// Nothing was installed at the table the refused calls named.
	fillSink(a)
	expectFault(t, a.gpuCopy(a.sinkVA, va), "GPU read through entry 0 after refused maps")

	// The page-table budget: small tables until it runs out, then all back.
	var held []uint32
	for {
		code, h := p.one(hypercall.Call{Op: hypercall.OpMemAlloc, Kind: hypercall.KindSmallTable})
		if code == hypercall.ErrNoMem {
			break
		}
		if code != hypercall.OK || len(held) > 2000 {
			t.Fatalf("allocation %d: %v", len(held), code)
		}
		held = append(held, h)
	}
	t.Logf("the budget held %d small tables (%d MiB)", len(held), len(held)*nvc0.SmallPTSize>>20)
	for _, h := range held {
		if code, _ := p.one(hypercall.Call{Op: hypercall.OpMemFree, Handle: h}); code != hypercall.OK {
			t.Fatalf("free: %v", code)
		}
	}
	if code, h := p.one(hypercall.Call{Op: hypercall.OpMemAlloc, Kind: hypercall.KindSmallTable}); code != hypercall.OK {
		t.Errorf("allocation after freeing everything: %v (the budget was not returned)", code)
	} else {
		p.one(hypercall.Call{Op: hypercall.OpMemFree, Handle: h})
	}

	// Slots: outside guest RAM, unaligned, beyond the slot count, unregistered.
	for _, tc := range []struct {
		what      string
		slot      uint32
		lo        uint64
		want      hypercall.Code
		callAfter bool
	}{
		{"a page past guest RAM", 2, guestRAM | hypercall.SlotEnable, hypercall.ErrSlot, true},
		{"a page at 1 TiB", 2, 1<<40 | hypercall.SlotEnable, hypercall.ErrSlot, true},
		{"an unaligned page", 2, (guestRAM - pageSize + 0x800) | hypercall.SlotEnable, hypercall.ErrSlot, true},
		{"slot 64", hypercall.Slots, p.page.Bus | hypercall.SlotEnable, hypercall.ErrSlot, false},
	} {
		if code := p.register(tc.slot, tc.lo); code != tc.want {
			t.Errorf("register %s: %v, want %v", tc.what, code, tc.want)
		}
		if tc.callAfter {
			if code := p.trap(tc.slot); code != hypercall.ErrSlot {
				t.Errorf("call of a slot refused at %s: %v, want ErrSlot", tc.what, code)
			}
		}
	}
	if code := p.trap(hypercall.Slots); code != hypercall.ErrSlot {
		t.Errorf("call of slot 64: %v", code)
	}
	if code := p.register(1, 0); code != hypercall.OK {
		t.Fatalf("unregister: %v", code)
	}
	if code := p.trap(1); code != hypercall.ErrSlot {
		t.Errorf("call of an unregistered slot: %v", code)
	}
	a.newChannel(t)
	a.controlCopies(t)
	s.honest.verified(t)
	s.checkCanaries(t, canaries)
}

// TestPVArgumentPageRewritten: while the attacker's multicalls run, another
// thread of the attacker rewrites their arguments between entries of its
// own VRAM and the honest VM's page. A call either refuses the whole batch
// or installs exactly what it validated: a GPU read through every mapped
// entry returns the attacker's own page, never the honest VM's.
func TestPVArgumentPageRewritten(t *testing.T) {
	s := newPVScene(t, "pv-multicall")
	e, a := s.e, s.a
	canaries := s.canaries(t)
	a.controlCopies(t) // own page := the src pattern
	p := newPVRaw(t, a, 1)
	pt, base := p.pvTable(t, 8000)
	const n = 64
	good := vramPTE(a.own)
	bad := vramPTE(s.hv.Slot.VRAM.Base - a.slot.VRAM.Base) // the honest slice, shifted
	ptes := make([]uint64, n)
	for i := range ptes {
		ptes[i] = good
	}
	enc := hypercall.NewEncoder(true)
	_ = enc.Add(hypercall.Call{Op: hypercall.OpMapSGBatch, PT: pt, Count: n, PTEs: ptes})
	_ = enc.Add(hypercall.Call{Op: hypercall.OpVMFlush, PD: a.vm.PVPageDir()})
	copy(p.page.Bytes, enc.Page())
	at := enc.At(0)
	words := p.page.Bytes[at+hypercall.HeaderSize+16 : at+hypercall.HeaderSize+16+8*n]

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the rewriting thread
		defer wg.Done()
		for k := 0; ; k++ {
			select {
			case <-stop:
				return
			default:
			}
			v := bad
			if k%2 == 1 {
				v = good
			}
			for j := range n {
				binary.LittleEndian.PutUint64(words[8*j:], v)
			}
			time.Sleep(20 * time.Microsecond) // a window with all entries good, or all bad
		}
	}()
	rounds := 300
	if testing.Short() {
		rounds = 100
	}
	rej0, _ := pvCounters(e.vgpu("attacker"))
	var ok, refused int
	mapped := false
	for i := range rounds {
		p.trap(1)
		code, _ := hypercall.Result(p.page.Bytes, at)
		switch code {
		case hypercall.OK:
			ok++
			mapped = true
		case hypercall.ErrFault:
			refused++
		default:
			t.Fatalf("round %d: %v", i, code)
		}
		if !mapped {
			continue
		}
		fillSink(a)
		if err := a.gpuCopy(a.sinkVA, base+uint64(i%n)*pageSize); err != nil {
			t.Fatalf("round %d: a GPU read through an installed entry faulted: %v", i, err)
		}
		if !bytes.Equal(a.sink.Bytes, a.src.Bytes) {
			leaked := false
			for _, c := range canaries {
				leaked = leaked || containsChunk(a.sink.Bytes, c.data)
			}
			t.Fatalf("round %d: entry %d maps something other than the attacker's page (a canary: %v)", i, i%n, leaked)
		}
	}
	close(stop)
	wg.Wait()
	rej, _ := pvCounters(e.vgpu("attacker"))
	t.Logf("%d rounds: %d installed, %d refused (pv_rejected +%d)", rounds, ok, refused, rej-rej0)
	if ok == 0 {
		t.Fatal("no call was ever installed: the test proves nothing")
	}
	if rej-rej0 < uint64(refused) {
		t.Errorf("pv_rejected grew by %d for %d refused calls", rej-rej0, refused)
	}
	s.honest.verified(t)
	s.checkCanaries(t, canaries)
}

// TestPVFreeUnderRunningChannel: the attacker frees the page table its
// running channel reads through, and its page directory's handle, then
// allocates and fills new tables (which may reuse the freed memory once it
// is flushed). Reads through the old address only ever fault or return the
// attacker's own page; the channel's directory lives on until the channel
// lets go; nothing reaches another VM.
func TestPVFreeUnderRunningChannel(t *testing.T) {
	s := newPVScene(t, "pv-multicall")
	a := s.a
	canaries := s.canaries(t)
	a.controlCopies(t)
	p := newPVRaw(t, a, 1)
	pt, va := p.pvTable(t, 8000)
	if code, _ := p.one(hypercall.Call{Op: hypercall.OpMapBatch, PT: pt, Count: 16, PTE: vramPTE(a.own)}); code != hypercall.OK {
		t.Fatal(code)
	}
	p.flush(t)
	if err := a.gpuCopy(a.sinkVA, va); err != nil || !bytes.Equal(a.sink.Bytes, a.src.Bytes) {
		t.Fatalf("control read through its own table: %v", err)
	}
	check := func(when string) {
		fillSink(a)
		err := a.gpuCopy(a.sinkVA, va)
		if err == nil && !bytes.Equal(a.sink.Bytes, a.src.Bytes) {
			t.Fatalf("%s: a read through the freed table returned something other than the attacker's page", when)
		}
		if err != nil {
			a.newChannel(t)
		}
	}
	if code, _ := p.one(hypercall.Call{Op: hypercall.OpMemFree, Handle: pt}); code != hypercall.OK {
		t.Fatal(code)
	}
	check("after freeing the table, before any flush")
	// New tables full of entries that map the honest slice would be
	// refused; fill them with the attacker's own pages instead and see
	// that nothing of the old table's memory is read as a table.
	for range 8 {
		code, h := p.one(hypercall.Call{Op: hypercall.OpMemAlloc, Kind: hypercall.KindSmallTable})
		if code != hypercall.OK {
			t.Fatal(code)
		}
		if code, _ := p.one(hypercall.Call{Op: hypercall.OpMapBatch, PT: h, Count: 512, PTE: vramPTE(a.own)}); code != hypercall.OK {
			t.Fatal(code)
		}
		check("after a new table was filled")
	}
	p.flush(t)
	check("after a flush")
	// The page directory's handle goes while the channel runs on it: the
	// channel keeps it (its own memory still reads), a new channel cannot
	// name it.
	a.newChannel(t)
	pd := a.vm.PVPageDir()
	if code, _ := p.one(hypercall.Call{Op: hypercall.OpMemFree, Handle: pd}); code != hypercall.OK {
		t.Fatal(code)
	}
	fillSink(a)
	if err := a.gpuCopy(a.sinkVA, a.ownVA); err != nil || !bytes.Equal(a.sink.Bytes, a.src.Bytes) {
		t.Errorf("the running channel lost its page directory when the handle was freed: %v", err)
	}
	if ch, err := a.drv.NewChannel(a.vm); err == nil {
		ch.Close()
		t.Error("a channel came up on a freed page directory")
	} else if !errors.Is(err, hypercall.ErrHandle) {
		t.Errorf("new channel on a freed page directory: %v, want ErrHandle", err)
	}
	s.honest.verified(t)
	s.checkCanaries(t, canaries)
}

// TestPVHypercallFlood: the attacker floods the aggregator with hypercalls
// for a few seconds — full multicalls of scatter-gather maps, refused
// calls, allocations up to the budget and back — while the honest VM
// computes. The aggregator's heap stays bounded, the honest VM verifies,
// and the attacker's own connection keeps working.
func TestPVHypercallFlood(t *testing.T) {
	s := newPVScene(t, "pv-multicall")
	e, a := s.e, s.a
	p := newPVRaw(t, a, 1)
	pt, _ := p.pvTable(t, 8000)
	enc := hypercall.NewEncoder(true)
	for i := 0; ; i++ {
		if enc.Add(hypercall.Call{Op: hypercall.OpMapSGBatch, PT: pt, Index: uint32(i), Count: 1, PTEs: []uint64{vramPTE(a.own)}}) != nil {
			break
		}
	}
	full := append([]byte(nil), enc.Page()...)
	heap0 := heapInUse()
	dur := 3 * time.Second
	if testing.Short() {
		dur = 1500 * time.Millisecond
	}
	_, calls0 := pvCounters(e.vgpu("attacker"))
	start := time.Now()
	var peak uint64
	rounds := 0
	for time.Since(start) < dur || !s.honest.exited() && time.Since(start) < 30*time.Second {
		p.sendPage(full)
		p.sendPage(rawPage(77, 0))
		p.trap(40)
		var held []uint32
		for range 64 {
			code, h := p.one(hypercall.Call{Op: hypercall.OpMemAlloc, Kind: hypercall.KindLargeTable})
			if code != hypercall.OK {
				break
			}
			held = append(held, h)
		}
		for _, h := range held {
			p.one(hypercall.Call{Op: hypercall.OpMemFree, Handle: h})
		}
		if rounds%20 == 0 {
			peak = max(peak, heapInUse())
		}
		rounds++
	}
	_, calls := pvCounters(e.vgpu("attacker"))
	heap := heapInUse()
	t.Logf("%d rounds, %d hypercalls in %v; heap %.1f → %.1f MiB (peak %.1f)", rounds, calls-calls0,
		time.Since(start).Round(time.Millisecond), inMiB(heap0), inMiB(heap), inMiB(peak))
	if heap > heap0+32<<20 || peak > heap0+64<<20 {
		t.Errorf("the hypercall flood grew the aggregator's heap from %.1f to %.1f MiB (peak %.1f)", inMiB(heap0), inMiB(heap), inMiB(peak))
	}
	if code, _ := p.one(hypercall.Call{Op: hypercall.OpVMFlush, PD: a.vm.PVPageDir()}); code != hypercall.OK {
		t.Errorf("the attacker's own hypercalls stopped working: %v", code)
	}
	if err := a.dev.Err(); err != nil {
		t.Errorf("the flooding VM's connection failed: %v", err)
	}
	s.honest.verified(t)
}
