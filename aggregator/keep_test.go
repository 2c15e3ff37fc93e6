package aggregator

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/gpu/hostmem"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/ipc"
	"github.com/gpuvm/gpuvm/vgpuimage"
)

// keptScene is a board of two slots: an honest VM with a marker in one, a
// savable VM in the other that ran verified work and keeps a context open.
func keptScene(t *testing.T, mode string) (a *Aggregator, board *sim.Board, honest *guestVM, marker []uint32, s *savedGuest, ctx *gdev.Context) {
	t.Helper()
	a, board = newTestAggregator(t, 2)
	honest, marker = honestBeside(t, a)
	s = startSavable(t, a, 5, "kept", mode)
	return a, board, honest, marker, s, s.computing(t)
}

// holdKept holds s's vGPU with its VRAM kept in its slot and checks what
// that means: an image without pages, the slot kept for the domain and
// out of any newcomer's reach.
func holdKept(t *testing.T, a *Aggregator, s *savedGuest) (*HandoffHold, []byte) {
	t.Helper()
	slot := s.v.Slot.Index
	var img bytes.Buffer
	hold, err := a.Hold(context.Background(), s.v, &img, true)
	if err != nil {
		t.Fatal(err)
	}
	if hold.Kept != slot {
		t.Fatalf("kept slot %d, want the vGPU's %d", hold.Kept, slot)
	}
	m, err := vgpuimage.Decode(bytes.NewReader(img.Bytes()))
	if err != nil {
		t.Fatalf("the image does not decode: %v", err)
	}
	if len(m.Pages) != 0 {
		t.Fatalf("the image carries %d VRAM pages; its VRAM is kept in place", len(m.Pages))
	}
	if k := a.KeptSlots(); len(k) != 1 || k[0].Slot != slot || k[0].DomID != 5 {
		t.Fatalf("kept slots %+v", k)
	}
	// A newcomer finds no slot: the honest VM has one, the other keeps
	// the held vGPU's VRAM.
	other := startSavableErr(a, 9, "newcomer")
	if !errors.Is(other, ErrNoSlot) {
		t.Fatalf("a newcomer's attach while the slot is kept: %v, want ErrNoSlot", other)
	}
	return hold, img.Bytes()
}

// startSavableErr attaches a fresh fv-optimized guest: the attach's error.
func startSavableErr(a *Aggregator, domid uint32, name string) error {
	ram, err := hostmem.New(name, 64<<20)
	if err != nil {
		return err
	}
	defer ram.Close()
	v, err := attachRAMErr(a, Guest{DomID: domid, Name: name, Mode: "fv-optimized"}, ram)
	if err == nil {
		a.Detach(v)
	}
	return err
}

// TestHandoffKeptVRAMRelease: held with its VRAM kept in place and then
// released (the handoff called off), the vGPU comes back into its own
// slot at its guest's next access with nothing copied, and the context it
// opened before goes on: its channel, page tables and buffers were VRAM
// that never moved.
func TestHandoffKeptVRAMRelease(t *testing.T) {
	a, _, honest, marker, s, ctx := keptScene(t, "fv-optimized")
	slot := s.v.Slot.Index
	hold, _ := holdKept(t, a, s)
	hold.Release()
	if got := s.port.Read32(0, nvc0.RegBoot0); got == 0xFFFFFFFF {
		t.Fatal("the guest's access after the release read all-ones")
	}
	if s.v.Evicted() || s.v.Slot.Index != slot {
		t.Fatalf("after the release: parked %v, slot %d (want %d)", s.v.Evicted(), s.v.Slot.Index, slot)
	}
	if k := a.KeptSlots(); len(k) != 0 {
		t.Fatalf("slots still kept after the restore: %+v", k)
	}
	if err := maddOnce(ctx, 16); err != nil {
		t.Fatalf("madd in the context opened before the hold: %v", err)
	}
	verifiedWork(t, s.guestVM)
	checkHonest(t, honest, marker)
}

