package aggregator

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"time"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
	"github.com/gpuvm/gpuvm/pvdrm"
)

// pvFile is one DRM file of a pvdrm VM: its own GPU address space, its
// channels and its buffers, named by handles only this file can use.
type pvFile struct {
	id       uint32
	vm       *nouveau.VM
	chans    map[uint32]*pvChan
	gems     map[uint32]*gemObject
	zombies  []*gemObject // closed while the GPU still used them
	nextChan uint32
	nextGEM  uint32
}

// pvChan is a channel of a file.
type pvChan struct {
	ch    *nouveau.Channel
	freed atomic.Bool // stopped: nothing of it runs any more
	last  uint32      // the fence of its last submission (0: none)
}

// done reports whether fence seq passed on c (or c stopped, so nothing
// of it runs).
func (c *pvChan) done(seq uint32) bool { return c.freed.Load() || c.ch.Done(seq) }

// gemObject is a buffer: VRAM of the VM's slice, or pages of the guest's
// GART heap, mapped at va in its file's address space.
type gemObject struct {
	domain uint32
	flags  uint32
	size   uint64
	va     uint64
	vram   uint64 // DomainVRAM: its VRAM address
	gart   uint64 // DomainGART: its offset in the GART heap
	shared bool   // its pages were shared with the guest (GEM_MMAP)
	busy   map[*pvChan]uint32
}

// idle reports whether the GPU is done with every submission that used g.
func (g *gemObject) idle() bool {
	for c, seq := range g.busy {
		if !c.done(seq) {
			return false
		}
		delete(g.busy, c)
	}
	return true
}

// pvdrmOp handles one decoded request of a HELLO'd front end; it returns
// the results or a negative errno.
type pvdrmOp func(b *PVDRMBackend, ctx context.Context, f *pvFile, r pvdrm.Request) (map[string]uint64, int32)

// pvdrmOps is the back end's table of operations (HELLO is handled before
// it; CPU_PREP may answer later, from a waiter).
func pvdrmOps() map[pvdrm.Op]pvdrmOp {
	return map[pvdrm.Op]pvdrmOp{
		pvdrm.OpOpen:         (*PVDRMBackend).opOpen,
		pvdrm.OpClose:        (*PVDRMBackend).opClose,
		pvdrm.OpGetParam:     (*PVDRMBackend).opGetParam,
		pvdrm.OpChannelAlloc: (*PVDRMBackend).opChannelAlloc,
		pvdrm.OpChannelFree:  (*PVDRMBackend).opChannelFree,
		pvdrm.OpGEMNew:       (*PVDRMBackend).opGEMNew,
		pvdrm.OpGEMInfo:      (*PVDRMBackend).opGEMInfo,
		pvdrm.OpGEMClose:     (*PVDRMBackend).opGEMClose,
		pvdrm.OpGEMMmap:      (*PVDRMBackend).opGEMMmap,
		pvdrm.OpPushbuf:      (*PVDRMBackend).opPushbuf,
		pvdrm.OpCPUFini:      (*PVDRMBackend).opCPUFini,
	}
}

// handle decodes one request (a private copy of the slot) and answers it.
func (b *PVDRMBackend) handle(ctx context.Context, slot []byte) {
	r, status := b.codec.Decode(slot)
	rsp := pvdrm.Response{ID: r.ID, Op: r.Op, Status: status}
	if status != 0 {
		b.respond(rsp)
		return
	}
	if r.Op == pvdrm.OpHello {
		rsp.Results, rsp.Status = b.opHello(r)
		b.respond(rsp)
		return
	}
	if !b.hello {
		rsp.Status = -pvdrm.EPROTO
		b.respond(rsp)
		return
	}
	var f *pvFile
	if r.File != 0 {
		if f = b.files[r.File]; f == nil {
			rsp.Status = -pvdrm.EBADF
			b.respond(rsp)
			return
		}
	}
	if r.Op == pvdrm.OpCPUPrep {
		b.cpuPrep(ctx, f, r)
		return
	}
	rsp.Results, rsp.Status = b.ops[r.Op](b, ctx, f, r)
	b.respond(rsp)
}

func (b *PVDRMBackend) opHello(r pvdrm.Request) (map[string]uint64, int32) {
	if b.hello || r.Args["version"] == 0 {
		return nil, -pvdrm.EPROTO
	}
	b.hello = true
	var offer uint64
	if b.pooling {
		offer |= pvdrm.FeaturePooling
	}
	offer |= pvdrm.FeatureYield // the back end's driver declares points (PV)
	b.features = r.Args["features"] & offer
	return map[string]uint64{"version": min(r.Args["version"], pvdrm.Version), "max_files": pvdrmMaxFiles, "features": b.features}, 0
}

