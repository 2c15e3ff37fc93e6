package aggregator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/gpu/errreport"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/hypercall"
	"github.com/gpuvm/gpuvm/internal/ratelog"
	"github.com/gpuvm/gpuvm/ipc"
	"github.com/gpuvm/gpuvm/shadow"
	"github.com/gpuvm/gpuvm/vgpuimage"
)

// Restoring a vGPU from a state image (docs/protocol.md §13.5). The image
// is hostile input. RegisterRestore decodes all of it (structure, bounds,
// checksum) and checks it against this daemon (mode, slot sizes, which
// registers it may carry) before it registers anything; it then waits for
// its domain, like registered domain settings, bounded in number and time.
// The next device model whose Hello names the domain takes it: its vGPU
// is attached parked, carrying the image, and restored at once through
// the eviction's restore path, which re-derives every shadow from the
// guest's structures through the guest-write paths (setChannelInst, the
// PV hypercall paths, the BAR instance write), so that every address in
// the image is checked against the new slot and the VM's RAM as a guest's
// own write is. A restore that fails destroys the vGPU: nothing stays
// attached, and the device model is refused with the reason.

// RestoreTTL is how long a registered image waits for its domain's device
// model.
const RestoreTTL = 10 * time.Minute

// ErrImageRefused wraps why an image was refused before it was
// registered.
var ErrImageRefused = errors.New("state image refused")

// maxImageOverhead bounds an image's bytes besides its VRAM pages (the PV
// section at its largest, §13.4).
const maxImageOverhead = 300 << 20

// RestoreInfo describes a registered image.
type RestoreInfo struct {
	DomID   uint32    `json:"domid"`
	Mode    string    `json:"mode"`
	Name    string    `json:"name"`
	VRAM    uint64    `json:"vram"`
	Bytes   uint64    `json:"bytes"`
	Expires time.Time `json:"expires"`
	// KeptSlot is the slot that keeps the vGPU's VRAM, handed over in
	// place by the daemon's previous process (keep.go); absent: the image
	// carries its VRAM.
	KeptSlot *int `json:"kept_slot,omitempty"`
}

type pendingRestore struct {
	img   *vgpuimage.Image
	info  RestoreInfo
	timer *time.Timer
	// kept is the slot that keeps the image's VRAM (RegisterKept), -1:
	// none, the image carries its pages.
	kept int
}

// RegisterRestore reads an image from r, checks it (CheckImage) and holds
// it for domain domid's next device model. A second image for the domain
// replaces the first.
func (a *Aggregator) RegisterRestore(domid uint32, r io.Reader) (RestoreInfo, error) {
	img, err := vgpuimage.Decode(r)
	if err != nil {
		return RestoreInfo{}, fmt.Errorf("%w: %w", ErrImageRefused, err)
	}
	return a.RegisterImage(domid, img)
}

// RegisterImage is RegisterRestore of an image decoded already (by a host
// choosing among its boards): it takes img, scrubbing it if refused.
func (a *Aggregator) RegisterImage(domid uint32, img *vgpuimage.Image) (RestoreInfo, error) {
	if err := a.CheckImage(domid, img); err != nil {
		img.Scrub()
		return RestoreInfo{}, err
	}
	return a.holdRestoreIn(domid, img, -1)
}