// TestHandoffKeptVRAMCommit: committed, the vGPU is gone but its slot
// stays kept; its image registered with the slot (as the new process, or
// this one after a failed exec, registers it) restores into that slot
// when its device model comes, and the guest's old context computes.
func TestHandoffKeptVRAMCommit(t *testing.T) {
	for _, mode := range []string{"fv-optimized", "pv-multicall"} {
		t.Run(mode, func(t *testing.T) {
			a, _, honest, marker, s, ctx := keptScene(t, mode)
			slot := s.v.Slot.Index
			hold, img := holdKept(t, a, s)
			if err := hold.Commit(); err != nil {
				t.Fatal(err)
			}
			if n := len(a.VGPUs()); n != 1 {
				t.Fatalf("%d vGPUs after the commit, want the honest one", n)
			}
			if k := a.KeptSlots(); len(k) != 1 || k[0].Slot != slot {
				t.Fatalf("kept slots after the commit: %+v", k)
			}
			m, err := vgpuimage.Decode(bytes.NewReader(img))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := a.RegisterKept(5, m, slot); err != nil {
				t.Fatal(err)
			}
			nv := attachRAM(t, a, s.g, s.ram)
			if nv.Evicted() || nv.Slot.Index != slot {
				t.Fatalf("restored: parked %v, slot %d (want %d)", nv.Evicted(), nv.Slot.Index, slot)
			}
			s.goesOn(t, nv, ctx, "handoff")
			checkHonest(t, honest, marker)
		})
	}
}

