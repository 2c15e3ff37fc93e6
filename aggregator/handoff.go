package aggregator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/ipc"
	"github.com/gpuvm/gpuvm/vgpuimage"
)

// Handing a vGPU to a new daemon process (docs/protocol.md §15, `gpuvm
// serve` upgraded in place). It is a save in two phases: Hold parks the
// vGPU by the eviction path and writes its image, and keeps every restore
// of it back until the handoff is decided — Commit ends it with a saved
// Bye (its device model resumes on the new process, where the image is
// restored), Release lets it go on here: it stays parked and its guest's
// next access brings it back on this board. No guest access runs between
// the capture and either end, so the image is exactly what the new
// process goes on from.

// HandoffReason is the Bye of a vGPU handed to a new daemon process. It
// begins ipc.ByeSaved: the device model resumes (docs/protocol.md §13.7).
const HandoffReason = ipc.ByeHandoff + "; the vGPU resumes on the new process"

// HandoffBlocker says why v cannot be handed to a new daemon process, or
// "" if it can: a pvdrm vGPU whose back end has no transport that crosses
// a handoff, or no back end yet, and a Xen domain's device model that did
// not say it resumes after a handoff (its Hello's ResumesHandoff: gpuvm
// xl's and QEMU's device do, unless told not to) would leave its domain without
// its device. A pvdrm vGPU is handed over as a save is: on the local
// transport its front end resumes on the saved Bye; on the xen transport
// the new process takes the connected device over (host's Xen pvdrm
// service).
func HandoffBlocker(v *VGPU) string {
	switch {
	case config.Mode(v.Guest.Mode).IsPVDRM():
		b := v.pvdrmBackend()
		switch {
		case b == nil:
			return fmt.Sprintf("vGPU %d (%s, domid %d) is a %s vGPU whose back end is being attached", v.ID, v.Guest.Name, v.Guest.DomID, v.Guest.Mode)
		case !b.resumesHandoff():
			return fmt.Sprintf("vGPU %d (%s, domid %d) is a %s vGPU whose transport does not cross a handoff", v.ID, v.Guest.Name, v.Guest.DomID, v.Guest.Mode)
		}
	case v.Guest.XenRAM && !v.Guest.ResumesHandoff:
		return fmt.Sprintf("vGPU %d (%s, domid %d) has a Xen device model that does not resume after a handoff", v.ID, v.Guest.Name, v.Guest.DomID)
	}
	return ""
}

// HandoffHold is a vGPU parked, its image written, until the handoff is
// decided. Exactly one of Commit and Release must be called.
type HandoffHold struct {
	v    *VGPU
	done bool
	// Stats describe the save: the VRAM in the image, the eviction's
	// pause, the whole hold.
	Stats SaveStats
	// Kept is the slot that keeps the vGPU's VRAM, which the image does
	// not carry (keep.go); -1: the image carries it.
	Kept int
	// Board is the name of the board the vGPU was parked on (a move may
	// have taken it off the one it was listed on): Kept is its slot.
	Board string
	// letGo lets a pvdrm back end serve on once the hold ended (after a
	// commit it finds its vGPU gone and stops); nil for other modes.
	letGo func()
}

// VGPU is the vGPU held.
func (h *HandoffHold) VGPU() *VGPU { return h.v }

// Hold parks v and writes its state image to w, holding back every
// restore of it until Commit or Release. With keepVRAM, its VRAM stays in
// its slot, kept for it, and the image carries none (keep.go): for a new
// process that takes the board's memory over. A pvdrm vGPU's image always
// carries its VRAM objects: its restore re-creates each through the new
// back end's driver, which places them anew. ctx bounds the wait for its
// work in flight. On error nothing is held: v goes on here (parked, if the
// eviction happened; its next access brings it back).
func (a *Aggregator) Hold(ctx context.Context, v *VGPU, w io.Writer, keepVRAM bool) (*HandoffHold, error) {
	start := time.Now()
	if why := HandoffBlocker(v); why != "" {
		return nil, fmt.Errorf("hand off: %s: %w", why, ErrSaveUnsupported)
	}
	letGo, err := quiescePVDRM(ctx, v)
	if err != nil {
		return nil, fmt.Errorf("hand off %w", err)
	}
	keepVRAM = keepVRAM && letGo == nil
	v.restoreMu.Lock()
	held := false
	defer func() {
		if !held {
			v.restoreMu.Unlock()
			if letGo != nil {
				letGo()
			}
		}
	}()
	cur, _ := v.where()
	ev, err := cur.evictVGPU(ctx, v, "handing it to a new daemon process", keepVRAM)
	if err != nil {
		return nil, fmt.Errorf("hand off: %w", err)
	}
	kept := -1
	v.mu.Lock()
	if v.image != nil && v.image.kept {
		kept = v.homeSlot
	}
	v.mu.Unlock()
	img, err := v.capture(kept < 0)
	if err != nil {
		return nil, fmt.Errorf("hand off vGPU %d: %w", v.ID, err)
	}
	defer img.Scrub()
	if err := vgpuimage.Encode(w, img); err != nil {
		return nil, fmt.Errorf("hand off vGPU %d: writing the image: %w", v.ID, err)
	}
	held = true
	return &HandoffHold{v: v, Kept: kept, Board: cur.opts.BoardName, letGo: letGo, Stats: SaveStats{Bytes: img.Bytes(), Pause: ev.Took, Took: time.Since(start)}}, nil
}