// CheckImage checks a decoded image against this board: what can be
// checked before there is a slot and RAM to check it against.
func (a *Aggregator) CheckImage(domid uint32, img *vgpuimage.Image) error {
	id := &img.Identity
	refuse := func(f string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrImageRefused, fmt.Sprintf(f, args...))
	}
	switch {
	case domid < 1 || domid > 32751:
		return refuse("domain id %d not in 1..32751", domid)
	case !IsServedMode(id.Mode):
		return refuse("mode %q is not served (have %v)", id.Mode, Modes())
	case config.Mode(id.Mode).IsPVDRM() != id.PVDRM:
		return refuse("mode %s with a pvdrm section %v: a pvdrm mode's image has one, no other's does", id.Mode, id.PVDRM)
	}
	feat, err := FeaturesFor(id.Mode)
	// A pvdrm image carries no PV tables: they are its back-end driver's.
	if err != nil || (feat.PV && !feat.PVDRM) != id.PV {
		return refuse("mode %s with PV %v: %v", id.Mode, id.PV, err)
	}
	if id.PVDRM {
		if len(img.Regs) != 0 {
			return refuse("a pvdrm image with %d registers: a pvdrm guest has none", len(img.Regs))
		}
		for i, c := range img.Chans {
			if c.Inst != 0 || c.Ctl != 0 || c.Put != 0 || c.Enabled || c.Listed || c.Killed || c.State != nil {
				return refuse("a pvdrm image with state for channel %d: its channels are its back-end driver's", i)
			}
		}
	}
	if len(a.layout.Slots) == 0 {
		return refuse("the board has no slots")
	}
	if s := a.imageSlot(img); s.VRAM.Size != id.VRAM || uint64(s.Chans) != uint64(id.Channels) ||
		s.BAR1.Size != id.BAR1 || s.BAR3.Size != id.BAR3 {
		full := a.layout.Slots[0]
		return refuse("the image's vGPU (VRAM %d, %d channels, BAR1 %d, BAR3 %d) does not fit this board's slots (VRAM %d, %d channels, BAR1 %d, BAR3 %d)",
			id.VRAM, id.Channels, id.BAR1, id.BAR3, full.VRAM.Size, full.Chans, full.BAR1.Size, full.BAR3.Size)
	}
	for _, r := range img.Regs {
		if !a.imageReg(r.Off) {
			return refuse("register %#x is not plain per-VM storage: an image cannot set it", r.Off)
		}
	}
	for i, c := range img.Chans {
		if c.State != nil && (!c.Enabled || c.Inst&nvc0.ChanInstValid == 0) {
			return refuse("channel %d has running state but is not enabled with a valid instance", i)
		}
	}
	if img.PV != nil {
		for _, s := range img.PV.HC.Slots {
			if s.Index >= hypercall.Slots {
				return refuse("hypercall slot %d: the ABI has %d", s.Index, hypercall.Slots)
			}
		}
	}
	acc := &img.Account
	if n := len(acc.Waits); n != 0 && n != waitBuckets+1 {
		return refuse("account of %d wait buckets, want %d", n, waitBuckets+1)
	}
	// The totals carry on and are summed with other vGPUs' (the host's
	// load meter, the operator's figures): bounded so that no sum of them
	// over a board's vGPUs wraps an int64.
	for _, n := range append([]uint64{acc.Submissions, acc.GPUTimeNs, acc.QueueWaitNs, acc.Released, acc.SLOViolations, acc.SLOBoosted}, acc.Waits...) {
		if n > maxAccountTotal {
			return refuse("account total %d out of range (at most %d)", n, uint64(maxAccountTotal))
		}
	}
	return nil
}

// maxAccountTotal bounds every scheduler total an image carries: 2^56 ns
// is about 834 days of GPU time, and a board has at most 64 vGPU slots
// (config), so the sum over a board's vGPUs stays below 2^62.
const maxAccountTotal = 1 << 56

// imageSlot is the slot a restored vGPU of img gets, not yet placed: a
// slot of the board narrowed to the sizes its guest was told.
func (a *Aggregator) imageSlot(img *vgpuimage.Image) Slot {
	id := &img.Identity
	s := Quota{Channels: int(id.Channels), VRAM: id.VRAM, BAR1: id.BAR1, BAR3: id.BAR3}.narrow(a.layout.Slots[0], nvc0.LargePageSize, nvc0.PageSize)
	s.Index, s.VRAM.Base, s.ChanBase = -1, 0, 0
	return s
}

// maxRestores bounds the images waiting: as many as domain settings.
func (a *Aggregator) maxRestores() int { return a.maxDomainSettings() }

