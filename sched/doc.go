// Package sched holds the GPU time scheduling policies of the gpuvm
// aggregator (docs/design.md, "Doorbells and scheduling") and a
// discrete-event simulator to study them.
//
// # Model
//
// The aggregator traps every guest doorbell (GP_PUT write) and queues the
// submission per VM. The physical GPU is non-preemptive and raises no
// interrupts the aggregator uses, so one dispatcher goroutine asks a Policy
// which VM's oldest queued submission to release next, releases it, polls
// for its completion (fence / GP_GET progress) and reports the GPU time it
// measured, as in GPUvm (Suzuki, thesis 2018, §4.1.5). Submissions of one
// VM are never reordered. See Policy for the call protocol and Decision for
// what a policy can answer: dispatch a VM, idle, wait until a time (BAND's
// short wait for the same VM), or free-run — release everything from the
// non-denied VMs without asking until a time (NEON's disengaged schedulers).
// Time is passed explicitly (durations since a Clock's epoch), so policies
// are deterministic; RealClock and ManualClock are provided.
//
// Policies are not safe for concurrent use: the dispatcher goroutine owns
// its policy. Clocks are safe for concurrent use.
//
// # Policies
//
// Each policy lives in its own file and is created by name with New
// (names match config.PolicyNames()); Params carries the [scheduler]
// settings (FromConfig) with NEON/GPUvm defaults.
//
//   - fifo: release in submission order across VMs (thesis §4.3.3 baseline).
//   - credit: Xen-credit-like (thesis §4.3.3, Barham et al. [11]): usage
//     charged to credit, credit replenished every Period in proportion to
//     weight and capped at one period's worth, VMs with credit preferred
//     round-robin, any VM when none has credit (work-conserving).
//   - band: GPUvm's BAND (thesis §4.1.5, after Gdev's BAND [44]): credit plus
//     a short wait (BandPoll steps, at most BandWait) for the VM whose command
//     just completed when the next candidate has used more than its share,
//     and the scheduler's own time charged equally to all VMs.
//   - wfq: weighted fair queueing with per-VM virtual time (GLoop, thesis
//     §5.2.4): smallest virtual time first; a newly active VM starts at the
//     system virtual time.
//   - timeslice: NEON's timeslice with overuse control (Menychtas et al.,
//     ASPLOS'14, §3.1): a token holder owns the GPU for a slice; overruns are
//     deducted from its next slices.
//   - dfq: NEON's disengaged fair queueing (§3.3): free runs interleaved with
//     short engaged sampling phases that estimate request cost and virtual
//     time; VMs too far ahead are denied the next free run.
//   - strict: time-division multiplexing with fixed, non-work-conserving
//     slots (Timeslice × weight) anchored at the clock's epoch, so that the
//     GPU's owner at any time depends on the time and the roster alone: the
//     opt-in mode against timing channels between VMs. A submission is
//     released only while its VM's guard (its longest GPU time so far)
//     remains of the slot; a VM whose guard exceeds its slot runs one
//     submission per frame, from the slot's start.
//
// # Simulation
//
// Simulate runs a policy against closed-loop VM loads (VMLoad) on a
// simulated non-preemptive GPU with a virtual clock and reports GPU usage
// per VM per window, throughput and Jain's fairness index (Jain). With the
// thesis' madd / long-madd (15×) workload (Fig. 4.11) it reproduces the
// thesis' finding: CREDIT is unfair with 2 VMs — when the madd kernel
// completes the madd VM has not yet queued its next one, so only long-madd
// is queued and CREDIT dispatches it without credit — but fair with 4 and 8
// VMs; BAND is fair in all cases; FIFO in none. SimOptions.DecisionCost and
// SwitchCost model the scheduler's CPU time and GPU context switches for
// overhead studies (§4.3.4).
package sched
