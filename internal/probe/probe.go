// Package probe holds the aggregator's tracing points: empty functions
// that the hot paths call and that `gpuvm trace` (internal/bpftrace) puts
// uprobes on, in a daemon that is already running.
//
// A probe point does nothing: with no uprobe attached a call costs what an
// empty call costs (a few nanoseconds, BenchmarkProbe and BenchmarkAccess);
// there is no flag to test and nothing to enable. With a uprobe attached,
// each call traps into the kernel, which runs the tracer's BPF program and
// returns.
//
// On amd64 the probe points are written in assembly (probe_amd64.s) so
// that their first instruction is a 5-byte NOP, where the uprobe goes. The
// kernel emulates a NOP under a uprobe and resumes after it; the one
// instruction of an empty Go function, RET, it must single-step out of
// line instead, which costs a second trap: about 20 µs per hit against
// 5 µs on the machine this was measured on (docs/tracing.md). Assembly
// functions are never inlined, and their symbols stay in the executable's
// Go function table (.gopclntab) even when `go run`, `go test` or -ldflags=-s
// drop the ELF symbol table; the tracer finds them there, by name and by
// the NOP they begin with. Elsewhere they are empty Go functions that the
// compiler may not inline (there is no tracer for other architectures).
//
// The names and argument lists are the tracer's contract. Assembly
// functions take Go's stack-based ABI0: at the first instruction the
// return address is at 0(SP) and the arguments follow from 8(SP), each
// int in 8 bytes; R14 still holds the calling goroutine (g), which pairs a
// TrapBegin with its TrapEnd. Changing a signature means changing
// internal/bpftrace/gpuvm_trace.bpf.c and regenerating its object. Only
// values the caller has at hand are passed; nothing is computed for the
// probes' sake but one subtraction (Release's wait).
//
// Never put a uretprobe on these (or any Go) functions: the kernel's return
// trampoline rewrites the return address on the goroutine stack, which Go
// moves and walks; an exit is marked with its own probe instead (TrapEnd).
package probe

// Names of the probe points in the executable's function table.
const (
	SymTrapBegin = "github.com/gpuvm/gpuvm/internal/probe.TrapBegin"
	SymTrapEnd   = "github.com/gpuvm/gpuvm/internal/probe.TrapEnd"
	SymRelease   = "github.com/gpuvm/gpuvm/internal/probe.Release"
)

// Marker is the first instruction of every probe point on amd64, a 5-byte
// NOP (nopl 0x0(%rax,%rax,1)): the tracer checks it is there before it
// places a uprobe on it.
const Marker = "\x0f\x1f\x44\x00\x00"