func (b *PVDRMBackend) opOpen(_ context.Context, _ *pvFile, _ pvdrm.Request) (map[string]uint64, int32) {
	f, status := b.openFile(0)
	if status != 0 {
		return nil, status
	}
	return map[string]uint64{"file": uint64(f.id)}, 0
}

// openFile opens a DRM file — OPEN's path, with its bound — as id, or
// (id 0) as the next free id.
func (b *PVDRMBackend) openFile(id uint32) (*pvFile, int32) {
	if len(b.files) >= pvdrmMaxFiles {
		return nil, -pvdrm.ENOSPC
	}
	if _, taken := b.files[id]; taken {
		return nil, -pvdrm.EINVAL
	}
	vm, err := b.dev.NewVM()
	if err != nil {
		b.v.gripeLog("pvdrm open", "err", err)
		return nil, -pvdrm.ENOMEM
	}
	for id == 0 {
		b.nextFile++
		if _, taken := b.files[b.nextFile]; b.nextFile != 0 && !taken {
			id = b.nextFile
		}
	}
	f := &pvFile{id: id, vm: vm, chans: map[uint32]*pvChan{}, gems: map[uint32]*gemObject{}}
	b.files[f.id] = f
	return f, 0
}

func (b *PVDRMBackend) opClose(_ context.Context, f *pvFile, _ pvdrm.Request) (map[string]uint64, int32) {
	delete(b.files, f.id)
	if err := b.closeFile(f); err != nil {
		b.v.gripeLog("pvdrm close", "err", err)
		return nil, -pvdrm.EIO
	}
	return nil, 0
}

// closeFile stops the file's channels (so the GPU uses none of its
// buffers), then frees its buffers and its address space.
func (b *PVDRMBackend) closeFile(f *pvFile) error {
	var errs []error
	for h, c := range f.chans {
		errs = append(errs, b.freeChannel(c))
		delete(f.chans, h)
	}
	for h, g := range f.gems {
		errs = append(errs, b.release(f, g))
		delete(f.gems, h)
	}
	for _, g := range f.zombies {
		errs = append(errs, b.release(f, g))
	}
	f.zombies = nil
	errs = append(errs, f.vm.Close())
	return errors.Join(errs...)
}

// freeChannel stops and frees a channel. It is marked freed first: a
// waiter then stops waiting for it (nothing of it will run; the buffers
// it used are freed only by this goroutine, after the stop).
func (b *PVDRMBackend) freeChannel(c *pvChan) error {
	c.freed.Store(true)
	b.wake.broadcast() // its waiters answer now
	return c.ch.Close()
}

func (b *PVDRMBackend) opGetParam(_ context.Context, _ *pvFile, r pvdrm.Request) (map[string]uint64, int32) {
	var v uint64
	switch r.Args["param"] {
	case pvdrm.ParamChipset:
		v = nvc0.ChipsetGF100
	case pvdrm.ParamVRAMSize:
		v = b.vramSize
	case pvdrm.ParamChannels:
		v = uint64(b.chans)
	case pvdrm.ParamVABits:
		v = nvc0.VABits
	default:
		return nil, -pvdrm.EINVAL
	}
	return map[string]uint64{"value": v}, 0
}

func (b *PVDRMBackend) opChannelAlloc(_ context.Context, f *pvFile, _ pvdrm.Request) (map[string]uint64, int32) {
	h, status := b.newChannel(f, 0)
	if status != 0 {
		return nil, status
	}
	return map[string]uint64{"channel": uint64(h)}, 0
}

// newChannel creates a channel of f — CHANNEL_ALLOC's path, bounded by the
// VM's channel quota — as handle h, or (h 0) as the next handle.
func (b *PVDRMBackend) newChannel(f *pvFile, h uint32) (uint32, int32) {
	if h != 0 && f.chans[h] != nil {
		return 0, -pvdrm.EINVAL
	}
	ch, err := b.dev.NewChannel(f.vm)
	if err != nil {
		if errors.Is(err, nouveau.ErrNoChannel) {
			return 0, -pvdrm.ENOSPC // the VM's channel quota
		}
		b.v.gripeLog("pvdrm channel alloc", "err", err)
		return 0, -pvdrm.EIO
	}
	for h == 0 {
		f.nextChan++
		if f.nextChan != 0 && f.chans[f.nextChan] == nil {
			h = f.nextChan
		}
	}
	f.chans[h] = &pvChan{ch: ch}
	return h, 0
}

