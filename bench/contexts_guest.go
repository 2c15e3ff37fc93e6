package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gpuvm/gpuvm/devmodel"
	"github.com/gpuvm/gpuvm/gpu/kernels"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
)

// Instance is one application instance of the contexts experiment (thesis
// Fig. 4.10): a madd program in its own GPU context whose kernel runs
// repeat times, timed by phase.
type Instance struct {
	PhasesNs map[string]int64 `json:"phases_ns"`
	TotalNs  int64            `json:"total_ns"`
	Verified bool             `json:"verified"`
	Error    string           `json:"error,omitempty"`
}

// launchesPerSubmission is how many of an instance's repeated kernels go in
// one push buffer (gdev bounds a submission's repeat count).
const launchesPerSubmission = 1000

// RunMaddInstances runs n madd applications at once on drv, each in its own
// goroutine and GPU context: init (context, kernel, three n×n buffers),
// htod (the two inputs), launch (the kernel repeat times, then
// synchronise), dtoh (the result), close (free and destroy the context).
// Each verifies its result against the host reference; instance i's inputs
// depend on seed and i, so no two instances compute the same thing.
func RunMaddInstances(ctx context.Context, drv gdev.Driver, n, dim, repeat int, seed uint32) []Instance {
	out := make([]Instance, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			out[i] = runMaddInstance(ctx, drv, dim, repeat, seed+uint32(i)*7919)
		})
	}
	wg.Wait()
	return out
}

// runMaddInstance is one instance of RunMaddInstances.
func runMaddInstance(ctx context.Context, drv gdev.Driver, dim, repeat int, seed uint32) (inst Instance) {
	inst.PhasesNs = map[string]int64{}
	elems := dim * dim
	a, b := make([]uint32, elems), make([]uint32, elems)
	for i := range a {
		a[i], b[i] = uint32(i)*2654435761+seed, uint32(i)^seed*40503
	}
	in0, in1 := kernels.EncodeU32s(a), kernels.EncodeU32s(b)
	want := kernels.EncodeU32s(kernels.MaddU32(a, b))
	got := make([]byte, len(want))

	last := time.Now()
	lap := func(phase string) {
		now := time.Now()
		inst.PhasesNs[phase] += now.Sub(last).Nanoseconds()
		last = now
	}
	gctx, err := gdev.NewContextOn(drv)
	if err != nil {
		inst.Error = fmt.Sprintf("init: %v", err)
		return inst
	}
	err = func() error {
		fn, err := gctx.LoadFunction(nvc0.KernelMadd)
		if err != nil {
			return err
		}
		var p [3]gdev.DevPtr
		for i := range p {
			if p[i], err = gctx.MemAlloc(uint64(len(in0))); err != nil {
				return err
			}
		}
		lap(workloads.PhaseInit)
		if err := gctx.MemcpyHtoD(p[0], in0); err != nil {
			return err
		}
		if err := gctx.MemcpyHtoD(p[1], in1); err != nil {
			return err
		}
		lap(workloads.PhaseHtoD)
		for left := repeat; left > 0; left -= launchesPerSubmission {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := gctx.LaunchRepeat(fn, min(left, launchesPerSubmission), p[0].VA, p[1].VA, p[2].VA, uint64(dim)); err != nil {
				return err
			}
		}
		if err := gctx.Synchronize(); err != nil {
			return err
		}
		lap(workloads.PhaseLaunch)
		if err := gctx.MemcpyDtoH(got, p[2]); err != nil {
			return err
		}
		lap(workloads.PhaseDtoH)
		for _, q := range p {
			if err := gctx.MemFree(q); err != nil {
				return err
			}
		}
		return nil
	}()
	err = errors.Join(err, gctx.Close())
	lap(workloads.PhaseClose)
	for _, v := range inst.PhasesNs {
		inst.TotalNs += v
	}
	switch {
	case err != nil:
		inst.Error = err.Error()
	case string(got) != string(want):
		inst.Error = fmt.Sprintf("madd %dx%d: %v", dim, dim, workloads.ErrVerify)
	default:
		inst.Verified = true
	}
	return inst
}

// RunContextsGuest is a VM process of the contexts experiment: it attaches
// to its vGPU in cfg.Mode, waits at the start gate (if gate is set) and runs
// n madd instances at once (RunMaddInstances).
func RunContextsGuest(ctx context.Context, cfg devmodel.Config, n, dim, repeat int, gate string) (_ []Instance, err error) {
	drv, closeDrv, err := OpenGuestDriver(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, closeDrv()) }()
	if gate != "" {
		if err := waitAtGate(ctx, gate, cfg.DomID); err != nil {
			return nil, err
		}
	}
	return RunMaddInstances(ctx, drv, n, dim, repeat, cfg.DomID*104729), nil
}
