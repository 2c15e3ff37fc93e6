// SPDX-License-Identifier: (GPL-2.0-only OR BSD-3-Clause)
// (The build constraint keeps the Go tool from building this file.)
//go:build ignore

/*
 * gpuvm_trace.bpf.c - the BPF side of `gpuvm trace`.
 *
 * Uprobes on the aggregator's probe points (internal/probe) time each
 * trapped guest access and record each submission's doorbell-to-release
 * wait in per-vGPU log2 histograms; a sched_switch tracepoint adds up the
 * on-CPU time of the processes user space asks for (the device models and
 * the daemon). User space (internal/bpftrace) reads the maps; nothing is
 * sent per event.
 *
 * The probe points are Go assembly functions (internal/probe), probed at
 * their first instruction, a NOP. They take Go's stack-based ABI0: the
 * return address is at 0(%rsp) and the arguments follow from 8(%rsp), one
 * 8-byte slot each; R14 still holds the calling goroutine (g), which pairs
 * a TrapBegin with its TrapEnd. Only entry uprobes are used: a uretprobe
 * would corrupt Go stacks.
 *
 * Regenerate the checked-in object with `go generate ./internal/bpftrace`
 * (gen-bpf.sh; needs clang, llvm-strip, libbpf-dev and linux-libc-dev).
 */
#include <linux/types.h>
#include <linux/bpf.h>
#include <asm/ptrace.h>
#include <bpf/bpf_helpers.h>

/* Slot 0 counts zeros, slot i (i >= 1) values in [2^(i-1), 2^i); the last
 * slot takes everything from 2^(HIST_SLOTS-2) ns (~9 minutes) up. */
#define HIST_SLOTS 42

/* What a histogram measures (struct hist_key.kind). */
enum {
	KIND_READ = 0,	/* trapped read: TrapBegin to TrapEnd, ns */
	KIND_WRITE = 1,	/* trapped write, ns */
	KIND_WAIT = 2,	/* doorbell to release (Release's argument), ns */
};

/* Drop counters (the stats array), for user space to report. */
enum {
	STAT_UNMATCHED_END = 0,	/* a TrapEnd without its TrapBegin (attached in between) */
	STAT_HIST_FULL = 1,	/* no room for a new histogram */
	STAT_BAD_READ = 2,	/* the arguments could not be read */
	STAT_MAX = 3,
};

struct hist_key {
	__u32 vgpu;
	__u16 kind;
	__u16 bar;
};

struct hist_val {
	__u64 count;
	__u64 sum_ns;
	__u64 slots[HIST_SLOTS];
};

struct trap_start {
	__u64 ts;
	__u32 vgpu;
	__u16 kind;
	__u16 bar;
};

/* The daemon's process id, set before loading: the uprobes are attached
 * to it alone, and the programs check again. */
const volatile __u32 target_tgid = 0;

/* A zeroed value to create histograms from (too big for the stack). */
static const struct hist_val zero_hist;

/* Trapped accesses in progress, by goroutine. LRU: a TrapBegin whose
 * TrapEnd was never seen (the tracer detached in between) ages out. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, struct trap_start);
} trap_starts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct hist_key);
	__type(value, struct hist_val);
} hists SEC(".maps");

/* On-CPU nanoseconds by process (tgid). User space inserts the processes
 * to watch (value 0) and removes those that went; the program only adds. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, __u64);
} cpu_ns SEC(".maps");

/* When this CPU last switched tasks. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} last_switch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

static __always_inline int is_target(void)
{
	return (bpf_get_current_pid_tgid() >> 32) == target_tgid;
}

static __always_inline void stat_inc(__u32 which)
{
	__u64 *n = bpf_map_lookup_elem(&stats, &which);

	if (n)
		__sync_fetch_and_add(n, 1);
}

/* The histogram slot of v: 0 for 0, else floor(log2(v)) + 1, capped. */
static __always_inline __u32 log2_slot(__u64 v)
{
	__u32 r = 0;

	if (!v)
		return 0;
	if (v >> 32) {
		v >>= 32;
		r += 32;
	}
	if (v >> 16) {
		v >>= 16;
		r += 16;
	}
	if (v >> 8) {
		v >>= 8;
		r += 8;
	}
	if (v >> 4) {
		v >>= 4;
		r += 4;
	}
	if (v >> 2) {
		v >>= 2;
		r += 2;
	}
	if (v >> 1)
		r += 1;
	r += 1;
	return r < HIST_SLOTS ? r : HIST_SLOTS - 1;
}

