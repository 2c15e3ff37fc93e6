//go:build linux && amd64

package bpftrace

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/internal/probe"
)

// attachSelf attaches the tracer to this test process (its executable has
// the probe points: this package imports internal/probe), or skips the
// test saying why it cannot.
func attachSelf(t *testing.T, opts Options) *Tracer {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("loading BPF programs and attaching uprobes %s; running as uid %d", needPrivileges, os.Geteuid())
	}
	opts.PID = os.Getpid()
	tr, err := Attach(opts)
	if errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, unix.EPERM) {
		t.Skipf("the kernel refuses: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// rusage is this process's CPU time so far, by the kernel's account.
func rusage() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// pairs times n TrapBegin/TrapEnd pairs.
func pairs(n int) time.Duration {
	start := time.Now()
	for range n {
		probe.TrapBegin(0, 0, false)
		probe.TrapEnd(0)
	}
	return time.Since(start) / time.Duration(n)
}

// TestAttachCounts attaches the real uprobes and the sched_switch
// tracepoint to this process and checks what they count: every probe
// call from every thread, each value in its slot, the process's on-CPU
// time; and that Close leaves no program behind.
func TestAttachCounts(t *testing.T) {
	untraced := pairs(100000)
	tr := attachSelf(t, Options{})
	t.Logf("CPU time via %s", tr.SchedVia())
	ids := tr.programIDs()
	if len(ids) != 4 {
		t.Errorf("%d programs loaded, want 4 (3 uprobes, sched_switch)", len(ids))
	}
	if err := tr.Watch([]int{os.Getpid()}); err != nil {
		t.Fatal(err)
	}
	ruWindow0 := rusage()
	before, err := tr.Snapshot()
	if err != nil {
		t.Fatal(err)
	}

	// Traps from several threads: the begin/end pairs are keyed by
	// goroutine, and the uprobes must fire on every thread of the process.
	const threads, perThread = 4, 1000
	var wg sync.WaitGroup
	for i := range threads {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			for range perThread {
				probe.TrapBegin(3, i%2, i%2 == 1)
				probe.TrapEnd(3)
			}
		})
	}
	wg.Wait()
	for range 100 {
		probe.Release(5, 1500)
	}
	for range 10 {
		probe.Release(5, 0)
	}
	probe.Release(5, -7) // a clock step backwards counts as no wait
	for range 7 {
		probe.TrapEnd(9) // no TrapBegin: not timed, counted as unmatched
	}
	traced := pairs(20000)

	// Burn CPU, then sleep so the burning thread is switched out and its
	// last slice credited.
	ruBurn0 := rusage()
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
	}
	time.Sleep(50 * time.Millisecond)
	burnt := rusage() - ruBurn0

	after, err := tr.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	window := rusage() - ruWindow0
	d := after.Sub(before)
	for key, want := range map[HistKey]uint64{
		{VGPU: 3, Kind: KindRead, BAR: 0}:  threads / 2 * perThread,
		{VGPU: 3, Kind: KindWrite, BAR: 1}: threads / 2 * perThread,
		{VGPU: 5, Kind: KindWait}:          111,
	} {
		if got := d.Hists[key].Count; got != want {
			t.Errorf("%+v: counted %d, want %d", key, got, want)
		}
	}
	if got := d.Hists[HistKey{VGPU: 0, Kind: KindRead}].Count; got != 20000 {
		t.Errorf("vGPU 0 reads (the timed pairs): counted %d, want 20000", got)
	}
	wait := d.Hists[HistKey{VGPU: 5, Kind: KindWait}]
	if wait.Slots[Slot(1500)] != 100 || wait.Slots[0] != 11 || wait.SumNs != 150000 {
		t.Errorf("waits: slot of 1500 ns %d (want 100), slot 0 %d (want 11), sum %d ns (want 150000)", wait.Slots[Slot(1500)], wait.Slots[0], wait.SumNs)
	}
	if d.Stats.UnmatchedEnds != 7 || d.Stats.HistFull != 0 || d.Stats.BadReads != 0 {
		t.Errorf("stats %+v, want 7 unmatched ends", d.Stats)
	}
	floor := d.Hists[HistKey{VGPU: 0, Kind: KindRead}]
	t.Logf("an empty TrapBegin/TrapEnd pair: %v untraced, %v traced; measured in BPF: mean %v, p50 < %v, p99 < %v",
		untraced, traced, floor.Mean(), floor.Quantile(0.5), floor.Quantile(0.99))

	// The kernel's own account (getrusage) bounds what sched_switch
	// counted: at least the burn (whose slices all ended), at most the
	// whole window between the snapshots (and a slice begun before it).
	cpu := time.Duration(d.CPUNs[uint32(os.Getpid())])
	t.Logf("on-CPU time: %v by sched_switch; getrusage: %v in the burn, %v between the snapshots", cpu, burnt, window)
	if cpu < burnt*9/10 || cpu > window+50*time.Millisecond {
		t.Errorf("on-CPU time %v: want at least 90%% of the burn's %v and at most the window's %v", cpu, burnt, window)
	}

	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	// Nothing stays attached: a link left behind would keep its program.
	for _, id := range ids {
		for i := 0; ; i++ {
			p, err := ebpf.NewProgramFromID(id)
			if errors.Is(err, os.ErrNotExist) {
				break
			}
			if err == nil {
				p.Close()
			}
			if i > 200 {
				t.Fatalf("program %d still loaded after Close", id)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

func TestExplain(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("load: %w", unix.EPERM), "CAP_BPF"},
		{fmt.Errorf("attach: %w", ebpf.ErrNotSupported), "this kernel does not support it"},
		{unix.ENOSYS, "CONFIG_BPF_SYSCALL"},
	} {
		err := explain("doing it", c.err)
		if !errors.Is(err, c.err) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "doing it") {
			t.Errorf("explain(%v) = %v, want it wrapped with %q", c.err, err, c.want)
		}
	}
	if err := explainUprobe("/x", "p.F", fmt.Errorf("x: %w", ebpf.ErrNotSupported)); !strings.Contains(err.Error(), "CONFIG_UPROBE_EVENTS") {
		t.Errorf("uprobe not supported: %v", err)
	}
}

// An executable without the probe points is refused with a message that
// says so: a Go one (the go command) and another (/bin/true).
func TestAttachNoSymbols(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skipf("loading BPF programs %s", needPrivileges)
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		goCmd = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	for exe, want := range map[string]string{goCmd: "has no function " + probe.SymTrapBegin, "/bin/true": "not a Go executable"} {
		if _, err := os.Stat(exe); err != nil {
			t.Logf("skipping %s: %v", exe, err)
			continue
		}
		tr, err := Attach(Options{PID: os.Getpid(), Exe: exe, NoCPU: true})
		if errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, unix.EPERM) {
			t.Skipf("the kernel refuses: %v", err)
		}
		if err == nil {
			tr.Close()
			t.Fatalf("attached to %s", exe)
		}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %q does not say %q", exe, err, want)
		}
	}
}
