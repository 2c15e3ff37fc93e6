// Package gdev is gpuvm's guest GPU runtime, modelled on Gdev (the runtime the
// GPUvm evaluation used): contexts, device memory, host↔device copies through
// a pinned staging buffer or directly from pinned host memory, small copies
// through the BAR1 aperture, modules of built-in kernels, launches and
// synchronisation. It runs on top of guest-driver/nouveau (anything that
// offers 32-bit BAR access and DMA memory) or of the pvdrm front end (whole
// DRM operations sent to a back end in dom0, no registers).
package gdev

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/gpuvm/gpuvm/gpu"
	"github.com/gpuvm/gpuvm/gpu/hostmem"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
)

// Tunables, named after what Gdev calls them.
const (
	// StagingChunk is the size of each of the two pinned bounce buffers that
	// pageable copies go through (Gdev pipelines two chunks the same way).
	StagingChunk = 4 << 20
	// SmallCopyMax is the largest copy that goes through the BAR1 aperture with
	// CPU writes instead of the copy engine.
	SmallCopyMax = 4096
	// paramSlot is the space each launch's parameter (constant) buffer takes.
	paramSlot  = 256
	paramSlots = 64
	// copyPitch is the line length of copy-engine transfers (nouveau copies pages as lines).
	copyPitch    = nvc0.PageSize
	maxCopyLines = 8191
)

// DevPtr is a device memory allocation seen from the context: its GPU virtual address.
type DevPtr struct {
	VA     uint64
	Size   uint64
	vram   uint64
	bar1   uint64 // BAR1 aperture offset when CPU-mapped (small buffers)
	mapped bool
	handle uint32 // the engine's name for it
	host   []byte // pvdrm: kernel objects in host memory
}

// HostBuf is pinned host memory mapped into the context's address space.
type HostBuf struct {
	Bytes  []byte
	VA     uint64
	buf    hostmem.Buffer
	handle uint32
}

// Context is a GPU context: an address space and a channel.
type Context struct {
	eng engine

	staging    [2]HostBuf
	stagingSeq [2]uint32
	code       DevPtr // code segment of the built-in module
	params     DevPtr // ring of parameter buffers
	paramNext  int
	paramSeq   [paramSlots]uint32
	allocs     map[uint64]DevPtr
	hostAllocs map[uint64]HostBuf
	yield      bool // a scheduling point after each launch (SetYield)
}

// NewContext creates a context (address space + channel) on a nouveau
// device: NewContextOn(Nouveau(dev)).
func NewContext(dev *nouveau.Device) (*Context, error) { return NewContextOn(Nouveau(dev)) }

// NewContextOn creates a context (address space + channel) on drv, with the
// staging buffers, the code segment and the parameter ring it needs.
func NewContextOn(drv Driver) (ctx *Context, err error) {
	c := &Context{allocs: map[uint64]DevPtr{}, hostAllocs: map[uint64]HostBuf{}}
	if c.eng, err = drv.open(); err != nil {
		return nil, fmt.Errorf("new context: %w", err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(fmt.Errorf("new context: %w", err), c.Close())
		}
	}()
	for i := range c.staging {
		if c.staging[i], err = c.MemAllocHost(StagingChunk); err != nil {
			return nil, err
		}
	}
	if c.code, err = c.objAlloc(nvc0.PageSize); err != nil {
		return nil, err
	}
	if c.params, err = c.objAlloc(paramSlot * paramSlots); err != nil {
		return nil, err
	}
	return c, nil
}

// Channel returns the context's nouveau channel (nil on pvdrm, which has
// no channel the guest drives).
func (c *Context) Channel() *nouveau.Channel { return c.eng.channel() }

// objAlloc allocates a kernel object the CPU writes and the GPU reads:
// CPU-mapped device memory where the engine has BAR1, else host memory
// (GART) mapped into the address space.
func (c *Context) objAlloc(size uint64) (DevPtr, error) {
	if c.eng.cpuAccess() {
		return c.memAlloc(size, true)
	}
	h, err := c.MemAllocHost(size)
	if err != nil {
		return DevPtr{}, err
	}
	return DevPtr{VA: h.VA, Size: size, handle: h.handle, host: h.Bytes}, nil
}

// MemAlloc allocates device memory and maps it into the context.
func (c *Context) MemAlloc(size uint64) (DevPtr, error) {
	return c.memAlloc(size, size <= SmallCopyMax)
}

