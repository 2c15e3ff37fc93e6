package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
	"github.com/gpuvm/gpuvm/ipc"
)

// VMCommand builds the command of a VM process from the arguments of
// `gpuvm devmodel` (the CLI re-executes its own binary).
type VMCommand func(ctx context.Context, args []string) *exec.Cmd

// VirtualOptions configure virtualized runs.
type VirtualOptions struct {
	Board     sim.Config
	Partition config.PartitionConfig
	RAMSize   uint64        // guest RAM of the VM process
	Transport ipc.Transport // device model ↔ aggregator transport
	// TrapCost, with TrapCostSet, overrides the hypervisor cost the VM
	// charges per trap (default: the board timing profile's TrapNs).
	TrapCost    time.Duration
	TrapCostSet bool
	// PostedWrites lets the VM's trapped writes return before the
	// aggregator handled them (default: they complete first, as on Xen).
	PostedWrites bool
	// PollDoorbells has the aggregator poll the VM's user areas for
	// doorbells instead of trapping them (config scheduler.doorbell).
	PollDoorbells bool
	Command       VMCommand
	Logger        *slog.Logger
	// Run are the VM's options for each workload (phase counters, no
	// warm-up).
	Run RunOptions
	// Stderr receives the VM process's standard error, its progress and
	// log (default os.Stderr).
	Stderr io.Writer
}

// BenchPartition is the partitioning virtualized benchmarks use: one VM with
// room for every workload, its BAR slices as large as the apertures allow.
func BenchPartition(vram uint64) config.PartitionConfig {
	const reserved = 256 << 20
	return config.PartitionConfig{
		VRAMPerVM: config.Size(min(vram-reserved, 2<<30) &^ (1<<20 - 1)), ChannelsPerVM: 16,
		BAR1PerVM: 64 << 20, BAR3PerVM: 16 << 20, Reserved: reserved,
	}
}

// RunVirtualized runs workloads in mode: a fresh simulated board and
// aggregator in this process, serving one VM process (device model, guest
// driver and workloads) over the real IPC protocol. The VM process's stderr
// (progress) is passed through.
func RunVirtualized(ctx context.Context, mode string, names []string, runs int, params workloads.Params, opts VirtualOptions) ([]Result, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	srv, err := serveBoard(ctx, opts.Board, aggregator.Options{Partition: opts.Partition, MaxVMs: 1, Logger: log,
		PollDoorbells: opts.PollDoorbells}, nil)
	if err != nil {
		return nil, err
	}
	defer srv.close()
	sock := srv.socket()

	args := []string{"devmodel", "--socket", sock, "--mode", mode, "--domid", "1", "--name", "bench-vm",
		"--workloads", strings.Join(names, ","), "--runs", strconv.Itoa(runs), "--json",
		"--matrix-dim", strconv.Itoa(params.MatrixDim), "--loop-iterations", strconv.FormatUint(params.LoopIterations, 10),
		"--copy-size", strconv.FormatUint(params.CopyBytes, 10), "--rodinia-scale", strconv.Itoa(max(params.RodiniaScale, 1)),
		"--ram", strconv.FormatUint(opts.RAMSize, 10),
		"--transport", opts.Transport.String()}
	if opts.TrapCostSet {
		args = append(args, "--trap-cost", opts.TrapCost.String())
	}
	if opts.PostedWrites {
		args = append(args, "--posted-writes")
	}
	if opts.Run.PhaseCounters {
		args = append(args, "--phase-counters")
	}
	if opts.Run.NoWarmup {
		args = append(args, "--no-warmup")
	}
	cmd := opts.Command(ctx, args)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, opts.Stderr
	if opts.Stderr == nil {
		cmd.Stderr = os.Stderr
	}
	runErr := cmd.Run()
	var results []Result
	if err := json.Unmarshal(out.Bytes(), &results); err != nil {
		return nil, errors.Join(fmt.Errorf("%s VM process: %w", mode, runErr), fmt.Errorf("its output is not a result list: %w", err))
	}
	return results, nil
}
