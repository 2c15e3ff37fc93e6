package devmodel

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/ipc"
)

// Surviving a save of the vGPU (docs/protocol.md §13.7). When the operator
// saves the vGPU (gpuvm vgpu save), its aggregator parks it, writes its
// state image and ends the connection with a Bye whose reason begins
// ipc.ByeSaved. The device model keeps what is the guest's — its RAM, the
// driver state that lives in it and in this process — and the first guest
// access that finds the connection so ended resumes: it lets go of the
// old VRAM slice (the eviction revoked it already; this makes sure), and
// sends a Hello with the resume flag for the same domain, mode and RAM to
// each resume socket in turn until a daemon where the image was restored
// welcomes it, or Config.ResumeTimeout passes. Meanwhile every guest
// access waits: the guest sees a pause. Then the access that met the Bye,
// which the old aggregator did not answer (it ran none of it: a parked
// vGPU's accesses wait, and the save destroys it before they can run), is
// repeated on the restored vGPU, and the remap feature is set up from the
// new Welcome. With posted writes, those the old aggregator had not run
// when it parked the vGPU (it says how far it ran in the ring's req_done
// word, docs/protocol.md §6.9) are repeated first, in order.

// resumeFailure is why a resume failed: the device then stays failed.
type resumeFailure struct{ err error }

// Resume back-off bounds: how long to wait before asking the sockets again
// after none had an image for the domain.
const (
	resumeFirstBackoff = 10 * time.Millisecond
	resumeMaxBackoff   = 250 * time.Millisecond
)

// resumable reports whether err, which ended connection c, lets the
// device resume: a Bye saying the vGPU was saved, resuming configured, the
// device not closing, and with posted writes a server that said which of
// them it ran (ipc.Client.ReplaysPosted).
func (d *Device) resumable(c *ipc.Client, err error) bool {
	if d.cfg.ResumeTimeout <= 0 || d.posted && !c.ReplaysPosted() || !ipc.IsSavedBye(err) {
		return false
	}
	select {
	case <-d.closing:
		return false
	default:
		return true
	}
}

// errOr is the resume's failure, if one failed, else err.
func (d *Device) errOr(err error) error {
	if f := d.resumeFail.Load(); f != nil {
		return f.err
	}
	return err
}

// resumeAfter is called when an access on connection c failed with err.
// It returns the connection to repeat the access on — a resumed one — and
// true, or false when err stands. One resume runs at a time; accesses
// that meet the Bye meanwhile wait for it and take its connection.
func (d *Device) resumeAfter(c *ipc.Client, err error) (*ipc.Client, bool) {
	if !d.resumable(c, err) {
		return nil, false
	}
	d.resumeMu.Lock()
	defer d.resumeMu.Unlock()
	if now := d.cur.Load(); now != c {
		return now, true // resumed by another access
	}
	if d.resumeFail.Load() != nil || !d.resumable(c, err) {
		return nil, false
	}
	n, rerr := d.resume(c, err)
	if rerr != nil {
		d.resumeFail.Store(&resumeFailure{err: rerr})
		d.log.Error("device model: resume after a save failed", "domid", d.cfg.DomID, "err", rerr)
		return nil, false
	}
	d.cur.Store(n)
	d.resumes.Add(1)
	return n, true
}

