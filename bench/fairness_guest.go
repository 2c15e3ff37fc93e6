package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/gpuvm/gpuvm/devmodel"
	"github.com/gpuvm/gpuvm/gpu/kernels"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
)

// GuestLoad is what one VM of the fairness harness did.
type GuestLoad struct {
	Kind       string  `json:"kind"` // "madd" or "long-madd"
	Iterations int     `json:"iterations"`
	MeanIterNs float64 `json:"mean_iteration_ns"`
	Verified   bool    `json:"verified"`
	// Yield: the load declared a scheduling point after each kernel
	// (cooperative yield; long-madd only).
	Yield bool   `json:"yield,omitempty"`
	Error string `json:"error,omitempty"`
}

// FairnessKinds are the two loads of the thesis' Fig. 4.11 experiment.
func FairnessKinds() []string { return []string{"madd", "long-madd"} }

// RunFairnessGuest is one VM of the fairness harness: it loops a madd (one
// kernel per submission) or a long-madd (repeat kernels in one submission,
// 15× the work) on its vGPU for duration, then verifies the result.
//
// With yield, a long-madd declares a scheduling point after each of its
// kernels (gdev's SetYield: the PV and pvdrm modes), so that the scheduler may run
// another VM between them; a madd, one kernel, has nothing to yield.
//
// With gate set (a directory), it writes gate/ready-DOMID once it is set up
// and starts looping only when gate/go exists, so that VMs whose set-up
// takes different times (a trapping FV driver against a PV one on a
// loaded host) all load the GPU over the same period.
func RunFairnessGuest(ctx context.Context, cfg devmodel.Config, kind string, dim, repeat int, duration time.Duration, gate string, yield bool) (load GuestLoad, err error) {
	load.Kind = kind
	times := 1
	switch kind {
	case "madd":
	case "long-madd":
		times = repeat
	default:
		return load, fmt.Errorf("fairness load %q: want madd or long-madd", kind)
	}
	drv, closeDrv, err := OpenGuestDriver(ctx, cfg)
	if err != nil {
		return load, err
	}
	defer func() { err = errors.Join(err, closeDrv()) }()
	gctx, err := gdev.NewContextOn(drv)
	if err != nil {
		return load, err
	}
	defer func() { err = errors.Join(err, gctx.Close()) }()
	if yield && times > 1 {
		if err := gctx.SetYield(true); err != nil {
			return load, fmt.Errorf("fairness load %s in mode %s: %w", kind, cfg.Mode, err)
		}
		load.Yield = true
	}
	fn, err := gctx.LoadFunction(nvc0.KernelMadd)
	if err != nil {
		return load, err
	}
	n := dim * dim
	a, b := make([]uint32, n), make([]uint32, n)
	for i := range a {
		a[i], b[i] = uint32(i*7+int(cfg.DomID)), uint32(i*5+3)
	}
	var p [3]gdev.DevPtr
	for i := range p {
		if p[i], err = gctx.MemAlloc(uint64(4 * n)); err != nil {
			return load, err
		}
	}
	if err := gctx.MemcpyHtoD(p[0], kernels.EncodeU32s(a)); err != nil {
		return load, err
	}
	if err := gctx.MemcpyHtoD(p[1], kernels.EncodeU32s(b)); err != nil {
		return load, err
	}
	if gate != "" {
		if err := waitAtGate(ctx, gate, cfg.DomID); err != nil {
			return load, err
		}
	}
	start := time.Now()
	for time.Since(start) < duration && ctx.Err() == nil {
		if err := gctx.LaunchRepeat(fn, times, p[0].VA, p[1].VA, p[2].VA, uint64(dim)); err != nil {
			return load, err
		}
		if err := gctx.Synchronize(); err != nil {
			return load, err
		}
		load.Iterations++
	}
	if load.Iterations > 0 {
		load.MeanIterNs = float64(time.Since(start).Nanoseconds()) / float64(load.Iterations)
	}
	out := make([]byte, 4*n)
	if err := gctx.MemcpyDtoH(out, p[2]); err != nil {
		return load, err
	}
	want := kernels.MaddU32(a, b)
	got := kernels.DecodeU32s(out)
	load.Verified = true
	for i := range want {
		if got[i] != want[i] {
			load.Verified = false
			load.Error = fmt.Sprintf("result differs at element %d", i)
			break
		}
	}
	return load, nil
}

// gateTimeout bounds the wait for the other VMs at the start gate.
const gateTimeout = 5 * time.Minute

// waitAtGate says this VM is ready and waits for the harness' go.
func waitAtGate(ctx context.Context, gate string, domid uint32) error {
	if err := os.WriteFile(filepath.Join(gate, fmt.Sprintf("ready-%d", domid)), nil, 0o644); err != nil {
		return fmt.Errorf("start gate: %w", err)
	}
	deadline := time.Now().Add(gateTimeout)
	for {
		if _, err := os.Stat(filepath.Join(gate, "go")); err == nil {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("start gate %s: no go after %v", gate, gateTimeout)
		}
		time.Sleep(time.Millisecond)
	}
}

// openGate waits until n VMs are ready at gate, then lets them go.
func openGate(ctx context.Context, gate string, n int, failed func() bool) error {
	deadline := time.Now().Add(gateTimeout)
	for {
		ready, err := filepath.Glob(filepath.Join(gate, "ready-*"))
		if err != nil {
			return err
		}
		if len(ready) >= n {
			return os.WriteFile(filepath.Join(gate, "go"), nil, 0o644)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if failed() {
			return errors.New("a VM ended before the start")
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("start gate: %d of %d VMs ready after %v", len(ready), n, gateTimeout)
		}
		time.Sleep(time.Millisecond)
	}
}
