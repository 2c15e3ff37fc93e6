package aggregator

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpuvm/gpuvm/gpu/hwseq"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/internal/rangealloc"
)

// physBAR is one of the physical BAR address spaces the aggregator owns:
// RAMIN, page directory and the one small-page table covering the aperture.
type physBAR struct {
	ramin, pd, pt uint64
}

// physical is the aggregator acting as the host driver of the board: its own
// structures live in the reserved VRAM, written host-side; register sequences
// that involve several registers run under one lock.
type physical struct {
	gpu     HostGPU
	layout  Layout
	reserve *rangealloc.Allocator // reserved VRAM: BAR tables, playlists, shadows
	timeout time.Duration

	bar1, bar3 physBAR
	playlist   [2]uint64

	mu     sync.Mutex // serialises multi-register sequences and the fields below
	plCur  int
	active map[int]bool // physical channels on the playlist

	// preemptMu serialises preempts (RegPreempt is one register for the
	// board). It is held across the wait for a preempt to complete, so it
	// is a lock of its own: TLB flushes and playlist updates, which every
	// VM's doorbells need, never wait behind a preempt.
	preemptMu sync.Mutex

	// lost: the board stopped answering (health.go); sequences that wait
	// for it fail at once.
	lost atomic.Bool
}

func newPhysical(g HostGPU, l Layout, timeout time.Duration) (*physical, error) {
	p := &physical{gpu: g, layout: l, timeout: timeout, reserve: rangealloc.New(l.Reserved.Base, l.Reserved.Size), active: map[int]bool{}}
	return p, p.program()
}

// program brings up the aggregator's own structures on a board fresh from
// power-on, with p's reserve empty: the reserve scrubbed, the BAR1 and BAR3
// tables and the playlists allocated, the registers that name them set.
func (p *physical) program() error {
	g, l := p.gpu, p.layout
	if err := g.ScrubVRAM(l.Reserved.Base, l.Reserved.Size); err != nil {
		return fmt.Errorf("scrub reserved VRAM: %w", err)
	}
	var err error
	if p.bar3, err = p.newBAR(nvc0.BAR3Size); err != nil {
		return fmt.Errorf("BAR3: %w", err)
	}
	if p.bar1, err = p.newBAR(nvc0.BAR1Size); err != nil {
		return fmt.Errorf("BAR1: %w", err)
	}
	for i := range p.playlist {
		if p.playlist[i], err = p.alloc(nvc0.PageSize); err != nil {
			return fmt.Errorf("playlist: %w", err)
		}
	}
	g.Write32(nvc0.BAR0, nvc0.RegPMCEnable, nvc0.PMCEnableAll)
	g.Write32(nvc0.BAR0, nvc0.RegBAR3Inst, nvc0.InstEncode(p.bar3.ramin, nvc0.BARInstModeVM))
	g.Write32(nvc0.BAR0, nvc0.RegBAR1Inst, nvc0.InstEncode(p.bar1.ramin, nvc0.BARInstModeVM))
	g.Write32(nvc0.BAR0, nvc0.RegPollArea, nvc0.PollAreaEnable|uint32(l.PollArea.Base>>nvc0.PageShift))
	if err := p.flush(p.bar3.pd, true); err != nil {
		return err
	}
	return p.flush(p.bar1.pd, true)
}

// reinit brings p up again on its board back from falling off the bus
// (health.go): whatever p's reserve held went with the board, so it starts
// empty; no channel is on the playlist. Nothing else may use p meanwhile
// (the board is lost until it returns: no vGPU is resident).
func (p *physical) reinit() error {
	p.mu.Lock()
	p.reserve = rangealloc.New(p.layout.Reserved.Base, p.layout.Reserved.Size)
	p.active, p.plCur = map[int]bool{}, 0
	p.mu.Unlock()
	p.lost.Store(false)
	if err := p.program(); err != nil {
		p.lost.Store(true)
		return err
	}
	return nil
}

// alloc takes zeroed, page-aligned reserved VRAM (the reserve was scrubbed at
// start and every free scrubs).
func (p *physical) alloc(size uint64) (uint64, error) {
	return p.reserve.Alloc(size, nvc0.PageSize)
}

func (p *physical) free(addr uint64) error {
	size, ok := p.reserve.SizeOf(addr)
	if !ok {
		return fmt.Errorf("free reserved %#x: not allocated", addr)
	}
	if err := p.gpu.ScrubVRAM(addr, size); err != nil {
		return err
	}
	return p.reserve.Free(addr)
}

func (p *physical) newBAR(size uint64) (physBAR, error) {
	var b physBAR
	var err error
	if b.ramin, err = p.alloc(nvc0.RAMINSize); err != nil {
		return b, err
	}
	if b.pd, err = p.alloc(nvc0.PageDirSize); err != nil {
		return b, err
	}
	if b.pt, err = p.alloc(nvc0.SmallPTSize); err != nil {
		return b, err
	}
	w0, w1 := nvc0.PDE{SmallPresent: true, SmallAddr: b.pt}.Encode()
	if err := p.write32s(b.pd, w0, w1); err != nil {
		return b, err
	}
	if err := p.write64(b.ramin+nvc0.RAMINPageDir, b.pd); err != nil {
		return b, err
	}
	return b, p.write64(b.ramin+nvc0.RAMINAddrLimit, size-1)
}

