package nouveau

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/gpuvm/gpuvm/gpu/hostmem"
	"github.com/gpuvm/gpuvm/gpu/hwseq"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/internal/spin"
)

// Subchannels the driver binds its engine classes to (a software convention;
// nouveau's push906f.h puts the copy class on 4).
const (
	SubcCompute = 1
	SubcCopy    = 4
)

// engineContexts is the number of engine context images a channel has: GR,
// CE0 and CE1.
const engineContexts = 3

const (
	gpfifoLog2    = 10 // 1024 GPFIFO entries, as nouveau's nvc0 channels
	gpfifoEntries = 1 << gpfifoLog2
	gpfifoBytes   = gpfifoEntries * nvc0.GPFIFOEntrySize
	pushBytes     = 1 << 20 // push-buffer space after the GPFIFO ring
)

// pending is a submitted GPFIFO entry whose push-buffer space is still in use.
type pending struct {
	serial     uint64 // submission number (1, 2, ...)
	start, end uint64 // push space [start, end) in bytes
}

// Channel is a GPU command channel: RAMIN, a GPFIFO ring and push-buffer space
// in DMA memory mapped into the channel's VM, a user area (doorbell) in the
// poll area, and a semaphore page for fences.
type Channel struct {
	d   *Device
	vm  *VM
	id  int
	gen uint64 // the device's generation it was made in (reset.go)

	ramin   *kobj
	pgd     bool           // PV: the aggregator binds vm's page directory to ramin
	ctx     *kobj          // engine context images (GR, CE0, CE1), one page
	ctxVA   uint64         // where the channel's VM maps them
	ring    hostmem.Buffer // GPFIFO entries, then push-buffer space
	ringVA  uint64
	fence   hostmem.Buffer
	fenceVA uint64

	mu        sync.Mutex
	put       uint32 // next GPFIFO index
	submitted uint64
	queue     []pending
	head      uint64 // next free byte of push space
	seq       uint32 // last fence sequence emitted
	unfenced  bool   // work was submitted after the last fence
	closed    bool

	// spinNs is how long a fence wait spins before it sleeps on the
	// interrupt, adapted to how long the channel's waits take (irq.go).
	spinNs atomic.Int64
}

