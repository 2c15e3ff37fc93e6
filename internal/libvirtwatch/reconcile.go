package libvirtwatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/digitalocean/go-libvirt"

	"github.com/gpuvm/gpuvm/internal/vgpumeta"
)

// Domain ids a vGPU may have (ipc.MinDomID..ipc.MaxDomID: dom0 never,
// nor Xen's reserved ids).
const (
	minDomID = 1
	maxDomID = 32751
)

// stopTimeout bounds how long tearing one vGPU down may take.
const stopTimeout = 30 * time.Second

// reconcile makes the device models agree with the running domains: the
// ones of domains no longer running stop, and running domains that ask
// for a vGPU and have none get theirs.
func (w *Watcher) reconcile(ctx context.Context, c Conn) error {
	doms, _, err := c.ConnectListAllDomains(1, libvirt.ConnectListDomainsActive)
	if err != nil {
		return fmt.Errorf("listing the running domains: %w", err)
	}
	running := map[libvirt.UUID]bool{}
	for _, d := range doms {
		running[d.UUID] = true
	}
	for u, a := range w.attached {
		if !running[u] {
			w.detach(ctx, u, fmt.Sprintf("domain %s is not running (seen on connecting to libvirt)", a.name))
		}
	}
	for run := range w.ended {
		if !running[run.uuid] {
			delete(w.ended, run)
		}
	}
	for _, d := range doms {
		w.sync(ctx, c, d)
	}
	w.log.Info("libvirt: reconciled", "running_domains", len(doms), "vgpus", len(w.attached))
	return nil
}

// sync makes d's device model agree with d's state: attached while it
// runs and asks for a vGPU, gone otherwise.
func (w *Watcher) sync(ctx context.Context, c Conn, d libvirt.Domain) {
	// Whichever run of d has a vGPU, d not running now ends it.
	cur, err := c.DomainLookupByUUID(d.UUID)
	if libvirt.IsNotFound(err) {
		w.runStopped(ctx, d.UUID, 0)
		return
	}
	if err != nil {
		w.log.Error("libvirt: looking up a domain", "domain", d.Name, "err", err)
		return
	}
	state, _, err := c.DomainGetState(cur, 0)
	if libvirt.IsNotFound(err) {
		w.runStopped(ctx, d.UUID, 0)
		return
	}
	if err != nil {
		w.log.Error("libvirt: domain state", "domain", cur.Name, "err", err)
		return
	}
	if cur.ID <= 0 || libvirt.DomainState(state) == libvirt.DomainShutoff || libvirt.DomainState(state) == libvirt.DomainCrashed {
		w.runStopped(ctx, cur.UUID, 0)
		return
	}
	run := runKey{cur.UUID, uint32(cur.ID)}
	a := w.attached[cur.UUID]
	if a != nil && a.run == run {
		return
	}
	if a != nil {
		w.detach(ctx, cur.UUID, fmt.Sprintf("domain %s runs as domain id %d now", cur.Name, cur.ID))
	}
	if why, ok := w.ended[run]; ok {
		w.log.Debug("libvirt: not launching again a device model that ended", "domain", cur.Name, "why", why)
		return
	}
	if err := w.attach(ctx, c, cur); err != nil {
		w.log.Error("libvirt: domain left without a vGPU", "domain", cur.Name, "domid", cur.ID, "err", err)
	}
}

// attach registers d's vGPU settings and launches its device model, if
// its metadata asks for a vGPU.
func (w *Watcher) attach(ctx context.Context, c Conn, d libvirt.Domain) error {
	desc, err := c.DomainGetXMLDesc(d, 0)
	if err != nil {
		return fmt.Errorf("reading its XML: %w", err)
	}
	v, ok, err := vgpumeta.Parse([]byte(desc))
	if err != nil {
		return err
	}
	if !ok {
		w.log.Debug("libvirt: domain has no gpuvm metadata", "domain", d.Name)
		return nil
	}
	if d.ID < minDomID || d.ID > maxDomID {
		return fmt.Errorf("domain id %d: a vGPU's is %d..%d", d.ID, minDomID, maxDomID)
	}
	if err := validName(d.Name); err != nil {
		return err
	}
	_, _, mem, _, _, err := c.DomainGetInfo(d)
	if err != nil {
		return fmt.Errorf("domain info: %w", err)
	}
	dom := Domain{Name: d.Name, UUID: uuidString(d.UUID), ID: uint32(d.ID), MemoryKiB: mem, VGPU: v}
	if err := w.cfg.Registry.Register(ctx, dom.ID, v); err != nil {
		return err
	}
	m, err := w.cfg.Launcher.Launch(ctx, dom)
	if err != nil {
		return errors.Join(err, w.cfg.Registry.Forget(ctx, dom.ID))
	}
	run := runKey{d.UUID, dom.ID}
	w.attached[d.UUID] = &attachment{run: run, name: d.Name, model: m}
	go func() {
		<-m.Done()
		select {
		case w.endedCh <- ended{run, m}:
		case <-w.quit:
		}
	}()
	w.log.Info("libvirt: vGPU device model launched", "domain", d.Name, "domid", dom.ID, "mode", v.Mode, "profile", v.Profile, "pid", m.PID())
	return nil
}