// handoffByeWait bounds Commit's wait for the Bye to be written.
const handoffByeWait = 5 * time.Second

// Commit ends the held vGPU with the handoff's saved Bye: its device
// model resumes where the image is restored. It returns once the Bye is
// written and the connection closed (or after handoffByeWait): a process
// that ends sooner would close the connection with the Bye unsent, and
// its device model would take that for a crash.
func (h *HandoffHold) Commit() error {
	if h.done {
		return nil
	}
	h.done = true
	cur, _ := h.v.where()
	h.v.mu.Lock()
	if h.v.image != nil && h.v.image.kept {
		// The slot stays kept, its VRAM the handoff's now: the vGPU's
		// teardown leaves it (the new process restores into it, or this
		// one if the exec fails).
		h.v.image.kept = false
	}
	h.v.mu.Unlock()
	if h.Kept >= 0 {
		cur.disownKept(h.Kept, h.v.Guest.DomID)
	}
	h.v.logger().Info("vGPU handed off", "bytes", h.Stats.Bytes, "vram_kept_in_slot", h.Kept, "pause", h.Stats.Pause, "took", h.Stats.Took)
	err := cur.Destroy(h.v, HandoffReason)
	// The access its guest made meanwhile waits for this lock; let go, it
	// finds the vGPU gone and the connection ends with the Bye. A pvdrm
	// back end, let go, finds it gone too and stops.
	h.v.restoreMu.Unlock()
	if h.letGo != nil {
		h.letGo()
	}
	h.v.hangMu.Lock()
	ended := h.v.connEnded
	h.v.hangMu.Unlock()
	if ended != nil {
		select {
		case <-ended:
		case <-time.After(handoffByeWait):
			err = errors.Join(err, fmt.Errorf("vGPU %d: its connection did not end within %v", h.v.ID, handoffByeWait))
		}
	}
	return err
}

// serving records that v's connection is being served: the channel
// returned is closed once it ended.
func (v *VGPU) serving() chan struct{} {
	ch := make(chan struct{})
	v.hangMu.Lock()
	v.connEnded = ch
	v.hangMu.Unlock()
	return ch
}

// Release lets the held vGPU go on here after a handoff that did not
// happen: parked, it comes back on its guest's next access.
func (h *HandoffHold) Release() {
	if h.done {
		return
	}
	h.done = true
	h.v.restoreMu.Unlock()
	if h.letGo != nil {
		h.letGo()
	}
}

// EncodeWaitingImages writes each state image waiting for its domain's
// device model (RegisterRestore, RegisterKept) with write, which gets the
// domain, the slot that keeps the image's VRAM (-1: the image carries
// it) and a writer for it: a handoff carries them to the new process,
// where they wait again. Call it with the device socket handed off (no
// device model takes one meanwhile); the aggregator's lock is held
// throughout, so an image that expires meanwhile is dropped only after it
// was written.
func (a *Aggregator) EncodeWaitingImages(write func(domid uint32, kept int, enc func(io.Writer) error) error) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for domid, p := range a.restores {
		// Written, it must not expire before the exec (its kept VRAM
		// renewed under the manifest that names it): it waits a whole
		// RestoreTTL again, as in the new process.
		p.timer.Reset(RestoreTTL)
		if err := write(domid, p.kept, func(w io.Writer) error { return vgpuimage.Encode(w, p.img) }); err != nil {
			return fmt.Errorf("image waiting for domain %d: %w", domid, err)
		}
	}
	return nil
}
