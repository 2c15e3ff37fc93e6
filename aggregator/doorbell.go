package aggregator

import (
	"context"
	"encoding/binary"
	"time"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/internal/spin"
	"github.com/gpuvm/gpuvm/shadow"
)

// Doorbells and user areas.
//
// The GPU never reads a guest's user area: each shadow RAMIN names a shadow
// user area in reserved memory, where only the dispatcher writes GP_PUT
// (when the scheduler releases a submission) and only the GPU writes
// GP_GET. A guest GP_PUT therefore reaches the GPU only through the
// scheduler, whichever way the guest writes it, and the dispatcher judges
// completion from a GP_GET the guest cannot forge. The guest's own user
// area is its memory: GP_PUT written there is a doorbell — trapped (the
// BAR1 poll area, or any aperture the page tracker sees) or, with polled
// doorbells, found by the aggregator polling the user areas (GPUvm's
// "sidecore" idea, thesis §4.4), in which case those pages may be passed
// through to the guest and cost no trap. GP_GET reads through the poll area
// return the shadow's value; the dispatcher also mirrors it into the
// guest's user area for reads that do not trap.

// pollField is a word of a channel's user area in the guest's poll area.
type pollField int

const (
	fieldOther pollField = iota
	fieldGPGet
	fieldGPPut
	fieldGPUWritten // DMA_GET, DMA_GET_HI, reference: the GPU writes them
)

// pollWord reports whether a BAR1 offset is a word of one of the guest's
// channel user areas in its poll area, and which.
func (v *VGPU) pollWord(bar int, off uint64) (ch int, f pollField, ok bool) {
	if bar != nvc0.BAR1 || !v.pollOn || off < v.pollBase {
		return 0, 0, false
	}
	rel := off - v.pollBase
	c := rel / nvc0.UserAreaSize
	if c >= uint64(len(v.chans)) {
		return 0, 0, false
	}
	switch rel % nvc0.UserAreaSize {
	case nvc0.UserGPPut:
		f = fieldGPPut
	case nvc0.UserGPGet:
		f = fieldGPGet
	case nvc0.UserDMAGet, nvc0.UserDMAGetHi, nvc0.UserRef:
		f = fieldGPUWritten
	default:
		f = fieldOther
	}
	return int(c), f, true
}

// shadowGPGet returns GP_GET of guest channel i as the GPU keeps it.
func (v *VGPU) shadowGPGet(i int) (uint32, bool) { return v.shadowUserWord(i, nvc0.UserGPGet) }

// shadowUserWord returns the word at offset off of guest channel i's user
// area as the GPU keeps it (its shadow user area).
func (v *VGPU) shadowUserWord(i int, off uint64) (uint32, bool) {
	c := &v.chans[i]
	if c.sh == nil {
		return 0, false
	}
	var b [4]byte
	if err := v.agg.gpu.ReadVRAM(b[:], c.sh.ShadowUserArea()+off); err != nil {
		return 0, false
	}
	return binary.LittleEndian.Uint32(b[:]), true
}

// doorbell handles a guest GP_PUT for guest channel i: the channel is
// activated (lazy shadowing) and the submission queued for the scheduler.
func (v *VGPU) doorbell(i int, put uint32) {
	v.ctr.doorbells.Add(1)
	c := &v.chans[i]
	c.put = put
	if !c.running {
		return
	}
	if err := v.activate(i); err != nil {
		v.ctr.denied.Add(1)
		v.gripeLog("doorbell refused", "channel", i, "err", briefErr(err))
		return
	}
	entries := c.sh.GPFIFOEntries() // the size the GPU uses: the shadow's, bounded
	if put >= entries {
		v.ctr.denied.Add(1)
		v.gripeLog("doorbell refused", "channel", i, "put", put, "entries", entries)
		return
	}
	v.agg.disp.submit(&submission{v: v, ch: i, phys: v.phys(i), put: put, entries: entries,
		shadowUser: c.sh.ShadowUserArea(), guestUser: c.sh.UserArea()})
}

// guestGPPut reads GP_PUT from a channel's guest user area (once: the value
// read is the value used).
func (v *VGPU) guestGPPut(c *vchan) (uint32, bool) {
	if c.sh == nil || c.sh.UserArea() == 0 {
		return 0, false
	}
	var b [4]byte
	if err := v.agg.gpu.ReadVRAM(b[:], c.sh.UserArea()+nvc0.UserGPPut); err != nil {
		return 0, false
	}
	return binary.LittleEndian.Uint32(b[:]), true
}

// userAreaWritten is the page tracker's report of a trapped guest write
// (through PRAMIN, BAR1 or BAR3) to the GP_PUT word of a channel's user
// area: a doorbell, as it would be on the hardware, which reads GP_PUT from
// the user area.
func (v *VGPU) userAreaWritten(sh *shadow.Channel) {
	for i := range v.chans {
		c := &v.chans[i]
		if c.sh != sh {
			continue
		}
		if put, ok := v.guestGPPut(c); ok && put != c.put {
			v.doorbell(i, put)
		}
		return
	}
}

// pollDoorbells looks for new GP_PUT values in the user areas of the VM's
// running channels (polled doorbells).
func (v *VGPU) pollDoorbells() {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.dead {
		return
	}
	for i := range v.chans {
		c := &v.chans[i]
		if !c.running {
			continue
		}
		if put, ok := v.guestGPPut(c); ok && put != c.put {
			v.ctr.polledDoorbells.Add(1)
			v.doorbell(i, put)
		}
	}
	v.reclaim()
}

// runningChannels reports whether the VM has a running channel.
func (v *VGPU) runningChannels() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	for i := range v.chans {
		if v.chans[i].running {
			return true
		}
	}
	return false
}

// pollLoop polls every polled-doorbell vGPU's user areas until ctx is done:
// every interval while a channel runs, every idlePoll otherwise.
func (a *Aggregator) pollLoop(ctx context.Context, interval time.Duration) {
	const idlePoll = 2 * time.Millisecond
	for ctx.Err() == nil {
		busy := false
		for _, v := range a.VGPUs() {
			if !v.feat.PollDoorbells {
				continue
			}
			v.pollDoorbells()
			busy = busy || v.runningChannels()
		}
		if busy {
			spin.Nap(interval)
			continue
		}
		t := time.NewTimer(idlePoll)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

// mapPollPage points the physical poll-area page of guest channel i at the
// channel's shadow user area, so the dispatcher's physical doorbell
// reaches it.
func (v *VGPU) mapPollPage(i int) error {
	c := &v.chans[i]
	user := c.sh.ShadowUserArea()
	if c.polled == user {
		return nil
	}
	p := v.agg.phys
	va := p.layout.PollArea.Base + uint64(v.phys(i))*nvc0.UserAreaSize
	if err := p.setBARPTEs(&p.bar1, va, []nvc0.PTE{{Present: true, Addr: user, Target: nvc0.TargetVRAM}}); err != nil {
		return err
	}
	if err := p.flush(p.bar1.pd, true); err != nil {
		return err
	}
	c.polled = user
	return nil
}

// unmapPollPage clears guest channel i's physical poll-area page.
func (v *VGPU) unmapPollPage(i int) error {
	c := &v.chans[i]
	if c.polled == 0 {
		return nil
	}
	p := v.agg.phys
	va := p.layout.PollArea.Base + uint64(v.phys(i))*nvc0.UserAreaSize
	c.polled = 0
	if err := p.setBARPTEs(&p.bar1, va, []nvc0.PTE{{}}); err != nil {
		return err
	}
	return p.flush(p.bar1.pd, true)
}
