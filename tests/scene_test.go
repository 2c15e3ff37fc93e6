package tests

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/devmodel"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// attackModes are the attacker's virtualization modes for the page-table
// attacks: each mode shadows at a different moment (TLB flush, channel
// activation, incremental re-scan).
func attackModes() []string {
	if testing.Short() {
		return []string{"fv-incremental"}
	}
	return []string{"fv-naive", "fv-lazy", "fv-incremental"}
}

// scene is the common setup: the attacker in slot 0, the honest VM (a
// process) in slot 1, an idle victim VM (in this process) in slot 2 that
// stays attached for the whole test, so canaries in its slice stay valid.
type scene struct {
	e      *env
	a      *attacker
	honest *proc
	hv     *aggregator.VGPU
	victim aggregator.Slot
	vdev   *devmodel.Device
}

func newScene(t *testing.T, attackerMode string) *scene {
	return newSceneWith(t, attackerMode, true)
}

// newSceneWith builds the scene; without a driver the attacker is raw MMIO
// only (it may then move the PRAMIN window and BAR instances at will).
func newSceneWith(t *testing.T, attackerMode string, driver bool) *scene {
	t.Helper()
	return newSceneModes(t, attackerMode, "fv-naive", "fv-naive", driver)
}

// newSceneModes builds the scene with the honest VM and the victim in the
// given modes.
func newSceneModes(t *testing.T, attackerMode, honestMode, victimMode string, driver bool) *scene {
	t.Helper()
	e := newEnv(t)
	var a *attacker
	if driver {
		a = newAttacker(t, e, "attacker", 66, attackerMode)
	} else {
		dev := e.connect(t, "attacker", 66, attackerMode)
		a = &attacker{e: e, name: "attacker", dev: dev, r: raw{dev}, slot: e.vgpu("attacker").Slot}
		a.src.Bytes = pattern(0xA5, pageSize)
	}
	if a.slot.Index != 0 {
		t.Fatalf("attacker got slot %d, want 0", a.slot.Index)
	}
	p, hv := e.startHonestMode(t, honestMode)
	if hv.Slot.Index != 1 {
		t.Fatalf("honest VM got slot %d, want 1", hv.Slot.Index)
	}
	vdev := e.connect(t, "victim", 8, victimMode)
	vv := e.vgpu("victim")
	if vv == nil || vv.Slot.Index != 2 {
		t.Fatalf("victim VM not in slot 2")
	}
	return &scene{e: e, a: a, honest: p, hv: hv, victim: vv.Slot, vdev: vdev}
}

// canaries plants pages in the honest VM's and the victim's slices.
func (s *scene) canaries(t *testing.T) []canary {
	H, V := s.hv.Slot.VRAM, s.victim.VRAM
	return []canary{
		s.e.plant(t, "honest slice, first page", H.Base, 0x11),
		s.e.plant(t, "honest slice, last page", H.End()-pageSize, 0x22),
		s.e.plant(t, "victim slice, first page", V.Base, 0x33),
		s.e.plant(t, "victim slice, last page", V.End()-pageSize, 0x44),
	}
}

// checkCanaries checks every canary. The honest VM's slice is scrubbed when
// it exits, so its canaries may also read all zero once it is gone; they
// must never hold anything else (the attacker's data in particular).
func (s *scene) checkCanaries(t *testing.T, cs []canary) {
	t.Helper()
	H := s.hv.Slot.VRAM
	for _, c := range cs {
		if c.phys >= H.Base && c.phys < H.End() {
			got := s.e.readVRAM(t, c.phys, pageSize)
			if bytes.Equal(got, make([]byte, pageSize)) {
				continue // scrubbed at the honest VM's teardown (which starts before it exits)
			}
			if !bytes.Equal(got, c.data) {
				t.Errorf("canary %s at VRAM %#x was modified (attacker data in it: %v)", c.name, c.phys, containsChunk(got, s.a.src.Bytes))
			}
			continue
		}
		s.e.checkCanary(t, c)
	}
}

// target is a hostile guest address and the canary it would reach if the
// aggregator forwarded it untranslated or only shifted.
type target struct {
	what string
	g    uint64
}

func wrap(a *attacker, phys uint64) uint64 { return (phys - a.slot.VRAM.Base) & (nvc0.VASize - 1) }

// leakIn reports whether a 64-byte chunk of secret occurs in mem.
func leakIn(mem, secret []byte) bool { return containsChunk(mem, secret) }

// untilDone runs attack rounds while the honest VM computes: at least
// minRounds, then until it exits (for at most 30 s).
func untilDone(p *proc, minRounds int, round func(i int)) int {
	deadline := time.Now().Add(30 * time.Second)
	i := 0
	for ; i < minRounds || (!p.exited() && time.Now().Before(deadline)); i++ {
		round(i)
	}
	return i
}

// foreignChannels are channel ids outside an 8-channel range, as a guest

func u32bytes(ws []uint32) []byte {
	b := make([]byte, 4*len(ws))
	for i, w := range ws {
		binary.LittleEndian.PutUint32(b[4*i:], w)
	}
	return b
}

// hostileVRAM lists guest VRAM addresses outside the attacker's slice that
// would reach each canary if the aggregator did not bound them.
func hostileVRAM(a *attacker, cs []canary) []target {
	var ts []target
	for _, c := range cs {
		for _, tg := range []target{{c.name + " (shifted)", c.phys - a.slot.VRAM.Base},
			{c.name + " (raw physical)", c.phys}, {c.name + " (40-bit wrap)", wrap(a, c.phys) | nvc0.VASize}} {
			// A raw reserve address is small: inside the slice, legal.
			if tg.g&(nvc0.VASize-1) >= a.slot.VRAM.Size {
				ts = append(ts, tg)
			}
		}
	}
	return append(ts, target{"one page past the slice", a.slot.VRAM.Size})
}
