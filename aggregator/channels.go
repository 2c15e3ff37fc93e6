package aggregator

import (
	"encoding/binary"
	"fmt"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/shadow"
)

// Channel lifetimes.
//
// A guest channel's shadow RAMIN (and the shadow page directory and user
// area it names) may change only while the physical channel is stopped:
// disabled, off the playlist and preempted, so that no run still uses what
// the change frees (the board reads a RAMIN when a run starts and keeps
// using it for the whole run, as a GPU keeps a loaded context). The guest
// sees hardware semantics: a RAMIN it rewrites while the channel is enabled
// takes effect when it next enables the channel; disabling a channel stops
// it (the trap completes once the GPU has let go of it, as nouveau's
// gf100_chan_stop + preempt would); changing the instance of an enabled
// channel is refused. Freed shadow memory is retired, and reused only after
// a TLB flush of the page directory that may still name it (VGPU.reclaim).

// guestVRAMRead32 reads the guest's VRAM at guest address g, if inside its slice.
func (v *VGPU) guestVRAMRead32(g uint64) (uint32, bool) {
	phys, ok := v.tr.VRAMAddr(g, 4)
	if !ok || g%4 != 0 {
		return 0, false
	}
	var b [4]byte
	if err := v.agg.gpu.ReadVRAM(b[:], phys); err != nil {
		return 0, false
	}
	return binary.LittleEndian.Uint32(b[:]), true
}

// guestVRAMWrite32 writes the guest's VRAM at guest address g, if inside its
// slice, then tells the page tracker (a watched RAMIN, page table or user
// area).
func (v *VGPU) guestVRAMWrite32(g uint64, val uint32) bool {
	phys, ok := v.tr.VRAMAddr(g, 4)
	if !ok || g%4 != 0 {
		return false
	}
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], val)
	if err := v.agg.gpu.WriteVRAM(b[:], phys); err != nil {
		return false
	}
	v.noteGuestWrite(g, 4)
	return true
}

// noteGuestWrite tells the page tracker about a CPU write the aggregator saw.
func (v *VGPU) noteGuestWrite(g, n uint64) {
	v.shadows.NoteWrite(g, n)
}

// phys returns the physical channel id of guest channel i.
func (v *VGPU) phys(i int) int { return v.Slot.ChanBase + i }

func chanTableRead(v *VGPU, off uint32) uint32 {
	i, word, _ := nvc0.ChanFromTableOffset(off)
	if i >= len(v.chans) {
		v.deny("read", nvc0.BAR0, uint64(off), 0)
		return 0
	}
	c := &v.chans[i]
	if word == 0 {
		return c.inst
	}
	// PENDING comes from the physical channel while it runs (work the
	// guest submitted and the GPU has not finished); a channel that is
	// not running has none the GPU will do.
	val := c.ctl &^ nvc0.ChanCtlPending
	if !c.running {
		return val
	}
	status := v.agg.gpu.Read32(nvc0.BAR0, uint64(nvc0.ChanCtl(v.phys(i))))
	return val | status&nvc0.ChanCtlPending
}

func chanTableWrite(v *VGPU, off, val uint32) {
	i, word, _ := nvc0.ChanFromTableOffset(off)
	if i >= len(v.chans) {
		v.deny("write", nvc0.BAR0, uint64(off), val)
		if val != 0 {
			v.gripeLog("channel quota: channel refused", "channel", i, "quota", len(v.chans))
		}
		return
	}
	var err error
	if word == 0 {
		err = v.setChannelInst(i, val)
	} else {
		err = v.setChannelCtl(i, val)
	}
	if err != nil {
		v.ctr.denied.Add(1)
		v.gripeLog("channel table write refused", "channel", i, "word", word, "value", val, "err", err)
	}
}

// setChannelInst points guest channel i at a guest RAMIN: the physical
// channel gets a shadow RAMIN instead. The channel must be disabled (so
// stopped): its old shadow is then free to go.
func (v *VGPU) setChannelInst(i int, val uint32) error {
	c := &v.chans[i]
	if c.enabled || c.running {
		return fmt.Errorf("instance of enabled channel %d changed", i)
	}
	if c.wedged {
		return fmt.Errorf("channel %d is out of service", i)
	}
	if val == c.inst && c.sh != nil {
		return nil
	}
	if val&nvc0.ChanInstValid != 0 && nvc0.InstTarget(val) != nvc0.MemTargetVRAM {
		// As the board does: INVALID_TARGET, and the word is not taken.
		v.verr.ChanTableError(nvc0.ChanTableErrInvalidTarget)
		return fmt.Errorf("instance of channel %d outside VRAM (%#x)", i, val)
	}
	p := v.phys(i)
	if c.sh != nil {
		if err := v.unmapPollPage(i); err != nil {
			return err
		}
		v.agg.gpu.Write32(nvc0.BAR0, uint64(nvc0.ChanInst(p)), 0)
		// The channel is stopped: deliver what it reported before the
		// route goes.
		v.agg.faults.collect()
		v.agg.faults.unbind(p)
		err := c.sh.Close()
		c.sh = nil
		if err != nil {
			return err
		}
	}
	c.inst = val
	if val&nvc0.ChanInstValid == 0 {
		return nil
	}
	sh, err := v.shadows.OpenChannel(nvc0.InstDecode(val))
	if err != nil {
		c.inst = 0
		return err
	}
	c.sh = sh
	v.agg.faults.bind(p, sh.ShadowRAMIN(), v, i, val)
	v.agg.gpu.Write32(nvc0.BAR0, uint64(nvc0.ChanInst(p)), nvc0.InstEncode(sh.ShadowRAMIN(), nvc0.ChanInstValid|nvc0.ChanInstPollEnable))
	return nil
}