// holdRestoreIn holds img for domid's next device model; kept is the slot
// that keeps its VRAM (-1: none). It takes img — and, refused, the kept
// slot's VRAM goes.
func (a *Aggregator) holdRestoreIn(domid uint32, img *vgpuimage.Image, kept int) (RestoreInfo, error) {
	info := RestoreInfo{DomID: domid, Mode: img.Identity.Mode, Name: img.Identity.Name, VRAM: img.Identity.VRAM,
		Bytes: img.Bytes(), Expires: time.Now().Add(RestoreTTL)}
	if kept >= 0 {
		info.KeptSlot = &kept
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.restores[domid]; !ok && len(a.restores) >= a.maxRestores() {
		img.Scrub()
		if kept >= 0 {
			a.releaseKeptLocked(kept, domid)
		}
		return info, fmt.Errorf("%w: images for %d domains are waiting already", ErrImageRefused, len(a.restores))
	}
	if old, ok := a.restores[domid]; ok && old.kept == kept {
		old.kept = -1 // the same VRAM, now the new image's
	}
	a.dropRestoreLocked(domid)
	p := &pendingRestore{img: img, info: info, kept: kept}
	p.timer = time.AfterFunc(RestoreTTL, func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.restores[domid] == p {
			a.log.Info("state image dropped: no device model came for it", "domid", domid, "after", RestoreTTL)
			a.dropRestoreLocked(domid)
		}
	})
	a.restores[domid] = p
	a.log.Info("state image registered", "domid", domid, "mode", info.Mode, "name", info.Name, "bytes", info.Bytes, "kept_slot", kept)
	return info, nil
}

// dropRestoreLocked scrubs and forgets domid's image. Called with a.mu
// held.
func (a *Aggregator) dropRestoreLocked(domid uint32) {
	if p, ok := a.restores[domid]; ok {
		p.timer.Stop()
		p.img.Scrub()
		delete(a.restores, domid)
		if p.kept >= 0 {
			a.releaseKeptLocked(p.kept, domid)
		}
	}
}

// ForgetRestore drops the image waiting for domid.
func (a *Aggregator) ForgetRestore(domid uint32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.dropRestoreLocked(domid)
}

// Restores lists the images waiting for their domains.
func (a *Aggregator) Restores() []RestoreInfo {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]RestoreInfo, 0, len(a.restores))
	for _, p := range a.restores {
		out = append(out, p.info)
	}
	return out
}

// HasRestore reports whether an image waits for domid.
func (a *Aggregator) HasRestore(domid uint32) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := a.restores[domid]
	return ok
}

// NoImageError is why a resuming device model (Guest.Resume) of domain
// domid is refused while no image waits for it: its text begins
// ipc.RejectNoImage, which tells the device model to try again.
func NoImageError(domid uint32) error {
	return fmt.Errorf("%sno vGPU state image waits for domain %d here (gpuvm vgpu restore --domid %d FILE)", ipc.RejectNoImage, domid, domid)
}

// takeRestore removes and returns the image waiting for domid (nil: none)
// and the slot that keeps its VRAM (-1: none), which the caller then owns.
func (a *Aggregator) takeRestore(domid uint32) (*vgpuimage.Image, int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	p, ok := a.restores[domid]
	if !ok {
		return nil, -1
	}
	p.timer.Stop()
	delete(a.restores, domid)
	return p.img, p.kept
}

// restorePending reports whether an image waits for domain domid.
func (a *Aggregator) restorePending(domid uint32) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := a.restores[domid]
	return ok
}

// restoreAdmits reports whether a vGPU of img's size may come onto a as a
// new attach would: into a free slot, or — only on a board allowed to
// overcommit, as far as it may — into one another vGPU is evicted from. A
// restore never makes room by eviction where an attach could not.
func (a *Aggregator) restoreAdmits(p *pendingRestore) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if p.kept >= 0 {
		// Its own slot, which keeps its VRAM.
		k, ok := a.kept[p.kept]
		return ok && k.domid == p.info.DomID && a.vgpus[p.kept] == nil
	}
	img := p.img
	for i, v := range a.vgpus {
		if v == nil && a.slotFree(i) {
			return true
		}
	}
	return a.opts.Overcommit > 1 && a.overcommitFits(img.Identity.VRAM)
}

