package nouveau

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/gpuvm/gpuvm/gpu"
	"github.com/gpuvm/gpuvm/gpu/hostmem"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/hypercall"
)

// The para-virtual modes' hypercall client (hypercall's ABI: a register
// window on BAR5, call slots in guest RAM). The driver registers one page
// of DMA memory as slot 0 and makes every call through it.

// notRun is what the driver leaves in a call's result field before the
// call: a result that still reads it after the call was never written by
// the aggregator (it is no Code the aggregator returns).
const notRun = nvc0.ReadAllOnes

// pvClient makes hypercalls. Calls may come from several goroutines: mu
// serialises use of the slot; encoders belong to one batch each.
type pvClient struct {
	mmio  gpu.MMIO
	host  HostMemory
	multi bool      // PVMulticall: batches pack calls into multicalls
	encs  sync.Pool // *hypercall.Encoder for multicalls
	one   sync.Pool // *hypercall.Encoder for single calls

	mu     sync.Mutex // guards slot, closed and calls
	slot   hostmem.Buffer
	closed bool
	calls  uint64 // hypercalls made (a multicall is one)
}

// openPV checks that the virtual GPU serves hypercalls and registers the
// driver's call slot.
func (d *Device) openPV(multi bool) (*pvClient, error) {
	switch id := d.mmio.Read32(hypercall.BAR, hypercall.RegID); id {
	case hypercall.IDValue:
	case nvc0.ReadAllOnes:
		return nil, fmt.Errorf("hypercall ID: %w", ErrDeviceGone)
	default:
		return nil, fmt.Errorf("virtual GPU offers no hypercalls (BAR%d ID reads %#x): %w", hypercall.BAR, id, ErrNotSupported)
	}
	slot, err := d.host.Alloc(hypercall.PageSize)
	if err != nil {
		return nil, fmt.Errorf("hypercall slot: %w", err)
	}
	p := &pvClient{mmio: d.mmio, host: d.host, multi: multi, slot: slot}
	p.encs.New = func() any { return hypercall.NewEncoder(true) }
	p.one.New = func() any { return hypercall.NewEncoder(false) }
	if err := p.register(slot.Bus, true); err != nil {
		d.host.Free(slot)
		return nil, fmt.Errorf("hypercall slot at %#x: %w", slot.Bus, err)
	}
	return p, nil
}

// Hypercalls returns how many hypercalls the driver has made (a multicall
// counts once: it is one trap), 0 outside the PV modes. It is the guest's
// own count; the aggregator's counters are the trusted one.
func (d *Device) Hypercalls() uint64 {
	if d.pv == nil {
		return 0
	}
	d.pv.mu.Lock()
	defer d.pv.mu.Unlock()
	return d.pv.calls
}

// register makes the page at bus slot 0 (or, without enable, unregisters it).
func (p *pvClient) register(bus uint64, enable bool) error {
	lo := uint32(bus) &^ (hypercall.PageSize - 1)
	if enable {
		lo |= hypercall.SlotEnable
	}
	p.mmio.Write32(hypercall.BAR, hypercall.RegSlot, 0)
	p.mmio.Write32(hypercall.BAR, hypercall.RegSlotLo, lo)
	p.mmio.Write32(hypercall.BAR, hypercall.RegSlotHi, uint32(bus>>32))
	switch st := p.mmio.Read32(hypercall.BAR, hypercall.RegStatus); st {
	case uint32(hypercall.OK):
		return nil
	case nvc0.ReadAllOnes:
		return ErrDeviceGone
	default:
		return hypercall.Code(st)
	}
}

// close unregisters and frees the slot; later calls fail with ErrClosed.
func (p *pvClient) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	err := p.register(0, false)
	if err != nil {
		err = fmt.Errorf("unregister hypercall slot: %w", err)
	}
	return errors.Join(err, p.host.Free(p.slot))
}

// trap runs the call (or multicall) enc holds and returns each call's value.
func (p *pvClient) trap(enc *hypercall.Encoder) ([]uint32, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, fmt.Errorf("hypercall: %w", ErrClosed)
	}
	page := p.slot.Bytes[:hypercall.PageSize]
	copy(page, enc.Page())
	hypercall.PutResult(page, 0, notRun, 0)
	for i := range enc.Len() {
		hypercall.PutResult(page, enc.At(i), notRun, 0)
	}
	p.calls++
	p.mmio.Write32(hypercall.BAR, hypercall.RegCall, 0)

	top, _ := hypercall.Result(page, 0)
	if top == notRun {
		// The aggregator wrote no result into the page: the device is
		// gone, or the slot was not usable (RegResult says which).
		switch reg := p.mmio.Read32(hypercall.BAR, hypercall.RegResult); hypercall.Code(reg) {
		case notRun:
			return nil, fmt.Errorf("hypercall %v: %w", opAt(page, 0), ErrDeviceGone)
		case hypercall.OK:
			// Nothing failed; the calls' own results say what ran.
		default:
			return nil, fmt.Errorf("hypercall %v: %w", opAt(page, 0), hypercall.Code(reg))
		}
	}
	values := make([]uint32, enc.Len())
	for i := range values {
		code, v := hypercall.Result(page, enc.At(i))
		switch {
		case code == hypercall.OK:
			values[i] = v
			continue
		case code == notRun && top != hypercall.OK && top != notRun:
			code = top // the whole page was refused
		case code == notRun:
			code = hypercall.ErrFailed // the aggregator never reached it
		}
		return nil, fmt.Errorf("hypercall %v (call %d of %d): %w", opAt(page, enc.At(i)), i+1, enc.Len(), code)
	}
	if top != hypercall.OK && top != notRun {
		return nil, fmt.Errorf("hypercall %v: %w", opAt(page, 0), top)
	}
	return values, nil
}

