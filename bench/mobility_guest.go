package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/gpuvm/gpuvm/devmodel"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
)

// MobilityWorkloads are what each VM of gpuvm bench mobility loops, one
// run of each in turn.
func MobilityWorkloads() []string { return []string{"madd", "cpy"} }

// MobilityIter is one run of a mobility VM's loop, in wall-clock time (the
// harness lines it up with the moves it made).
type MobilityIter struct {
	Workload string `json:"workload"`
	StartNs  int64  `json:"start_unix_ns"`
	EndNs    int64  `json:"end_unix_ns"`
	Verified bool   `json:"verified"`
}

// MobilityGuest is what one VM of gpuvm bench mobility did: its results in
// gpuvm bench's shape (one per workload, over every run it made), each
// run's times, and whether it lost its device.
type MobilityGuest struct {
	Name    string         `json:"name"`
	Mode    string         `json:"mode"`
	VGPU    int            `json:"vgpu"`
	Results []Result       `json:"results"`
	Iters   []MobilityIter `json:"iterations"`
	// Lost says how the VM lost its GPU (its board failed, its vGPU was
	// destroyed): the run under way then fails with the device's error,
	// which is the documented outcome, not a wrong result. The runs before
	// it are in Results.
	Lost string `json:"lost,omitempty"`
	// Error is a failure of the VM itself (set-up, a run that failed while
	// its device was still there).
	Error string `json:"error,omitempty"`
}

// stopFile is the file of the start gate whose existence ends the loops.
const stopFile = "stop"

// RunMobilityGuest is one VM of gpuvm bench mobility: it attaches to the
// aggregator in cfg.Mode, waits at gate (as the fairness VMs do), then
// runs madd and cpy in turn, each verified, until gate/stop exists or ctx
// ends. A reset of its vGPU is recovered from as RunGuest does (the driver
// re-initialises, the run is made again, counted in Recovered); a lost
// device ends the loop with Lost set.
func RunMobilityGuest(ctx context.Context, cfg devmodel.Config, params workloads.Params, gate string) (g MobilityGuest, err error) {
	g.Name, g.Mode, g.VGPU = cfg.Name, cfg.Mode, -1
	dev, err := devmodel.Connect(ctx, cfg)
	if err != nil {
		return g, fmt.Errorf("mobility VM %s: %w", cfg.Name, err)
	}
	g.VGPU = int(dev.Welcome().VGPU)
	defer func() {
		if cerr := dev.Close(); cerr != nil && g.Lost == "" {
			err = errors.Join(err, fmt.Errorf("mobility VM %s: closing the device: %w", cfg.Name, cerr))
		}
	}()
	bar1, bar3 := dev.BARSizes()
	drv, err := nouveau.Open(dev, dev.RAM(), nouveau.Options{BAR1Size: bar1, BAR3Size: bar3, PV: DriverPVMode(cfg.Mode), Logger: cfg.Logger})
	if err != nil {
		return g, fmt.Errorf("mobility VM %s: guest driver: %w (device: %v)", cfg.Name, err, dev.Err())
	}
	defer func() {
		if cerr := drv.Close(); cerr != nil && g.Lost == "" {
			err = errors.Join(err, fmt.Errorf("mobility VM %s: closing the driver: %w", cfg.Name, cerr))
		}
	}()
	opts := RunOptions{NoWarmup: true, Recover: func(err error) bool {
		// A reset under a run is recovered from, as RunGuest does, and
		// also when the run failed otherwise on a GPU that reads as reset:
		// a wait the driver began before the reset (a FECS command of a
		// new context) times out rather than failing with ErrDeviceReset.
		// A device that is gone (a lost device) is not recovered from:
		// this bench reports it.
		if dev.Err() != nil {
			return false
		}
		if !errors.Is(err, nouveau.ErrDeviceReset) && !drv.ResetDetected() {
			return false
		}
		return drv.Reset() == nil
	}}
	var ws []workloads.Workload
	for _, name := range MobilityWorkloads() {
		w, err := workloads.New(name, params)
		if err != nil {
			return g, err
		}
		ws = append(ws, w)
	}
	if err := waitAtGate(ctx, gate, cfg.DomID); err != nil {
		return g, err
	}
	per := map[string][]Result{}
	defer func() { g.Results = mergeRuns(ws, per) }()
	for ctx.Err() == nil && !exists(filepath.Join(gate, stopFile)) {
		for _, w := range ws {
			t0 := time.Now()
			r := RunWorkloadWith(ctx, cfg.Mode, gdev.Nouveau(drv), w, 1, nil, nil, opts)
			if r.Error != "" {
				// A lost device (its board fell off the bus) reads all
				// ones; this guest reports it rather than resetting it.
				if derr := dev.Err(); derr != nil {
					g.Lost = fmt.Sprintf("%s: %s (device: %v)", w.Name(), r.Error, derr)
					return g, nil
				}
				if dev.Read32(nvc0.BAR0, nvc0.RegBoot0) == nvc0.ReadAllOnes {
					g.Lost = fmt.Sprintf("%s: %s (device: reads all ones, a lost device)", w.Name(), r.Error)
					return g, nil
				}
			}
			per[w.Name()] = append(per[w.Name()], r)
			g.Iters = append(g.Iters, MobilityIter{Workload: w.Name(), StartNs: t0.UnixNano(), EndNs: time.Now().UnixNano(), Verified: r.Verified})
			if r.Error != "" {
				g.Error = fmt.Sprintf("%s: %s", w.Name(), r.Error)
				return g, nil
			}
		}
	}
	return g, nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// mergeRuns folds each workload's one-run results into one result in
// gpuvm bench's shape: every run counted, verified if every run was,
// totals and phases the medians (min, max) over the runs.
func mergeRuns(ws []workloads.Workload, per map[string][]Result) []Result {
	out := []Result{}
	for _, w := range ws {
		rs := per[w.Name()]
		if len(rs) == 0 {
			continue
		}
		m := Result{Mode: rs[0].Mode, Workload: w.Name(), Runs: len(rs), Verified: true, PhasesNs: map[string]int64{},
			PhasesMinNs: map[string]int64{}, PhasesMaxNs: map[string]int64{}, Counters: map[string]any{}}
		var totals []int64
		phases := map[string][]int64{}
		for _, r := range rs {
			m.Verified = m.Verified && r.Verified
			m.Recovered += r.Recovered
			if r.Error != "" && m.Error == "" {
				m.Error = r.Error
			}
			if r.Verified {
				totals = append(totals, r.TotalNs)
				for p, ns := range r.PhasesNs {
					phases[p] = append(phases[p], ns)
				}
			}
		}
		m.TotalNs, m.TotalMinNs, m.TotalMaxNs = medianMinMax(totals)
		for p, v := range phases {
			m.PhasesNs[p], m.PhasesMinNs[p], m.PhasesMaxNs[p] = medianMinMax(v)
		}
		out = append(out, m)
	}
	return out
}

// medianMinMax returns the median, minimum and maximum of v (zeros when
// empty).
func medianMinMax(v []int64) (med, lo, hi int64) {
	if len(v) == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2], s[0], s[len(s)-1]
}