// attachRestored gives guest g the vGPU the image waiting for its domain
// describes: attached parked, carrying the image, then restored into a
// slot of a. On any failure nothing of it stays attached. The image is
// taken only once the guest is admitted — its id free, its mode and name
// the image's, room on the board — so a refusal that is not the image's
// fault (a second device model for a domain still served, a full board)
// leaves it waiting; from then on it is consumed, whatever happens.
func (a *Aggregator) attachRestored(g Guest, mapRAM func() ([]byte, func() error, error)) (*VGPU, error) {
	fail := func(err error) (*VGPU, error) {
		return nil, fmt.Errorf("restore %s (domid %d) from a state image: %w", g.Name, g.DomID, err)
	}
	id, err := a.reg.claim(g)
	if err != nil {
		return fail(err)
	}
	a.mu.Lock()
	p, ok := a.restores[g.DomID]
	var want vgpuimage.Identity
	if ok {
		want = p.img.Identity
	}
	a.mu.Unlock()
	switch {
	case !ok:
		a.reg.release(id)
		if g.Resume {
			return nil, NoImageError(g.DomID)
		}
		return fail(fmt.Errorf("the image waiting for the domain was taken meanwhile: %w", ErrNoSlot))
	case g.Mode != want.Mode:
		a.reg.release(id)
		return fail(fmt.Errorf("%w: the device model asks for mode %s, the image is of a mode %s vGPU", ErrImageRefused, g.Mode, want.Mode))
	case g.Name != want.Name:
		// The image is the domain's: a device model that names another
		// guest is not given it (a domid alone is what a compromised
		// device model of another domain could claim).
		a.reg.release(id)
		return fail(fmt.Errorf("%w: the device model is for guest %q, the image is of guest %q", ErrImageRefused, g.Name, want.Name))
	case !a.restoreAdmits(p):
		a.reg.release(id)
		return fail(fmt.Errorf("no free slot on board %s for it (the image keeps waiting): %w", a.opts.BoardName, ErrNoSlot))
	}
	img, kept := a.takeRestore(g.DomID)
	if img == nil {
		a.reg.release(id)
		return fail(fmt.Errorf("the image waiting for the domain was taken meanwhile: %w", ErrNoSlot))
	}
	defer img.Scrub()
	v, err := a.parkedFromImage(id, g, img, mapRAM)
	if err != nil {
		a.reg.release(id)
		if kept >= 0 {
			a.releaseKept(kept, g.DomID)
		}
		return fail(err)
	}
	if kept >= 0 {
		// Its VRAM is in the slot kept for it: restored there, not copied.
		v.image.kept, v.homeSlot = true, kept
	}
	a.mu.Lock()
	a.parked[id] = v
	a.mu.Unlock()
	v.evicted.Store(true)
	st, err := a.restoreNow(v)
	if err != nil {
		cur, _ := v.where()
		return fail(errors.Join(err, cur.Detach(v)))
	}
	v.log.Info("vGPU restored from a state image", "mode", g.Mode, "slot", st.Slot, "bytes", st.Bytes, "took", st.Took,
		"saved_as", img.Identity.Name, "saved_domid", img.Identity.DomID)
	return v, nil
}

