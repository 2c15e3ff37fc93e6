package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/devmodel"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
	"github.com/gpuvm/gpuvm/ipc"
	"github.com/gpuvm/gpuvm/pvdrm"
)

// RunGuest is the VM process of a virtualized benchmark: it connects a
// device model to the aggregator, opens the guest driver on the virtual GPU
// and runs the workloads, taking the vGPU's counters from the aggregator
// around the measured runs. The report's board is the vGPU the aggregator
// granted (VGPUBoardInfo), once connected.
// opts are each workload's RunWorkloadWith options.
func RunGuest(ctx context.Context, cfg devmodel.Config, names []string, runs int, params workloads.Params, opts RunOptions, progress Progress) (rep Report, err error) {
	warmup := 1
	if opts.NoWarmup {
		warmup = 0
	}
	rep.Warmup = warmup
	run := func(ctx context.Context, mode string, drv gdev.Driver, w workloads.Workload, runs int, counters CounterSource, progress Progress) Result {
		return RunWorkloadWith(ctx, mode, drv, w, runs, counters, progress, opts)
	}
	if config.Mode(cfg.Mode).IsPVDRM() {
		rep, err = runPVDRMGuest(ctx, cfg, names, runs, params, run, progress)
		rep.Warmup = warmup
		return rep, err
	}
	dev, err := devmodel.Connect(ctx, cfg)
	if err != nil {
		return rep, err
	}
	defer func() { err = errors.Join(err, dev.Close()) }()
	rep.Board = VGPUBoardInfo(dev.Welcome(), cfg.Mode)
	bar1, bar3 := dev.BARSizes()
	drv, err := nouveau.Open(dev, dev.RAM(), nouveau.Options{BAR1Size: bar1, BAR3Size: bar3, PV: DriverPVMode(cfg.Mode), Logger: cfg.Logger})
	if err != nil {
		return rep, fmt.Errorf("guest driver: %w (device: %v)", err, dev.Err())
	}
	defer func() { err = errors.Join(err, drv.Close()) }()
	if opts.Recover == nil {
		// A reset of the vGPU under a run (the operator's gpuvm vgpu
		// reset) is recovered from as a guest OS would: the driver
		// re-initialises and the run is made again. A run the reset
		// caught elsewhere than in a fence wait fails otherwise — a
		// read-back through BAR1 after its last fence reads the fresh
		// GPU's memory and fails verification, a FECS command begun
		// before the reset times out — so any failed run is made again if
		// the GPU reads as reset. A device that reads as gone (its
		// board fell off the bus: a lost device) is reset by the guest
		// itself, with a function-level reset, as an OS's PCIe error
		// recovery resets a function that dropped off the link: the
		// vGPU comes back on its board, once that is back, or on
		// another board, if the host has one with room.
		opts.Recover = func(err error) bool {
			if errors.Is(err, nouveau.ErrDeviceGone) {
				return drv.FunctionReset() == nil
			}
			if !errors.Is(err, nouveau.ErrDeviceReset) && !drv.ResetDetected() {
				return false
			}
			return drv.Reset() == nil
		}
	}
	names2 := aggregator.CounterNames()
	counters := func() map[string]uint64 {
		c, err := dev.Counters(names2)
		if err != nil {
			return map[string]uint64{}
		}
		return c
	}
	for _, name := range names {
		w, err := workloads.New(name, params)
		if err != nil {
			return rep, err
		}
		res := run(ctx, cfg.Mode, gdev.Nouveau(drv), w, runs, counters, progress)
		if res.Error != "" && dev.Err() != nil {
			res.Error += fmt.Sprintf(" (device: %v)", dev.Err())
		}
		rep.Results = append(rep.Results, res)
	}
	return rep, nil
}

// runFunc runs one workload (RunWorkload with the guest's options).
type runFunc func(ctx context.Context, mode string, drv gdev.Driver, w workloads.Workload, runs int, counters CounterSource, progress Progress) Result

// DriverPVMode is the guest driver's para-virtual mode for a virtualization
// mode: hypercalls one per update (pv-naive), batched (pv-multicall), or
// none.
func DriverPVMode(mode string) nouveau.PVMode {
	switch config.Mode(mode) {
	case config.ModePVNaive:
		return nouveau.PVNaive
	case config.ModePVMulticall:
		return nouveau.PVMulticall
	}
	return nouveau.PVOff
}

// VGPUBoardInfo describes the virtual GPU a Welcome grants: its VRAM and
// channels (the VM's quota) and the board's timing profile, if the
// aggregator named it.
func VGPUBoardInfo(w ipc.Welcome, mode string) BoardInfo {
	timing := w.Params[ipc.ParamTiming]
	if timing == "" {
		timing = "not reported"
	}
	return BoardInfo{Name: "virtual GPU", Kind: "vgpu " + mode, VRAMBytes: w.VRAMSize, Channels: int(w.Channels), Timing: timing}
}

