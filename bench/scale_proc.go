package bench

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// What the scaling harness reads of the processes and the host: the
// aggregator's own CPU time (getrusage) and memory (the Go heap after a
// collection, /proc/self/statm), and the VM processes' CPU time and
// resident memory from /proc/PID.

// clockTicks is USER_HZ, the unit of /proc/PID/stat's CPU times: 100 on
// every Linux architecture Go supports (sysconf(_SC_CLK_TCK) is 100 there).
const clockTicks = 100

// selfCPU is the CPU time (user + system) of this process so far.
func selfCPU() (time.Duration, error) {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// procCPU is the CPU time (user + system, all threads) of process pid so
// far, at /proc/PID/stat's 10 ms resolution.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("process %d CPU time: %w", pid, err)
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// count fields after its closing parenthesis. utime and stime are
	// fields 14 and 15, the 12th and 13th after it.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("process %d: /proc stat without a command name", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("process %d: /proc stat has %d fields after the name", pid, len(f))
	}
	var ticks uint64
	for _, k := range f[11:13] {
		n, err := strconv.ParseUint(k, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("process %d: /proc stat CPU time %q: %w", pid, k, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// statm is a process's memory from /proc/PID/statm, in bytes.
type statm struct {
	Resident uint64 // resident set
	Shared   uint64 // of it, file and shared-memory pages (the memfds)
}

// readStatm reads /proc/<who>/statm ("self" or a PID).
func readStatm(who string) (statm, error) {
	b, err := os.ReadFile("/proc/" + who + "/statm")
	if err != nil {
		return statm{}, fmt.Errorf("memory of %s: %w", who, err)
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return statm{}, fmt.Errorf("memory of %s: statm %q", who, b)
	}
	var v [2]uint64
	for i := range v {
		if v[i], err = strconv.ParseUint(f[i+1], 10, 64); err != nil {
			return statm{}, fmt.Errorf("memory of %s: statm %q: %w", who, b, err)
		}
	}
	page := uint64(os.Getpagesize())
	return statm{Resident: v[0] * page, Shared: v[1] * page}, nil
}

// memSample is the aggregator process's memory at one moment.
type memSample struct {
	Heap uint64 // live Go heap after a collection
	statm
}

// selfMemory collects garbage and reads this process's live heap and
// resident set.
func selfMemory() (memSample, error) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	st, err := readStatm("self")
	return memSample{Heap: ms.HeapAlloc, statm: st}, err
}

// hostCPU is the host's CPU time from /proc/stat: busy (everything but
// idle and iowait) and total, summed over the CPUs, in USER_HZ ticks.
type hostCPU struct{ busy, total uint64 }

func readHostCPU() (hostCPU, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return hostCPU{}, fmt.Errorf("host CPU time: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return hostCPU{}, fmt.Errorf("host CPU time: /proc/stat begins %q", line)
	}
	var h hostCPU
	for i, k := range f[1:] {
		n, err := strconv.ParseUint(k, 10, 64)
		if err != nil {
			return hostCPU{}, fmt.Errorf("host CPU time: %q: %w", k, err)
		}
		if i >= 8 { // guest and guest_nice are already in user and nice
			break
		}
		h.total += n
		if i != 3 && i != 4 { // idle, iowait
			h.busy += n
		}
	}
	return h, nil
}

// busyFraction is the share of the host's CPU time that was busy between
// two samples.
func busyFraction(a, b hostCPU) float64 {
	if b.total <= a.total {
		return 0
	}
	return float64(b.busy-a.busy) / float64(b.total-a.total)
}