// setChannelCtl enables or disables guest channel i. Enabling starts the
// physical channel on a current, valid shadow; disabling stops it (the one
// stop path), so that what it used may change or go.
func (v *VGPU) setChannelCtl(i int, val uint32) error {
	c := &v.chans[i]
	enable := val&nvc0.ChanCtlEnable != 0
	switch {
	case enable && c.wedged:
		return fmt.Errorf("channel %d is out of service", i)
	case enable && c.sh == nil:
		return fmt.Errorf("enable of channel %d without an instance", i)
	case enable && !c.running:
		// The channel is about to become runnable: its shadow RAMIN must be
		// current and valid (its page tables are scanned at activation).
		v.settleRevokes()
		if c.sh.Dirty() {
			_ = c.sh.Refresh()
		}
		if !c.sh.Valid() {
			return fmt.Errorf("enable of channel %d: %w", i, c.sh.Err())
		}
		c.ctl, c.enabled, c.killed = val, true, false
		v.startChannel(i)
		return nil
	case !enable && c.running:
		c.ctl, c.enabled = val, false
		return v.stopChannel(i)
	}
	c.ctl, c.enabled = val, enable && !c.killed
	return nil
}

// startChannel enables guest channel i's physical channel: a fresh channel
// (the board clears GP_GET) whose shadow GP_PUT is 0 too, so the GPU runs
// nothing until the dispatcher releases a submission.
func (v *VGPU) startChannel(i int) {
	c := &v.chans[i]
	c.put = 0
	var zero [4]byte
	if err := v.agg.gpu.WriteVRAM(zero[:], c.sh.ShadowUserArea()+nvc0.UserGPPut); err != nil {
		v.log.Error("reset shadow GP_PUT", "channel", i, "err", err)
	}
	// Deliver what the channel reported before: the board then holds no
	// report of it while it runs again (one per channel at most).
	v.agg.faults.collect()
	v.agg.faults.started(v.phys(i))
	v.agg.gpu.Write32(nvc0.BAR0, uint64(nvc0.ChanCtl(v.phys(i))), nvc0.ChanCtlDefault)
	c.running = true
	v.syncPlaylist()
}

// stopChannel is the one stop path for a guest channel — used when the
// guest disables it, by the watchdog and at teardown (which stops the
// whole slot at once, see teardown): the physical channel is disabled,
// taken off the playlist and preempted, and the trap returns once the GPU
// no longer runs it. Its queued and in-flight submissions end. A stop that
// never completes takes the channel out of service for good.
func (v *VGPU) stopChannel(i int) error {
	c := &v.chans[i]
	wedged, err := v.agg.phys.stop(v.phys(i))
	c.running, c.inList = false, false
	v.agg.disp.channelStopped(v, i)
	if len(wedged) > 0 {
		c.wedged = true
		v.wedged++
		v.ctr.wedged.Add(1)
		v.log.Error("channel stop did not complete: channel out of service", "channel", i, "err", err)
		return fmt.Errorf("stop of channel %d: %w", i, err)
	}
	if err != nil {
		v.log.Error("channel stop", "channel", i, "err", err)
	}
	return nil
}

// submitPlaylist reads the guest's playlist from its VRAM and records which
// of its channels it lists; the physical playlist (merged with every other
// VM's) holds those that are also running.
func (v *VGPU) submitPlaylist(val uint32) {
	count := int(val & nvc0.PlaylistCountMask)
	if count > len(v.chans) {
		v.deny("write", nvc0.BAR0, nvc0.RegPlaylistSubmit, val)
		return
	}
	addr, target := nvc0.PlaylistAddrDecode(v.emu[nvc0.RegPlaylistAddr])
	if target != nvc0.MemTargetVRAM {
		// As the board does: a scheduler error, and nothing changes.
		v.verr.SchedError(nvc0.SchedErrorInvalidTarget)
		v.deny("write", nvc0.BAR0, nvc0.RegPlaylistSubmit, val)
		return
	}
	listed := make([]bool, len(v.chans))
	for k := range count {
		id, ok := v.guestVRAMRead32(addr + uint64(k)*nvc0.PlaylistEntrySize)
		if !ok || int(id) >= len(v.chans) || v.chans[id].sh == nil || !v.chans[id].sh.Valid() {
			v.deny("playlist entry", nvc0.BAR0, nvc0.RegPlaylistSubmit, id)
			continue
		}
		listed[id] = true
	}
	for i := range v.chans {
		v.chans[i].listed = listed[i]
	}
	v.syncPlaylist()
	v.verr.RunlistDone() // the update completed inside the trap
}

