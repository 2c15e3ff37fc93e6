package aggregator

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/ipc"
	"github.com/gpuvm/gpuvm/vgpuimage"
)

// Saving a vGPU as a state image (docs/protocol.md §13, issue 18). The
// vGPU is parked by the eviction path — its work in flight ends (a
// submission boundary), its channels stop and their state is saved, its
// VRAM in use is copied off the board — and its state, which a parked
// vGPU keeps in the daemon's memory, is written as an image: the
// guest-visible registers and channels, the PV tables, the scheduler
// account, the VRAM pages. Nothing of another VM is in it: the pages are
// its own slot's, the rest is its own control block. Once the image is
// written the vGPU is destroyed (its device model gets a Bye saying it was
// saved), unless the caller keeps it: then it stays parked and its
// guest's next access brings it back on this board. An image that could
// not be written leaves it parked either way.

// ErrSaveUnsupported is returned for a vGPU whose state cannot be saved:
// a vGPU of a pvdrm mode with no back end on it (one being attached),
// whose state is nowhere but in that back end.
var ErrSaveUnsupported = errors.New("saving this vGPU's state is not supported")

// SaveReason is the Bye a saved vGPU's device model gets. It begins
// ipc.ByeSaved: the device model may keep its guest and come back with a
// resuming Hello where the image is restored (docs/protocol.md §13.7).
const SaveReason = ipc.ByeSaved + "vGPU saved to a state image (gpuvm vgpu save); it resumes where the image is restored"

// SaveStats describes one save.
type SaveStats struct {
	// Bytes is the VRAM in the image; Pause how long the eviction
	// paused the guest; Took the whole save, writing included.
	Bytes       uint64
	Pause, Took time.Duration
}

// SaveCommitTimeout is how long a saved vGPU is held parked for its
// image's commit (SaveHold): past it the save is aborted and the vGPU
// resumes here at its guest's next access.
const SaveCommitTimeout = time.Minute

// SaveHold is a saved vGPU held parked, with no restore of it possible,
// until the caller knows its image is safe: Commit destroys it, Abort
// lets it resume here. Without either, the hold aborts itself after
// SaveCommitTimeout. A save is two-phase so that a vGPU is never gone
// before its image is on disk: an image written to a client that then
// fails to store it (a full disk, a dropped connection) costs the guest a
// pause, not its GPU.
type SaveHold struct {
	a     *Aggregator
	v     *VGPU
	token string
	timer *time.Timer
	once  sync.Once
	err   error
	// onEnd, when set, runs once the hold ended: a pvdrm back end serves
	// on (after a commit, it finds its vGPU gone and stops).
	onEnd func()
}

// Save parks v, writes its state image to w and then destroys it — or,
// with keep, leaves it parked. ctx bounds the wait for its work in flight.
// It is SaveHeld committed at once, for callers whose writer is the
// image's final place.
func (a *Aggregator) Save(ctx context.Context, v *VGPU, w io.Writer, keep bool) (SaveStats, error) {
	st, h, err := a.SaveHeld(ctx, v, w, keep)
	if err != nil || h == nil {
		return st, err
	}
	return st, h.Commit()
}

// SaveHeld parks v and writes its state image to w. With keep it leaves v
// parked (its guest's next access resumes it here) and returns no hold;
// otherwise it returns v held parked until the hold is committed or
// aborted. An image that could not be written leaves v parked either way.
func (a *Aggregator) SaveHeld(ctx context.Context, v *VGPU, w io.Writer, keep bool) (SaveStats, *SaveHold, error) {
	start := time.Now()
	var st SaveStats
	if err := pvdrmSaves(v); err != nil {
		return st, nil, fmt.Errorf("save %w", err)
	}
	letGo, err := quiescePVDRM(ctx, v)
	if err != nil {
		return st, nil, fmt.Errorf("save %w", err)
	}
	quietHeld := false
	defer func() {
		if letGo != nil && !quietHeld {
			letGo()
		}
	}()
	// No restore from the moment it is parked until it is destroyed or
	// the hold is let go (kept: until its image is written): a guest
	// access meanwhile waits in ensureResident. Were it let through
	// between the capture and the destruction it would run on state the
	// image does not hold, and its device model, which repeats on the
	// restored vGPU only the accesses that got no answer, would go on
	// from a state the image lacks.
	v.restoreMu.Lock()
	held := false
	defer func() {
		if !held {
			v.restoreMu.Unlock()
		}
	}()
	cur, _ := v.where()
	ev, err := cur.Evict(ctx, v, "saving its state")
	if err != nil {
		return st, nil, fmt.Errorf("save: %w", err)
	}
	st.Pause = ev.Took
	img, err := v.capture(true)
	if err != nil {
		return st, nil, fmt.Errorf("save vGPU %d: %w", v.ID, err)
	}
	defer img.Scrub()
	st.Bytes = img.Bytes()
	if err := vgpuimage.Encode(w, img); err != nil {
		return st, nil, fmt.Errorf("save vGPU %d: writing the image: %w (the vGPU stays parked)", v.ID, err)
	}
	st.Took = time.Since(start)
	v.logger().Info("vGPU saved", "bytes", st.Bytes, "pause", st.Pause, "took", st.Took, "keep", keep)
	if keep {
		return st, nil, nil
	}
	held, quietHeld = true, true
	h := &SaveHold{a: a, v: v, onEnd: letGo}
	h.timer = time.AfterFunc(SaveCommitTimeout, func() {
		if h.release(false) {
			v.logger().Warn("save not committed in time: the vGPU stays parked and resumes here", "timeout", SaveCommitTimeout)
		}
	})
	return st, h, nil
}

