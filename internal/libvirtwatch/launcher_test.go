package libvirtwatch

import (
	"context"
	"log/slog"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/internal/vgpumeta"
)

// lines is a slog.Handler keeping the "output" of each record.
type lines struct {
	mu  sync.Mutex
	out []string
}

func (h *lines) Enabled(context.Context, slog.Level) bool { return true }
func (h *lines) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *lines) WithGroup(string) slog.Handler            { return h }
func (h *lines) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "output" {
			h.mu.Lock()
			h.out = append(h.out, a.Value.String())
			h.mu.Unlock()
		}
		return true
	})
	return nil
}

// TestLineLogger: output is logged a line at a time, and a long line,
// with or without its newline, is cut into pieces of at most maxLine
// bytes, none of it kept waiting beyond that.
func TestLineLogger(t *testing.T) {
	h := &lines{}
	l := &lineLogger{log: slog.New(h), level: slog.LevelInfo, what: "device model"}
	l.Write([]byte("one\ntw"))
	l.Write([]byte("o\r\n\nthree"))
	big := strings.Repeat("x", 1<<20+10) // a megabyte without a newline
	l.Write([]byte(big))
	if n := l.buf.Len(); n > maxLine {
		t.Errorf("%d bytes held after a large write without a newline; want at most %d", n, maxLine)
	}
	l.Write([]byte("\n" + strings.Repeat("y", 3*maxLine) + "\nlast"))
	l.flush()
	for i, line := range h.out {
		if len(line) > maxLine {
			t.Errorf("line %d: %d bytes", i, len(line))
		}
	}
	if len(h.out) < 3 || h.out[0] != "one" || h.out[1] != "two" {
		t.Fatalf("logged %.100q", h.out)
	}
	// The rest, cut, is all there.
	got := strings.Join(h.out[2:], "")
	if want := "three" + big + strings.Repeat("y", 3*maxLine) + "last"; got != want {
		t.Errorf("logged %d bytes after the first lines, want %d", len(got), len(want))
	}
}

// TestLaunchPdeathsig: a device model launched from a goroutine whose
// thread then ends (it locked the thread and returned without unlocking
// it, which ends the thread) keeps running: only the watcher's process
// ending signals it.
func TestLaunchPdeathsig(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep command")
	}
	p := &ProcessLauncher{Command: func([]string) *exec.Cmd { return exec.Command(sleep, "60") }, Logger: slog.New(slog.DiscardHandler)}
	launched := make(chan Model, 1)
	launch := func() {
		m, err := p.Launch(context.Background(), Domain{Name: "d", ID: 1, VGPU: vgpumeta.VGPU{Mode: "fv-optimized"}})
		if err != nil {
			t.Error(err)
		}
		launched <- m
	}
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if syscall.Gettid() != syscall.Getpid() {
			launch()
			return
		}
		// The main thread never ends: launch from another, locked
		// too (this goroutine keeps it off the main thread).
		done := make(chan struct{})
		go func() {
			defer close(done)
			runtime.LockOSThread()
			launch()
		}()
		<-done
		runtime.UnlockOSThread()
	}()
	m := <-launched
	if m == nil {
		return
	}
	defer m.Stop(context.Background())
	select {
	case <-m.Done():
		t.Fatalf("the device model ended with the thread of the goroutine that launched it: %v", m.Err())
	case <-time.After(500 * time.Millisecond):
	}
}