// NewChannel creates a channel in vm, enables it, puts it on the playlist, and
// binds its compute context (FECS) and the copy engines to it through the
// engine context pointers of its RAMIN, as gf100_ectx_bind does.
func (d *Device) NewChannel(vm *VM) (c *Channel, err error) {
	d.mu.Lock()
	id := -1
	for i, ch := range d.chans {
		if ch == nil {
			id = i
			break
		}
	}
	if id < 0 || d.closed {
		d.mu.Unlock()
		return nil, ErrNoChannel
	}
	if vm.gen != d.gen.Load() {
		d.mu.Unlock()
		return nil, fmt.Errorf("new channel in a VM from before a reset: %w", ErrDeviceReset)
	}
	c = &Channel{d: d, vm: vm, id: id, gen: vm.gen}
	d.chans[id] = c
	d.mu.Unlock()
	defer func() {
		if err != nil {
			c.release()
			c, err = nil, fmt.Errorf("channel %d: %w", id, err)
		}
	}()

	if c.ramin, err = d.newKobj(nvc0.RAMINSize, nvc0.PageSize); err != nil {
		return c, fmt.Errorf("RAMIN: %w", err)
	}
	if c.ring, err = d.host.Alloc(gpfifoBytes + pushBytes); err != nil {
		return c, fmt.Errorf("push buffer: %w", err)
	}
	if c.ringVA, err = c.mapHost(c.ring); err != nil {
		return c, err
	}
	if c.fence, err = d.host.Alloc(nvc0.PageSize); err != nil {
		return c, fmt.Errorf("fence page: %w", err)
	}
	if c.fenceVA, err = c.mapHost(c.fence); err != nil {
		return c, err
	}

	// Engine contexts: a zeroed 256-byte image per engine, in VRAM mapped
	// into the channel's VM (nvkm_falcon_cclass_bind, gf100_gr_chan_new).
	if c.ctx, err = d.newKobjZeroing(nvc0.PageSize, nvc0.PageSize, engineContexts*nvc0.EngineContextSize); err != nil {
		return c, fmt.Errorf("engine contexts: %w", err)
	}
	if c.ctxVA, err = vm.AllocVA(nvc0.PageSize, nvc0.PageSize); err != nil {
		return c, err
	}
	if err = vm.MapVRAM(c.ctxVA, c.ctx.addr, nvc0.PageSize); err != nil {
		return c, err
	}

	// RAMFC and the address space (gf100_chan_ramfc_write, gf100_vmm_join_).
	user := d.userArea.addr + uint64(id)*nvc0.UserAreaSize
	lo, hi := nvc0.RAMINAddrEncode(user)
	d.kwr32(c.ramin, nvc0.RAMINUserLo, lo)
	d.kwr32(c.ramin, nvc0.RAMINUserHi, hi)
	d.kwr32(c.ramin, nvc0.RAMINSignature, nvc0.RAMINSignatureValue)
	d.kwr32(c.ramin, nvc0.RAMINGPFIFOLo, uint32(c.ringVA))
	d.kwr32(c.ramin, nvc0.RAMINGPFIFOHi, nvc0.GPFIFOHiEncode(c.ringVA, gpfifoLog2))
	lo, hi = nvc0.RAMINAddrEncode(vm.PageDir()) // 0 in PV modes: SET_PGD below
	d.kwr32(c.ramin, nvc0.RAMINPageDir, lo)
	d.kwr32(c.ramin, nvc0.RAMINPageDir+4, hi)
	d.kwr64(c.ramin, nvc0.RAMINAddrLimit, nvc0.VASize-1)
	for i, off := range [engineContexts]uint64{nvc0.RAMINEngineGR, nvc0.RAMINEngineCE0, nvc0.RAMINEngineCE1} {
		lo, hi := nvc0.RAMINEngineEncode(c.ctxVA + uint64(i)*nvc0.EngineContextSize)
		d.kwr32(c.ramin, off, lo)
		d.kwr32(c.ramin, off+4, hi)
	}
	d.mmio.Write32(nvc0.BAR1, c.userOffset(nvc0.UserGPPut), 0)
	if d.pv != nil {
		if err = d.pv.setPGD(c.ramin.addr, vm.pvPD); err != nil {
			return c, fmt.Errorf("bind page directory: %w", err)
		}
		c.pgd = true
	}

	inst := nvc0.InstEncode(c.ramin.addr, nvc0.ChanInstValid|nvc0.ChanInstPollEnable)
	d.wr(nvc0.ChanInst(id), inst)
	if got := d.rd(nvc0.ChanInst(id)); got != inst {
		if got == nvc0.ReadAllOnes && d.rd(nvc0.RegBoot0) == nvc0.ReadAllOnes {
			return c, fmt.Errorf("channel %d: %w", id, ErrDeviceGone)
		}
		// A virtual GPU refuses channels beyond the VM's quota.
		return c, fmt.Errorf("the GPU refused the channel (instance reads %#x): %w", got, ErrNoChannel)
	}
	d.wr(nvc0.ChanCtl(id), nvc0.ChanCtlDefault)
	if err = d.updatePlaylist(); err != nil {
		return c, err
	}
	if err = d.fecsBind(c.ramin.addr); err != nil {
		return c, err
	}

	if err = c.Submit([]uint32{
		nvc0.Incr(SubcCompute, nvc0.MthdSetObject, 1), nvc0.ClassFermiCompute,
		nvc0.Incr(SubcCopy, nvc0.MthdSetObject, 1), nvc0.ClassFermiCopy,
	}); err != nil {
		return c, err
	}
	return c, nil
}

// ID returns the channel id.
func (c *Channel) ID() int { return c.id }

// VM returns the channel's address space.
func (c *Channel) VM() *VM { return c.vm }

func (c *Channel) userOffset(field uint64) uint64 {
	return c.d.pollBase + uint64(c.id)*nvc0.UserAreaSize + field
}

func (c *Channel) mapHost(b hostmem.Buffer) (uint64, error) {
	size := uint64(len(b.Bytes))
	va, err := c.vm.AllocVA(size, nvc0.PageSize)
	if err != nil {
		return 0, err
	}
	if err := c.vm.MapHost(va, b.Bus, size); err != nil {
		c.vm.FreeVA(va)
		return 0, err
	}
	return va, nil
}

// updatePlaylist writes the live channels into the spare playlist buffer and
// submits it (nouveau double-buffers the runlist the same way).
func (d *Device) updatePlaylist() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	pl := d.playlist[d.plCur]
	d.plCur ^= 1
	n := 0
	for id, ch := range d.chans {
		if ch == nil || ch.ramin == nil || ch.closed {
			continue
		}
		d.kwr32(pl, uint64(n)*nvc0.PlaylistEntrySize, uint32(id))
		d.kwr32(pl, uint64(n)*nvc0.PlaylistEntrySize+4, nvc0.PlaylistEntryWord1)
		n++
	}
	return hwseq.SubmitPlaylist(d.mmio, pl.addr, n, d.opts.Timeout)
}