// pvdrmBackend is v's pvdrm back end: nil for a vGPU of another mode, or
// one whose back end is still being attached.
func (v *VGPU) pvdrmBackend() *PVDRMBackend {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.pvdrm
}

// pvdrmLeaves says why v's state cannot leave this daemon for another (a
// save, a migration), or nil if it can: a pvdrm vGPU's front end must
// come back by itself after the saved Bye, which only the local
// transport's does (a Xen front end's device is this daemon's; only a
// handoff, whose new process takes the device over, moves it).
func pvdrmLeaves(v *VGPU) error {
	if !config.Mode(v.Guest.Mode).IsPVDRM() {
		return nil
	}
	b := v.pvdrmBackend()
	switch {
	case b == nil:
		return fmt.Errorf("vGPU %d (mode %s): %w: it has no pvdrm back end", v.ID, v.Guest.Mode, ErrSaveUnsupported)
	case !b.frontEndRedials():
		return fmt.Errorf("vGPU %d (mode %s): %w: its front end is on the xen transport, which does not follow it to another daemon", v.ID, v.Guest.Mode, ErrSaveUnsupported)
	}
	return nil
}

// pvdrmSaves says why v's state cannot be saved as an image, or nil if
// it can: as pvdrmLeaves, except that a front end on the xen transport
// waits out the save for a back end of this daemon that restores the
// image (gpuvm xl save and restore, docs/pvdrm.md §8, "A device across a save").
func pvdrmSaves(v *VGPU) error {
	if b := v.pvdrmBackend(); b != nil && b.frontEndFollowsSave() {
		return nil
	}
	return pvdrmLeaves(v)
}

// quiescePVDRM stops a pvdrm vGPU's back end between two requests, as a
// save or a handoff does before restoreMu (a request it is serving may be
// waiting for the vGPU to be resident; pvdrm_save.go), and returns how to
// let it serve on: nil for a vGPU of another mode.
func quiescePVDRM(ctx context.Context, v *VGPU) (func(), error) {
	if !config.Mode(v.Guest.Mode).IsPVDRM() {
		return nil, nil
	}
	b := v.pvdrmBackend()
	if b == nil {
		return nil, fmt.Errorf("vGPU %d (mode %s): %w: it has no pvdrm back end", v.ID, v.Guest.Mode, ErrSaveUnsupported)
	}
	letGo, err := b.quiesce(ctx)
	if err != nil {
		return nil, fmt.Errorf("vGPU %d: %w", v.ID, err)
	}
	return letGo, nil
}

// Commit destroys the held vGPU (its device model gets the Bye saying it
// was saved). It fails if the hold timed out first.
func (h *SaveHold) Commit() error {
	if !h.release(true) {
		return fmt.Errorf("commit save of vGPU %d: %w", h.v.ID, ErrSaveExpired)
	}
	return h.err
}

// Abort lets the held vGPU go on parked: its guest's next access resumes
// it here. It reports whether the hold was still there to abort.
func (h *SaveHold) Abort() bool { return h.release(false) }

// ErrSaveExpired is a save's commit that came after the hold was let go
// (timed out or aborted): the vGPU was not destroyed.
var ErrSaveExpired = errors.New("the save was aborted or timed out, and the vGPU resumed or may resume here")

// release ends the hold once: committing destroys the vGPU. It reports
// whether this call ended it.
func (h *SaveHold) release(commit bool) bool {
	done := false
	h.once.Do(func() {
		done = true
		h.timer.Stop()
		if commit {
			cur, _ := h.v.where()
			h.err = cur.Destroy(h.v, SaveReason)
			if errors.Is(h.err, ErrDetached) {
				h.err = nil // gone already: its image is all that is left either way
			}
		}
		h.v.saveHold.CompareAndSwap(h, nil)
		h.v.restoreMu.Unlock()
		if h.onEnd != nil {
			h.onEnd()
		}
	})
	return done
}