// opAt returns the op of the call whose header is at byte at of page.
func opAt(page []byte, at int) hypercall.Op {
	return hypercall.Op(binary.LittleEndian.Uint32(page[at+hypercall.OffOp:]))
}

// pvBatch is a list of calls being made, in order: in PVNaive each call
// traps as it is added; in PVMulticall calls collect in a multicall page
// that traps when the next call does not fit and at done. The first error
// stops the batch (later adds do nothing) and is done's result.
type pvBatch struct {
	p      *pvClient
	enc    *hypercall.Encoder // the multicall being built (PVMulticall)
	calls  []hypercall.Call   // the calls in enc
	keep   bool               // collect the calls' values
	values []uint32
	err    error
}

// batch starts a batch; with keep, done returns every call's value.
func (p *pvClient) batch(keep bool) *pvBatch {
	b := &pvBatch{p: p, keep: keep}
	if p.multi {
		b.enc = p.encs.Get().(*hypercall.Encoder)
		b.enc.Reset()
	}
	return b
}

// add makes call c, or queues it.
func (b *pvBatch) add(c hypercall.Call) error {
	if b.err != nil {
		return b.err
	}
	if !b.p.multi {
		b.err = b.single(c)
		return b.err
	}
	err := b.enc.Add(c)
	if errors.Is(err, hypercall.ErrFull) {
		if b.err = b.flush(); b.err != nil {
			return b.err
		}
		err = b.enc.Add(c)
	}
	if err != nil {
		b.err = fmt.Errorf("hypercall %v: encode: %w", c.Op, err)
		return b.err
	}
	b.calls = append(b.calls, c)
	return nil
}

// single traps one call by itself.
func (b *pvBatch) single(c hypercall.Call) error {
	enc := b.p.one.Get().(*hypercall.Encoder)
	defer b.p.one.Put(enc)
	enc.Reset()
	if err := enc.Add(c); err != nil {
		return fmt.Errorf("hypercall %v: encode: %w", c.Op, err)
	}
	v, err := b.p.trap(enc)
	if b.keep {
		b.values = append(b.values, v...)
	}
	return err
}

// flush traps the queued calls: a lone call by itself, several as one
// multicall.
func (b *pvBatch) flush() error {
	defer func() { b.enc.Reset(); b.calls = b.calls[:0] }()
	switch len(b.calls) {
	case 0:
		return nil
	case 1:
		return b.single(b.calls[0])
	}
	v, err := b.p.trap(b.enc)
	if b.keep {
		b.values = append(b.values, v...)
	}
	return err
}

// done makes the queued calls and ends the batch.
func (b *pvBatch) done() ([]uint32, error) {
	if b.enc != nil {
		if b.err == nil {
			b.err = b.flush()
		}
		b.p.encs.Put(b.enc)
		b.enc = nil
	}
	return b.values, b.err
}

// run makes calls, in order, as one batch and returns their values.
func (p *pvClient) run(calls ...hypercall.Call) ([]uint32, error) {
	b := p.batch(true)
	for _, c := range calls {
		if b.add(c) != nil {
			break
		}
	}
	return b.done()
}

// alloc allocates a page directory or page table (hypercall.Kind*) and
// returns its handle.
func (p *pvClient) alloc(kind uint32) (uint32, error) {
	v, err := p.run(hypercall.Call{Op: hypercall.OpMemAlloc, Kind: kind})
	if err != nil {
		return 0, err
	}
	return v[0], nil
}

// pteValue is a PTE as the hypercall arguments carry it.
func pteValue(p nvc0.PTE) uint64 {
	lo, hi := p.Encode()
	return uint64(lo) | uint64(hi)<<32
}

// pages returns how many pages size bytes span.
func pages(size uint64) uint64 { return (size + nvc0.PageSize - 1) / nvc0.PageSize }