func (c *Context) memAlloc(size uint64, cpuMapped bool) (p DevPtr, err error) {
	if size == 0 {
		return DevPtr{}, fmt.Errorf("mem alloc: zero size")
	}
	size = (size + nvc0.PageSize - 1) &^ (nvc0.PageSize - 1)
	if p, err = c.eng.allocDevice(size, cpuMapped && c.eng.cpuAccess()); err != nil {
		return DevPtr{}, fmt.Errorf("mem alloc %d: %w", size, err)
	}
	c.allocs[p.VA] = p
	return p, nil
}

// MemFree frees device memory from MemAlloc.
func (c *Context) MemFree(p DevPtr) error {
	q, ok := c.allocs[p.VA]
	if !ok {
		return fmt.Errorf("mem free %#x: not allocated", p.VA)
	}
	delete(c.allocs, p.VA)
	return c.eng.freeDevice(q)
}

// MemAllocHost allocates pinned host memory mapped into the context.
func (c *Context) MemAllocHost(size uint64) (HostBuf, error) {
	if size == 0 {
		return HostBuf{}, fmt.Errorf("host alloc: zero size")
	}
	h, err := c.eng.allocHost(size)
	if err != nil {
		return HostBuf{}, fmt.Errorf("host alloc %d: %w", size, err)
	}
	c.hostAllocs[h.VA] = h
	return h, nil
}

// MemFreeHost frees pinned host memory from MemAllocHost.
func (c *Context) MemFreeHost(h HostBuf) error {
	q, ok := c.hostAllocs[h.VA]
	if !ok {
		return fmt.Errorf("host free %#x: not allocated", h.VA)
	}
	delete(c.hostAllocs, h.VA)
	return c.eng.freeHost(q)
}

// copyEngine queues copy-engine transfers of n bytes from src to dst (GPU
// virtual addresses) as page-pitched lines, as nouveau's nvc0 copy does, with
// a fence in the same submission; it returns the fence.
func (c *Context) copyEngine(dst, src, n uint64, uses ...uint32) (uint32, error) {
	var words []uint32
	emit := func(dst, src, lineLen, lines uint64) {
		words = append(words,
			nvc0.Incr(nouveau.SubcCopy, nvc0.CopyMthdSrcAddrHi, 8),
			uint32(src>>32), uint32(src), uint32(dst>>32), uint32(dst),
			copyPitch, copyPitch, uint32(lineLen), uint32(lines),
			nvc0.Immd(nouveau.SubcCopy, nvc0.CopyMthdExec, nvc0.CopyExecLinear))
	}
	for n >= copyPitch {
		lines := min(n/copyPitch, maxCopyLines)
		emit(dst, src, copyPitch, lines)
		dst, src, n = dst+lines*copyPitch, src+lines*copyPitch, n-lines*copyPitch
	}
	if n > 0 {
		emit(dst, src, n, 1)
	}
	return c.eng.submit(words, uses...)
}

func (c *Context) checkRange(p DevPtr, off, n uint64) error {
	if q, ok := c.allocs[p.VA]; !ok || off+n > q.Size || off+n < off {
		return fmt.Errorf("device range %#x+%#x [%d bytes] outside its allocation", p.VA, off, n)
	}
	return nil
}

// MemcpyHtoD copies pageable host memory to the device: small copies through
// the BAR1 aperture, others through the two pinned staging buffers in turn.
func (c *Context) MemcpyHtoD(dst DevPtr, src []byte) error {
	n := uint64(len(src))
	if err := c.checkRange(dst, 0, n); err != nil {
		return fmt.Errorf("memcpy HtoD: %w", err)
	}
	if q := c.allocs[dst.VA]; q.mapped && n <= SmallCopyMax {
		// Copies are ordered after earlier work on the context, as CUDA's
		// are: a kernel still running may be reading the buffer.
		if err := c.eng.finish(); err != nil {
			return fmt.Errorf("memcpy HtoD: %w", err)
		}
		c.eng.cpuWrite(q, 0, src)
		return nil
	}
	for off, i := uint64(0), 0; off < n; off, i = off+StagingChunk, i^1 {
		chunk := min(StagingChunk, n-off)
		if err := c.eng.wait(c.stagingSeq[i], c.staging[i].handle); err != nil {
			return fmt.Errorf("memcpy HtoD: %w", err)
		}
		copy(c.staging[i].Bytes, src[off:off+chunk])
		seq, err := c.copyEngine(dst.VA+off, c.staging[i].VA, chunk, dst.handle, c.staging[i].handle)
		if err != nil {
			return fmt.Errorf("memcpy HtoD: %w", err)
		}
		c.stagingSeq[i] = seq
	}
	if err := c.eng.finish(); err != nil {
		return fmt.Errorf("memcpy HtoD: %w", err)
	}
	return nil
}