// capture copies parked v's state into an image. With carryVRAM, VRAM
// it keeps in its slot (keep.go) is copied out into the image first and
// the slot let go: an image that leaves the daemon carries it. Called
// with v.restoreMu held.
func (v *VGPU) capture(carryVRAM bool) (*vgpuimage.Image, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.dead {
		return nil, ErrDetached
	}
	if v.image == nil {
		return nil, errors.New("not parked")
	}
	if carryVRAM {
		if err := v.unkeep(v.agg); err != nil {
			return nil, err
		}
	}
	m := &vgpuimage.Image{Identity: vgpuimage.Identity{
		Mode: v.Guest.Mode, Profile: v.profile, Name: v.Guest.Name, DomID: v.Guest.DomID,
		RAM: uint64(len(v.ram)), VRAM: v.Slot.VRAM.Size, Channels: uint32(len(v.chans)),
		BAR1: v.Slot.BAR1.Size, BAR3: v.Slot.BAR3.Size, PV: v.feat.PV,
	}}
	offs := make([]uint32, 0, len(v.emu))
	for off := range v.emu {
		if v.agg.imageReg(off) {
			offs = append(offs, off)
		}
	}
	slices.Sort(offs)
	for _, off := range offs {
		m.Regs = append(m.Regs, vgpuimage.Reg{Off: off, Val: v.emu[off]})
	}
	for i, c := range v.chans {
		ch := vgpuimage.Chan{Inst: c.inst, Ctl: c.ctl, Put: c.put, Enabled: c.enabled, Listed: c.listed, Killed: c.killed}
		if i < len(v.image.chans) && v.image.chans[i] != nil {
			ch.State = slices.Clone(v.image.chans[i])
		}
		m.Chans = append(m.Chans, ch)
	}
	if v.feat.PV {
		m.PV = v.capturePV()
	}
	if acc := v.leftAccount; acc != nil && acc.v == v {
		m.Account = vgpuimage.Account{Submissions: acc.submissions, GPUTimeNs: uint64(acc.gpuTime), QueueWaitNs: uint64(acc.queueWait),
			Released: acc.released, SLOViolations: acc.slo.violations, SLOBoosted: acc.slo.boosted, Waits: slices.Clone(acc.waits[:])}
	}
	if v.pvdrm != nil {
		if err := v.pvdrm.capturePVDRM(m, v.image.pages); err != nil {
			return nil, fmt.Errorf("pvdrm back end: %w", err)
		}
		return m, nil
	}
	for _, p := range v.image.pages {
		m.Pages = append(m.Pages, vgpuimage.Page{Off: p.off, Data: slices.Clone(p.data)})
	}
	return m, nil
}

// capturePV is a parked PV vGPU's tables, apertures and hypercall window.
// Called with v.mu held.
func (v *VGPU) capturePV() *vgpuimage.PV {
	p := &vgpuimage.PV{}
	if pv := v.image.pv; pv != nil {
		p.BAR1, p.BAR3 = slices.Clone(pv.bars[0]), slices.Clone(pv.bars[1])
		if t := pv.tables; t != nil {
			p.Next = t.Next
			for _, o := range t.Objects {
				p.Objects = append(p.Objects, vgpuimage.PVObject{Handle: o.Handle, Kind: uint8(o.Kind), In: o.In, PDE: uint32(o.PDE), Entries: slices.Clone(o.Entries)})
			}
			for ramin, pd := range t.Bindings {
				p.Bindings = append(p.Bindings, vgpuimage.PVBinding{RAMIN: ramin, PD: pd})
			}
			slices.SortFunc(p.Bindings, func(a, b vgpuimage.PVBinding) int { return cmp.Compare(a.RAMIN, b.RAMIN) })
		}
	}
	if h := v.hc; h != nil {
		for i, used := range h.used {
			if used {
				p.HC.Slots = append(p.HC.Slots, vgpuimage.HCSlot{Index: uint32(i), GPA: h.slots[i]})
			}
		}
		p.HC.Sel, p.HC.Lo, p.HC.Hi, p.HC.Status, p.HC.Last, p.HC.N = h.sel, h.lo, h.hi, uint32(h.status), uint32(h.last), h.calls
	}
	return p
}

// replayedRegs are the registers besides plain storage that an image
// carries: their derived state is re-applied through the guest's own
// write path at a restore (the PRAMIN window and poll area through their
// handlers, the BAR instances through the rebuild's setInst).
var replayedRegs = []uint32{nvc0.RegPRAMINWindow, nvc0.RegPollArea, nvc0.RegBAR1Inst, nvc0.RegBAR3Inst}