func (p *physical) write32s(addr uint64, ws ...uint32) error {
	buf := make([]byte, 4*len(ws))
	for i, w := range ws {
		binary.LittleEndian.PutUint32(buf[4*i:], w)
	}
	return p.gpu.WriteVRAM(buf, addr)
}

func (p *physical) write64(addr, v uint64) error {
	return p.write32s(addr, uint32(v), uint32(v>>32))
}

func (p *physical) read32(addr uint64) (uint32, error) {
	var b [4]byte
	err := p.gpu.ReadVRAM(b[:], addr)
	return binary.LittleEndian.Uint32(b[:]), err
}

// setBARPTEs writes consecutive physical BAR page-table entries starting at
// aperture offset va (the caller flushes).
func (p *physical) setBARPTEs(bar *physBAR, va uint64, ptes []nvc0.PTE) error {
	buf := make([]byte, len(ptes)*nvc0.PTESize)
	for i, e := range ptes {
		lo, hi := e.Encode()
		binary.LittleEndian.PutUint32(buf[i*nvc0.PTESize:], lo)
		binary.LittleEndian.PutUint32(buf[i*nvc0.PTESize+4:], hi)
	}
	return p.gpu.WriteVRAM(buf, bar.pt+nvc0.SmallPTEIndex(va)*nvc0.PTESize)
}

// flush runs a physical TLB flush.
func (p *physical) flush(pd uint64, bar bool) error {
	if p.lost.Load() {
		return ErrBoardLost
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return hwseq.FlushTLB(p.gpu, pd, bar, p.timeout)
}

// setActive puts physical channels on or off the playlist and resubmits it
// (double-buffered, as a host driver does). Nothing changes: no submission.
func (p *physical) setActive(chans map[int]bool) error {
	if p.lost.Load() {
		return ErrBoardLost
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	changed := false
	for ch, on := range chans {
		changed = changed || p.active[ch] != on
	}
	if !changed {
		return nil
	}
	for ch, on := range chans {
		if on {
			p.active[ch] = true
		} else {
			delete(p.active, ch)
		}
	}
	ids := make([]int, 0, len(p.active))
	for ch := range p.active {
		ids = append(ids, ch)
	}
	slices.Sort(ids)
	pl := p.playlist[p.plCur]
	p.plCur ^= 1
	buf := make([]byte, len(ids)*nvc0.PlaylistEntrySize)
	for i, ch := range ids {
		binary.LittleEndian.PutUint32(buf[i*nvc0.PlaylistEntrySize:], uint32(ch))
		binary.LittleEndian.PutUint32(buf[i*nvc0.PlaylistEntrySize+4:], nvc0.PlaylistEntryWord1)
	}
	if err := p.gpu.WriteVRAM(buf, pl); err != nil {
		return err
	}
	return hwseq.SubmitPlaylist(p.gpu, pl, len(ids), p.timeout)
}

// fecsCommand runs a FECS command whose data the aggregator built (a shadow
// instance word).
func (p *physical) fecsCommand(cmd, data uint32) error {
	if p.lost.Load() {
		return ErrBoardLost
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return hwseq.FECSCommand(p.gpu, cmd, data, p.timeout)
}

// fecsQuery runs a FECS size query.
func (p *physical) fecsQuery(cmd uint32) (uint32, error) {
	if p.lost.Load() {
		return 0, ErrBoardLost
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return hwseq.FECSQuery(p.gpu, cmd, p.timeout)
}

// stop stops physical channels the way nouveau's gf100 code does — clear
// each one's enable bit (gf100_chan_stop), take them off the playlist, then
// preempt each (gf100_chan_preempt) and wait until the preempt is no longer
// pending (gf100_runl_preempt_pending) — whatever the aggregator believes
// about them. When it returns, the channels run nothing and touch no
// memory. It returns the channels whose preempt did not complete in time
// (wedged) with the error.
func (p *physical) stop(chans ...int) (wedged []int, err error) {
	if p.lost.Load() {
		// Nothing can tell that they stopped: none counts as stopped.
		return slices.Clone(chans), fmt.Errorf("stop channels %v: %w", chans, ErrBoardLost)
	}
	off := map[int]bool{}
	for _, ch := range chans {
		hwseq.DisableChannel(p.gpu, ch)
		off[ch] = false
	}
	var errs []error
	if err := p.setActive(off); err != nil {
		errs = append(errs, fmt.Errorf("playlist: %w", err))
	}
	p.preemptMu.Lock()
	defer p.preemptMu.Unlock()
	for _, ch := range chans {
		if err := hwseq.Preempt(p.gpu, ch, p.timeout); err != nil {
			wedged = append(wedged, ch)
			errs = append(errs, err)
		}
	}
	return wedged, errors.Join(errs...)
}

// doorbell writes GP_PUT of physical channel ch through the physical poll area.
func (p *physical) doorbell(ch int, put uint32) {
	p.gpu.Write32(nvc0.BAR1, p.layout.PollArea.Base+uint64(ch)*nvc0.UserAreaSize+nvc0.UserGPPut, put)
}
