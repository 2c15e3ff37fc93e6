package aggregator

import (
	"encoding/binary"
	"fmt"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/shadow"
)

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
// slice, after telling the shadows (a watched RAMIN or page-table page).
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

// noteGuestWrite tells the shadows about a CPU write the aggregator saw.
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
	status := v.agg.gpu.Read32(nvc0.BAR0, uint64(nvc0.ChanCtl(v.phys(i))))
	return c.ctl&^(nvc0.ChanCtlBusy|nvc0.ChanCtlFaulted) | status&(nvc0.ChanCtlBusy|nvc0.ChanCtlFaulted)
}

func chanTableWrite(v *VGPU, off, val uint32) {
	i, word, _ := nvc0.ChanFromTableOffset(off)
	if i >= len(v.chans) {
		v.deny("write", nvc0.BAR0, uint64(off), val)
		if val != 0 {
			v.log.Info("channel quota: channel refused", "channel", i, "quota", len(v.chans))
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
		v.log.Warn("channel table write refused", "channel", i, "word", word, "value", val, "err", err)
	}
}

// setChannelInst points guest channel i at a guest RAMIN: the physical
// channel gets a shadow RAMIN instead.
func (v *VGPU) setChannelInst(i int, val uint32) error {
	c := &v.chans[i]
	if c.enabled {
		return fmt.Errorf("instance of enabled channel %d changed", i)
	}
	if val == c.inst && c.sh != nil {
		return nil
	}
	p := v.phys(i)
	if c.sh != nil {
		if err := v.unmapPollPage(i); err != nil {
			return err
		}
		v.agg.gpu.Write32(nvc0.BAR0, uint64(nvc0.ChanInst(p)), 0)
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
	v.agg.gpu.Write32(nvc0.BAR0, uint64(nvc0.ChanInst(p)), nvc0.InstEncode(sh.ShadowRAMIN(), nvc0.ChanInstValid|nvc0.ChanInstVRAM))
	return nil
}

// setChannelCtl enables or disables guest channel i.
func (v *VGPU) setChannelCtl(i int, val uint32) error {
	c := &v.chans[i]
	enable := val&nvc0.ChanCtlEnable != 0
	if enable && c.sh == nil {
		return fmt.Errorf("enable of channel %d without an instance", i)
	}
	if enable && !c.enabled {
		// The channel is about to become runnable: its shadow RAMIN must be
		// current and valid (its page tables are scanned at activation).
		if c.sh.Dirty() {
			_ = c.sh.Refresh()
		}
		if !c.sh.Valid() {
			return fmt.Errorf("enable of channel %d: %w", i, c.sh.Err())
		}
	}
	c.ctl = val
	c.enabled = enable
	v.agg.gpu.Write32(nvc0.BAR0, uint64(nvc0.ChanCtl(v.phys(i))), val&(nvc0.ChanCtlDefault))
	return nil
}

// submitPlaylist reads the guest's playlist from its VRAM and puts its
// listed, valid channels on the physical playlist (merged with every other
// VM's).
func (v *VGPU) submitPlaylist(val uint32) {
	count := int(val & nvc0.PlaylistCountMask)
	if count > len(v.chans) {
		v.deny("write", nvc0.BAR0, nvc0.RegPlaylistSubmit, val)
		return
	}
	addr := uint64(v.emu[nvc0.RegPlaylistAddr]) << nvc0.PageShift
	listed := make([]bool, len(v.chans))
	for k := range count {
		id, ok := v.guestVRAMRead32(addr + uint64(k)*nvc0.PlaylistEntrySize)
		if !ok || int(id) >= len(v.chans) || v.chans[id].sh == nil || !v.chans[id].sh.Valid() {
			v.deny("playlist entry", nvc0.BAR0, nvc0.RegPlaylistSubmit, id)
			continue
		}
		listed[id] = true
	}
	change := map[int]bool{}
	for i := range v.chans {
		if v.chans[i].listed != listed[i] {
			change[v.phys(i)] = listed[i]
			v.chans[i].listed = listed[i]
		}
	}
	if len(change) == 0 {
		return
	}
	if err := v.agg.phys.setActive(change); err != nil {
		v.log.Error("physical playlist", "err", err)
	}
}

// killChannel kills guest channel val on the board.
func (v *VGPU) killChannel(off, val uint32) {
	if int(val) >= len(v.chans) {
		v.deny("write", nvc0.BAR0, uint64(off), val)
		return
	}
	if err := v.agg.phys.kill(v.phys(int(val))); err != nil {
		v.log.Error("channel kill", "channel", val, "err", err)
	}
	v.chans[val].enabled = false
	v.emu[off] = val
}

// tlbFlush handles a guest TLB flush of the address space whose page
// directory the guest wrote to RegTLBFlushPD.
func (v *VGPU) tlbFlush(trigger uint32) {
	if trigger&nvc0.TLBFlushTrigger == 0 {
		return
	}
	v.ctr.tlbFlushes.Add(1)
	pd := uint64(v.emu[nvc0.RegTLBFlushPD]) << nvc0.TLBFlushPDShift
	if trigger&nvc0.TLBFlushTypeBARVM != 0 {
		for _, b := range v.bars {
			if b.guestPD == pd && b.valid {
				b.rebuild()
			}
		}
		return
	}
	space, ok := v.shadows.Space(pd)
	if !ok {
		return // no channel uses that page directory yet; it is scanned when one does
	}
	if v.feat.Lazy {
		v.stale[space] = true // GPUvm's lazy shadowing: scan at the next activation
		return
	}
	v.syncSpace(space)
}

// syncSpace brings a shadow space up to date and flushes the physical TLB if
// anything changed.
func (v *VGPU) syncSpace(s *shadow.Space) {
	var st shadow.Stats
	var err error
	if v.feat.Incremental && v.synced[s] {
		st, err = s.SyncIncremental()
	} else {
		st, err = s.Sync()
	}
	if err != nil {
		v.log.Warn("shadow scan", "guest_pd", s.GuestPD(), "err", err)
		return
	}
	v.synced[s] = true
	delete(v.stale, s)
	if st.Changed() {
		if err := v.agg.phys.flush(s.ShadowPD(), false); err != nil {
			v.log.Error("physical TLB flush", "err", err)
		}
	}
	v.updateRemap()
}

// activate makes guest channel i ready to run: GPUvm's lazy shadowing scans
// here (doorbell, context bind, copy-engine bind).
func (v *VGPU) activate(i int) error {
	c := &v.chans[i]
	if c.sh == nil {
		return fmt.Errorf("channel %d has no instance", i)
	}
	if c.sh.Dirty() {
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
	if !v.synced[s] || v.stale[s] || (v.feat.Incremental && s.Dirty()) {
		v.syncSpace(s)
	}
	return nil
}

// mapPollPage points the physical poll-area page of guest channel i at the
// channel's (translated) user area, so the dispatcher's physical doorbell
// reaches it.
func (v *VGPU) mapPollPage(i int) error {
	c := &v.chans[i]
	user := c.sh.UserArea()
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

// fecsCommand runs a guest FECS command on the board with the instance
// translated to the shadow.
func (v *VGPU) fecsCommand(cmd uint32) {
	data := v.emu[nvc0.RegFECSData]
	i, ok := v.channelByInst(data)
	if cmd != nvc0.FECSCmdBindPointer || data&nvc0.FECSBindValid == 0 || !ok {
		v.deny("FECS command", nvc0.BAR0, nvc0.RegFECSCmd, cmd)
		return
	}
	if err := v.activate(i); err != nil {
		v.deny("FECS bind", nvc0.BAR0, nvc0.RegFECSCmd, data)
		return
	}
	if err := v.agg.phys.fecsBind(v.chans[i].sh.ShadowRAMIN()); err != nil {
		v.log.Error("FECS bind", "err", err)
		return
	}
	v.emu[nvc0.RegFECSStatus] |= nvc0.FECSDone
}

// copyBind binds a copy engine to a guest channel's (shadow) instance.
func (v *VGPU) copyBind(reg, val uint32) {
	i, ok := v.channelByInst(val)
	if val&nvc0.CopyInstValid == 0 || !ok || v.activate(i) != nil {
		v.deny("copy-engine bind", nvc0.BAR0, uint64(reg), val)
		return
	}
	v.agg.gpu.Write32(nvc0.BAR0, uint64(reg), nvc0.InstEncode(v.chans[i].sh.ShadowRAMIN(), nvc0.CopyInstValid))
}

// doorbell handles a guest GP_PUT write for guest channel i.
func (v *VGPU) doorbell(i int, put uint32) {
	v.ctr.doorbells.Add(1)
	c := &v.chans[i]
	c.put = put
	if !c.enabled {
		return
	}
	if err := v.activate(i); err != nil {
		v.log.Warn("doorbell refused", "channel", i, "err", err)
		v.ctr.denied.Add(1)
		return
	}
	entries, err := v.gpfifoEntries(c)
	if err != nil || put >= entries {
		v.log.Warn("doorbell refused", "channel", i, "put", put, "err", err)
		v.ctr.denied.Add(1)
		return
	}
	v.agg.disp.submit(&submission{v: v, ch: i, phys: v.phys(i), put: put, entries: entries, user: c.sh.UserArea()})
}

// gpfifoEntries reads the GPFIFO size the GPU uses for a channel: the one
// in its shadow RAMIN (bounded by the shadow).
func (v *VGPU) gpfifoEntries(c *vchan) (uint32, error) {
	var b [8]byte
	if err := v.agg.gpu.ReadVRAM(b[:], c.sh.ShadowRAMIN()+nvc0.RAMINGPFIFOLo); err != nil {
		return 0, err
	}
	_, n := nvc0.GPFIFODecode(binary.LittleEndian.Uint32(b[:]), binary.LittleEndian.Uint32(b[4:]))
	return n, nil
}

// refreshFault reads the board's fault report and, if it names one of this
// VM's channels, keeps a translated copy (guest instance, guest channel id).
func (v *VGPU) refreshFault() {
	g := v.agg.gpu
	status := g.Read32(nvc0.BAR0, nvc0.RegFaultStatus)
	inst := g.Read32(nvc0.BAR0, nvc0.RegFaultInst)
	p := int((status >> nvc0.FaultChanShift) & nvc0.FaultChanMask)
	if inst&nvc0.FaultValid == 0 || p < v.Slot.ChanBase || p >= v.Slot.ChanBase+v.Slot.Chans {
		return
	}
	i := p - v.Slot.ChanBase
	v.fault = [4]uint32{
		nvc0.FaultValid | v.chans[i].inst&nvc0.ChanInstMask,
		g.Read32(nvc0.BAR0, nvc0.RegFaultAddrLo),
		g.Read32(nvc0.BAR0, nvc0.RegFaultAddrHi),
		status&^(nvc0.FaultChanMask<<nvc0.FaultChanShift) | uint32(i)<<nvc0.FaultChanShift,
	}
	v.intr |= nvc0.PFIFOIntrMMUFault
}