// imageReg reports whether a state image may carry register off: plain
// per-VM storage in a's register table, or one of replayedRegs.
func (a *Aggregator) imageReg(off uint32) bool {
	if slices.Contains(replayedRegs, off) {
		return true
	}
	h, ok := a.regs.exact[off]
	return ok && h.plain
}

// TransferStall bounds how long a save's stream may wait for its client
// to read on, and a restore's for its client to send on: a stalled client
// cannot hold a vGPU parked, or a transfer's memory, past it.
const TransferStall = 30 * time.Second

// SaveTokenHeader carries a save's token, which its commit and abort name
// (?token=).
const SaveTokenHeader = "Gpuvm-Save-Token"

// serveSave answers POST /v1/vgpus/{id}/save: 200 with the image as the
// body (application/octet-stream) and the vGPU held parked for its commit
// (serveSaveEnd) — kept parked with ?keep=1 —, 404 for no such vGPU, 501
// for one that cannot be saved, 409 when its work in flight did not end in
// time, 503 when MaxImageTransfers are under way, 500 otherwise. Headers
// go out only once the vGPU is parked, so an error before that is a JSON
// answer; an error while streaming cuts the stream short (the client's
// decoder finds it truncated) and leaves the vGPU parked, and so does a
// client that stops reading for TransferStall.
func (a *Aggregator) serveSave(w http.ResponseWriter, r *http.Request) {
	v := a.lookup(r.PathValue("id"))
	if v == nil {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such vGPU"})
		return
	}
	done, ok := a.reg.TryImageTransfer()
	if !ok {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": ErrTransfersBusy.Error()})
		return
	}
	defer done()
	keep := r.URL.Query().Get("keep") == "1"
	token := ""
	if !keep {
		token = rand.Text()
		w.Header().Set(SaveTokenHeader, token)
	}
	cur, _ := v.where()
	ctx, cancel := context.WithTimeout(r.Context(), cur.opts.Timeout)
	defer cancel()
	sw := &lazyHeader{w: w, rc: http.NewResponseController(w)}
	_, h, err := cur.SaveHeld(ctx, v, sw, keep)
	switch {
	case err == nil:
		if !sw.started {
			sw.start()
		}
		if h != nil {
			h.token = token
			v.saveHold.Store(h)
		}
	case sw.started:
		a.log.Warn("save: image cut short", "vgpu", v.ID, "err", err)
	default:
		writeParkError(w, err)
	}
}

// serveSaveEnd answers POST /v1/vgpus/{id}/save/commit and .../abort
// (?token= the save's): the commit destroys the vGPU held for it (200
// {"destroyed":true}), the abort lets it resume here (200
// {"aborted":true}); 404 for no such vGPU, 409 when no save of it with
// that token is held (it timed out or was aborted: the vGPU resumed, and
// the image is stale).
func (a *Aggregator) serveSaveEnd(commit bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v := a.lookup(r.PathValue("id"))
		if v == nil {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such vGPU"})
			return
		}
		h := v.saveHold.Load()
		token := r.URL.Query().Get("token")
		if h == nil || token == "" || subtle.ConstantTimeCompare([]byte(h.token), []byte(token)) != 1 {
			writeJSON(w, http.StatusConflict, map[string]string{"error": "no save of this vGPU with that token is held: " + ErrSaveExpired.Error()})
			return
		}
		if !commit {
			if !h.Abort() {
				writeJSON(w, http.StatusConflict, map[string]string{"error": ErrSaveExpired.Error()})
				return
			}
			writeJSON(w, http.StatusOK, map[string]bool{"aborted": true})
			return
		}
		if err := h.Commit(); err != nil {
			code := http.StatusInternalServerError
			if errors.Is(err, ErrSaveExpired) {
				code = http.StatusConflict
			}
			writeJSON(w, code, map[string]string{"error": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, map[string]bool{"destroyed": true})
	}
}

// lazyHeader sends the 200 and content type with the first byte of the
// image, and gives each write TransferStall to reach the client.
type lazyHeader struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	started bool
}

func (l *lazyHeader) start() {
	l.started = true
	l.w.Header().Set("Content-Type", "application/octet-stream")
	l.w.WriteHeader(http.StatusOK)
}

func (l *lazyHeader) Write(p []byte) (int, error) {
	if !l.started {
		l.start()
	}
	_ = l.rc.SetWriteDeadline(time.Now().Add(TransferStall)) // not every writer has deadlines
	return l.w.Write(p)
}
