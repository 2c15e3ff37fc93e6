package pvdrm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/gpuvm/gpuvm/ipc"
)

// A local front end across a save of its vGPU (docs/protocol.md §13.7):
// the saved Bye leaves its ring, GART heap and client as they are — a
// request made meanwhile waits on the ring — and it dials again with the
// Hello's resume flag, the same GART memfd and the same ring and eventfds.
// The daemon that restored the image goes on at the ring index both ends
// stood at, so every handle, mapping and fence the front end holds stays
// valid. A no-image refusal, or no daemon listening, is tried again until
// DialConfig.ResumeTimeout; any other refusal is final, and then the
// client fails as after any Bye.

// Resume back-off: from resumeBackoff doubling up to resumeBackoffMax.
const (
	resumeBackoff    = 10 * time.Millisecond
	resumeBackoffMax = 250 * time.Millisecond
)

// watch waits for the device-model connection's end: a saved Bye resumes
// (when the front end may), anything else fails the client.
func (fe *FrontEnd) watch(local *Local) {
	for {
		ctl := fe.control()
		select {
		case <-ctl.Done():
		case <-fe.closing:
			return
		}
		err := ctl.Err()
		if fe.cfg.ResumeTimeout <= 0 || !ipc.IsSavedBye(err) {
			fe.Client.Abort(err)
			fe.endControl(nil)
			return
		}
		start := time.Now()
		c, rerr := fe.resume(local)
		if rerr != nil {
			fe.Client.Abort(fmt.Errorf("pvdrm front end: %w; resume: %w", err, rerr))
			fe.endControl(nil)
			return
		}
		if log := fe.cfg.Logger; log != nil {
			log.Info("pvdrm front end: resumed on the restored vGPU", "domid", fe.cfg.DomID, "vgpu", fe.Welcome().VGPU, "pause", time.Since(start))
		}
		if !fe.endControl(c) {
			c.Close() // the front end is closing
			return
		}
		ctl.Close()
	}
}

// endControl ends the device-model connection's term: c replaces it, and
// the calls that met its Bye go on on c; nil says the front end gave up,
// and those calls, and every later one, fail with the Bye (ctlEnd stays
// closed: no resume will come). It reports false, replacing nothing, if
// the front end is closing: Close closes the connection it finds, so one
// put in after it looked would stay open.
func (fe *FrontEnd) endControl(c *ipc.Client) bool {
	fe.mu.Lock()
	defer fe.mu.Unlock()
	select {
	case <-fe.closing:
		return false
	default:
	}
	close(fe.ctlEnd)
	if c != nil {
		fe.ctl = c
		fe.ctlEnd = make(chan struct{})
	}
	return true
}

// resume dials the resume sockets in turn with a resuming Hello until one
// welcomes the front end back with the vGPU its guest knows.
func (fe *FrontEnd) resume(local *Local) (*ipc.Client, error) {
	gartFile, err := fe.gart.File()
	if err != nil {
		return nil, err
	}
	defer gartFile.Close()
	cfg := fe.cfg
	hello := ipc.Hello{DomID: cfg.DomID, Name: cfg.Name, Mode: cfg.Mode, RAMSize: fe.gart.Size(), Transport: ipc.TransportShm, Resume: true}
	sockets := cfg.ResumeSockets
	if len(sockets) == 0 {
		sockets = []string{cfg.Socket}
	}
	deadline := time.Now().Add(cfg.ResumeTimeout)
	backoff := resumeBackoff
	var last error
	for {
		for _, s := range sockets {
			c, _, err := fe.dialResume(s, deadline, hello, gartFile, local.Files())
			if err == nil {
				return c, nil
			}
			last = err
			var r *ipc.RejectedError
			if errors.As(err, &r) && !ipc.IsNoImage(err) {
				return nil, err // final: the image is not this front end's, or its restore failed
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the vGPU was saved and no daemon restored it for domain %d within %v; last answer: %w", cfg.DomID, cfg.ResumeTimeout, last)
		}
		select {
		case <-time.After(backoff):
		case <-fe.closing:
			return nil, errors.New("front end closed")
		}
		backoff = min(2*backoff, resumeBackoffMax)
	}
}

// dialResume makes one resuming Hello on socket s; a Welcome for another
// vGPU than the guest knows (VRAM size, channels) fails it.
func (fe *FrontEnd) dialResume(s string, deadline time.Time, hello ipc.Hello, gart *os.File, files []*os.File) (*ipc.Client, ipc.Welcome, error) {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	c, w, extra, err := ipc.Dial(ctx, s, hello, gart, files, &ipc.DialOptions{Logger: fe.cfg.Logger})
	for _, f := range extra {
		f.Close()
	}
	if err != nil {
		return nil, w, err
	}
	fe.mu.Lock()
	defer fe.mu.Unlock()
	if w.VRAMSize != fe.welcome.VRAMSize || w.Channels != fe.welcome.Channels {
		c.Close()
		return nil, w, fmt.Errorf("resumed on a vGPU of %d bytes of VRAM and %d channels, the guest's has %d and %d",
			w.VRAMSize, w.Channels, fe.welcome.VRAMSize, fe.welcome.Channels)
	}
	fe.welcome = w
	return c, w, nil
}
