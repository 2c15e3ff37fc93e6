package aggregator

import (
	"fmt"

	"github.com/gpuvm/gpuvm/vgpuimage"
)

// VRAM kept in place across a daemon handoff (docs/protocol.md §15.3). A
// GPU's memory outlives the driver process that lets go of it; so does the
// simulated board's, whose memfds a handing-off daemon passes to the
// process that replaces it. A vGPU handed over that way is parked by the
// eviction path without its VRAM being copied out: its slot is *kept* —
// out of every other vGPU's reach, neither renewed nor freed — and its
// state image carries no pages. The new process builds the board over the
// same memfds and registers the image with the slot (RegisterKept); the
// domain's device model restores it into that slot and nowhere else, and
// nothing is copied either way. A kept slot whose image goes unused (it
// expires, is replaced, is refused, its vGPU is destroyed) is renewed and
// freed as any teardown's: the VRAM kept there goes with it.
//
// Only the handoff keeps slots: a slot number reaches RegisterKept from
// the manifest the daemon's own predecessor wrote (same PID), never from
// an image or a request, so no image can name VRAM it does not carry.

// keptSlot is whose VRAM a kept slot holds.
type keptSlot struct {
	domid uint32
	name  string
	vram  uint64 // the vGPU's VRAM (its quota): what comes back into the slot
	// owner is the id of the parked vGPU whose VRAM it is, -1 when an
	// image waiting for its domain (or a handoff under way) owns it.
	owner int
}

// KeptSlot describes a slot kept for a vGPU's VRAM.
type KeptSlot struct {
	Slot  int    `json:"slot"`
	DomID uint32 `json:"domid"`
	Name  string `json:"name"`
}

// KeptSlots lists the slots kept for vGPUs' VRAM.
func (a *Aggregator) KeptSlots() []KeptSlot {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []KeptSlot
	for i := range a.layout.Slots {
		if k, ok := a.kept[i]; ok {
			out = append(out, KeptSlot{Slot: i, DomID: k.domid, Name: k.name})
		}
	}
	return out
}

// slotFree reports whether slot i may be given to a vGPU that has no claim
// on it: it is neither out of service nor kept. Called with a.mu held.
func (a *Aggregator) slotFree(i int) bool {
	_, broken := a.broken[i]
	_, kept := a.kept[i]
	return !broken && !kept
}

// keepSlot keeps v's slot after an eviction that left its VRAM there.
func (a *Aggregator) keepSlot(v *VGPU, slot int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.vgpus[slot] == v {
		a.vgpus[slot] = nil
	}
	a.kept[slot] = keptSlot{domid: v.Guest.DomID, name: v.Guest.Name, vram: v.Slot.VRAM.Size, owner: v.ID}
}

// disownKept makes slot's kept VRAM of domid nobody's but the handoff's:
// its vGPU is gone, and an image registered with the slot takes it.
func (a *Aggregator) disownKept(slot int, domid uint32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if k, ok := a.kept[slot]; ok && k.domid == domid {
		k.owner = -1
		a.kept[slot] = k
	}
}

// slotForRestore holds the slot parked v is restored into: the slot kept
// for its VRAM if its image left it there (kept true), else the one other
// holds.
func (a *Aggregator) slotForRestore(v *VGPU, other func() (Slot, error)) (s Slot, kept bool, err error) {
	v.mu.Lock()
	kept, slot := v.image != nil && v.image.kept, v.homeSlot
	v.mu.Unlock()
	if !kept {
		s, err = other()
		return s, false, err
	}
	s, err = a.claimKept(v, slot)
	return s, true, err
}

// freeClaimed gives back slot, held for a restore that did not happen (its
// vGPU went meanwhile); kept: claimed from the vGPU's kept VRAM, which
// is still there and goes first (the teardown found nothing kept).
func (a *Aggregator) freeClaimed(slot int, kept bool) {
	if kept {
		a.mu.Lock()
		if err := a.cleanSlot(a.layout.Slots[slot].VRAM); err != nil {
			a.broken[slot] = fmt.Sprintf("renewing a slot whose kept VRAM's vGPU went: %v", err)
			a.log.Error("slot out of service", "slot", slot, "reason", a.broken[slot])
		}
		a.mu.Unlock()
	}
	a.freeHeld(slot)
}

// RenewUnclaimed renews slot if no vGPU holds it and it keeps no VRAM:
// a new process's sweep of the slots it adopted kept whose images did
// not register (refused before RegisterKept saw them).
func (a *Aggregator) RenewUnclaimed(slot int) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if slot < 0 || slot >= len(a.layout.Slots) {
		return fmt.Errorf("board %s has no slot %d", a.opts.BoardName, slot)
	}
	if _, kept := a.kept[slot]; kept || a.vgpus[slot] != nil {
		return nil
	}
	if err := a.cleanSlot(a.layout.Slots[slot].VRAM); err != nil {
		a.broken[slot] = fmt.Sprintf("renewing a slot handed over with VRAM no image claimed: %v", err)
		return err
	}
	return nil
}

// unkeep copies the VRAM parked v keeps in its slot into its image and
// lets the slot go (renewed): for a save or a migration, whose image must
// carry it. Called with v.mu held.
func (v *VGPU) unkeep(a *Aggregator) error {
	if v.image == nil || !v.image.kept {
		return nil
	}
	from := a.layout.Slots[v.homeSlot]
	if err := exportSlot(a, Region{Base: from.VRAM.Base, Size: v.Slot.VRAM.Size}, v.image); err != nil {
		return fmt.Errorf("copying its kept VRAM out: %w", err)
	}
	v.image.kept = false
	a.releaseKept(v.homeSlot, v.Guest.DomID)
	return nil
}

