package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/gpuvm/gpuvm/devmodel"
	"github.com/gpuvm/gpuvm/gpu/kernels"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
)

// The two roles of the covert-channel harness' VMs.
const (
	// CovertSender encodes a bit string in its GPU load: per bit period it
	// keeps the GPU busy for a 1 and idles for a 0.
	CovertSender = "sender"
	// CovertReceiver submits a short probe kernel back to back and times
	// each one from submission to completion with its own clock.
	CovertReceiver = "receiver"
)

// CovertRoles are the roles a covert-channel VM can play.
func CovertRoles() []string { return []string{CovertSender, CovertReceiver} }

// CovertGuestOptions configure one VM of the covert-channel harness.
type CovertGuestOptions struct {
	// Role is CovertSender or CovertReceiver.
	Role string
	// Start is when bit period 0 begins, on the host's wall clock: the
	// attacker pair agreed on it beforehand (two VMs can, e.g. over the
	// network), which is the standard assumption of covert-channel
	// measurements. When it is zero, AwaitStart is called once the VM is
	// set up and returns it (the harness announces it to both VMs once
	// both are ready).
	Start      time.Time
	AwaitStart func(ctx context.Context) (time.Time, error)
	// Bit is the bit period.
	Bit time.Duration
	// Message is the sender's bit string ('0' and '1'), preamble included.
	Message string
	// Periods is how many bit periods the receiver probes (the sender's is
	// len(Message)).
	Periods int
	// Iterations is the loop-kernel size: the sender's busy kernel, or the
	// receiver's probe.
	Iterations uint64
	// CPUOnly makes the sender a control that never touches the GPU: it
	// keeps its own CPU busy through each 1-bit period instead. What the
	// receiver decodes from it leaks through the host, not the GPU.
	CPUOnly bool
}

// CovertGuest is what one VM of the covert-channel harness reports: the
// receiver's probe samples, and for either role how many kernels it ran
// and whether their results verified.
type CovertGuest struct {
	Role string `json:"role"`
	// Kernels is the number of loop kernels run (sender: busy kernels,
	// receiver: probes), MeanKernelNs their mean submission-to-completion
	// time.
	Kernels      int     `json:"kernels"`
	MeanKernelNs float64 `json:"mean_kernel_ns"`
	// ReadyNs is when the VM was set up, relative to Start (negative:
	// before, as it must be).
	ReadyNs int64 `json:"ready_ns"`
	// ProbeAtNs and ProbeLatencyNs are, per probe of the receiver, when it
	// was submitted (since Start) and how long it took to complete.
	ProbeAtNs      []int64 `json:"probe_at_ns,omitempty"`
	ProbeLatencyNs []int64 `json:"probe_latency_ns,omitempty"`
	Verified       bool    `json:"verified"`
	Error          string  `json:"error,omitempty"`
}

// ErrLateStart is returned by RunCovertGuest when the VM was not set up
// before the agreed start.
var ErrLateStart = errors.New("VM was not ready at the agreed start")

