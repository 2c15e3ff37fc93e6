package devmodel

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpuvm/gpuvm/ipc"
)

// A Xen domain's device model across a daemon handoff (docs/protocol.md
// §15). The domain keeps running while `gpuvm serve` hands its vGPUs to a
// new process of itself; its device model must keep the ioreq server, the
// BAR placements and the guest's view, and only its aggregator connection
// changes. With XenConfig.ResumeTimeout set, the device model says so in
// its Hello (ResumesHandoff) — a daemon hands off a Xen domain's vGPU only
// then — and when the connection ends with the handoff's Bye
// (ipc.ByeHandoff) it sends a resuming Hello to the same socket, where
// the new process waits with the vGPU's image, until it is welcomed or
// ResumeTimeout passes. The guest's accesses wait meanwhile (its vCPU
// stays in the ioreq); the access that met the Bye, which the old process
// ran none of, is repeated on the new connection. A save's Bye (gpuvm xl
// save, whose domain is destroyed next) still ends the device model.
//
// Writes are posted when the daemon says which requests it ran (the
// ring's req_done, docs/protocol.md §6.9): those the old process had not
// run when it parked the vGPU are repeated on the new connection first.
// With a daemon that does not (older than the feature) they complete
// before their ioreq does (Write32Sync), since a posted write it had not
// run would be lost.

// xenBackend is the aggregator connection of a Xen domain's device model,
// replaced by a resume after a handoff.
type xenBackend struct {
	cfg   XenConfig
	hello ipc.Hello
	was   ipc.Welcome

	cur atomic.Pointer[ipc.Client]
	mu  sync.Mutex // one resume at a time; guards unqueued
	// unqueued are posted writes a resume could not queue (the new
	// connection ended at once): the next resume queues them.
	unqueued []ipc.PostedWrite
	failed   atomic.Pointer[error]
	resumes  atomic.Int64
	closing  chan struct{}
	once     sync.Once
}

// client is the current connection.
func (b *xenBackend) client() *ipc.Client { return b.cur.Load() }

// resuming reports whether the device model resumes after a handoff.
func (b *xenBackend) resuming() bool { return b.cfg.ResumeTimeout > 0 }

// Read32 reads through the current connection, once more on the resumed
// one if the first met the handoff's Bye.
func (b *xenBackend) Read32(bar int, off uint64) (uint32, error) {
	for {
		c := b.client()
		v, err := c.Read32(bar, off)
		if err == nil || !b.resumeAfter(c, err) {
			return v, err
		}
	}
}

// Write32 writes through the current connection: posted unless the device
// model resumes on a daemon that does not say which requests it ran (then
// it completes first).
func (b *xenBackend) Write32(bar int, off uint64, v uint32) error {
	for {
		c := b.client()
		var err error
		if b.resuming() && !c.ReplaysPosted() {
			err = c.Write32Sync(bar, off, v)
		} else {
			err = c.Write32(bar, off, v)
		}
		if err == nil || !b.resumeAfter(c, err) {
			return err
		}
	}
}

// Fill32 stores v to n words in one round trip (BackendFiller).
func (b *xenBackend) Fill32(bar int, off uint64, v uint32, n int) error {
	for {
		c := b.client()
		err := c.Fill32(bar, off, v, n)
		if err == nil || !b.resumeAfter(c, err) {
			return err
		}
	}
}

// reset is the guest's function-level reset, on the current connection.
func (b *xenBackend) reset() error {
	for {
		c := b.client()
		err := resetOverIPC(c)
		if err == nil || !b.resumeAfter(c, err) {
			return err
		}
	}
}

// resumeAfter is called when connection c failed with err: it reports
// whether a resumed connection replaced it (the caller repeats its
// access there). One resume runs at a time; the others wait for it.
func (b *xenBackend) resumeAfter(c *ipc.Client, err error) bool {
	if !b.resuming() || !ipc.IsHandoffBye(err) {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.client() != c {
		return true // resumed by another access
	}
	if b.failed.Load() != nil {
		return false
	}
	n, rerr := b.resume(c, err)
	if rerr != nil {
		b.failed.Store(&rerr)
		b.cfg.Logger.Error("device model: resume after the daemon's handoff failed", "domid", b.cfg.DomID, "err", rerr)
		return false
	}
	b.cur.Store(n)
	b.resumes.Add(1)
	return true
}

// resume replaces old, ended by a handoff (why), with a connection to the
// vGPU the daemon's new process restored. Called with b.mu held.
func (b *xenBackend) resume(old *ipc.Client, why error) (*ipc.Client, error) {
	start := time.Now()
	log := b.cfg.Logger
	log.Info("device model: the daemon hands off; resuming on its new process", "domid", b.cfg.DomID, "bye", why)
	unrun, uerr := takeUnrun(old, &b.unqueued)
	_ = old.Close()
	if uerr != nil {
		return nil, fmt.Errorf("resuming after the handoff: %w", uerr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.ResumeTimeout)
	defer cancel()
	go func() {
		select {
		case <-b.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	hello := b.hello
	hello.Resume = true
	backoff := resumeFirstBackoff
	var last error
	for {
		c, w, extra, err := ipc.Dial(ctx, b.cfg.Socket, hello, nil, nil, &ipc.DialOptions{Spin: b.spin(), Logger: log})
		closeFiles(extra)
		if err == nil {
			if w.VRAMSize != b.was.VRAMSize || w.Channels != b.was.Channels ||
				w.Params[ipc.ParamBAR1Size] != b.was.Params[ipc.ParamBAR1Size] || w.Params[ipc.ParamBAR3Size] != b.was.Params[ipc.ParamBAR3Size] {
				_ = c.Close()
				return nil, fmt.Errorf("the restored vGPU (VRAM %d, %d channels) is not the one handed off (VRAM %d, %d channels, the same apertures)",
					w.VRAMSize, w.Channels, b.was.VRAMSize, b.was.Channels)
			}
			rest, err := replayPosted(c, unrun)
			if err != nil {
				_ = c.Close()
				return nil, fmt.Errorf("resuming after the handoff: %w", err)
			}
			b.unqueued = rest
			log.Info("device model: resumed on the daemon's new process", "domid", b.cfg.DomID, "vgpu", w.VGPU, "pause", time.Since(start),
				"replayed_writes", len(unrun)-len(rest))
			return c, nil
		}
		if !retryResume(err) {
			return nil, fmt.Errorf("resuming after the handoff: %s refused the domain: %w", b.cfg.Socket, err)
		}
		last = err
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("the daemon handed off and no process of it restored the vGPU of domain %d within %v; last answer: %w",
				b.cfg.DomID, b.cfg.ResumeTimeout, last)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, resumeMaxBackoff)
	}
}

// spin is the connection's ipc.DialOptions.Spin (XenConfig.Spin).
func (b *xenBackend) spin() int {
	if b.cfg.Spin == 0 {
		return -1
	}
	return b.cfg.Spin
}

// close interrupts a resume under way.
func (b *xenBackend) close() { b.once.Do(func() { close(b.closing) }) }

// err is why a resume failed, if one did.
func (b *xenBackend) err() error {
	if p := b.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// errResumeFailed wraps a failed resume's reason.
var errResumeFailed = errors.New("the vGPU did not resume after the daemon's handoff")