// barMap maps size bytes at aperture offset va of BAR bar, page off of them
// by pte(off): a BAR_MAP per page (PVNaive) or one for the range. The
// aggregator flushes the BAR's TLB.
func (p *pvClient) barMap(bar int, va, size uint64, pte func(off uint64) nvc0.PTE) error {
	b := p.batch(false)
	if p.multi {
		b.add(hypercall.Call{Op: hypercall.OpBARMap, BAR: uint32(bar), Index: uint32(va / nvc0.PageSize),
			Count: uint32(pages(size)), PTE: pteValue(pte(0))})
	} else {
		for i := range pages(size) {
			if b.add(hypercall.Call{Op: hypercall.OpBARMap, BAR: uint32(bar), Index: uint32(va/nvc0.PageSize + i),
				Count: 1, PTE: pteValue(pte(i * nvc0.PageSize))}) != nil {
				break
			}
		}
	}
	_, err := b.done()
	return wrapBAR(bar, va, err)
}

// barUnmap unmaps size bytes at aperture offset va of BAR bar: a BAR_UNMAP
// per page (PVNaive) or one for the range.
func (p *pvClient) barUnmap(bar int, va, size uint64) error {
	b := p.batch(false)
	if p.multi {
		b.add(hypercall.Call{Op: hypercall.OpBARUnmap, BAR: uint32(bar), Index: uint32(va / nvc0.PageSize), Count: uint32(pages(size))})
	} else {
		for i := range pages(size) {
			if b.add(hypercall.Call{Op: hypercall.OpBARUnmap, BAR: uint32(bar), Index: uint32(va/nvc0.PageSize + i), Count: 1}) != nil {
				break
			}
		}
	}
	_, err := b.done()
	return wrapBAR(bar, va, err)
}

func wrapBAR(bar int, va uint64, err error) error {
	if err != nil {
		return fmt.Errorf("BAR%d aperture %#x: %w", bar, va, err)
	}
	return nil
}

// setPGD binds page directory pd (0: none) to the channel whose instance
// block is at ramin.
func (p *pvClient) setPGD(ramin uint64, pd uint32) error {
	_, err := p.run(hypercall.Call{Op: hypercall.OpSetPGD, RAMIN: ramin, PD: pd})
	return err
}

// pvMMU has the aggregator build a VM's page tables (vmMMU in PV modes):
// tables are handles, and each update is MAP/MAP_BATCH/UNMAP_BATCH calls
// on them and a VM_FLUSH, one trap each (PVNaive) or packed into
// multicalls (PVMulticall).
type pvMMU struct {
	vm *VM
	b  *pvBatch // the update in progress (vm.mu)
}

func (m *pvMMU) newTable(pde uint64) (pageTable, error) {
	p := m.vm.d.pv
	h, err := p.alloc(hypercall.KindSmallTable)
	if err != nil {
		return pageTable{}, err
	}
	if _, err := p.run(hypercall.Call{Op: hypercall.OpMapPGT, PD: m.vm.pvPD, PDE: uint32(pde), Small: h}); err != nil {
		_, ferr := p.run(hypercall.Call{Op: hypercall.OpMemFree, Handle: h})
		return pageTable{}, errors.Join(err, ferr)
	}
	return pageTable{handle: h}, nil
}

func (m *pvMMU) write(pt pageTable, idx, count uint64, pte func(i uint64) nvc0.PTE) error {
	if m.b == nil {
		m.b = m.vm.d.pv.batch(false)
	}
	b := m.b
	if b.p.multi { // count ≤ SmallPTECount-idx: the run stays in its table
		if pte == nil {
			return b.add(hypercall.Call{Op: hypercall.OpUnmapBatch, PT: pt.handle, Index: uint32(idx), Count: uint32(count)})
		}
		return b.add(hypercall.Call{Op: hypercall.OpMapBatch, PT: pt.handle, Index: uint32(idx), Count: uint32(count), PTE: pteValue(pte(0))})
	}
	for i := range count {
		c := hypercall.Call{Op: hypercall.OpUnmapBatch, PT: pt.handle, Index: uint32(idx + i), Count: 1}
		if pte != nil {
			c = hypercall.Call{Op: hypercall.OpMap, PT: pt.handle, Index: uint32(idx + i), PTE: pteValue(pte(i))}
		}
		if err := b.add(c); err != nil {
			return err
		}
	}
	return nil
}

func (m *pvMMU) finish(err error) error {
	b := m.b
	switch {
	case b == nil && err != nil: // the first table failed: nothing changed
		return err
	case b == nil: // an empty range: flush, as nouveau does
		b = m.vm.d.pv.batch(false)
	}
	m.b = nil
	b.add(hypercall.Call{Op: hypercall.OpVMFlush, PD: m.vm.pvPD})
	_, derr := b.done()
	if err == nil || derr == err { // a failed call is both
		return derr
	}
	return errors.Join(err, derr)
}

func (m *pvMMU) close(pts map[uint64]pageTable) error {
	b := m.vm.d.pv.batch(false)
	for _, pt := range pts {
		b.add(hypercall.Call{Op: hypercall.OpMemFree, Handle: pt.handle}) // unlinks it
	}
	b.add(hypercall.Call{Op: hypercall.OpVMFlush, PD: m.vm.pvPD})
	b.add(hypercall.Call{Op: hypercall.OpMemFree, Handle: m.vm.pvPD})
	_, err := b.done()
	return err
}