// uuidString is u in its canonical text form.
func uuidString(u libvirt.UUID) string {
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// validName checks that name can name a vGPU (ipc.Hello: 1..64 printable
// ASCII bytes, no '/').
func validName(name string) error {
	if len(name) == 0 || len(name) > 64 {
		return fmt.Errorf("domain name %.64q (%d bytes): a vGPU's name is 1..64 bytes", name, len(name))
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 0x20 || c > 0x7e || c == '/' {
			return fmt.Errorf("domain name %.64q: a vGPU's name is printable ASCII without '/'", name)
		}
	}
	return nil
}

// stopped handles the event of d's stopping: d's id, if the event has one,
// is the run that stopped.
func (w *Watcher) stopped(ctx context.Context, _ Conn, d libvirt.Domain) {
	w.runStopped(ctx, d.UUID, max(d.ID, 0))
}

// runStopped tears down the vGPU of the domain with UUID u, if it has one:
// run domid of the domain stopped (0: whichever run it was). The vGPU of
// another run stays: an event queued before a reconnection's
// reconciliation attached the domain's next run must not tear that down.
func (w *Watcher) runStopped(ctx context.Context, u libvirt.UUID, domid int32) {
	ours := func(run runKey) bool { return domid == 0 || run.domid == uint32(domid) }
	for run := range w.ended {
		if run.uuid == u && ours(run) {
			delete(w.ended, run)
		}
	}
	a := w.attached[u]
	if a == nil {
		return
	}
	if !ours(a.run) {
		w.log.Debug("libvirt: the vGPU is of another run of the domain; left attached", "domain", a.name, "domid", a.run.domid, "stopped_domid", domid)
		return
	}
	w.detach(ctx, u, fmt.Sprintf("domain %s stopped", a.name))
}

// detach stops the device model of the domain with UUID u and forgets its
// vGPU settings.
func (w *Watcher) detach(ctx context.Context, u libvirt.UUID, why string) {
	a := w.attached[u]
	if a == nil {
		return
	}
	delete(w.attached, u)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
	defer cancel()
	err := a.model.Stop(sctx)
	// The aggregator forgets the settings when the vGPU detaches; a
	// device model that never connected left them behind.
	err = errors.Join(err, w.cfg.Registry.Forget(sctx, a.run.domid))
	if err != nil {
		w.log.Error("libvirt: tearing a vGPU down", "domain", a.name, "domid", a.run.domid, "why", why, "err", err)
		return
	}
	w.log.Info("libvirt: vGPU torn down", "domain", a.name, "domid", a.run.domid, "why", why)
}

// modelEnded takes note of a device model that ended by itself (not by
// detach): its domain keeps running without a vGPU.
func (w *Watcher) modelEnded(ctx context.Context, e ended) {
	a := w.attached[e.run.uuid]
	if a == nil || a.model != e.model {
		return // stopped by detach
	}
	delete(w.attached, e.run.uuid)
	why := fmt.Sprint(e.model.Err())
	w.ended[e.run] = why
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
	defer cancel()
	if err := w.cfg.Registry.Forget(sctx, e.run.domid); err != nil {
		w.log.Warn("libvirt: forgetting vGPU settings", "domain", a.name, "err", err)
	}
	w.log.Error("libvirt: device model ended; the domain runs on without a vGPU until it is started again",
		"domain", a.name, "domid", e.run.domid, "err", why)
}

// stopAll stops every device model (Run is ending).
func (w *Watcher) stopAll() {
	for u, a := range w.attached {
		w.detach(context.Background(), u, fmt.Sprintf("gpuvm libvirt is stopping (domain %s)", a.name))
	}
}
