package sim

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/gpu"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// Moving a channel's state between boards (docs/design.md, "Moving a
// vGPU"). A GF100 keeps a channel's PFIFO state in RAMFC (part of its
// instance block: GP_GET, the push-buffer fetch address, the subchannel
// bindings) and each engine's method state in the context image that a
// preemption saves; a move copies both. The board keeps the same state in
// its channel structure, so SaveChannelState exports it as an image (the
// analogue of reading RAMFC and the engine contexts of a stopped channel)
// and RestoreChannelState loads it into a channel just enabled and not yet
// given work (the analogue of writing them before the channel is
// scheduled). The image's layout is the board's own: only a board of the
// same kind reads it.

// chanImageWords is the length of a channel state image: version, flags,
// GP_GET, DMA_GET (lo, hi), reference, the subchannel bindings, the
// semaphore, compute and copy method state.
const chanImageWords = 6 + nvc0.NumSubchannels + 3 + 7 + nvc0.NumCopyEngines*8

const (
	chanImageVersion = 1
	chanImageBound   = 1 << 0 // the channel ran since it was enabled: method state present
	chanImageStopped = 1 << 1 // stopped on an error: fetches nothing more
)

// ErrChannelBusy is returned when a channel's state is saved while it runs
// or has work pending, or restored into one that is not freshly enabled.
var ErrChannelBusy = errors.New("sim: channel is not idle")

// SaveChannelState returns the state image of channel ch, which must be
// idle: disabled (or preempted) with no run in progress, and no work
// pending unless it is disabled. Whatever the board would keep in RAMFC and the engine context
// images is in it.
func (b *Board) SaveChannelState(ch int) ([]uint32, error) {
	if !b.enter() {
		return nil, errClosed
	}
	defer b.leave()
	if b.busLost.Load() {
		return nil, ErrBusLost
	}
	if ch < 0 || ch >= len(b.chans) {
		return nil, fmt.Errorf("sim: save channel %d: no such channel", ch)
	}
	c := b.chans[ch]
	c.mu.Lock()
	defer c.mu.Unlock()
	// A disabled channel whose doorbell came after its stop (a guest that
	// rings through a passed-through user-area page, as a hostile one may
	// at any moment) holds work not yet fetched, not work in progress:
	// GP_GET in the image says where the GPU stopped, and the host rings
	// again after the restore for the entries its guest put past it.
	enabled := c.ctl&nvc0.ChanCtlEnable != 0
	if c.running || c.preempting || (c.pending && enabled) {
		return nil, fmt.Errorf("sim: save channel %d: %w", ch, ErrChannelBusy)
	}
	img := make([]uint32, 0, chanImageWords)
	var flags uint32
	bound := c.stateEpoch == c.epoch
	if bound {
		flags |= chanImageBound
	}
	if c.stopped {
		flags |= chanImageStopped
	}
	var dmaLo, dmaHi, ref uint32
	if c.inst&nvc0.ChanInstValid != 0 {
		if user, ok := b.userArea(nvc0.InstDecode(c.inst)); ok {
			dmaLo, _ = b.physRead32(phys{addr: user + nvc0.UserDMAGet})
			dmaHi, _ = b.physRead32(phys{addr: user + nvc0.UserDMAGetHi})
			ref, _ = b.physRead32(phys{addr: user + nvc0.UserRef})
		}
	}
	img = append(img, chanImageVersion, flags, c.gpGet, dmaLo, dmaHi, ref)
	var subc [nvc0.NumSubchannels]uint32
	sem, compute := semState{}, computeState{}
	cp := [nvc0.NumCopyEngines]copyState{}
	if bound {
		subc, sem, compute, cp = c.subc, c.sem, c.compute, c.copy
	}
	img = append(img, subc[:]...)
	img = append(img, sem.addrHi, sem.addrLo, sem.payload)
	img = append(img, compute.words()...)
	for i := range cp {
		img = append(img, cp[i].words()...)
	}
	if len(img) != chanImageWords {
		return nil, fmt.Errorf("sim: save channel %d: image of %d words, want %d", ch, len(img), chanImageWords)
	}
	return img, nil
}

