package gdev

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
	"github.com/gpuvm/gpuvm/pvdrm"
)

// pushBufferSize is the GART buffer each pvdrm context writes its push
// buffers into (libdrm_nouveau's pushbuf is a ring of such buffers).
const pushBufferSize = 1 << 20

// waitTimeout bounds a CPU_PREP wait.
const waitTimeout = 10 * time.Second

// PVDRM returns the Driver of a pvdrm front end: each Context is a DRM
// file with one channel; shares maps the buffers GEM_MMAP shares.
func PVDRM(c *pvdrm.Client, shares pvdrm.Shares) Driver { return pvdrmDriver{c, shares} }

type pvdrmDriver struct {
	c  *pvdrm.Client
	sh pvdrm.Shares
}

func (d pvdrmDriver) open() (engine, error) {
	e := &pvdrmEngine{c: d.c, sh: d.sh, lastUse: map[uint32]uint32{}, maps: map[uint32][]byte{}}
	rsp, err := e.do(pvdrm.OpOpen, 0, nil)
	if err != nil {
		return nil, err
	}
	e.file = uint32(rsp.Results["file"])
	if rsp, err = e.do(pvdrm.OpChannelAlloc, e.file, nil); err != nil {
		return nil, errors.Join(err, e.close())
	}
	e.ch = uint32(rsp.Results["channel"])
	if e.push, err = e.allocHost(pushBufferSize); err != nil {
		return nil, errors.Join(err, e.stop(), e.close())
	}
	return e, nil
}

// pvdrmEngine drives a DRM file through the front end: no registers, only
// requests on the ring.
type pvdrmEngine struct {
	c    *pvdrm.Client
	sh   pvdrm.Shares
	file uint32
	ch   uint32

	push     HostBuf
	pushHead uint64
	lastUse  map[uint32]uint32 // handle → the last fence of work that used it
	last     uint32            // the last fence submitted
	done     uint32            // every fence up to here has passed
	maps     map[uint32][]byte // handle → the front end's mapping of its pages
}

func (e *pvdrmEngine) do(op pvdrm.Op, file uint32, args map[string]uint64) (pvdrm.Response, error) {
	return e.c.Do(context.Background(), pvdrm.Request{Op: op, File: file, Args: args})
}

func (e *pvdrmEngine) allocDevice(size uint64, _ bool) (DevPtr, error) {
	rsp, err := e.do(pvdrm.OpGEMNew, e.file, map[string]uint64{"size": size, "domain": pvdrm.DomainVRAM})
	if err != nil {
		return DevPtr{}, err
	}
	return DevPtr{VA: rsp.Results["gpu_va"], Size: size, handle: uint32(rsp.Results["handle"])}, nil
}

func (e *pvdrmEngine) freeDevice(p DevPtr) error {
	delete(e.lastUse, p.handle)
	_, err := e.do(pvdrm.OpGEMClose, e.file, map[string]uint64{"handle": uint64(p.handle)})
	return err
}

func (e *pvdrmEngine) allocHost(size uint64) (HostBuf, error) {
	rsp, err := e.do(pvdrm.OpGEMNew, e.file, map[string]uint64{"size": size, "domain": pvdrm.DomainGART, "flags": pvdrm.GEMMappable})
	if err != nil {
		return HostBuf{}, err
	}
	h := uint32(rsp.Results["handle"])
	va := rsp.Results["gpu_va"]
	fail := func(err error) (HostBuf, error) {
		_, cerr := e.do(pvdrm.OpGEMClose, e.file, map[string]uint64{"handle": uint64(h)})
		return HostBuf{}, errors.Join(err, cerr)
	}
	if rsp, err = e.do(pvdrm.OpGEMMmap, e.file, map[string]uint64{"handle": uint64(h)}); err != nil {
		return fail(err)
	}
	b, err := e.sh.Map(uint32(rsp.Results["share"]), uint32(rsp.Results["pages"]), rsp.Results["offset"])
	if err != nil {
		return fail(err)
	}
	if uint64(len(b)) < size {
		return fail(errors.Join(fmt.Errorf("pvdrm: %d bytes shared for a %d-byte buffer", len(b), size), e.sh.Unmap(b)))
	}
	e.maps[h] = b
	return HostBuf{Bytes: b[:size], VA: va, handle: h}, nil
}

