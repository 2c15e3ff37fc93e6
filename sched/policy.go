package sched

import (
	"errors"
	"fmt"
	"time"

	"github.com/gpuvm/gpuvm/config"
)

// VMID identifies a VM (a Xen domain) to the scheduler.
type VMID int

// Action is what a Decision tells the dispatcher to do.
type Action uint8

// Actions a policy can decide.
const (
	// Idle: release nothing. Call Next again after the next Submitted or
	// Completed report (nothing will change before then).
	Idle Action = iota
	// Dispatch: release the oldest queued submission of Decision.VM to the
	// physical doorbell, then report it with Started.
	Dispatch
	// Wait: release nothing now; call Next again at Decision.Until, or
	// earlier if a submission arrives. BAND uses it for its short wait for
	// the previous VM's next submission (one band_poll step at a time), and
	// the timeslice and DFQ policies to hold the GPU for a VM that is
	// momentarily idle.
	Wait
	// FreeRun: the policy disengages. Until Decision.Until, release every
	// queued and newly arriving submission of every VM not listed in
	// Decision.Deny immediately, without calling Next; submissions of denied
	// VMs stay queued. Keep reporting Submitted, Started and Completed. Call
	// Next again at Until (NEON's disengaged fair queueing, §3.3).
	FreeRun
)

// String returns the action's name.
func (a Action) String() string {
	switch a {
	case Idle:
		return "idle"
	case Dispatch:
		return "dispatch"
	case Wait:
		return "wait"
	case FreeRun:
		return "free-run"
	}
	return fmt.Sprintf("action(%d)", uint8(a))
}

// Decision is a policy's answer to Next.
type Decision struct {
	// Action says what to do.
	Action Action
	// VM is the VM whose oldest queued submission to release (Dispatch).
	VM VMID
	// Until is when to call Next again (Wait, FreeRun), on the policy's
	// time base.
	Until time.Duration
	// Deny lists, in increasing order, the VMs whose submissions must stay
	// queued during a FreeRun. The slice belongs to the policy and must not
	// be modified.
	Deny []VMID
}

// Policy is a GPU time scheduling policy: it decides which VM's queued
// submission the dispatcher releases to the non-preemptive physical GPU
// next, and is told how much GPU time each submission used.
//
// The protocol, driven by the aggregator's single dispatcher goroutine:
//
//   - AddVM/RemoveVM when a VM attaches to or detaches from the GPU.
//   - Submitted each time a VM's doorbell write is trapped and queued.
//   - Next whenever the dispatcher may release work (an engaged dispatcher
//     calls it when the previously released submission has completed, when
//     a submission arrives while the GPU is idle, and when a Wait or FreeRun
//     expires). Next is advisory and may be called repeatedly; it changes
//     no queue counts.
//   - Started when the dispatcher actually releases a submission — whether
//     chosen by Next or released during a FreeRun.
//   - Completed when the dispatcher observes the released submission's
//     completion (fence / GP_GET progress), with the GPU time it measured
//     (release to completion).
//   - Overhead with GPU-idle time the scheduler itself consumed while work
//     was queued (decision CPU time, BAND's waits). BAND charges it equally
//     to the VMs (thesis §4.1.5); the other policies ignore it.
//
// Every method takes the current time on the dispatcher's Clock; policies
// read no clock, so they are deterministic. Submissions of one VM are never
// reordered: a Dispatch names a VM, not a submission.
//
// Policies are NOT safe for concurrent use: they are meant to be owned by the
// one dispatcher goroutine. Wrap them in a mutex to share one.
type Policy interface {
	// Name returns the policy's registered name ("fifo", "band", ...).
	Name() string
	// AddVM registers a VM with a scheduling weight ≥ 1 (its share is
	// weight / sum of weights of the competing VMs).
	AddVM(id VMID, weight int, now time.Duration) error
	// RemoveVM forgets a VM and its queued submissions.
	RemoveVM(id VMID, now time.Duration) error
	// Submitted reports that VM id queued one submission.
	Submitted(id VMID, now time.Duration) error
	// Next decides what the dispatcher should do now.
	Next(now time.Duration) Decision
	// Started reports that one queued submission of VM id was released to
	// the GPU.
	Started(id VMID, now time.Duration) error
	// Completed reports that a released submission of VM id completed after
	// using gpuTime of GPU time.
	Completed(id VMID, gpuTime, now time.Duration) error
	// Overhead reports scheduler time d during which the GPU idled while
	// work was queued.
	Overhead(d, now time.Duration)
	// SetWeight changes a registered VM's weight (≥ 1) from now on (SLA
	// feedback; weight.go). strict refuses it with ErrFixedWeights.
	SetWeight(id VMID, weight int, now time.Duration) error
	// Weight returns a registered VM's current weight.
	Weight(id VMID) (int, error)
}

// Errors returned (wrapped, with context) by New and the Policy methods.
var (
	// ErrUnknownPolicy: New was given a name not in Names().
	ErrUnknownPolicy = errors.New("unknown scheduling policy")
	// ErrBadParam: a Params field is out of range.
	ErrBadParam = errors.New("invalid scheduler parameter")
	// ErrUnknownVM: the VM was never added or was removed.
	ErrUnknownVM = errors.New("unknown VM")
	// ErrDuplicateVM: AddVM of a VM already registered.
	ErrDuplicateVM = errors.New("VM already registered")
	// ErrBadWeight: AddVM with a weight below 1.
	ErrBadWeight = errors.New("VM weight must be at least 1")
	// ErrNotQueued: Started for a VM with no queued submission, or
	// Completed for a VM with none released.
	ErrNotQueued = errors.New("no such submission")
)

