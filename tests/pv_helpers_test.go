package tests

// Helpers of the para-virtualization attacks (pv_test.go): a PV scene and
// raw hypercalls issued from a slot of the attacker's own.

import (
	"encoding/binary"
	"testing"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/gpu/hostmem"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/hypercall"
)

// pvModes are the attacker's PV modes (the aggregator side is the same;
// the driver batches or not).
func pvModes() []string {
	if testing.Short() {
		return []string{"pv-multicall"}
	}
	return []string{"pv-naive", "pv-multicall"}
}

// newPVScene is the scene with every VM para-virtual: the attacker in
// mode, the honest VM (a process) in pv-multicall, the idle victim in
// pv-naive.
func newPVScene(t *testing.T, mode string) *scene {
	t.Helper()
	return newSceneModes(t, mode, "pv-multicall", "pv-naive", true)
}

// pvRaw issues hypercalls from a slot page of the attacker's RAM, beside
// the slot its driver uses.
type pvRaw struct {
	a    *attacker
	page hostmem.Buffer
	slot uint32
}

func newPVRaw(t *testing.T, a *attacker, slot uint32) *pvRaw {
	t.Helper()
	b, err := a.dev.RAM().Alloc(hypercall.PageSize)
	if err != nil {
		t.Fatal(err)
	}
	p := &pvRaw{a: a, page: b, slot: slot}
	if c := p.register(slot, b.Bus|hypercall.SlotEnable); c != hypercall.OK {
		t.Fatalf("register slot %d at %#x: %v", slot, b.Bus, c)
	}
	return p
}

// register writes the slot registration registers (lo carries the enable
// bit) and returns RegStatus.
func (p *pvRaw) register(slot uint32, lo uint64) hypercall.Code {
	m := p.a.dev
	m.Write32(hypercall.BAR, hypercall.RegSlot, slot)
	m.Write32(hypercall.BAR, hypercall.RegSlotLo, uint32(lo))
	m.Write32(hypercall.BAR, hypercall.RegSlotHi, uint32(lo>>32))
	return hypercall.Code(m.Read32(hypercall.BAR, hypercall.RegStatus))
}

// trap runs the call in slot and returns RegResult.
func (p *pvRaw) trap(slot uint32) hypercall.Code {
	p.a.dev.Write32(hypercall.BAR, hypercall.RegCall, slot)
	return hypercall.Code(p.a.dev.Read32(hypercall.BAR, hypercall.RegResult))
}

// sendPage puts a raw page in the slot and runs it.
func (p *pvRaw) sendPage(page []byte) hypercall.Code {
	copy(p.page.Bytes, page)
	return p.trap(p.slot)
}

// call runs one call (or a multicall of several) and returns the top
// result, each call's result and value.
func (p *pvRaw) call(cs ...hypercall.Call) (top hypercall.Code, codes []hypercall.Code, vals []uint32) {
	enc := hypercall.NewEncoder(len(cs) > 1)
	for _, c := range cs {
		if err := enc.Add(c); err != nil {
			return hypercall.ErrInval, nil, nil
		}
	}
	top = p.sendPage(enc.Page())
	for i := range cs {
		code, v := hypercall.Result(p.page.Bytes, enc.At(i))
		codes, vals = append(codes, code), append(vals, v)
	}
	return top, codes, vals
}

// one runs a single call and returns its result and value.
func (p *pvRaw) one(c hypercall.Call) (hypercall.Code, uint32) {
	_, codes, vals := p.call(c)
	if len(codes) == 0 {
		return hypercall.ErrInval, 0
	}
	return codes[0], vals[0]
}

// rawPage builds a slot page from a header and argument words.
func rawPage(op hypercall.Op, length uint32, args ...uint32) []byte {
	b := make([]byte, hypercall.PageSize)
	binary.LittleEndian.PutUint32(b[hypercall.OffOp:], uint32(op))
	binary.LittleEndian.PutUint32(b[hypercall.OffLen:], length)
	for i, a := range args {
		binary.LittleEndian.PutUint32(b[hypercall.HeaderSize+4*i:], a)
	}
	return b
}

// vramPTE is a guest PTE word mapping guest VRAM address g.
func vramPTE(g uint64) uint64 {
	lo, hi := nvc0.PTE{Present: true, Addr: g, Target: nvc0.TargetVRAM}.Encode()
	return uint64(lo) | uint64(hi)<<32
}

// sysPTE is a guest PTE word mapping guest-physical address gpa.
func sysPTE(gpa uint64) uint64 {
	lo, hi := nvc0.PTE{Present: true, Addr: gpa, Target: nvc0.TargetSysSnooped}.Encode()
	return uint64(lo) | uint64(hi)<<32
}

// pvTable gives the attacker a page table of its own, linked into its
// driver's page directory at entry pde, and returns the handle and the
// GPU virtual address of its entry 0.
func (p *pvRaw) pvTable(t *testing.T, pde uint32) (uint32, uint64) {
	t.Helper()
	code, h := p.one(hypercall.Call{Op: hypercall.OpMemAlloc, Kind: hypercall.KindSmallTable})
	if code != hypercall.OK {
		t.Fatalf("allocate a page table: %v", code)
	}
	if code, _ := p.one(hypercall.Call{Op: hypercall.OpMapPGT, PD: p.a.vm.PVPageDir(), PDE: pde, Small: h}); code != hypercall.OK {
		t.Fatalf("link the page table at entry %d: %v", pde, code)
	}
	return h, uint64(pde) << nvc0.PDEShift
}

// flush flushes the GPU TLB of the attacker's page directory.
func (p *pvRaw) flush(t *testing.T) {
	t.Helper()
	if code, _ := p.one(hypercall.Call{Op: hypercall.OpVMFlush, PD: p.a.vm.PVPageDir()}); code != hypercall.OK {
		t.Fatalf("VM_FLUSH: %v", code)
	}
}

// pvCounters returns the attacker's PV counters.
func pvCounters(v *aggregator.VGPU) (rejected, calls uint64) {
	c := v.Counters()
	return c.PVRejected, c.Hypercalls
}
