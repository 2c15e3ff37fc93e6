package bpftrace

import (
	"errors"
	"os"
	"time"
)

// Options say what to attach to.
type Options struct {
	// PID is the daemon's process id: the uprobes fire in it alone.
	PID int
	// Exe is its executable, where the probe points' symbols are looked
	// up; default /proc/PID/exe (right even if the file was replaced or
	// deleted since the daemon started).
	Exe string
	// NoCPU leaves out the scheduler tracepoint (no on-CPU times).
	NoCPU bool
}

// Snapshot is the tracer's counters at one instant: everything counted
// since Attach.
type Snapshot struct {
	At time.Time
	// Hists are the histograms by vGPU, kind and BAR.
	Hists map[HistKey]Hist
	// CPUNs is the on-CPU time of each process watched since Attach.
	CPUNs map[uint32]uint64
	// Stats are the BPF programs' drop counters.
	Stats Stats
}

// Sub is what s counted since prev, an earlier snapshot of the same
// tracer.
func (s Snapshot) Sub(prev Snapshot) Snapshot {
	d := Snapshot{At: s.At, Hists: map[HistKey]Hist{}, CPUNs: map[uint32]uint64{}}
	for k, h := range s.Hists {
		if h = h.Sub(prev.Hists[k]); h.Count != 0 {
			d.Hists[k] = h
		}
	}
	for pid, ns := range s.CPUNs {
		if p := prev.CPUNs[pid]; ns >= p {
			d.CPUNs[pid] = ns - p
		}
	}
	d.Stats = Stats{UnmatchedEnds: s.Stats.UnmatchedEnds - prev.Stats.UnmatchedEnds, HistFull: s.Stats.HistFull - prev.Stats.HistFull,
		BadReads: s.Stats.BadReads - prev.Stats.BadReads}
	return d
}

// ErrNoTracefs says tracefs is not mounted, which tracepoints need.
var ErrNoTracefs = errors.New("tracepoints need tracefs, which is not mounted: mount -t tracefs nodev /sys/kernel/tracing")

// TracefsDir is where tracefs is mounted (the kernel's sched_switch event
// is there), if it is.
func TracefsDir() (string, bool) {
	for _, dir := range []string{"/sys/kernel/tracing", "/sys/kernel/debug/tracing"} {
		if _, err := os.Stat(dir + "/events/sched/sched_switch/id"); err == nil {
			return dir, true
		}
	}
	return "", false
}
