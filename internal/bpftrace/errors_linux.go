//go:build linux && amd64

package bpftrace

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// needPrivileges names what loading BPF and attaching probes takes.
const needPrivileges = "needs root (CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN)"

// Capability bits (linux/capability.h).
const (
	capSysAdmin = 21
	capPerfmon  = 38
	capBPF      = 39
)

// CheckPrivileges says, if so, why this process may not load BPF programs
// or attach perf events to another process (Attach checks it first).
func CheckPrivileges() error {
	eff, err := effectiveCaps()
	if err != nil {
		return nil // cannot tell: let the kernel say
	}
	has := func(c uint) bool { return eff&(1<<c) != 0 }
	if has(capSysAdmin) || (has(capBPF) && has(capPerfmon)) {
		return nil
	}
	var missing []string
	for _, c := range []struct {
		bit  uint
		name string
	}{{capBPF, "CAP_BPF"}, {capPerfmon, "CAP_PERFMON"}} {
		if !has(c.bit) {
			missing = append(missing, c.name)
		}
	}
	return fmt.Errorf("bpftrace: tracing %s; this process (uid %d) lacks %s", needPrivileges, os.Geteuid(), strings.Join(missing, " and "))
}

// effectiveCaps reads this process's effective capability set.
func effectiveCaps() (uint64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "CapEff:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	return 0, errors.New("no CapEff in /proc/self/status")
}

// explain wraps an error of the kernel's with what was being done and what
// is missing, as far as the error tells.
func explain(what string, err error) error {
	var ve *ebpf.VerifierError
	switch {
	case errors.As(err, &ve):
		return fmt.Errorf("bpftrace: %s: the kernel's BPF verifier refused a program: %w\n%+v", what, err, ve)
	case errors.Is(err, ebpf.ErrNotSupported):
		return fmt.Errorf("bpftrace: %s: this kernel does not support it: %w", what, err)
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		return fmt.Errorf("bpftrace: %s: %w: %s; with those, a security policy refuses it (kernel lockdown, an LSM, seccomp)", what, err, needPrivileges)
	case errors.Is(err, unix.ENOSYS):
		return fmt.Errorf("bpftrace: %s: %w: the kernel has no bpf() system call (CONFIG_BPF_SYSCALL)", what, err)
	}
	return fmt.Errorf("bpftrace: %s: %w", what, err)
}

// explainUprobe is explain for a uprobe on symbol sym of exe.
func explainUprobe(exe, sym string, err error) error {
	switch {
	case errors.Is(err, link.ErrNoSymbol):
		return fmt.Errorf("bpftrace: %s has no function %s: the process is not a gpuvm daemon with probe points (a build from before they were added?): %w", exe, sym, err)
	case errors.Is(err, ebpf.ErrNotSupported):
		return fmt.Errorf("bpftrace: uprobe on %s: this kernel has neither the uprobe PMU (/sys/bus/event_source/devices/uprobe) nor tracefs uprobe_events (CONFIG_UPROBE_EVENTS): %w", sym, err)
	}
	return explain("attaching a uprobe to "+sym+" in "+exe, err)
}