// MemcpyDtoH copies device memory to pageable host memory through the staging buffers.
func (c *Context) MemcpyDtoH(dst []byte, src DevPtr) error {
	n := uint64(len(dst))
	if err := c.checkRange(src, 0, n); err != nil {
		return fmt.Errorf("memcpy DtoH: %w", err)
	}
	if q := c.allocs[src.VA]; q.mapped && n <= SmallCopyMax {
		if err := c.eng.finish(); err != nil { // wait for the work that writes it
			return fmt.Errorf("memcpy DtoH: %w", err)
		}
		c.eng.cpuRead(q, 0, dst)
		return nil
	}
	// Pipeline: DMA chunk k+1 while the CPU copies chunk k out.
	var prev = -1
	var prevOff, prevLen uint64
	for off, i := uint64(0), 0; off < n || prev >= 0; off, i = off+StagingChunk, i^1 {
		if off < n {
			chunk := min(StagingChunk, n-off)
			seq, err := c.copyEngine(c.staging[i].VA, src.VA+off, chunk, src.handle, c.staging[i].handle)
			if err != nil {
				return fmt.Errorf("memcpy DtoH: %w", err)
			}
			c.stagingSeq[i] = seq
		}
		if prev >= 0 {
			if err := c.eng.wait(c.stagingSeq[prev], c.staging[prev].handle); err != nil {
				return fmt.Errorf("memcpy DtoH: %w", err)
			}
			copy(dst[prevOff:prevOff+prevLen], c.staging[prev].Bytes)
			prev = -1
		}
		if off < n {
			prev, prevOff, prevLen = i, off, min(StagingChunk, n-off)
		}
	}
	return nil
}

// MemcpyHtoDPinned DMAs n bytes from pinned host memory to the device.
func (c *Context) MemcpyHtoDPinned(dst DevPtr, src HostBuf, n uint64) error {
	if err := c.checkRange(dst, 0, n); err != nil || n > uint64(len(src.Bytes)) {
		return fmt.Errorf("memcpy HtoD pinned: %d bytes: %w", n, errors.Join(err, errors.New("bad range")))
	}
	if _, err := c.copyEngine(dst.VA, src.VA, n, dst.handle, src.handle); err != nil {
		return fmt.Errorf("memcpy HtoD pinned: %w", err)
	}
	return c.eng.finish()
}

// MemcpyDtoHPinned DMAs n bytes from the device to pinned host memory.
func (c *Context) MemcpyDtoHPinned(dst HostBuf, src DevPtr, n uint64) error {
	if err := c.checkRange(src, 0, n); err != nil || n > uint64(len(dst.Bytes)) {
		return fmt.Errorf("memcpy DtoH pinned: %d bytes: %w", n, errors.Join(err, errors.New("bad range")))
	}
	if _, err := c.copyEngine(dst.VA, src.VA, n, dst.handle, src.handle); err != nil {
		return fmt.Errorf("memcpy DtoH pinned: %w", err)
	}
	return c.eng.finish()
}

// writeObj writes a kernel object: through its BAR1 mapping, or into its
// host memory.
func (c *Context) writeObj(p DevPtr, off uint64, src []byte) {
	if p.host != nil {
		copy(p.host[off:], src)
		return
	}
	c.eng.cpuWrite(p, off, src)
}

// writeAperture writes at off in BAR1 with 32-bit CPU stores (memcpy_toio).
func writeAperture(mmio gpu.MMIO, off uint64, src []byte) {
	var tail [4]byte
	for i := uint64(0); i < uint64(len(src)); i += 4 {
		w := src[i:]
		if len(w) < 4 {
			copy(tail[:], w)
			w = tail[:]
		}
		mmio.Write32(nvc0.BAR1, off+i, binary.LittleEndian.Uint32(w))
	}
}

// readAperture reads at off in BAR1 with 32-bit CPU loads.
func readAperture(mmio gpu.MMIO, off uint64, dst []byte) {
	var w [4]byte
	for i := uint64(0); i < uint64(len(dst)); i += 4 {
		binary.LittleEndian.PutUint32(w[:], mmio.Read32(nvc0.BAR1, off+i))
		copy(dst[i:], w[:])
	}
}

// Function is a kernel of a loaded module.
type Function struct {
	ID      nvc0.KernelID
	startID uint32
}

