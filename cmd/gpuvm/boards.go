package main

import (
	"errors"
	"log/slog"

	"github.com/urfave/cli/v2"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/host"
	"github.com/gpuvm/gpuvm/sched"
)

// newHost brings up every board the configuration declares ([[boards]], or
// [board] alone), each with its own aggregator and scheduler instance, all
// sharing one vGPU registry.
func newHost(c *cli.Context, cfg config.Config, log *slog.Logger, inh *inherited) (h *host.Host, err error) {
	reg := aggregator.NewRegistry()
	var boards []*host.Board
	var closers []func() error
	defer func() {
		if err != nil {
			for _, b := range boards {
				err = errors.Join(err, b.Agg.Close(), b.Release())
			}
			for _, cl := range closers {
				err = errors.Join(err, cl())
			}
		}
	}()
	for i, e := range cfg.AllBoards() {
		if e.Kind != config.BoardSim {
			return nil, usageError("board %s: kind %q: this build drives the simulated board only (real boards need the PCI back end)", e.Name, e.Kind)
		}
		timing, err := sim.TimingByName(string(e.Timing))
		if err != nil {
			return nil, usageError("board %s: %v", e.Name, err)
		}
		layout, err := aggregator.NewLayout(cfg.Partition, e.MaxVMs, uint64(e.VRAM), e.Channels)
		if err != nil {
			return nil, usageError("board %s: %v", e.Name, err)
		}
		segs := layout.Segments(uint64(e.VRAM))
		// Over the VRAM a previous process of this daemon handed over
		// (handoff_vram.go), or new.
		board, err := inh.newSimBoard(e.Name, sim.Config{VRAMSize: uint64(e.VRAM), Channels: e.Channels, MemPartitions: e.MemPartitions,
			Timing: timing, VRAMSegments: segs}, len(layout.Slots), log)
		if err != nil {
			return nil, err
		}
		closers = append(closers, board.Close)
		// One scheduler instance per board: each board's GPU time is its own.
		policy, err := sched.New(string(cfg.Scheduler.Policy), sched.FromConfig(cfg.Scheduler))
		if err != nil {
			return nil, usageError("scheduler: %v", err)
		}
		agg, err := aggregator.New(board, aggregator.Options{Partition: cfg.Partition, MaxVMs: e.MaxVMs, Channels: e.Channels,
			Logger: log.With("board", e.Name), Registry: reg, Board: i, BoardName: e.Name,
			BusReadNs: timing.MMIOReadNs, BusWriteNs: timing.MMIOWriteNs, TrapNs: timing.TrapNs, Timing: timing.Name,
			Policy: policy, Watchdog: cfg.Scheduler.Watchdog.Duration,
			Overcommit: e.Overcommit, EvictIdle: cfg.Daemon.EvictIdle.Duration,
			RestoreWait: cfg.Daemon.RestoreWait.Duration, MinResidency: cfg.Daemon.MinResidency.Duration,
			PollDoorbells: cfg.Scheduler.Doorbell == config.DoorbellPoll, PollInterval: cfg.Scheduler.DoorbellPoll.Duration,
			// Per-VM [[vm]] settings, matched by domain name or id.
			Weight: func(g aggregator.Guest) int { return cfg.LookupVM(g.Name, int(g.DomID)).Weight },
			SLO:    sloOptions(cfg),
			Mode:   func(g aggregator.Guest) string { return string(cfg.ConfiguredMode(g.Name, int(g.DomID))) },
			Quota: func(g aggregator.Guest) aggregator.Quota {
				v := cfg.LookupVM(g.Name, int(g.DomID))
				return aggregator.Quota{Channels: v.Channels, VRAM: uint64(v.VRAM), BAR1: uint64(v.BAR1), BAR3: uint64(v.BAR3)}
			},
			Profiles:  profiles(cfg),
			ProfileOf: func(g aggregator.Guest) string { return cfg.LookupVM(g.Name, int(g.DomID)).Profile },
			DomainRAM: domainRAM(c, log),
		})
		if err != nil {
			return nil, err
		}
		closers = closers[:len(closers)-1] // the host closes it, after its aggregator
		boards = append(boards, &host.Board{Index: i, Name: e.Name, Timing: timing.Name, Agg: agg, Release: board.Close, FailBus: board.FailBus, RepairBus: board.RepairBus,
			VRAMFiles: board.VRAMSegmentFiles, VRAMSegments: segs})
	}
	d := cfg.Daemon
	return host.New(reg, boards, host.Options{Logger: log, FaultInjection: c.Bool("fault-injection"), Placement: d.Placement,
		Xen: c.Bool("xen"), XenDevDir: c.Path("xen-dir"),
		Pin: func(g aggregator.Guest, profile string) string { return pinOf(cfg, g, profile) },
		Balance: host.BalanceOptions{Policy: d.Balance, Interval: d.BalanceInterval.Duration, Threshold: d.BalanceThreshold,
			Hold: d.BalanceHold.Duration}})
}

// pinOf is the board cfg pins guest g to ("": any): its [[vm]] entry's
// board (or that entry's profile's), else the board of the profile its
// settings name (registered from xl or libvirt).
func pinOf(cfg config.Config, g aggregator.Guest, profile string) string {
	if b := cfg.LookupVM(g.Name, int(g.DomID)).Board; b != "" {
		return b
	}
	if p, ok := cfg.LookupProfile(profile); ok && profile != "" {
		return p.Board
	}
	return ""
}