// Params tunes the policies. A zero field takes its default (see Defaults);
// negative values are rejected by New.
type Params struct {
	// Period is the credit replenish period of credit and band: every
	// Period each competing VM's credit grows by Period × its share, capped
	// at that amount. Default 100 ms (the GPUvm prototype used 100 ms–1 s,
	// as the initial design notes record; see docs/design.md).
	Period time.Duration
	// BandWait is BAND's longest wait, after a VM's submission completes,
	// for that VM's next submission when the next candidate VM has used
	// more than its share. Default 500 µs (Gdev's yield chance, thesis
	// §4.1.5 [44]).
	BandWait time.Duration
	// BandPoll is the interval at which a waiting BAND dispatcher re-checks
	// the queue (the Until of each Wait step). Default 50 µs.
	BandPoll time.Duration
	// Timeslice is the slice a timeslice token holder owns the GPU for
	// (scaled by its weight), and the length of a VM's fixed slot in
	// strict's frame (also scaled by its weight). Default 30 ms (NEON §5.2).
	Timeslice time.Duration
	// Poll is NEON's polling period: how long timeslice keeps the token
	// with, and dfq keeps sampling, a VM that has nothing queued before
	// moving on. Default 1 ms (NEON §5.2).
	Poll time.Duration
	// SampleTime is the longest engaged sampling run per VM in dfq.
	// Default 5 ms (NEON §5.2).
	SampleTime time.Duration
	// SampleRequests ends a VM's dfq sampling run early once this many of
	// its requests completed. Default 32 (NEON §5.2).
	SampleRequests int
	// FreeRunFactor sets dfq's free-run length to FreeRunFactor ×
	// SampleTime × the number of VMs sampled (NEON §5.2: 5 × 5 ms = 25 ms
	// for one task, 50 ms for two). Default 5.
	FreeRunFactor int
}

// Defaults returns the default Params.
func Defaults() Params {
	return Params{
		Period:         100 * time.Millisecond,
		BandWait:       500 * time.Microsecond,
		BandPoll:       50 * time.Microsecond,
		Timeslice:      30 * time.Millisecond,
		Poll:           time.Millisecond,
		SampleTime:     5 * time.Millisecond,
		SampleRequests: 32,
		FreeRunFactor:  5,
	}
}

// FromConfig returns the Params for a [scheduler] table. Config has no keys
// for Poll, SampleTime, SampleRequests and FreeRunFactor, so they keep their
// NEON defaults; the config's Watchdog belongs to the dispatcher, not to a
// policy.
func FromConfig(c config.SchedulerConfig) Params {
	return Params{
		Period:    c.Period.Duration,
		BandWait:  c.BandWait.Duration,
		BandPoll:  c.BandPoll.Duration,
		Timeslice: c.Timeslice.Duration,
		Poll:      c.Poll.Duration, SampleTime: c.SampleTime.Duration,
		SampleRequests: c.SampleRequests, FreeRunFactor: c.FreeRunFactor,
	}
}

// withDefaults fills zero fields from Defaults and checks the result.
func (p Params) withDefaults() (Params, error) {
	d := Defaults()
	durs := []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"period", &p.Period, d.Period},
		{"band_wait", &p.BandWait, d.BandWait},
		{"band_poll", &p.BandPoll, d.BandPoll},
		{"timeslice", &p.Timeslice, d.Timeslice},
		{"poll", &p.Poll, d.Poll},
		{"sample_time", &p.SampleTime, d.SampleTime},
	}
	for _, f := range durs {
		if *f.v < 0 {
			return p, fmt.Errorf("%s %v: %w", f.name, *f.v, ErrBadParam)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	ints := []struct {
		name string
		v    *int
		def  int
	}{
		{"sample_requests", &p.SampleRequests, d.SampleRequests},
		{"free_run_factor", &p.FreeRunFactor, d.FreeRunFactor},
	}
	for _, f := range ints {
		if *f.v < 0 {
			return p, fmt.Errorf("%s %d: %w", f.name, *f.v, ErrBadParam)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	if p.BandPoll > p.BandWait {
		return p, fmt.Errorf("band_poll %v longer than band_wait %v: %w", p.BandPoll, p.BandWait, ErrBadParam)
	}
	return p, nil
}

// registration is one entry of the policy table.
type registration struct {
	name string
	make func(Params) Policy
}

// registry is the table of policies, in config.Policies() order. It is a
// function, not a variable, so the package holds no mutable state.
func registry() []registration {
	return []registration{
		{"fifo", func(Params) Policy { return newFIFO() }},
		{"credit", func(p Params) Policy { return newCredit(p) }},
		{"band", func(p Params) Policy { return newBand(p) }},
		{"wfq", func(p Params) Policy { return newWFQ(p) }},
		{"timeslice", func(p Params) Policy { return newTimeslice(p) }},
		{"dfq", func(p Params) Policy { return newDFQ(p) }},
		{"strict", func(p Params) Policy { return newStrict(p) }},
	}
}

// Names returns the registered policy names.
func Names() []string {
	r := registry()
	names := make([]string, len(r))
	for i, e := range r {
		names[i] = e.name
	}
	return names
}

// New returns a fresh policy by name (one of Names(), matching
// config.PolicyNames()) with params; zero fields of params take defaults.
func New(name string, params Params) (Policy, error) {
	p, err := params.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("sched: policy %q: %w", name, err)
	}
	for _, e := range registry() {
		if e.name == name {
			return e.make(p), nil
		}
	}
	return nil, fmt.Errorf("sched: policy %q: %w", name, ErrUnknownPolicy)
}
