package aggregator

import (
	"context"
	"sync"
	"time"

	"github.com/gpuvm/gpuvm/pvdrm"
)

// CPU_PREP waits of the pvdrm back end. A waiter sleeps until something
// that can change its answer happens, and polls nothing:
//
//   - a submission of the VM ends — completed, faulted, or stopped by the
//     aggregator (the watchdog, a channel free, teardown): the dispatcher,
//     which sees every completion as it reaps, calls the back end's
//     broadcast (dispatcher.onEnded). The fence of a pvdrm submission is
//     its last method, written before GP_GET passes it, so it has passed
//     by then; a fault stops the channel and ends the submission too, and
//     the vGPU has the fault's report by then (reap collects the reports
//     first);
//   - the back end frees one of the waiter's channels (freeChannel);
//   - the back end stops (ctx);
//   - the wait's deadline;
//   - and, as a safety net, the fault check every faultPoll
//     (pvdrmFaultPoll, far slower than the completions it backs up).
//
// The broadcast is per back end (per VM): one VM's completions wake only
// its own waiters, each of which checks a few fences in memory. A VM has
// at most one waiter per ring slot (each holds an unanswered request, and
// the ring refuses more outstanding requests than it has slots), so a VM's
// completion costs O(its waiters) and a waiter O(1) per completion of its
// VM's work, however long the work runs.

// pvdrmWake is a broadcast: wait returns a channel that the next
// broadcast closes.
type pvdrmWake struct {
	mu sync.Mutex
	ch chan struct{} // closed at the next broadcast; nil while no one waits
}

// wait returns a channel closed at the next broadcast. A waiter takes it
// before it checks what a broadcast announces, so an event between its
// check and its sleep is not lost.
func (w *pvdrmWake) wait() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch == nil {
		w.ch = make(chan struct{})
	}
	return w.ch
}

// broadcast wakes every waiter. It never blocks (the dispatcher calls it
// under its lock) and allocates nothing while no one waits.
func (w *pvdrmWake) broadcast() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch != nil {
		close(w.ch)
		w.ch = nil
	}
}

// fenceWait is a fence a CPU_PREP waits for: seq on c.
type fenceWait struct {
	c   *pvChan
	seq uint32
}

// await blocks until every fence of ws passed (status 0), a channel it
// waits on faulted (EIO) or the deadline passed (ETIMEDOUT). If ctx ends
// first (the back end stops) there is no one to answer: answer is false.
// It runs in a waiter goroutine: it reads only what is safe beside the
// serving goroutine (fences, freed flags, the driver's fault registers).
func (b *PVDRMBackend) await(ctx context.Context, ws []fenceWait, deadline time.Time) (status int32, answer bool) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		wake := b.wake.wait() // first: a completion after the check below wakes it
		b.waitChecks.Add(1)
		for len(ws) > 0 && ws[0].c.done(ws[0].seq) {
			ws = ws[1:]
		}
		if len(ws) == 0 {
			return 0, true
		}
		if ws[0].c.ch.Fault() != nil {
			return -pvdrm.EIO, true
		}
		if ctx.Err() != nil {
			return 0, false
		}
		left := time.Until(deadline)
		if left <= 0 {
			return -pvdrm.ETIMEDOUT, true
		}
		if next := min(left, b.faultPoll); timer == nil {
			timer = time.NewTimer(next)
		} else {
			timer.Reset(next) // Go ≥ 1.23: no stale tick survives a Reset
		}
		select {
		case <-wake:
		case <-ctx.Done():
		case <-timer.C:
		}
	}
}