// LoadFunction places the code object of a built-in kernel in the context's
// code segment (through BAR1) and returns it.
func (c *Context) LoadFunction(id nvc0.KernelID) (Function, error) {
	if id == 0 || uint64(id)*nvc0.KernelObjectSize >= c.code.Size {
		return Function{}, fmt.Errorf("load function: kernel id %d out of range", id)
	}
	start := uint32(id) * nvc0.KernelObjectSize
	obj := make([]byte, nvc0.KernelObjectSize)
	binary.LittleEndian.PutUint32(obj[0:], nvc0.KernelMagic)
	binary.LittleEndian.PutUint32(obj[4:], uint32(id))
	binary.LittleEndian.PutUint32(obj[8:], nvc0.KernelVersion)
	c.writeObj(c.code, uint64(start), obj)
	return Function{ID: id, startID: start}, nil
}

// Launch queues a kernel with its parameters (u64 words: device pointers and
// scalars). It does not wait; Synchronize does.
func (c *Context) Launch(f Function, params ...uint64) error { return c.LaunchRepeat(f, 1, params...) }

// LaunchRepeat queues the kernel times times back to back in one push
// buffer: a single submission that keeps the (non-preemptive) GPU times as
// long — the thesis' "long" workloads. With SetYield on, each launch is
// its own entry of the submission, with a scheduling point between them.
func (c *Context) LaunchRepeat(f Function, times int, params ...uint64) error {
	if times < 1 || times > maxRepeat {
		return fmt.Errorf("launch %v: repeat count %d outside 1..%d", f.ID, times, maxRepeat)
	}
	if len(params)*8 > paramSlot {
		return fmt.Errorf("launch %v: %d parameters exceed %d bytes", f.ID, len(params), paramSlot)
	}
	slot := c.paramNext
	c.paramNext = (c.paramNext + 1) % paramSlots
	if err := c.eng.wait(c.paramSeq[slot], c.params.handle); err != nil {
		return fmt.Errorf("launch %v: %w", f.ID, err)
	}
	buf := make([]byte, len(params)*8)
	for i, p := range params {
		binary.LittleEndian.PutUint64(buf[8*i:], p)
	}
	off := uint64(slot * paramSlot)
	c.writeObj(c.params, off, buf)
	cb := c.params.VA + off
	setup := []uint32{
		nvc0.Incr(nouveau.SubcCompute, nvc0.ComputeMthdCodeAddrHi, 2), uint32(c.code.VA >> 32), uint32(c.code.VA),
		nvc0.Incr(nouveau.SubcCompute, nvc0.ComputeMthdCBSize, 3), uint32(len(buf)), uint32(cb >> 32), uint32(cb),
		nvc0.Incr(nouveau.SubcCompute, nvc0.ComputeMthdStartID, 1), f.startID,
	}
	var seq uint32
	var err error
	if c.yield && times > 1 {
		// One entry per kernel, a scheduling point between them. Each
		// entry sets the kernel up again: another VM's channel may run
		// between two of them.
		// At most yieldChunk kernels a submission, so that a long
		// repeat fits the GPFIFO ring.
		for done := 0; done < times && err == nil; {
			parts := make([][]uint32, min(times-done, yieldChunk))
			for i := range parts {
				parts[i] = append(append([]uint32(nil), setup...), launches(1)...)
			}
			seq, err = c.eng.(yielder).submitYield(parts, c.code.handle, c.params.handle)
			done += len(parts)
		}
	} else {
		seq, err = c.eng.submit(append(setup, launches(times)...), c.code.handle, c.params.handle)
	}
	if err != nil {
		return fmt.Errorf("launch %v: %w", f.ID, err)
	}
	c.paramSeq[slot] = seq
	return nil
}

// maxRepeat bounds LaunchRepeat (one push buffer).
const maxRepeat = 1024

// yieldChunk bounds the kernels of one submission with yield on (one
// GPFIFO entry each).
const yieldChunk = 256

// launches returns times LAUNCH methods.
func launches(times int) []uint32 {
	out := make([]uint32, times)
	for i := range out {
		out[i] = nvc0.Immd(nouveau.SubcCompute, nvc0.ComputeMthdLaunch, 0)
	}
	return out
}

// Synchronize waits for everything queued on the context.
func (c *Context) Synchronize() error {
	if err := c.eng.finish(); err != nil {
		return fmt.Errorf("synchronize: %w", err)
	}
	return nil
}

// Close frees every allocation, the channel and the address space.
func (c *Context) Close() error {
	if c.eng == nil {
		return nil
	}
	errs := []error{c.eng.stop()}
	for _, p := range c.allocs {
		if p.host == nil {
			errs = append(errs, c.eng.freeDevice(p))
		}
	}
	c.allocs = map[uint64]DevPtr{}
	for _, h := range c.hostAllocs {
		errs = append(errs, c.MemFreeHost(h))
	}
	errs = append(errs, c.eng.close())
	c.eng = nil
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close context: %w", err)
	}
	return nil
}
