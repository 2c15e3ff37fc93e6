package bpftrace

import _ "embed" // the BPF object

//go:generate sh gen-bpf.sh

// object is gpuvm_trace.bpf.o, the compiled gpuvm_trace.bpf.c.
//
//go:embed gpuvm_trace.bpf.o
var object []byte

// Program and map names in the object.
const (
	progTrapBegin   = "trap_begin"
	progTrapEnd     = "trap_end"
	progRelease     = "release"
	progSchedSwitch = "sched_switch"
	progSchedRaw    = "sched_switch_raw"
	varTargetTGID   = "target_tgid"
)

// Stats are the BPF programs' drop counters (the stats array).
type Stats struct {
	// UnmatchedEnds counts TrapEnds without their TrapBegin: accesses
	// under way when the tracer attached, not timed.
	UnmatchedEnds uint64 `json:"unmatched_ends"`
	// HistFull counts values lost for want of room for a new histogram.
	HistFull uint64 `json:"hist_full"`
	// BadReads counts probe hits whose arguments could not be read from
	// the goroutine's stack.
	BadReads uint64 `json:"bad_reads"`
}
