package aggregator

import (
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/internal/ratelog"
)

// Engine contexts and the registers that carry physical addresses outside
// the page tables (FECS commands, CHAN_ADDR, the copy engines' CHANNEL_CUR):
// a guest's value names its own VRAM (or RAM), so each is translated to the
// shadow it stands for, emulated per VM, or denied — never passed on. The
// copy engines and GR find their contexts through the engine context
// pointers of the channel's RAMIN, which the shadow RAMIN confines
// (shadow.RAMINFields).

// fecsClass says how the aggregator handles one FECS command.
type fecsClass int

const (
	fecsDenied     fecsClass = iota // dropped and counted; FECS never sees it
	fecsTranslated                  // the data is a guest instance: run on the board with the shadow's
	fecsQuery                       // a size query: the board's answer is returned
	fecsEmulated                    // completes in the trap with no effect on the board
)

// fecsCommands is the FECS command table (anything not listed is denied).
// Commands whose data is an instance address run only with the instance of
// one of the guest's own channels, translated to its shadow. Stopping or
// starting context switching and halting FECS act for every VM: denied.
// The register-list commands take an instance or VA in RegFECSReglistData
// that nouveau uses only with NVIDIA's firmware: denied. Saving the current
// context and setting FECS's watchdog concern the aggregator's own
// scheduling: they complete without reaching the board.
func fecsCommands() map[uint32]fecsClass {
	return map[uint32]fecsClass{
		nvc0.FECSCmdSetChan:       fecsTranslated,
		nvc0.FECSCmdBindPointer:   fecsTranslated,
		nvc0.FECSCmdWFIGoldenSave: fecsTranslated,
		nvc0.FECSCmdImageSize:     fecsQuery,
		nvc0.FECSCmdZcullSize:     fecsQuery,
		nvc0.FECSCmdPMSize:        fecsQuery,
		nvc0.FECSCmdReglistSize:   fecsQuery,
		nvc0.FECSCmdSave:          fecsEmulated,
		nvc0.FECSCmdWatchdog:      fecsEmulated,
	}
}

// fecsCommand runs a guest FECS command (see fecsCommands).
func (v *VGPU) fecsCommand(cmd uint32) {
	data := v.emu[nvc0.RegFECSData]
	switch v.agg.fecs[cmd] {
	case fecsTranslated:
		i, ok := v.channelByInst(data)
		if data&nvc0.FECSBindValid == 0 || nvc0.InstTarget(data) != nvc0.MemTargetVRAM || !ok {
			v.deny("FECS command", nvc0.BAR0, nvc0.RegFECSCmd, cmd)
			v.gripeLog("FECS command with an instance that is not one of the VM's channels refused", "cmd", cmd, "data", data)
			return
		}
		if err := v.activate(i); err != nil {
			v.deny("FECS command", nvc0.BAR0, nvc0.RegFECSCmd, data)
			return
		}
		if err := v.agg.phys.fecsCommand(cmd, nvc0.InstEncode(v.chans[i].sh.ShadowRAMIN(), nvc0.FECSBindValid)); err != nil {
			v.log.Error("FECS command", "cmd", cmd, "err", err)
			return
		}
		v.emu[nvc0.RegFECSStatus] |= nvc0.FECSDone
	case fecsQuery:
		size, err := v.agg.phys.fecsQuery(cmd)
		if err != nil {
			v.log.Error("FECS query", "cmd", cmd, "err", err)
			return
		}
		v.emu[nvc0.RegFECSStatus] = size
	case fecsEmulated:
		v.emu[nvc0.RegFECSStatus] |= nvc0.FECSDone
	default:
		v.deny("FECS command", nvc0.BAR0, nvc0.RegFECSCmd, cmd)
	}
}

// ownInstRead translates a register that names the channel an engine has
// loaded (FECS CHAN_ADDR, a copy engine's CHANNEL_CUR): while the engine
// (PFIFO engine id engine) runs one of the guest's channels and the
// register names it, the guest reads its own instance word with the valid
// bit; otherwise none. A context left resident after its work ended reads
// as none too: whether it is still there depends on whether another VM
// used the engine since.
func ownInstRead(valid uint32, engine int) func(v *VGPU, off uint32) uint32 {
	return func(v *VGPU, off uint32) uint32 {
		if engineStatusRead(v, nvc0.RegEngineStatus(engine)) == 0 {
			return 0
		}
		val := v.agg.gpu.Read32(nvc0.BAR0, uint64(off))
		if val&valid == 0 || nvc0.InstTarget(val) != nvc0.MemTargetVRAM {
			return 0
		}
		shadow := nvc0.InstDecode(val)
		for i := range v.chans {
			if c := &v.chans[i]; c.sh != nil && c.sh.ShadowRAMIN() == shadow {
				return nvc0.InstEncode(c.sh.GuestRAMIN(), valid)
			}
		}
		return 0
	}
}

// briefErr shortens a guest-caused error for a log line.
func briefErr(err error) string { return ratelog.Brief(err, 300) }