// fecsBind asks the context-switch firmware to bind a channel's graphics/compute context.
func (d *Device) fecsBind(ramin uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return hwseq.FECSBind(d.mmio, ramin, d.opts.Timeout)
}

// Submit copies a push buffer into the channel's push space, appends a GPFIFO
// entry for it and rings the doorbell (GP_PUT through the poll area).
func (c *Channel) Submit(words []uint32) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.unfenced = true
	return c.submitLocked(words)
}

// SubmitFenced submits a push buffer followed, in the same GPFIFO entry, by a
// semaphore release of the next fence sequence number, which it returns: one
// doorbell for the work and its fence, as nouveau emits them.
func (c *Channel) SubmitFenced(words []uint32) (uint32, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	seq := c.seq
	all := append(append([]uint32(nil), words...),
		nvc0.Incr(0, nvc0.MthdSemaphoreAddrHi, 4), uint32(c.fenceVA>>32), uint32(c.fenceVA), seq, nvc0.SemaphoreRelease)
	if err := c.submitLocked(all); err != nil {
		return 0, err
	}
	c.unfenced = false
	return seq, nil
}

func (c *Channel) submitLocked(words []uint32) error {
	if err := c.queueWordsLocked(words); err != nil {
		return err
	}
	c.ringLocked()
	return nil
}

// queueWordsLocked copies words into the push space and appends a GPFIFO
// entry for them, without ringing the doorbell.
func (c *Channel) queueWordsLocked(words []uint32) error {
	n := uint64(len(words)) * 4
	if n == 0 || n > pushBytes/2 {
		return fmt.Errorf("submit of %d words: bad length", len(words))
	}
	if c.closed {
		return ErrClosed
	}
	if !c.d.current(c.gen) {
		return fmt.Errorf("channel %d: %w", c.id, ErrDeviceReset)
	}
	start, err := c.reserve(n)
	if err != nil {
		return err
	}
	push := c.ring.Bytes[gpfifoBytes+start:]
	for i, w := range words {
		binary.LittleEndian.PutUint32(push[4*i:], w)
	}
	c.entryLocked(c.ringVA+gpfifoBytes+start, uint32(len(words)), start, start+n)
	c.head = start + n
	return nil
}

// entryLocked appends a GPFIFO entry for words at va; [start, end) is the
// push space it holds until the GPU is past it.
func (c *Channel) entryLocked(va uint64, words uint32, start, end uint64) {
	w0, w1 := nvc0.GPFIFOEncode(va, words)
	e := c.ring.Bytes[uint64(c.put)*nvc0.GPFIFOEntrySize:]
	binary.LittleEndian.PutUint32(e, w0)
	binary.LittleEndian.PutUint32(e[4:], w1)
	c.submitted++
	c.queue = append(c.queue, pending{serial: c.submitted, start: start, end: end})
	c.put = (c.put + 1) % gpfifoEntries
}

// ringLocked writes GP_PUT: the doorbell.
func (c *Channel) ringLocked() {
	if !c.d.current(c.gen) {
		return // the id may be another channel's now
	}
	c.d.mmio.Write32(nvc0.BAR1, c.userOffset(nvc0.UserGPPut), c.put)
}

// Segment is a push buffer the caller placed in memory its channel's
// address space maps: Words 32-bit words at VA.
type Segment struct {
	VA    uint64
	Words uint32
}

// MaxSegments bounds one SubmitSegments call.
const MaxSegments = 64

// SubmitSegments submits push buffers that live outside the channel's own
// push space — in buffers of the channel's address space, as DRM's pushbuf
// ioctl submits a client's buffers — one GPFIFO entry each, followed by a
// semaphore release of the next fence sequence number, which it returns;
// one doorbell for all of it.
func (c *Channel) SubmitSegments(segs []Segment) (uint32, error) {
	if err := checkSegments(segs); err != nil {
		return 0, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, ErrClosed
	}
	for _, s := range segs {
		// A GPFIFO slot (and no push space) per segment.
		if _, err := c.reserve(0); err != nil {
			return 0, err
		}
		c.entryLocked(s.VA, s.Words, c.head, c.head)
	}
	c.seq++
	seq := c.seq
	if err := c.queueWordsLocked([]uint32{nvc0.Incr(0, nvc0.MthdSemaphoreAddrHi, 4), uint32(c.fenceVA >> 32), uint32(c.fenceVA), seq, nvc0.SemaphoreRelease}); err != nil {
		c.ringLocked() // the segments are queued: let them run
		return 0, err
	}
	c.unfenced = false
	c.ringLocked()
	return seq, nil
}