// syncPlaylist puts the guest's running, listed channels on the physical
// playlist and takes the others off.
func (v *VGPU) syncPlaylist() {
	change := map[int]bool{}
	for i := range v.chans {
		c := &v.chans[i]
		if want := c.listed && c.running; c.inList != want {
			change[v.phys(i)] = want
			c.inList = want
		}
	}
	if len(change) == 0 {
		return
	}
	if err := v.agg.phys.setActive(change); err != nil {
		v.log.Error("physical playlist", "err", err)
	}
}

// preemptWrite handles a guest write of RegPreempt. The aggregator already
// stopped the channel if the guest disabled it (the stop sequence nouveau
// runs: disable, then preempt), and releases an enabled channel's work only
// through its scheduler, so there is nothing to do on the board: the
// preempt completes inside the trap.
func preemptWrite(v *VGPU, off, val uint32) {
	if val&^uint32(nvc0.PreemptChanMask) != 0 || int(val) >= len(v.chans) {
		v.deny("write", nvc0.BAR0, uint64(off), val)
		return
	}
	v.emu[off] = val
}

// tlbFlush handles a guest TLB flush (gf100_vmm_invalidate): of the
// address space whose page directory the guest wrote to RegTLBFlushPD, or
// with ALL_PDB of every one; HUB_ONLY limits it to the BAR (hub) address
// spaces, otherwise channel and BAR spaces alike are flushed. A page
// directory outside VRAM names nothing the guest can have: ignored.
func (v *VGPU) tlbFlush(trigger uint32) {
	if trigger&nvc0.TLBFlushTrigger == 0 {
		return
	}
	v.ctr.tlbFlushes.Add(1)
	v.settleRevokes()
	pd, target := nvc0.TLBFlushPDDecode(v.emu[nvc0.RegTLBFlushPD])
	all := trigger&nvc0.TLBFlushAllPDB != 0
	if target != nvc0.MemTargetVRAM && !all {
		v.gripeLog("TLB flush of a page directory outside VRAM ignored", "value", v.emu[nvc0.RegTLBFlushPD])
		return
	}
	for _, b := range v.bars {
		if all || b.sp.GuestPD() == pd {
			b.rebuild()
		}
	}
	if trigger&nvc0.TLBFlushHubOnly != 0 {
		return
	}
	var spaces []*shadow.Space
	if all {
		spaces = v.shadows.Spaces()
	} else if space, ok := v.shadows.Space(pd); ok {
		spaces = append(spaces, space)
	} // else no channel uses that page directory yet; it is scanned when one does
	for _, space := range spaces {
		if v.feat.Lazy {
			v.stale[space] = true // GPUvm's lazy shadowing: scan at the next activation
			continue
		}
		v.syncSpace(space)
	}
}

// syncSpace brings a shadow space up to date and flushes the physical TLB if
// anything changed — also when the scan failed part way (over the shadow
// budget, say): the entries it did write must not stay hidden behind stale
// translations.
func (v *VGPU) syncSpace(s *shadow.Space) {
	var st shadow.Stats
	var err error
	if v.feat.Incremental && v.synced[s] {
		st, err = s.SyncIncremental()
	} else {
		st, err = s.Sync()
	}
	if st.Changed() {
		if ferr := v.agg.phys.flush(s.ShadowPD(), false); ferr != nil {
			v.log.Error("physical TLB flush", "err", ferr)
		}
	}
	if err != nil {
		v.ctr.scanErrors.Add(1)
		v.gripeLog("shadow scan", "guest_pd", s.GuestPD(), "err", briefErr(err))
		return
	}
	v.synced[s] = true
	delete(v.stale, s)
	v.updateRemap()
}

// activate makes guest channel i ready to run: GPUvm's lazy shadowing scans
// here (doorbell, context bind, copy-engine bind). A RAMIN the guest
// rewrote while the channel runs is not applied (see Channel lifetimes).
func (v *VGPU) activate(i int) error {
	c := &v.chans[i]
	if c.sh == nil {
		return fmt.Errorf("channel %d has no instance", i)
	}
	v.settleRevokes() // pages a device model may still map into its guest (§6.8)
	if c.sh.Dirty() && !c.running {
		if err := c.sh.Refresh(); err != nil {
			return err
		}
	}
	if !c.sh.Valid() {
		return c.sh.Err()
	}
	if err := v.mapPollPage(i); err != nil {
		return err
	}
	s := c.sh.Space()
	if s.PV() {
		return nil // built by hypercalls: nothing to scan
	}
	if !v.synced[s] || v.stale[s] || (v.feat.Incremental && s.Dirty()) {
		v.syncSpace(s)
	}
	return nil
}

// channelByInst finds the guest channel whose instance is the guest RAMIN in
// an instance-style register value.
func (v *VGPU) channelByInst(val uint32) (int, bool) {
	ramin := nvc0.InstDecode(val)
	for i := range v.chans {
		if v.chans[i].sh != nil && v.chans[i].sh.GuestRAMIN() == ramin {
			return i, true
		}
	}
	return 0, false
}