// claimKept holds kept slot for v, the vGPU whose VRAM it keeps, as
// holdSlot holds a free one (narrowed to v's quota).
func (a *Aggregator) claimKept(v *VGPU, slot int) (Slot, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	k, ok := a.kept[slot]
	if !ok || k.domid != v.Guest.DomID || a.vgpus[slot] != nil {
		return Slot{}, fmt.Errorf("slot %d of board %s keeps no VRAM of domid %d: %w", slot, a.opts.BoardName, v.Guest.DomID, ErrNoSlot)
	}
	delete(a.kept, slot)
	s := a.layout.Slots[slot]
	s.VRAM.Size, s.Chans, s.BAR1.Size, s.BAR3.Size = v.Slot.VRAM.Size, v.Slot.Chans, v.Slot.BAR1.Size, v.Slot.BAR3.Size
	a.vgpus[slot] = &VGPU{ID: v.ID, Slot: s, Guest: v.Guest}
	return s, nil
}

// unclaimKept gives slot, which claimKept held for v, back to v's kept
// VRAM: a restore that failed before v took the slot, whose teardown then
// renews it (dropImage) — never freed with v's VRAM still in it.
func (a *Aggregator) unclaimKept(v *VGPU, slot int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if u := a.vgpus[slot]; u != nil && u.agg == nil && u.ID == v.ID {
		a.vgpus[slot] = nil
	}
	a.kept[slot] = keptSlot{domid: v.Guest.DomID, name: v.Guest.Name, vram: v.Slot.VRAM.Size, owner: v.ID}
}

// releaseKept renews and frees slot if it keeps domid's VRAM.
func (a *Aggregator) releaseKept(slot int, domid uint32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.releaseKeptLocked(slot, domid)
}

// releaseKeptLocked is releaseKept with a.mu held: the renewal (a new
// backing for the slot's VRAM, or a scrub) is done under it, so no vGPU
// takes the slot before its VRAM is gone.
func (a *Aggregator) releaseKeptLocked(slot int, domid uint32) {
	k, ok := a.kept[slot]
	if !ok || k.domid != domid {
		return
	}
	delete(a.kept, slot)
	if err := a.cleanSlot(a.layout.Slots[slot].VRAM); err != nil {
		a.broken[slot] = fmt.Sprintf("renewing the slot kept for %s (domid %d): %v", k.name, k.domid, err)
		a.log.Error("slot out of service", "slot", slot, "reason", a.broken[slot])
		return
	}
	a.log.Info("kept VRAM released: the slot is renewed", "slot", slot, "domid", domid, "name", k.name)
}

// RegisterKept registers img, the state image of a vGPU of domain domid
// handed over with its VRAM left in slot (docs/protocol.md §15.3), for the
// domain's next device model, which restores it into that slot. The image
// is checked as any restore's (CheckImage) and must carry no VRAM pages;
// slot must be one of the board's, in service and held by no vGPU, and
// kept for no other domain. It takes img. If the image is refused, the
// slot's VRAM goes: the slot is renewed.
func (a *Aggregator) RegisterKept(domid uint32, img *vgpuimage.Image, slot int) (RestoreInfo, error) {
	refuse := func(err error) (RestoreInfo, error) {
		img.Scrub()
		if slot >= 0 && slot < len(a.layout.Slots) {
			a.mu.Lock()
			// Renewed unless a vGPU holds it or another domain's VRAM is
			// kept there.
			if k, ok := a.kept[slot]; a.vgpus[slot] == nil && (!ok || k.domid == domid) {
				a.kept[slot] = keptSlot{domid: domid, name: k.name, owner: -1}
				a.releaseKeptLocked(slot, domid)
			}
			a.mu.Unlock()
		}
		return RestoreInfo{}, fmt.Errorf("VRAM kept in slot %d: %w", slot, err)
	}
	if slot < 0 || slot >= len(a.layout.Slots) {
		return refuse(fmt.Errorf("%w: board %s has slots 0..%d", ErrImageRefused, a.opts.BoardName, len(a.layout.Slots)-1))
	}
	if err := a.CheckImage(domid, img); err != nil {
		return refuse(err)
	}
	if img.Identity.PVDRM || len(img.Pages) != 0 {
		return refuse(fmt.Errorf("%w: an image whose VRAM is kept in place carries no pages and is no pvdrm vGPU's", ErrImageRefused))
	}
	a.mu.Lock()
	k, kept := a.kept[slot]
	_, broken := a.broken[slot]
	switch {
	case a.vgpus[slot] != nil || broken:
		a.mu.Unlock()
		img.Scrub()
		return RestoreInfo{}, fmt.Errorf("%w: slot %d of board %s is in use or out of service", ErrImageRefused, slot, a.opts.BoardName)
	case kept && k.domid != domid:
		a.mu.Unlock()
		img.Scrub()
		return RestoreInfo{}, fmt.Errorf("%w: slot %d of board %s keeps the VRAM of domid %d", ErrImageRefused, slot, a.opts.BoardName, k.domid)
	}
	a.kept[slot] = keptSlot{domid: domid, name: img.Identity.Name, vram: img.Identity.VRAM, owner: -1}
	a.mu.Unlock()
	return a.holdRestoreIn(domid, img, slot)
}