func (b *PVDRMBackend) opChannelFree(_ context.Context, f *pvFile, r pvdrm.Request) (map[string]uint64, int32) {
	h := uint32(r.Args["channel"])
	c := f.chans[h]
	if c == nil {
		return nil, -pvdrm.ENOENT
	}
	delete(f.chans, h)
	if err := b.freeChannel(c); err != nil {
		b.v.gripeLog("pvdrm channel free", "err", err)
		return nil, -pvdrm.EIO
	}
	return nil, 0
}

// opPushbuf submits push segments held in the file's own buffers. Every
// handle is checked against the file (one copy of the request, already
// taken off the ring); the GPU then runs the segments in the file's
// address space, where nothing but the file's buffers is mapped.
func (b *PVDRMBackend) opPushbuf(_ context.Context, f *pvFile, r pvdrm.Request) (map[string]uint64, int32) {
	c := f.chans[uint32(r.Args["channel"])]
	if c == nil {
		return nil, -pvdrm.ENOENT
	}
	used := make([]*gemObject, 0, len(r.Buffers))
	for _, h := range r.Buffers {
		g := f.gems[h]
		if g == nil {
			return nil, -pvdrm.ENOENT
		}
		used = append(used, g)
	}
	segs := make([]nouveau.Segment, 0, len(r.Push))
	points := make([]bool, 0, len(r.Push))
	for _, p := range r.Push {
		if p.Flags&pvdrm.PushYield != 0 && b.features&pvdrm.FeatureYield == 0 {
			return nil, -pvdrm.EINVAL // a scheduling point the file was not granted
		}
		points = append(points, p.Flags&pvdrm.PushYield != 0)
		g := f.gems[p.Handle]
		if g == nil || !slices.Contains(r.Buffers, p.Handle) {
			return nil, -pvdrm.EINVAL // every segment's buffer must be listed
		}
		end := uint64(p.Offset) + uint64(p.Length)
		if p.Length == 0 || p.Offset%4 != 0 || p.Length%4 != 0 || end > g.size || p.Length/4 > nvc0.MaxPushBufferWords {
			return nil, -pvdrm.EINVAL
		}
		segs = append(segs, nouveau.Segment{VA: g.va + uint64(p.Offset), Words: p.Length / 4})
	}
	if err := c.ch.Fault(); err != nil {
		return nil, -pvdrm.EIO
	}
	seq, err := c.ch.SubmitSegmentsYield(segs, points)
	if err != nil {
		b.v.gripeLog("pvdrm pushbuf", "err", err)
		if seq == 0 {
			return nil, -pvdrm.EIO
		}
		// Submitted without its points: the work runs, unsplit.
	}
	c.last = seq
	for _, g := range used {
		if g.busy == nil {
			g.busy = map[*pvChan]uint32{}
		}
		g.busy[c] = seq
	}
	return map[string]uint64{"fence": uint64(seq)}, 0
}

// cpuPrep answers CPU_PREP: at once when the buffer is idle or the front
// end would not wait, else from a waiter goroutine that blocks until the
// buffer's work ends (await; at most one waiter per ring slot, since each
// holds an unanswered request).
func (b *PVDRMBackend) cpuPrep(ctx context.Context, f *pvFile, r pvdrm.Request) {
	rsp := pvdrm.Response{ID: r.ID, Op: r.Op}
	g := f.gems[uint32(r.Args["handle"])]
	switch {
	case g == nil:
		rsp.Status = -pvdrm.ENOENT
	case g.idle():
	case r.Args["timeout_ns"] == 0:
		rsp.Status = -pvdrm.EBUSY
	default:
		ws := make([]fenceWait, 0, len(g.busy)) // at most the file's channels
		for c, seq := range g.busy {
			ws = append(ws, fenceWait{c, seq})
		}
		deadline := time.Now().Add(time.Duration(min(r.Args["timeout_ns"], uint64(pvdrmMaxWait))))
		b.waiters.Add(1)
		go func() {
			defer b.waiters.Done()
			var answer bool
			if rsp.Status, answer = b.await(ctx, ws, deadline); answer {
				b.respond(rsp)
			}
		}()
		return
	}
	b.respond(rsp)
}

func (b *PVDRMBackend) opCPUFini(_ context.Context, f *pvFile, r pvdrm.Request) (map[string]uint64, int32) {
	if f.gems[uint32(r.Args["handle"])] == nil {
		return nil, -pvdrm.ENOENT
	}
	return nil, 0
}
