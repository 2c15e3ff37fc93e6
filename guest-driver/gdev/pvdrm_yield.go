package gdev

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/gpuvm/gpuvm/pvdrm"
)

// Cooperative yield on pvdrm: each part is a PUSHBUF segment flagged
// PushYield but the last (FeatureYield, docs/pvdrm.md), up to
// pvdrm.MaxPushEntries segments a request.

func (e *pvdrmEngine) canYield() bool { return e.c.Features&pvdrm.FeatureYield != 0 }

func (e *pvdrmEngine) submitYield(parts [][]uint32, uses ...uint32) (uint32, error) {
	var total uint64
	for _, p := range parts {
		if len(p) == 0 {
			return 0, fmt.Errorf("submit of an empty part")
		}
		total += uint64(len(p)) * 4
	}
	if len(parts) == 0 || total > pushBufferSize {
		return 0, fmt.Errorf("submit of %d parts, %d bytes: bad length", len(parts), total)
	}
	if e.pushHead+total > pushBufferSize {
		// Wrap: everything written before must have run.
		if err := e.finish(); err != nil {
			return 0, err
		}
		e.pushHead = 0
	}
	segs := make([]pvdrm.PushEntry, len(parts))
	for i, p := range parts {
		off := e.pushHead
		for j, w := range p {
			binary.LittleEndian.PutUint32(e.push.Bytes[off+uint64(4*j):], w)
		}
		n := uint64(len(p)) * 4
		e.pushHead += n
		segs[i] = pvdrm.PushEntry{Handle: e.push.handle, Offset: uint32(off), Length: uint32(n)}
		if i < len(parts)-1 {
			segs[i].Flags = pvdrm.PushYield
		}
	}
	bufs := []uint32{e.push.handle}
	for _, h := range uses {
		if h != 0 && !slices.Contains(bufs, h) {
			bufs = append(bufs, h)
		}
	}
	var seq uint32
	for len(segs) > 0 {
		n := min(len(segs), pvdrm.MaxPushEntries)
		rsp, err := e.c.Do(context.Background(), pvdrm.Request{Op: pvdrm.OpPushbuf, File: e.file,
			Args: map[string]uint64{"channel": uint64(e.ch)}, Buffers: bufs, Push: segs[:n]})
		if err != nil {
			return 0, err
		}
		seq = uint32(rsp.Results["fence"])
		segs = segs[n:]
	}
	for _, h := range bufs {
		e.lastUse[h] = seq
	}
	e.last = seq
	return seq, nil
}