// checkSegments validates the segments of one submission: 1..MaxSegments
// of them, each 1..MaxPushBufferWords words at a word-aligned address.
func checkSegments(segs []Segment) error {
	if len(segs) == 0 || len(segs) > MaxSegments {
		return fmt.Errorf("submit of %d segments: want 1..%d", len(segs), MaxSegments)
	}
	for _, s := range segs {
		if s.Words == 0 || s.Words > nvc0.MaxPushBufferWords || s.VA%4 != 0 {
			return fmt.Errorf("submit of %d words at %#x: bad segment", s.Words, s.VA)
		}
	}
	return nil
}

// Done reports, without waiting, whether the GPU has passed fence seq.
func (c *Channel) Done(seq uint32) bool { return int32(c.fenceValue()-seq) >= 0 }

// Fault returns the channel's fault, if the GPU reported one.
func (c *Channel) Fault() error { return c.checkFault() }

// reserve finds n contiguous bytes of push space and a free GPFIFO slot,
// reclaiming completed entries (by reading GP_GET) and waiting if needed.
func (c *Channel) reserve(n uint64) (uint64, error) {
	deadline := time.Now().Add(c.d.opts.Timeout)
	for reclaimed := false; ; {
		if len(c.queue) < gpfifoEntries-1 {
			if start, ok := c.fits(n); ok {
				return start, nil
			}
		}
		if reclaimed {
			if err := c.checkFault(); err != nil {
				return 0, err
			}
			if time.Now().After(deadline) {
				return 0, fmt.Errorf("channel %d push space: %w", c.id, ErrTimeout)
			}
			spin.Nap(20 * time.Microsecond)
		}
		c.reclaim()
		reclaimed = true
	}
}

func (c *Channel) fits(n uint64) (uint64, bool) {
	if len(c.queue) == 0 {
		return 0, true
	}
	tail := c.queue[0].start
	if c.head >= tail {
		if c.head+n <= pushBytes {
			return c.head, true
		}
		if n < tail {
			return 0, true
		}
		return 0, false
	}
	if c.head+n < tail {
		return c.head, true
	}
	return 0, false
}

// reclaim drops queue entries the GPU has finished, from GP_GET.
func (c *Channel) reclaim() {
	get := c.d.mmio.Read32(nvc0.BAR1, c.userOffset(nvc0.UserGPGet)) % gpfifoEntries
	outstanding := uint64((c.put - get + gpfifoEntries) % gpfifoEntries)
	done := c.submitted - outstanding
	i := 0
	for i < len(c.queue) && c.queue[i].serial <= done {
		i++
	}
	c.queue = c.queue[i:]
}

// Fence returns a fence sequence number that completes after all work
// submitted so far: the last one emitted if nothing was submitted since,
// else a new semaphore release.
func (c *Channel) Fence() (uint32, error) {
	c.mu.Lock()
	if !c.unfenced {
		seq := c.seq
		c.mu.Unlock()
		return seq, nil
	}
	c.mu.Unlock()
	return c.SubmitFenced(nil)
}

// fenceValue reads the semaphore the GPU releases (the GPU writes it
// concurrently, so read it atomically).
func (c *Channel) fenceValue() uint32 {
	return atomic.LoadUint32((*uint32)(unsafe.Pointer(&c.fence.Bytes[0])))
}

// WaitFence waits until the channel's fence semaphore reaches seq. It
// spins briefly (most fences complete within microseconds); then, on a GPU
// that delivers interrupts (gpu.Interrupter), it sleeps on the interrupt
// (irq.go); otherwise it polls, checking the channel for a fault every
// FaultPoll. It gives up after the driver's timeout.
func (c *Channel) WaitFence(seq uint32) error {
	var seen uint32
	irq := c.d.irq
	if irq != nil {
		seen, _ = irq.IRQCount() // before the check: an interrupt after it wakes the sleep
	}
	for range fenceSpin {
		if c.fencePassed(seq) {
			return nil
		}
	}
	if irq != nil {
		return c.sleepFence(seq, seen)
	}
	return c.pollFence(seq)
}

// fenceSpin is how many times WaitFence checks the fence before it sleeps
// or naps.
const fenceSpin = 256

// fencePassed reports whether the fence reached seq.
func (c *Channel) fencePassed(seq uint32) bool { return int32(c.fenceValue()-seq) >= 0 }

