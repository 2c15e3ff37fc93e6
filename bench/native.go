package bench

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/gpuvm/gpuvm/gpu/hostmem"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
)

// NativeHostRAM is the DMA memory the native target gives the driver: room for
// the staging buffers, channel rings and pincpy's two 64 MiB pinned buffers.
// It is a sparse memfd, so only what is touched costs memory.
const NativeHostRAM = 512 << 20

// Native is the no-virtualization target: the guest driver and the simulated
// board in one process, the driver's MMIO going straight to the board.
type Native struct {
	Board  *sim.Board
	RAM    *hostmem.RAM
	Device *nouveau.Device
}

// OpenNative creates a simulated board from cfg, registers host RAM with it
// as machine memory and opens the guest driver on it.
func OpenNative(cfg sim.Config, log *slog.Logger) (*Native, error) {
	board, err := sim.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("native: %w", err)
	}
	n := &Native{Board: board}
	if n.RAM, err = hostmem.New("gpuvm-native-ram", NativeHostRAM); err != nil {
		return nil, errors.Join(fmt.Errorf("native: %w", err), n.Close())
	}
	base, err := board.RegisterSystemMemory(n.RAM.Bytes())
	if err != nil {
		return nil, errors.Join(fmt.Errorf("native: %w", err), n.Close())
	}
	n.RAM.SetBusBase(base)
	// The driver reaches the board through a port: its writes pipeline as
	// on a bus, the way a guest's remapped writes do in its device model.
	if n.Device, err = nouveau.Open(board.NewPort(), n.RAM, nouveau.Options{Logger: log}); err != nil {
		return nil, errors.Join(fmt.Errorf("native: %w", err), n.Close())
	}
	return n, nil
}

// Counters snapshots the board's counters under the names the report uses.
func (n *Native) Counters() map[string]uint64 {
	s := n.Board.Stats()
	return map[string]uint64{
		"bar0_reads":  s.MMIOReads[nvc0.BAR0],
		"bar0_writes": s.MMIOWrites[nvc0.BAR0],
		"bar1_reads":  s.MMIOReads[nvc0.BAR1],
		"bar1_writes": s.MMIOWrites[nvc0.BAR1],
		"bar3_reads":  s.MMIOReads[nvc0.BAR3],
		"bar3_writes": s.MMIOWrites[nvc0.BAR3],
		"tlb_flushes": s.TLBFlushes,
		"doorbells":   s.Doorbells,
		"kernels":     s.KernelsRun,
		"copies":      s.CopiesRun,
	}
}

// BoardInfoFor describes a simulated board configuration for a report.
func BoardInfoFor(cfg sim.Config) BoardInfo {
	t := cfg.Timing
	info := BoardInfo{Name: "Quadro 6000 (GF100GL)", Kind: "sim", VRAMBytes: cfg.VRAMSize, Channels: cfg.Channels, Timing: t.Name}
	if t.Name != "none" {
		info.TimingInfo = map[string]any{
			"mmio_read_ns": t.MMIOReadNs, "mmio_write_ns": t.MMIOWriteNs, "launch_overhead_ns": t.LaunchOverheadNs,
			"dma_bytes_per_sec": t.DMABytesPerSec, "vram_bytes_per_sec": t.VRAMBytesPerSec, "compute_ops_per_sec": t.ComputeOpsPerSec,
		}
	}
	return info
}

// Close tears the target down.
func (n *Native) Close() error {
	var errs []error
	if n.Device != nil {
		errs = append(errs, n.Device.Close())
	}
	if n.Board != nil {
		errs = append(errs, n.Board.Close())
	}
	if n.RAM != nil {
		errs = append(errs, n.RAM.Close())
	}
	return errors.Join(errs...)
}
