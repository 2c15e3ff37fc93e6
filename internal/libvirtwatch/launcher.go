package libvirtwatch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/gpuvm/gpuvm/internal/vgpumeta"
)

// Domain is a running libvirt domain that asks for a vGPU.
type Domain struct {
	Name string
	UUID string // canonical text form
	ID   uint32 // the domain id: the vGPU's domid
	// MemoryKiB is the domain's current memory, as libvirt reports it.
	MemoryKiB uint64
	VGPU      vgpumeta.VGPU
}

// A Launcher starts the device model that serves a domain's vGPU. The
// Watcher has registered the domain's vGPU settings with the aggregator
// first; the device model attaches the vGPU by connecting to it.
type Launcher interface {
	Launch(ctx context.Context, d Domain) (Model, error)
}

// A Model is a running device model. The vGPU stays attached until Stop,
// or until the model ends by itself (Done): the aggregator destroyed the
// vGPU, or went away.
type Model interface {
	// Stop ends the device model, which detaches the vGPU, and returns
	// when it is gone (or ctx ends).
	Stop(ctx context.Context) error
	// Done is closed when the model has ended.
	Done() <-chan struct{}
	// Err is why the model ended, once Done is closed; nil after Stop.
	Err() error
	// PID is the device model's process id (0: in this process).
	PID() int
}

// ProcessLauncher runs each domain's device model as a `gpuvm devmodel
// --hold` process: the in-process harness's device model, which creates
// the guest's RAM itself, runs the guest driver and Workloads on the vGPU
// and then keeps it attached until told to stop (SIGTERM). It serves
// libvirt domains that are not Xen domains (the test driver's): nothing
// runs inside them, but each gets and keeps a real vGPU of the aggregator.
type ProcessLauncher struct {
	// Command returns the command that runs gpuvm with args.
	Command func(args []string) *exec.Cmd
	// Socket is the aggregator's device-model socket.
	Socket string
	// RAM is the guest RAM each device model creates ("128MiB").
	RAM string
	// Workloads are run on the vGPU once it is attached ("nop").
	Workloads string
	// StopTimeout is how long Stop waits after SIGTERM before SIGKILL
	// (default 10s).
	StopTimeout time.Duration
	Logger      *slog.Logger
}

// Launch starts d's device model process.
func (p *ProcessLauncher) Launch(_ context.Context, d Domain) (Model, error) {
	args := []string{"devmodel", "--hold", "--socket=" + p.Socket, "--domid=" + strconv.FormatUint(uint64(d.ID), 10),
		"--name=" + d.Name, "--mode=" + string(d.VGPU.Mode), "--ram=" + p.RAM, "--workloads=" + p.Workloads, "--runs=1"}
	cmd := p.Command(args)
	log := p.Logger.With("domain", d.Name, "domid", d.ID)
	// Its progress, holding and errors (stderr) are worth telling; its
	// results table (stdout) is detail.
	out := &lineLogger{log: log, level: slog.LevelInfo, what: "device model"}
	table := &lineLogger{log: log, level: slog.LevelDebug, what: "device model results"}
	cmd.Stdout, cmd.Stderr = table, out
	// A device model must not outlive the watcher that would stop it,
	// even one killed without its chance to stop them. Pdeathsig fires
	// when the thread that forked the process ends, not the process
	// (go.dev/issue/27505): startPinned forks from a thread that lives as
	// long as the process.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := startPinned(cmd); err != nil {
		return nil, fmt.Errorf("device model of domain %s: %w", d.Name, err)
	}
	m := &process{cmd: cmd, done: make(chan struct{}), timeout: p.StopTimeout}
	if m.timeout <= 0 {
		m.timeout = 10 * time.Second
	}
	go func() {
		err := cmd.Wait()
		out.flush()
		table.flush()
		m.mu.Lock()
		if !m.stopping && err == nil {
			err = errors.New("exited while its domain runs")
		}
		if !m.stopping {
			m.err = fmt.Errorf("device model (pid %d): %w", cmd.Process.Pid, err)
		}
		m.mu.Unlock()
		close(m.done)
	}()
	return m, nil
}

// forker is the goroutine that starts the device model processes, locked
// to its OS thread and never unlocked, and never ending: that thread ends
// only with the process. Started from whatever thread the caller's
// goroutine runs on, a process with Pdeathsig would get its signal when
// that thread ends, and the runtime ends a thread when a goroutine that
// locked it ends without unlocking, any goroutine that ran there later
// (a cgo callback's, a library's). Locking the caller's goroutine instead
// would tie the device models to the life of the caller's goroutine.
var forker struct {
	once  sync.Once
	start chan func()
}

// startPinned starts cmd from the forker's thread.
func startPinned(cmd *exec.Cmd) error {
	forker.once.Do(func() {
		forker.start = make(chan func())
		go func() {
			runtime.LockOSThread() // for good
			for f := range forker.start {
				f()
			}
		}()
	})
	done := make(chan error, 1)
	forker.start <- func() { done <- cmd.Start() }
	return <-done
}

// process is a device model process.
type process struct {
	cmd     *exec.Cmd
	done    chan struct{}
	timeout time.Duration

	mu       sync.Mutex
	stopping bool
	err      error
}

func (m *process) Done() <-chan struct{} { return m.done }
func (m *process) PID() int              { return m.cmd.Process.Pid }

func (m *process) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

// Stop sends SIGTERM, and SIGKILL if the process is still there after the
// stop timeout.
func (m *process) Stop(ctx context.Context) error {
	m.mu.Lock()
	m.stopping = true
	m.mu.Unlock()
	select {
	case <-m.done:
		return nil
	default:
	}
	if err := m.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("device model (pid %d): %w", m.cmd.Process.Pid, err)
	}
	t := time.NewTimer(m.timeout)
	defer t.Stop()
	select {
	case <-m.done:
		return nil
	case <-t.C:
	case <-ctx.Done():
	}
	_ = m.cmd.Process.Kill()
	<-m.done
	return fmt.Errorf("device model (pid %d) did not stop on SIGTERM; killed", m.cmd.Process.Pid)
}

// lineLogger logs what a device model writes, a line at a time (a line
// longer than maxLine is cut).
type lineLogger struct {
	log   *slog.Logger
	level slog.Level
	what  string

	mu  sync.Mutex
	buf bytes.Buffer
}

const maxLine = 4096

func (l *lineLogger) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	for {
		// A newline is looked for only where it ends a line short
		// enough: a large write without one costs its length, not its
		// square.
		b := l.buf.Bytes()
		i := bytes.IndexByte(b[:min(len(b), maxLine+1)], '\n')
		switch {
		case i >= 0:
			l.emit(l.buf.Next(i + 1))
		case l.buf.Len() > maxLine:
			l.emit(l.buf.Next(maxLine)) // cut: what is kept stays under maxLine
		default:
			return len(p), nil
		}
	}
}

func (l *lineLogger) emit(line []byte) {
	line = bytes.TrimRight(line, "\r\n")
	if len(bytes.TrimSpace(line)) > 0 {
		l.log.Log(context.Background(), l.level, l.what, "output", string(line))
	}
}

// flush logs a last line without its newline.
func (l *lineLogger) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.buf.Len() > 0 {
		l.emit(l.buf.Next(l.buf.Len()))
	}
}