// resume replaces old, ended by a save (why), with a connection to a
// restored vGPU. Called with resumeMu held.
func (d *Device) resume(old *ipc.Client, why error) (*ipc.Client, error) {
	start := time.Now()
	sockets := d.cfg.ResumeSockets
	if len(sockets) == 0 {
		sockets = []string{d.cfg.Socket}
	}
	d.log.Info("device model: vGPU saved; waiting for its restore", "domid", d.cfg.DomID, "sockets", sockets,
		"timeout", d.cfg.ResumeTimeout, "bye", why)
	// No access may reach the old slice any more: the eviction revoked it
	// (rebind with no files), unless the device model's acknowledgement
	// came too late; then it goes now.
	d.remapMu.Lock()
	d.remapOn.Store(false)
	uerr := d.unmapRemap()
	d.remapMu.Unlock()
	if uerr != nil {
		d.log.Warn("device model: unmapping the saved vGPU's slice", "err", uerr)
	}
	// The posted writes the old daemon did not run go to the restored
	// vGPU first, in order, before the access that met the Bye.
	unrun, perr := takeUnrun(old, &d.unqueued)
	_ = old.Close()
	if perr != nil {
		return nil, fmt.Errorf("device model: resuming after the save: %w", perr)
	}

	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.ResumeTimeout)
	defer cancel()
	go func() { // Close interrupts the wait
		select {
		case <-d.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	backoff := resumeFirstBackoff
	var last error
	for {
		for _, sock := range sockets {
			c, w, extra, err := d.dial(ctx, sock, true)
			if err == nil {
				rest, aerr := d.adoptResumed(c, w, extra, unrun)
				closeFiles(extra)
				if aerr != nil {
					_ = c.Close()
					return nil, fmt.Errorf("device model: resuming on %s: %w", sock, aerr)
				}
				d.log.Info("device model: resumed on the restored vGPU", "domid", d.cfg.DomID, "socket", sock,
					"vgpu", w.VGPU, "pause", time.Since(start), "replayed_writes", len(unrun)-len(rest))
				d.unqueued = rest
				return c, nil
			}
			if !retryResume(err) {
				select {
				case <-d.closing:
					return nil, errors.New("device model: closed while waiting for the saved vGPU's restore")
				default:
				}
				return nil, fmt.Errorf("device model: resuming after the save: %s refused the domain: %w", sock, err)
			}
			last = err
		}
		select {
		case <-ctx.Done():
			select {
			case <-d.closing:
				return nil, errors.New("device model: closed while waiting for the saved vGPU's restore")
			default:
			}
			return nil, fmt.Errorf("device model: the vGPU was saved and no daemon restored it for domain %d within %v (gpuvm vgpu restore --domid %d FILE, on one of %v); last answer: %w",
				d.cfg.DomID, d.cfg.ResumeTimeout, d.cfg.DomID, sockets, last)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, resumeMaxBackoff)
	}
}

// takeUnrun returns the posted writes to repeat after connection old
// ended with a saved Bye: those its daemon did not run (none when it does
// not say: then every write completed), then those an earlier resume
// could not queue (*unqueued, emptied).
func takeUnrun(old *ipc.Client, unqueued *[]ipc.PostedWrite) ([]ipc.PostedWrite, error) {
	var unrun []ipc.PostedWrite
	if old.ReplaysPosted() {
		var err error
		if unrun, err = old.UnrunPosted(); err != nil {
			return nil, err
		}
	}
	unrun = append(unrun, *unqueued...)
	*unqueued = nil
	return unrun, nil
}

// replayPosted repeats on c, in order, the posted writes the old
// connection's daemon did not run, and waits until they ran (a read
// behind them): the guest's accesses that do not trap must not overtake
// them. If c ends with a saved Bye meanwhile (saved again at once), the
// writes it did not queue are returned, for the next resume to queue
// after those it did.
func replayPosted(c *ipc.Client, unrun []ipc.PostedWrite) (rest []ipc.PostedWrite, err error) {
	if len(unrun) == 0 {
		return nil, nil
	}
	for i, w := range unrun {
		if err := c.Write32(w.BAR, w.Off, w.Value); err != nil {
			if ipc.IsSavedBye(err) {
				return unrun[i:], nil
			}
			return nil, fmt.Errorf("repeating a posted write the saved vGPU had not run (bar %d off %#x): %w", w.BAR, w.Off, err)
		}
	}
	if _, err := c.Read32(nvc0.BAR0, 0); err != nil && !ipc.IsSavedBye(err) {
		return nil, fmt.Errorf("waiting for the repeated posted writes: %w", err)
	}
	return nil, nil
}

// retryResume reports whether a resuming Hello that failed with err may be
// sent again: no image waits yet, or no daemon listens there yet.
func retryResume(err error) bool {
	return ipc.IsNoImage(err) || errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED)
}

// adoptResumed checks that the restored vGPU is the one the guest's driver
// knows — the same VRAM, channels and apertures, which a restore keeps —
// and sets the device up on it (adopt), after the posted writes unrun
// are repeated (replayPosted) — before the remap slice can serve an
// access. It returns those it could not queue.
func (d *Device) adoptResumed(c *ipc.Client, w ipc.Welcome, extra []*os.File, unrun []ipc.PostedWrite) ([]ipc.PostedWrite, error) {
	was := d.Welcome()
	bar1, bar3 := pageParam(w, ipc.ParamBAR1Size, nvc0.BAR1Size), pageParam(w, ipc.ParamBAR3Size, nvc0.BAR3Size)
	if w.VRAMSize != was.VRAMSize || w.Channels != was.Channels || bar1 != d.bar1Size || bar3 != d.bar3Size {
		return nil, fmt.Errorf("the restored vGPU (VRAM %d, %d channels, BAR1 %d, BAR3 %d) is not the saved one (VRAM %d, %d channels, BAR1 %d, BAR3 %d)",
			w.VRAMSize, w.Channels, bar1, bar3, was.VRAMSize, was.Channels, d.bar1Size, d.bar3Size)
	}
	rest, err := replayPosted(c, unrun)
	if err != nil {
		return nil, err
	}
	d.infoMu.Lock()
	d.welcome = w
	d.infoMu.Unlock()
	return rest, d.adopt(c, w, extra)
}

// Resumes is how many times the device resumed after a save.
func (d *Device) Resumes() int { return int(d.resumes.Load()) }