// roundTrips is how many ring and MMIO round trips a pvdrm VM times before
// each workload.
const roundTrips = 2000

// runPVDRMGuest is RunGuest in a pvdrm mode: no device model, no registers;
// the front end connects its ring and Gdev runs over it. Before each
// workload it times the ring's request round trip and the shared-memory
// MMIO round trip of the device-model connection, in the same process
// (counters ring_round_trip_ns and mmio_round_trip_ns), and it reports
// the front end's own counts (front_requests, front_notifications,
// front_maps: shares it mapped).
func runPVDRMGuest(ctx context.Context, cfg devmodel.Config, names []string, runs int, params workloads.Params, run runFunc, progress Progress) (rep Report, err error) {
	fe, err := pvdrm.DialLocal(ctx, frontEndConfig(cfg))
	if err != nil {
		return rep, err
	}
	defer func() { err = errors.Join(err, fe.Close()) }()
	rep.Board = VGPUBoardInfo(fe.Welcome(), cfg.Mode)
	drv := gdev.PVDRM(fe.Client, fe.Shares)
	names2 := aggregator.CounterNames()
	counters := func() map[string]uint64 {
		c, err := fe.Counters(names2)
		if err != nil {
			return map[string]uint64{}
		}
		st := fe.Client.Stats()
		c["front_requests"], c["front_notifications"], c["front_maps"] = st.Requests, st.Notifications, fe.Shares.Mappings()
		return c
	}
	for _, name := range names {
		w, err := workloads.New(name, params)
		if err != nil {
			return rep, err
		}
		ring, mmio, err := timeRoundTrips(ctx, fe)
		if err != nil {
			return rep, err
		}
		res := run(ctx, cfg.Mode, drv, w, runs, counters, progress)
		res.Counters["ring_round_trip_ns"], res.Counters["mmio_round_trip_ns"] = ring.Nanoseconds(), mmio.Nanoseconds()
		rep.Results = append(rep.Results, res)
	}
	return rep, nil
}

// frontEndConfig is the pvdrm front end of the VM cfg describes: after a
// saved Bye (a save, a migration, a handoff of the daemon) it resumes as
// its device model would (cfg.ResumeTimeout, cfg.ResumeSockets).
func frontEndConfig(cfg devmodel.Config) pvdrm.DialConfig {
	return pvdrm.DialConfig{Socket: cfg.Socket, DomID: cfg.DomID, Name: cfg.Name, Mode: cfg.Mode, GARTSize: cfg.RAMSize, Logger: cfg.Logger,
		ResumeTimeout: cfg.ResumeTimeout, ResumeSockets: cfg.ResumeSockets}
}

// timeRoundTrips times the two round trips on a file of its own.
func timeRoundTrips(ctx context.Context, fe *pvdrm.FrontEnd) (ring, mmio time.Duration, err error) {
	rsp, err := fe.Client.Do(ctx, pvdrm.Request{Op: pvdrm.OpOpen})
	if err != nil {
		return 0, 0, err
	}
	file := uint32(rsp.Results["file"])
	ring, mmio, err = fe.RoundTrips(ctx, file, roundTrips)
	_, cerr := fe.Client.Do(ctx, pvdrm.Request{Op: pvdrm.OpClose, File: file})
	return ring, mmio, errors.Join(err, cerr)
}

// OpenGuestDriver connects a VM to the aggregator in cfg.Mode and returns
// the Gdev driver its programs run on, and how to close it: the guest
// driver over a device model (full and para-virtualization), or the pvdrm
// front end.
func OpenGuestDriver(ctx context.Context, cfg devmodel.Config) (gdev.Driver, func() error, error) {
	if config.Mode(cfg.Mode).IsPVDRM() {
		fe, err := pvdrm.DialLocal(ctx, frontEndConfig(cfg))
		if err != nil {
			return nil, nil, err
		}
		return gdev.PVDRM(fe.Client, fe.Shares), fe.Close, nil
	}
	dev, err := devmodel.Connect(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	bar1, bar3 := dev.BARSizes()
	drv, err := nouveau.Open(dev, dev.RAM(), nouveau.Options{BAR1Size: bar1, BAR3Size: bar3, PV: DriverPVMode(cfg.Mode), Logger: cfg.Logger})
	if err != nil {
		return nil, nil, errors.Join(fmt.Errorf("guest driver: %w (device: %v)", err, dev.Err()), dev.Close())
	}
	return gdev.Nouveau(drv), func() error { return errors.Join(drv.Close(), dev.Close()) }, nil
}