func (e *pvdrmEngine) freeHost(h HostBuf) error {
	var errs []error
	if b, ok := e.maps[h.handle]; ok {
		delete(e.maps, h.handle)
		errs = append(errs, e.sh.Unmap(b))
	}
	delete(e.lastUse, h.handle)
	_, err := e.do(pvdrm.OpGEMClose, e.file, map[string]uint64{"handle": uint64(h.handle)})
	return errors.Join(append(errs, err)...)
}

// The guest has no BAR: device memory is never CPU-mapped.
func (e *pvdrmEngine) cpuAccess() bool                 { return false }
func (e *pvdrmEngine) cpuWrite(DevPtr, uint64, []byte) {}
func (e *pvdrmEngine) cpuRead(DevPtr, uint64, []byte)  {}
func (e *pvdrmEngine) channel() *nouveau.Channel       { return nil }

// after reports whether fence a comes after fence b (sequence numbers wrap).
func after(a, b uint32) bool { return int32(a-b) > 0 }

func (e *pvdrmEngine) passed(seq uint32) bool { return !after(seq, e.done) }

func (e *pvdrmEngine) note(seq uint32) {
	if after(seq, e.done) {
		e.done = seq
	}
}

// prep waits until the GPU is done with buffer h (CPU_PREP).
func (e *pvdrmEngine) prep(h uint32) error {
	_, err := e.do(pvdrm.OpCPUPrep, e.file, map[string]uint64{"handle": uint64(h), "timeout_ns": uint64(waitTimeout)})
	return err
}

// submit writes words into the push buffer and submits them with the
// buffers they use (PUSHBUF), returning the fence.
func (e *pvdrmEngine) submit(words []uint32, uses ...uint32) (uint32, error) {
	n := uint64(len(words)) * 4
	if n == 0 || n > pushBufferSize {
		return 0, fmt.Errorf("submit of %d words: bad length", len(words))
	}
	if e.pushHead+n > pushBufferSize {
		// Wrap: everything written before must have run.
		if err := e.finish(); err != nil {
			return 0, err
		}
		e.pushHead = 0
	}
	off := e.pushHead
	for i, w := range words {
		binary.LittleEndian.PutUint32(e.push.Bytes[off+uint64(4*i):], w)
	}
	e.pushHead += n
	bufs := []uint32{e.push.handle}
	for _, h := range uses {
		if h != 0 && !slices.Contains(bufs, h) {
			bufs = append(bufs, h)
		}
	}
	rsp, err := e.c.Do(context.Background(), pvdrm.Request{Op: pvdrm.OpPushbuf, File: e.file,
		Args:    map[string]uint64{"channel": uint64(e.ch)},
		Buffers: bufs, Push: []pvdrm.PushEntry{{Handle: e.push.handle, Offset: uint32(off), Length: uint32(n)}}})
	if err != nil {
		return 0, err
	}
	seq := uint32(rsp.Results["fence"])
	for _, h := range bufs {
		e.lastUse[h] = seq
	}
	e.last = seq
	return seq, nil
}

// wait waits for fence seq by waiting for a buffer the fenced work used
// (CPU_PREP): once it is idle, every fence up to its last use has passed.
func (e *pvdrmEngine) wait(seq uint32, on uint32) error {
	if e.passed(seq) {
		return nil
	}
	if last, ok := e.lastUse[on]; ok && !after(seq, last) {
		if err := e.prep(on); err != nil {
			return err
		}
		e.note(last)
		return nil
	}
	return e.finish()
}

// finish waits for everything: the push buffer is used by every submission.
func (e *pvdrmEngine) finish() error {
	if e.passed(e.last) {
		return nil
	}
	if err := e.prep(e.push.handle); err != nil {
		return err
	}
	e.note(e.last)
	return nil
}

func (e *pvdrmEngine) stop() error {
	if e.ch == 0 {
		return nil
	}
	_, err := e.do(pvdrm.OpChannelFree, e.file, map[string]uint64{"channel": uint64(e.ch)})
	e.ch = 0
	e.done = e.last // the channel is stopped: nothing of it runs
	return err
}

// close unmaps what the front end still maps and closes the file, which
// frees every buffer it holds.
func (e *pvdrmEngine) close() error {
	var errs []error
	for h, b := range e.maps {
		errs = append(errs, e.sh.Unmap(b))
		delete(e.maps, h)
	}
	if e.file != 0 {
		_, err := e.do(pvdrm.OpClose, e.file, nil)
		errs = append(errs, err)
		e.file = 0
	}
	return errors.Join(errs...)
}