static __always_inline void record(struct hist_key *key, __u64 v)
{
	struct hist_val *h = bpf_map_lookup_elem(&hists, key);
	__u32 slot;

	if (!h) {
		bpf_map_update_elem(&hists, key, &zero_hist, BPF_NOEXIST);
		h = bpf_map_lookup_elem(&hists, key);
		if (!h) {
			stat_inc(STAT_HIST_FULL);
			return;
		}
	}
	slot = log2_slot(v);
	__sync_fetch_and_add(&h->count, 1);
	__sync_fetch_and_add(&h->sum_ns, v);
	if (slot < HIST_SLOTS)
		__sync_fetch_and_add(&h->slots[slot], 1);
}

/* Reads a probe point's first n (at most 3) argument slots. */
static __always_inline int go_args(struct pt_regs *ctx, __u64 *args, __u32 n)
{
	if (bpf_probe_read_user(args, n * sizeof(__u64), (void *)(ctx->rsp + 8))) {
		stat_inc(STAT_BAD_READ);
		return -1;
	}
	return 0;
}

/* probe.TrapBegin(vgpu, bar int, write bool) */
SEC("uprobe")
int trap_begin(struct pt_regs *ctx)
{
	struct trap_start s = {};
	__u64 g = ctx->r14;
	__u64 args[3];

	if (!is_target() || go_args(ctx, args, 3))
		return 0;
	s.vgpu = (__u32)args[0];
	s.bar = (__u16)args[1];
	s.kind = (args[2] & 0xff) ? KIND_WRITE : KIND_READ;
	s.ts = bpf_ktime_get_ns();
	bpf_map_update_elem(&trap_starts, &g, &s, BPF_ANY);
	return 0;
}

/* probe.TrapEnd(vgpu int) */
SEC("uprobe")
int trap_end(struct pt_regs *ctx)
{
	__u64 now = bpf_ktime_get_ns();
	__u64 g = ctx->r14;
	struct trap_start *s;
	struct hist_key key = {};
	__u64 args[1], ts;

	if (!is_target() || go_args(ctx, args, 1))
		return 0;
	s = bpf_map_lookup_elem(&trap_starts, &g);
	if (!s || s->vgpu != (__u32)args[0]) {
		stat_inc(STAT_UNMATCHED_END);
		return 0;
	}
	key.vgpu = s->vgpu;
	key.kind = s->kind;
	key.bar = s->bar;
	ts = s->ts;
	bpf_map_delete_elem(&trap_starts, &g);
	record(&key, now > ts ? now - ts : 0);
	return 0;
}

/* probe.Release(vgpu int, waitNs int64) */
SEC("uprobe")
int release(struct pt_regs *ctx)
{
	struct hist_key key = {};
	__u64 args[2];
	__s64 wait;

	if (!is_target() || go_args(ctx, args, 2))
		return 0;
	key.vgpu = (__u32)args[0];
	key.kind = KIND_WAIT;
	wait = (__s64)args[1];
	record(&key, wait > 0 ? (__u64)wait : 0);
	return 0;
}

/*
 * At a switch the task leaving this CPU (still current) ran since the
 * previous switch here: credit that to its process if it is watched. A
 * slice is credited when it ends, so a task that stays on a CPU across a
 * report boundary shows in the next report.
 */
static __always_inline void account_switch(void)
{
	__u32 zero = 0, tgid;
	__u64 *last, *ns, now, prev;

	last = bpf_map_lookup_elem(&last_switch, &zero);
	if (!last)
		return;
	now = bpf_ktime_get_ns();
	prev = *last;
	*last = now;
	if (!prev || now < prev)
		return;
	tgid = bpf_get_current_pid_tgid() >> 32;
	if (!tgid)
		return; /* idle */
	ns = bpf_map_lookup_elem(&cpu_ns, &tgid);
	if (ns)
		__sync_fetch_and_add(ns, now - prev);
}

/* sched/sched_switch through tracefs (the usual way) ... */
SEC("tracepoint/sched/sched_switch")
int sched_switch(void *ctx)
{
	account_switch();
	return 0;
}

/* ... or as a raw tracepoint, which needs no tracefs. */
SEC("raw_tracepoint/sched_switch")
int sched_switch_raw(void *ctx)
{
	account_switch();
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