// pollFence polls semaphore memory until it reaches seq, checking the
// channel for a fault every FaultPoll and giving up after the driver's
// timeout: the wait on a GPU without interrupts.
func (c *Channel) pollFence(seq uint32) error {
	start := time.Now()
	nextCheck := start.Add(c.d.opts.FaultPoll)
	for i := fenceSpin; ; i++ {
		if c.fencePassed(seq) {
			return nil
		}
		now := time.Now()
		if now.After(nextCheck) {
			if err := c.checkFault(); err != nil {
				return err
			}
			if now.Sub(start) > c.d.opts.Timeout {
				return fmt.Errorf("channel %d fence %d (at %d): %w", c.id, seq, c.fenceValue(), ErrTimeout)
			}
			nextCheck = now.Add(c.d.opts.FaultPoll)
		}
		if i > 4096 {
			spin.Nap(20 * time.Microsecond) // time.Sleep may take a whole millisecond
		}
	}
}

// Finish waits for all work submitted so far.
func (c *Channel) Finish() error {
	seq, err := c.Fence()
	if err != nil {
		return err
	}
	return c.WaitFence(seq)
}

// checkFault collects the GPU's error reports and returns this channel's
// first one as a FaultError, if any.
func (c *Channel) checkFault() error {
	if err := c.d.collectErrors(); err != nil {
		return fmt.Errorf("channel %d: %w", c.id, err)
	}
	if !c.d.current(c.gen) {
		return fmt.Errorf("channel %d: %w", c.id, ErrDeviceReset)
	}
	if fe := c.d.channelError(c.id); fe != nil {
		return fe
	}
	if c.d.resetDetected() {
		return fmt.Errorf("channel %d: %w", c.id, ErrDeviceReset)
	}
	return nil
}

// Close stops the channel (disable and preempt), takes it off the playlist
// and frees its memory.
func (c *Channel) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	d := c.d
	if d.orphaned(c.gen) {
		return c.releaseOrphan()
	}
	d.mu.Lock()
	err := hwseq.StopChannel(d.mmio, c.id, d.opts.Timeout)
	d.mu.Unlock()
	d.wr(nvc0.ChanCtl(c.id), 0)
	d.wr(nvc0.ChanInst(c.id), 0)
	if perr := d.updatePlaylist(); err == nil {
		err = perr
	}
	if rerr := c.release(); err == nil {
		err = rerr
	}
	if err != nil {
		return fmt.Errorf("close channel %d: %w", c.id, err)
	}
	return nil
}

// release frees what the channel allocated and its id.
func (c *Channel) release() error {
	d := c.d
	var first error
	keep := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	if c.fenceVA != 0 {
		keep(c.vm.Unmap(c.fenceVA, uint64(len(c.fence.Bytes))))
		keep(c.vm.FreeVA(c.fenceVA))
	}
	if c.fence.Bytes != nil {
		keep(d.host.Free(c.fence))
	}
	if c.ringVA != 0 {
		keep(c.vm.Unmap(c.ringVA, uint64(len(c.ring.Bytes))))
		keep(c.vm.FreeVA(c.ringVA))
	}
	if c.ring.Bytes != nil {
		keep(d.host.Free(c.ring))
	}
	if c.ctxVA != 0 {
		keep(c.vm.Unmap(c.ctxVA, nvc0.PageSize))
		keep(c.vm.FreeVA(c.ctxVA))
	}
	keep(d.freeKobj(c.ctx))
	c.ctx = nil
	if c.pgd { // after Close stopped the channel
		keep(d.pv.setPGD(c.ramin.addr, 0))
		c.pgd = false
	}
	keep(d.freeKobj(c.ramin))
	c.ramin = nil
	d.forgetError(c.id)
	d.mu.Lock()
	if d.chans[c.id] == c {
		d.chans[c.id] = nil
	}
	d.mu.Unlock()
	return first
}

// Seq returns the last fence sequence number the channel emitted.
func (c *Channel) Seq() uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seq
}

// ResumeFences makes a new channel go on from fence seq, as the channel it
// replaces (a saved one) stood with all its work done: once the new one's
// own setup work is done, its next fence is seq+1 and every fence up to
// seq has passed, so that a user holding fences of the old channel orders
// the new one's after them.
func (c *Channel) ResumeFences(seq uint32) error {
	own, err := c.Fence()
	if err != nil {
		return err
	}
	if err := c.WaitFence(own); err != nil {
		return fmt.Errorf("resume fences: the channel's setup: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seq != own || c.unfenced {
		return errors.New("resume fences of a channel in use")
	}
	c.seq = seq
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&c.fence.Bytes[0])), seq)
	return nil
}
