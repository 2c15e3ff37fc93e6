// Package bpftrace is the kernel side of `gpuvm trace`: it loads the BPF
// programs of gpuvm_trace.bpf.c into the kernel and attaches them to a
// running aggregator daemon without restarting or pausing it:
//
//   - uprobes on the daemon's probe points (internal/probe) time every
//     trapped guest access (TrapBegin to TrapEnd, paired by goroutine) and
//     record every submission's doorbell-to-release wait (Release's
//     argument), in log2 histograms per vGPU, kind and BAR;
//   - the sched/sched_switch tracepoint adds up the on-CPU time of the
//     processes Watch names (the device models, the daemon).
//
// User space reads the maps when asked (Snapshot); no event crosses to
// user space on its own. Close detaches everything: a daemon nobody traces
// runs its probe points as the empty calls they are.
//
// The programs are compiled ahead of time: gpuvm_trace.bpf.o is checked in
// and embedded, so building gpuvm needs no clang. `go generate
// ./internal/bpftrace` rebuilds it (gen-bpf.sh) and bpf.sum records what it
// was built from; TestObjectUpToDate checks both. The uprobes read amd64
// registers, so tracing works on linux/amd64 only (elsewhere Attach says
// so). docs/tracing.md has the whole design.
package bpftrace