// parkedFromImage builds the parked vGPU img describes, every value of
// the image re-applied through the path that checks it. On error nothing
// of it is left.
func (a *Aggregator) parkedFromImage(id int, g Guest, img *vgpuimage.Image, mapRAM func() ([]byte, func() error, error)) (v *VGPU, err error) {
	feat, err := a.featuresFor(g)
	if err != nil {
		return nil, err
	}
	slot := a.imageSlot(img)
	v = &VGPU{agg: a, ID: id, Slot: slot, Guest: g, feat: feat, profile: img.Identity.Profile, emu: map[uint32]uint32{},
		windowOK: true, verr: errreport.New(max(virtualQueue, slot.Chans)),
		synced: map[*shadow.Space]bool{}, stale: map[*shadow.Space]bool{},
		chans: make([]vchan, slot.Chans), homeSlot: -1,
		log:   a.log.With("vgpu", id, "board", a.opts.Board, "slot", -1, "domid", g.DomID, "name", g.Name),
		gripe: ratelog.New(guestLogRate, guestLogBurst)}
	defer func() {
		if err != nil {
			if v.remap != nil {
				err = errors.Join(err, v.remap.close())
			}
			if v.ram != nil {
				err = errors.Join(err, v.unmapRAM())
			}
		}
	}()
	if v.ram, v.unmapRAM, err = mapRAM(); err != nil {
		v.ram = nil
		return v, fmt.Errorf("map guest RAM: %w", err)
	}
	if uint64(len(v.ram)) < img.Identity.RAM {
		return v, fmt.Errorf("%w: the device model offers %d bytes of RAM, the image's vGPU had %d", ErrImageRefused, len(v.ram), img.Identity.RAM)
	}
	if feat.Remap {
		if v.remap, err = newRemapTable(slot); err != nil {
			return v, err
		}
	}
	if err := v.applyImage(img); err != nil {
		return v, fmt.Errorf("%w: %w", ErrImageRefused, err)
	}
	return v, nil
}

// applyImage sets v's guest-visible state and its evicted image from img.
func (v *VGPU) applyImage(img *vgpuimage.Image) error {
	for _, r := range img.Regs {
		switch {
		case r.Off == nvc0.RegPRAMINWindow:
			praminWindowWrite(v, r.Off, r.Val) // a window off VRAM stays refused
		case r.Off == nvc0.RegPollArea:
			v.agg.regs.exact[r.Off].write(v, r.Off, r.Val)
		case v.agg.imageReg(r.Off):
			// Plain storage; the BAR instances are applied by the
			// rebuild, through the guest's write path (setInst).
			v.emu[r.Off] = r.Val
		default:
			return fmt.Errorf("register %#x is not plain per-VM storage", r.Off)
		}
	}
	states := make([][]uint32, len(v.chans))
	for i, c := range img.Chans {
		v.chans[i] = vchan{inst: c.Inst, ctl: c.Ctl, put: c.Put, enabled: c.Enabled, listed: c.Listed, killed: c.Killed}
		states[i] = c.State
	}
	ev := &evictImage{chans: states}
	if v.feat.PV {
		v.hc = &hypercalls{dec: hypercall.NewDecoder(), flushPDs: map[uint64]struct{}{}}
		v.hcOps = hcHandlers()
		if err := v.applyPV(img.PV, ev); err != nil {
			return err
		}
	}
	acc := &img.Account
	v.leftAccount = &account{v: v, submissions: acc.Submissions, gpuTime: time.Duration(acc.GPUTimeNs),
		queueWait: time.Duration(acc.QueueWaitNs), released: acc.Released}
	v.leftAccount.slo.violations, v.leftAccount.slo.boosted = acc.SLOViolations, acc.SLOBoosted
	copy(v.leftAccount.waits[:], acc.Waits)
	for _, p := range img.Pages {
		ev.pages = append(ev.pages, imagePage{off: p.Off, data: p.Data})
		ev.bytes += uint64(len(p.Data))
	}
	v.image = ev
	return nil
}