// TestKeptVRAMRefusals: an image registered with a kept slot is refused
// when the slot keeps another domain's VRAM (which stays), when it
// carries pages of its own, or names a slot the board lacks; refused for
// its own domain's slot, or dropped unused, the slot is renewed — the
// VRAM it kept is gone before any vGPU can take the slot.
func TestKeptVRAMRefusals(t *testing.T) {
	a, board, honest, marker, s, _ := keptScene(t, "fv-optimized")
	slot := s.v.Slot.Index
	base := a.layout.Slots[slot].VRAM
	hold, img := holdKept(t, a, s)
	if err := hold.Commit(); err != nil {
		t.Fatal(err)
	}
	decode := func() *vgpuimage.Image {
		m, err := vgpuimage.Decode(bytes.NewReader(img))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	resident := func() int {
		r, err := board.VRAMResidentRanges(base.Base, base.Size)
		if err != nil {
			t.Fatal(err)
		}
		return len(r)
	}
	if resident() == 0 {
		t.Fatal("the kept slot holds nothing: the test sees no VRAM to keep")
	}
	// Another domain's image naming the slot: refused, the VRAM stays.
	other := decode()
	other.Identity.Name = "other"
	if _, err := a.RegisterKept(6, other, slot); !errors.Is(err, ErrImageRefused) {
		t.Fatalf("an image of domid 6 for the slot kept for domid 5: %v", err)
	}
	if k := a.KeptSlots(); len(k) != 1 || resident() == 0 {
		t.Fatalf("another domain's refused image let the kept VRAM go: %+v", k)
	}
	if _, err := a.RegisterKept(5, decode(), 7); !errors.Is(err, ErrImageRefused) {
		t.Fatalf("slot 7 of a two-slot board: %v", err)
	}
	// The domain's own image, registered and then forgotten: renewed.
	if _, err := a.RegisterKept(5, decode(), slot); err != nil {
		t.Fatal(err)
	}
	a.ForgetRestore(5)
	if k := a.KeptSlots(); len(k) != 0 || resident() != 0 {
		t.Fatalf("a forgotten kept image: kept %+v, %d resident ranges left", k, resident())
	}
	// Kept again (a second hold), then an image with pages: refused and
	// the slot renewed.
	s2 := startSavable(t, a, 5, "kept", "fv-optimized")
	verifiedWork(t, s2.guestVM)
	hold, img = holdKept(t, a, s2)
	if err := hold.Commit(); err != nil {
		t.Fatal(err)
	}
	withPage := decode()
	withPage.Pages = []vgpuimage.Page{{Off: 0, Data: make([]byte, vgpuimage.PageSize)}}
	if _, err := a.RegisterKept(5, withPage, slot); !errors.Is(err, ErrImageRefused) {
		t.Fatalf("a kept image carrying pages: %v", err)
	}
	if k := a.KeptSlots(); len(k) != 0 || resident() != 0 {
		t.Fatalf("after a refused image: kept %+v, %d resident ranges left", k, resident())
	}
	// The slot is free again, and whoever takes it sees none of it.
	if err := startSavableErr(a, 9, "newcomer"); err != nil {
		t.Fatalf("a newcomer once the slot is renewed: %v", err)
	}
	checkHonest(t, honest, marker)
}

// TestKeptClaimedThenDestroyedRenews: a restore that claimed the kept
// slot finds its vGPU destroyed meanwhile (the teardown found nothing
// kept to renew): the slot it gives back is renewed first, and the next
// tenant gets none of the VRAM that was kept there.
func TestKeptClaimedThenDestroyedRenews(t *testing.T) {
	a, board, honest, marker, s, _ := keptScene(t, "fv-optimized")
	base := a.layout.Slots[s.v.Slot.Index].VRAM
	hold, _ := holdKept(t, a, s)
	hold.Release() // called off: parked, its slot kept
	to, kept, err := a.slotForRestore(s.v, nil)
	if err != nil || !kept {
		t.Fatalf("claim the kept slot: kept %v, %v", kept, err)
	}
	if err := a.Destroy(s.v, "the operator destroys it meanwhile"); err != nil {
		t.Logf("destroy: %v", err)
	}
	a.freeClaimed(to.Index, kept) // the restore finds it dead
	if r, err := board.VRAMResidentRanges(base.Base, base.Size); err != nil || len(r) != 0 {
		t.Fatalf("the slot given back holds %d ranges of the destroyed vGPU's VRAM (%v)", len(r), err)
	}
	if err := startSavableErr(a, 9, "newcomer"); err != nil {
		t.Fatalf("a newcomer after the slot was renewed: %v", err)
	}
	checkHonest(t, honest, marker)
}

// TestSaveOfKeptParkedCarriesVRAM: a vGPU parked with its VRAM kept (a
// handoff called off) and then saved: the image carries that VRAM (it
// leaves the daemon), and the kept slot goes once it is copied out.
func TestSaveOfKeptParkedCarriesVRAM(t *testing.T) {
	a, board, _, _, s, _ := keptScene(t, "fv-optimized")
	base := a.layout.Slots[s.v.Slot.Index].VRAM
	hold, _ := holdKept(t, a, s)
	hold.Release()
	before, err := board.VRAMResidentRanges(base.Base, base.Size)
	if err != nil || len(before) == 0 {
		t.Fatalf("nothing resident in the kept slot: %v", err)
	}
	var img bytes.Buffer
	if _, err := a.Save(context.Background(), s.v, &img, false); err != nil {
		t.Fatal(err)
	}
	m, err := vgpuimage.Decode(bytes.NewReader(img.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Pages) == 0 {
		t.Fatalf("the saved image of a vGPU whose VRAM was kept carries no pages (%d ranges were resident)", len(before))
	}
	if k := a.KeptSlots(); len(k) != 0 {
		t.Fatalf("slots still kept after the save: %+v", k)
	}
}

// TestHoldNamesTheBoardItParksOn: a vGPU moved to another board after
// it was listed on the first is held where it is, and the hold names that
// board: the slot it keeps is that board's.
func TestHoldNamesTheBoardItParksOn(t *testing.T) {
	a, b, _, _ := twoBoards(t, 2)
	startGuestAs(t, b, 41, "filler", "fv-optimized")
	s := startSavable(t, a, 5, "mover", "fv-optimized")
	verifiedWork(t, s.guestVM)
	if _, err := Move(context.Background(), s.v, b); err != nil {
		t.Fatal(err)
	}
	var img bytes.Buffer
	hold, err := a.Hold(context.Background(), s.v, &img, true) // listed on a
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Release()
	if hold.Board != "b" || len(b.KeptSlots()) != 1 || b.KeptSlots()[0].Slot != hold.Kept || len(a.KeptSlots()) != 0 {
		t.Fatalf("hold names board %q slot %d; kept on a %+v, on b %+v", hold.Board, hold.Kept, a.KeptSlots(), b.KeptSlots())
	}
}

// TestResetWaitingOnHoldIsNotAnswered: a guest's function-level reset that
// waits while its vGPU is held for a handoff, and finds it destroyed by
// the commit, did not run: the call fails (its connection ends unanswered)
// so that the device model repeats it on the restored vGPU, instead of
// an answer saying it was refused, which no device model repeats.
func TestResetWaitingOnHoldIsNotAnswered(t *testing.T) {
	a, _, _, _, s, _ := keptScene(t, "fv-optimized")
	hold, _ := holdKept(t, a, s)
	type answer struct {
		r   ipc.CallResult
		err error
	}
	got := make(chan answer, 1)
	go func() {
		r, err := s.v.Call(ipc.OpReset, nil)
		got <- answer{r, err}
	}()
	select {
	case g := <-got:
		t.Fatalf("the reset ran while its vGPU was held: %+v", g)
	case <-time.After(50 * time.Millisecond):
	}
	if err := hold.Commit(); err != nil {
		t.Fatal(err)
	}
	g := <-got
	if !errors.Is(g.err, ErrDetached) {
		t.Fatalf("the reset of a vGPU destroyed while it waited: %+v, %v; want ErrDetached", g.r, g.err)
	}
}