// RestoreChannelState loads a state image SaveChannelState made into
// channel ch, which must be enabled with a valid instance and not yet have
// been given work (no doorbell since it was enabled, no run). GP_GET, the
// push-buffer fetch address and the reference are written to the user area
// its RAMIN names, as the GPU publishes them; the next run continues the
// ring at GP_GET with the restored bindings and method state.
func (b *Board) RestoreChannelState(ch int, img []uint32) error {
	if !b.enter() {
		return errClosed
	}
	defer b.leave()
	if b.busLost.Load() {
		return ErrBusLost
	}
	if ch < 0 || ch >= len(b.chans) {
		return fmt.Errorf("sim: restore channel %d: no such channel", ch)
	}
	if len(img) != chanImageWords || img[0] != chanImageVersion {
		return fmt.Errorf("sim: restore channel %d: not a channel state image (%d words)", ch, len(img))
	}
	c := b.chans[ch]
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running || c.preempting || c.pending || c.stateEpoch == c.epoch ||
		c.ctl&nvc0.ChanCtlEnable == 0 || c.inst&nvc0.ChanInstValid == 0 {
		return fmt.Errorf("sim: restore channel %d: %w", ch, ErrChannelBusy)
	}
	user, ok := b.userArea(nvc0.InstDecode(c.inst))
	if !ok {
		return fmt.Errorf("sim: restore channel %d: its user area is not in VRAM", ch)
	}
	ramin := nvc0.InstDecode(c.inst)
	if _, entries := nvc0.GPFIFODecode(b.vramRead32(ramin+nvc0.RAMINGPFIFOLo), b.vramRead32(ramin+nvc0.RAMINGPFIFOHi)); img[2] >= entries {
		// The GPU never leaves GP_GET past its ring: the image is not one
		// of this channel's.
		return fmt.Errorf("sim: restore channel %d: GP_GET %d is past its ring of %d entries", ch, img[2], entries)
	}
	flags, w := img[1], img[6:]
	c.gpGet = img[2]
	if flags&chanImageBound != 0 {
		// The next run finds its epoch's state in place instead of clearing it.
		c.stateEpoch = c.epoch
		copy(c.subc[:], w[:nvc0.NumSubchannels])
		w = w[nvc0.NumSubchannels:]
		c.sem = semState{addrHi: w[0], addrLo: w[1], payload: w[2]}
		w = w[3:]
		c.compute = computeState{codeHi: w[0], codeLo: w[1], cbSize: w[2], cbHi: w[3], cbLo: w[4], startID: w[5], gridX: w[6]}
		w = w[7:]
		for i := range c.copy {
			c.copy[i] = copyState{srcHi: w[0], srcLo: w[1], dstHi: w[2], dstLo: w[3], srcPitch: w[4], dstPitch: w[5], xCount: w[6], yCount: w[7]}
			w = w[8:]
		}
	}
	c.stopped = flags&chanImageStopped != 0
	b.physWrite32(phys{addr: user + nvc0.UserDMAGet}, img[3])
	b.physWrite32(phys{addr: user + nvc0.UserDMAGetHi}, img[4])
	b.physWrite32(phys{addr: user + nvc0.UserRef}, img[5])
	b.physWrite32(phys{addr: user + nvc0.UserGPGet}, img[2])
	return nil
}

// VRAMResidentRanges lists the ranges of VRAM [base, base+size) that hold
// pages (SEEK_DATA/SEEK_HOLE on the memfds behind it): what was written
// there since it was last scrubbed or renewed. Everything outside them
// reads zeros. Addresses are the board's; ranges are page-granular.
func (b *Board) VRAMResidentRanges(base, size uint64) ([]gpu.Range, error) {
	if !b.vram.inRange(base, size) {
		return nil, fmt.Errorf("sim: VRAM [%#x, +%#x): beyond %#x", base, size, b.cfg.VRAMSize)
	}
	b.vram.mu.Lock()
	defer b.vram.mu.Unlock()
	var out []gpu.Range
	end := base + size
	for _, s := range b.vram.segs {
		lo, hi := max(base, s.base), min(end, s.base+s.size)
		if lo >= hi {
			continue
		}
		for off := int64(lo - s.base); off < int64(hi-s.base); {
			data, err := unix.Seek(s.fd, off, unix.SEEK_DATA)
			if errors.Is(err, unix.ENXIO) {
				break // no data past off
			}
			if err != nil {
				// No SEEK_DATA here: all of it may be in use.
				out = append(out, gpu.Range{Base: s.base + uint64(off), Size: hi - s.base - uint64(off)})
				break
			}
			if data >= int64(hi-s.base) {
				break
			}
			hole, err := unix.Seek(s.fd, data, unix.SEEK_HOLE)
			if err != nil {
				hole = int64(hi - s.base)
			}
			hole = min(hole, int64(hi-s.base))
			out = append(out, gpu.Range{Base: s.base + uint64(data), Size: uint64(hole - data)})
			off = hole
		}
	}
	return out, nil
}

// ExportVRAM copies VRAM at off into p as the copy engine moves VRAM to
// host memory: at the bus DMA rate (Timing.DMABytesPerSec), not at the
// uncached-BAR rate ReadVRAM charges. A move of a vGPU uses it.
func (b *Board) ExportVRAM(p []byte, off uint64) error {
	return b.dmaVRAM(p, off, false)
}

// ImportVRAM copies p into VRAM at off as the copy engine moves host
// memory to VRAM, at the bus DMA rate.
func (b *Board) ImportVRAM(p []byte, off uint64) error {
	return b.dmaVRAM(p, off, true)
}

func (b *Board) dmaVRAM(p []byte, off uint64, write bool) error {
	if !b.enter() {
		return errClosed
	}
	defer b.leave()
	if b.busLost.Load() {
		return ErrBusLost
	}
	defer b.chargeFrom(time.Now(), int64(perSec(uint64(len(p)), b.timing.DMABytesPerSec)))
	if !b.vram.inRange(off, uint64(len(p))) {
		return fmt.Errorf("sim: DMA VRAM [%#x, +%#x): beyond %#x", off, len(p), b.cfg.VRAMSize)
	}
	if write {
		copy(b.vram.mem[off:], p)
	} else {
		copy(p, b.vram.mem[off:])
	}
	return nil
}