// applyPV sets a PV vGPU's hypercall window from p (each slot page
// registered through the guest's registration path) and its tables into
// ev, which the rebuild imports through the hypercalls' paths.
func (v *VGPU) applyPV(p *vgpuimage.PV, ev *evictImage) error {
	h := v.hc
	for _, s := range p.HC.Slots {
		if code := v.registerSlot(s.Index, true, s.GPA); code != hypercall.OK {
			return fmt.Errorf("hypercall slot %d at %#x refused (%v)", s.Index, s.GPA, code)
		}
	}
	h.sel, h.lo, h.hi = p.HC.Sel, p.HC.Lo, p.HC.Hi
	h.status, h.last, h.calls = hypercall.Code(p.HC.Status), hypercall.Code(p.HC.Last), p.HC.N
	st := &shadow.PVState{Next: p.Next, Bindings: make(map[uint64]uint32, len(p.Bindings))}
	for _, o := range p.Objects {
		st.Objects = append(st.Objects, shadow.PVObjectState{Handle: o.Handle, Kind: shadow.PVKind(o.Kind), Entries: o.Entries, In: o.In, PDE: int(o.PDE)})
	}
	for _, b := range p.Bindings {
		st.Bindings[b.RAMIN] = b.PD
	}
	ev.pv = &pvImage{tables: st, bars: [2][]uint64{p.BAR1, p.BAR3}}
	return nil
}

// restoreNow restores parked v (attached on a from an image) into a slot
// of a, as its guest's first access would (ensureResident), before its
// device model is welcomed: no remap rebind, the Welcome hands the slice.
func (a *Aggregator) restoreNow(v *VGPU) (EvictStats, error) {
	v.restoreMu.Lock()
	defer v.restoreMu.Unlock()
	to, kept, err := a.slotForRestore(v, func() (Slot, error) {
		if a.opts.Overcommit > 1 {
			return a.roomFor(context.Background(), v, -1)
		}
		return a.holdSlotPrefer(v, -1) // never by evicting another vGPU
	})
	if err != nil {
		return EvictStats{}, err
	}
	v.mu.Lock()
	if v.dead || v.image == nil || v.agg != a {
		v.mu.Unlock()
		a.freeClaimed(to.Index, kept)
		return EvictStats{}, ErrDetached
	}
	st, err := v.restoreOn(a, to)
	v.mu.Unlock()
	if err != nil {
		return st, err
	}
	a.paused(Pause{Kind: PauseRestore, VGPU: v.ID, FromBoard: a.opts.BoardName, ToBoard: st.Board,
		FromSlot: -1, ToSlot: st.Slot, Bytes: st.Bytes, Took: st.Took})
	return st, nil
}

// serveRestore answers POST /v1/domains/{domid}/restore: the body is an
// image (at most a slot's VRAM and the format's overhead); 200 with its
// RestoreInfo once it waits for the domain, 400 with the reason when it
// is refused (nothing registered), 503 when MaxImageTransfers are under
// way. A client that stops sending for TransferStall is cut off.
func (a *Aggregator) serveRestore(w http.ResponseWriter, r *http.Request) {
	domid, err := strconv.ParseUint(r.PathValue("domid"), 10, 32)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "domain id: " + err.Error()})
		return
	}
	done, ok := a.reg.TryImageTransfer()
	if !ok {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": ErrTransfersBusy.Error()})
		return
	}
	defer done()
	info, err := a.RegisterRestore(uint32(domid), StallReader(w, http.MaxBytesReader(w, r.Body, a.MaxImageBytes())))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, info)
}

// MaxImageBytes bounds an image the board takes: its slot's VRAM and the
// format's overhead.
func (a *Aggregator) MaxImageBytes() int64 {
	var vram uint64
	if len(a.layout.Slots) > 0 {
		vram = a.layout.Slots[0].VRAM.Size
	}
	return int64(vram + maxImageOverhead)
}

// StallReader reads a request's body for w's handler, giving each read
// TransferStall to arrive.
func StallReader(w http.ResponseWriter, body io.Reader) io.Reader {
	return &stallReader{rc: http.NewResponseController(w), r: body}
}

type stallReader struct {
	rc *http.ResponseController
	r  io.Reader
}

func (s *stallReader) Read(p []byte) (int, error) {
	_ = s.rc.SetReadDeadline(time.Now().Add(TransferStall)) // not every server has deadlines
	return s.r.Read(p)
}
