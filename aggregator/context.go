package aggregator

import (
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/internal/ratelog"
)

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
	if c := &v.chans[i]; c.sh == nil || nvc0.InstDecode(inst) != c.sh.ShadowRAMIN() {
		return // a report about an earlier instance of the physical channel
	}
	v.fault = [4]uint32{
		nvc0.FaultValid | v.chans[i].inst&nvc0.ChanInstMask,
		g.Read32(nvc0.BAR0, nvc0.RegFaultAddrLo),
		g.Read32(nvc0.BAR0, nvc0.RegFaultAddrHi),
		status&^(nvc0.FaultChanMask<<nvc0.FaultChanShift) | uint32(i)<<nvc0.FaultChanShift,
	}
	v.intr |= nvc0.PFIFOIntrMMUFault
}

// reportKilled makes guest channel i's stop by the aggregator visible to
// the guest as a fault of its own (reason FaultReasonKilled).
func (v *VGPU) reportKilled(i int) {
	c := &v.chans[i]
	c.killed = true
	c.enabled = false
	c.ctl &^= nvc0.ChanCtlEnable
	v.fault = [4]uint32{nvc0.FaultValid | c.inst&nvc0.ChanInstMask, 0, 0,
		nvc0.FaultReasonKilled | uint32(i)<<nvc0.FaultChanShift}
	v.intr |= nvc0.PFIFOIntrMMUFault | nvc0.PFIFOIntrChanErr
}

// briefErr shortens a guest-caused error for a log line.
func briefErr(err error) string { return ratelog.Brief(err, 300) }
