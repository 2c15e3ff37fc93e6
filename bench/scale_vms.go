package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// scaleVMs are the VM processes of one scaling run. A VM that exits stays
// a zombie — its /proc entry, CPU time included, still readable — until
// release: the harness reads every VM's CPU time at the end of the
// measured window, which a starved harness may reach late.
type scaleVMs struct {
	wg      sync.WaitGroup
	ended   atomic.Int32
	reap    chan struct{}
	once    sync.Once
	mu      sync.Mutex
	endedAt []time.Time // when each VM exited (zero: running)
	pids    []int
	loads   []GuestLoad
	errs    []error
}

func newScaleVMs(n int) *scaleVMs {
	return &scaleVMs{reap: make(chan struct{}), endedAt: make([]time.Time, n), pids: make([]int, n),
		loads: make([]GuestLoad, n), errs: make([]error, n)}
}

// start starts VM i; its JSON summary lands in loads[i].
func (s *scaleVMs) start(cmd *exec.Cmd, i int) error {
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	if err := cmd.Start(); err != nil {
		s.ended.Add(1)
		return fmt.Errorf("%s: %w", vmName(i), err)
	}
	s.pids[i] = cmd.Process.Pid
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		var info unix.Siginfo
		for unix.Waitid(unix.P_PID, cmd.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil) == unix.EINTR {
		}
		s.mu.Lock()
		s.endedAt[i] = time.Now()
		s.mu.Unlock()
		s.ended.Add(1)
		<-s.reap
		rerr := cmd.Wait()
		if jerr := json.Unmarshal(out.Bytes(), &s.loads[i]); jerr != nil {
			s.errs[i] = errors.Join(fmt.Errorf("%s: %w", vmName(i), rerr), jerr)
		} else if !s.loads[i].Verified {
			s.errs[i] = fmt.Errorf("%s: %s", vmName(i), s.loads[i].Error)
		}
	}()
	return nil
}

// release lets the VMs that exited, and those that will, be reaped.
func (s *scaleVMs) release() { s.once.Do(func() { close(s.reap) }) }

// endedBefore is how many VMs exited before t.
func (s *scaleVMs) endedBefore(t time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, e := range s.endedAt {
		if !e.IsZero() && e.Before(t) {
			n++
		}
	}
	return n
}

// wait releases and waits for the VMs, and returns their errors.
func (s *scaleVMs) wait() error {
	s.release()
	s.wg.Wait()
	return errors.Join(s.errs...)
}

// signal sends VM i signal sig.
func (s *scaleVMs) signal(i int, sig unix.Signal) error {
	if err := unix.Kill(s.pids[i], sig); err != nil {
		return fmt.Errorf("%s: %v: %w", vmName(i), sig, err)
	}
	return nil
}

// cpu is the VM processes' CPU time so far.
func (s *scaleVMs) cpu() (time.Duration, error) {
	var sum time.Duration
	for i, pid := range s.pids {
		t, err := procCPU(pid)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", vmName(i), err)
		}
		sum += t
	}
	return sum, nil
}

// rss is each VM process's resident set now.
func (s *scaleVMs) rss() ([]uint64, error) {
	out := make([]uint64, len(s.pids))
	for i, pid := range s.pids {
		m, err := readStatm(strconv.Itoa(pid))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", vmName(i), err)
		}
		out[i] = m.Resident
	}
	return out, nil
}

// setupWatch follows the VMs' set-up through the start gate: when each
// started, and when its ready-DOMID file appeared there (seen by polling
// every millisecond).
type setupWatch struct {
	gate           string
	started, ready []time.Time
	onReady        func(i int) error // called as VM i is seen ready
	nready         int
	lastProgress   time.Time
}

// poll records the ready files that appeared since the last poll.
func (w *setupWatch) poll() error {
	ents, err := os.ReadDir(w.gate)
	if err != nil {
		return err
	}
	now := time.Now()
	for _, e := range ents {
		id, ok := strings.CutPrefix(e.Name(), "ready-")
		if !ok {
			continue
		}
		domid, err := strconv.Atoi(id)
		if err != nil || domid < 1 || domid > len(w.ready) || !w.ready[domid-1].IsZero() {
			continue
		}
		w.ready[domid-1] = now
		w.nready++
		w.lastProgress = now
		if w.onReady != nil {
			if err := w.onReady(domid - 1); err != nil {
				return err
			}
		}
	}
	return nil
}

// waitReady waits until at least want VMs are ready at the gate. It fails
// if a VM ended (failed returns true), ctx ends, or no VM got ready for
// gateTimeout.
func (w *setupWatch) waitReady(ctx context.Context, want int, failed func() bool) error {
	if w.lastProgress.IsZero() {
		w.lastProgress = time.Now()
	}
	for {
		if err := w.poll(); err != nil {
			return err
		}
		if w.nready >= want {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if failed() {
			return errors.New("a VM ended before the start")
		}
		if time.Since(w.lastProgress) > gateTimeout {
			return fmt.Errorf("%d of %d VMs ready, none more for %v", w.nready, want, gateTimeout)
		}
		time.Sleep(time.Millisecond)
	}
}

// setupTimes is each VM's time from its start to ready at the gate.
func (w *setupWatch) setupTimes() []time.Duration {
	out := make([]time.Duration, len(w.ready))
	for i := range out {
		out[i] = w.ready[i].Sub(w.started[i])
	}
	return out
}