// RunCovertGuest is one VM of the covert-channel harness, a real guest: it
// connects its device model, opens the guest driver and a gdev context,
// loads the loop kernel and, from the agreed start, sends or receives
// (CovertGuestOptions.Role). Each loop kernel writes its generator's final
// value to device memory; the last one is read back and checked against
// the host reference at the end.
func RunCovertGuest(ctx context.Context, cfg devmodel.Config, o CovertGuestOptions) (g CovertGuest, err error) {
	g.Role = o.Role
	switch {
	case o.Role != CovertSender && o.Role != CovertReceiver:
		return g, fmt.Errorf("covert role %q: want %s or %s", o.Role, CovertSender, CovertReceiver)
	case o.Bit <= 0 || o.Iterations == 0 || o.Iterations > nvc0.MaxKernelLoopIterations:
		return g, fmt.Errorf("covert %s: bit period %v, %d iterations: out of range", o.Role, o.Bit, o.Iterations)
	case o.Role == CovertSender && !isBits(o.Message):
		return g, fmt.Errorf("covert sender: message %q is not a non-empty string of 0 and 1", o.Message)
	case o.Role == CovertReceiver && o.Periods < 1:
		return g, fmt.Errorf("covert receiver: %d bit periods", o.Periods)
	}
	dev, err := devmodel.Connect(ctx, cfg)
	if err != nil {
		return g, err
	}
	defer func() { err = errors.Join(err, dev.Close()) }()
	bar1, bar3 := dev.BARSizes()
	drv, err := nouveau.Open(dev, dev.RAM(), nouveau.Options{BAR1Size: bar1, BAR3Size: bar3, PV: DriverPVMode(cfg.Mode), Logger: cfg.Logger})
	if err != nil {
		return g, fmt.Errorf("guest driver: %w (device: %v)", err, dev.Err())
	}
	defer func() { err = errors.Join(err, drv.Close()) }()
	gctx, err := gdev.NewContext(drv)
	if err != nil {
		return g, fmt.Errorf("gdev context: %w", err)
	}
	defer func() { err = errors.Join(err, gctx.Close()) }()
	fn, err := gctx.LoadFunction(nvc0.KernelLoop)
	if err != nil {
		return g, err
	}
	out, err := gctx.MemAlloc(8)
	if err != nil {
		return g, fmt.Errorf("allocate the result word: %w", err)
	}
	k := &loopKernel{ctx: gctx, fn: fn, out: out, iters: o.Iterations}
	// One kernel before the start: the first launch pays one-time costs
	// (code upload, context setup) that would blur bit period 0.
	if _, err := k.run(); err != nil {
		return g, fmt.Errorf("warm-up kernel: %w", err)
	}
	ready := time.Now()
	if o.Start.IsZero() {
		if o.AwaitStart == nil {
			return g, fmt.Errorf("covert %s: no start time and no way to learn it", o.Role)
		}
		if o.Start, err = o.AwaitStart(ctx); err != nil {
			return g, fmt.Errorf("covert %s: learn the start time: %w", o.Role, err)
		}
	}
	g.ReadyNs = ready.Sub(o.Start).Nanoseconds()
	if late := time.Since(o.Start); late > 0 {
		return g, fmt.Errorf("covert %s: ready %v after the start: %w", o.Role, late, ErrLateStart)
	}
	if err := sleepUntil(ctx, o.Start); err != nil {
		return g, err
	}
	if o.Role == CovertSender {
		err = k.send(ctx, o)
	} else {
		err = k.receive(ctx, o, &g)
	}
	g.Kernels = k.count
	if k.count > 0 {
		g.MeanKernelNs = float64(k.total.Nanoseconds()) / float64(k.count)
	}
	if err != nil {
		return g, err
	}
	var word [8]byte
	if err := gctx.MemcpyDtoH(word[:], out); err != nil {
		return g, fmt.Errorf("read the result word: %w", err)
	}
	if got, want := binary.LittleEndian.Uint64(word[:]), kernels.LoopValue(o.Iterations); got != want {
		g.Error = fmt.Sprintf("loop %d: result %#x, want %#x", o.Iterations, got, want)
		return g, nil
	}
	g.Verified = true
	return g, nil
}

// isBits reports whether s is a non-empty string of '0' and '1'.
func isBits(s string) bool {
	for _, c := range s {
		if c != '0' && c != '1' {
			return false
		}
	}
	return s != ""
}

// loopKernel launches one loop kernel at a time and times it.
type loopKernel struct {
	ctx   *gdev.Context
	fn    gdev.Function
	out   gdev.DevPtr
	iters uint64
	count int
	total time.Duration
}

// run launches the kernel, waits for it and returns its
// submission-to-completion time.
func (k *loopKernel) run() (time.Duration, error) {
	t0 := time.Now()
	if err := k.ctx.Launch(k.fn, k.iters, k.out.VA); err != nil {
		return 0, err
	}
	if err := k.ctx.Synchronize(); err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

// send keeps the GPU busy through each 1-bit period, kernel after kernel
// (or, CPUOnly, its own CPU), and idles through each 0-bit period. It launches no kernel in a 1-bit
// period once less than half its last kernel's time remains, so that its
// load ends near the period's end.
func (k *loopKernel) send(ctx context.Context, o CovertGuestOptions) error {
	var last time.Duration
	for i, b := range o.Message {
		end := o.Start.Add(time.Duration(i+1) * o.Bit)
		if b == '0' {
			if err := sleepUntil(ctx, end); err != nil {
				return err
			}
			continue
		}
		if o.CPUOnly {
			spinUntil(end)
			continue
		}
		for time.Until(end) > last/2 {
			if err := ctx.Err(); err != nil {
				return err
			}
			d, err := k.run()
			if err != nil {
				return fmt.Errorf("bit %d: %w", i, err)
			}
			k.count++
			k.total += d
			last = d
		}
	}
	return nil
}

// spinUntil keeps the CPU busy until t (the generator the loop kernel
// runs, in chunks between clock reads).
func spinUntil(t time.Time) uint64 {
	var x uint64
	for time.Now().Before(t) {
		for range 4096 {
			x = x*6364136223846793005 + 1442695040888963407
		}
	}
	return x
}

// receive probes back to back until the last bit period ends, recording
// each probe's submission time and latency.
func (k *loopKernel) receive(ctx context.Context, o CovertGuestOptions, g *CovertGuest) error {
	end := o.Start.Add(time.Duration(o.Periods) * o.Bit)
	for {
		t0 := time.Now()
		if !t0.Before(end) {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		d, err := k.run()
		if err != nil {
			return fmt.Errorf("probe %d: %w", k.count, err)
		}
		k.count++
		k.total += d
		g.ProbeAtNs = append(g.ProbeAtNs, t0.Sub(o.Start).Nanoseconds())
		g.ProbeLatencyNs = append(g.ProbeLatencyNs, d.Nanoseconds())
	}
}

// sleepUntil sleeps until t or until ctx ends.
func sleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}
