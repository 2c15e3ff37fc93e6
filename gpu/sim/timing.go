package sim

import (
	"fmt"
	"time"
)

// Timing is the board's timing model. The zero value (TimingNone) adds no
// delay anywhere: the board runs as fast as the host allows, for tests.
//
// With a non-zero profile every MMIO read costs MMIOReadNs and every write
// MMIOWriteNs (busy-waited: time.Sleep cannot express sub-microsecond delays;
// through a Port, writes pipeline as posted writes do and reads wait
// behind them, see port.go; the native driver and a guest's remapped
// accesses are timed that way),
// a kernel takes at least LaunchOverheadNs + max(Ops/ComputeOpsPerSec,
// Bytes/VRAMBytesPerSec), and a copy at least Bytes/DMABytesPerSec when either
// side is system memory, else Bytes/VRAMBytesPerSec. When the real work took
// longer than the model, the real time stands.
//
// Host-side VRAM access (ReadVRAM, WriteVRAM) — the aggregator's own reads
// and writes of VRAM (shadow scans, PRAMIN emulation, RAMIN mirroring,
// doorbells) — crosses the same bus as a guest's: it costs MMIOReadNs per
// 32-bit word read and MMIOWriteNs per word written, as uncached accesses
// through a BAR mapping do. ScrubVRAM is a GPU-side clear: Bytes/VRAMBytesPerSec.
//
// TrapNs is not a board cost: it is the hypervisor's share of one trapped
// guest access (VM exit, ioreq delivery to the device model, resume), which
// a run without a hypervisor does not pay. The aggregator passes it to
// device models, which charge it per trapped access.
type Timing struct {
	// Name is the profile's name ("none", "fermi" or a caller's own).
	Name string
	// MMIOReadNs is the cost of one uncached BAR read (a PCIe round trip).
	MMIOReadNs int64
	// MMIOWriteNs is the cost of one posted BAR write.
	MMIOWriteNs int64
	// LaunchOverheadNs is the fixed cost of a kernel launch.
	LaunchOverheadNs int64
	// DMABytesPerSec is the bus bandwidth for copies touching system memory (0 = unlimited).
	DMABytesPerSec float64
	// VRAMBytesPerSec is the device-memory bandwidth (0 = unlimited).
	VRAMBytesPerSec float64
	// ComputeOpsPerSec is the kernel throughput in simple operations per second (0 = unlimited).
	ComputeOpsPerSec float64
	// TrapNs is the hypervisor's share of one trapped guest access, charged
	// by device models (not by the board).
	TrapNs int64
}

// TimingNone returns the profile that adds no delay.
func TimingNone() Timing { return Timing{Name: "none"} }

// TimingFermi returns a Fermi-class profile: a Quadro 6000 (GF100GL, 448 CUDA
// cores at 1.15 GHz, 6 GiB GDDR5 on a 384-bit bus) in a PCIe 2.0 x16 slot.
//
//   - MMIOReadNs 800: an uncached read of a BAR register is a non-posted PCIe
//     round trip; measured on PCIe 2.0 systems it is 0.5–1 µs.
//   - MMIOWriteNs 250: a posted write needs no completion, but uncached
//     stores leave the core one at a time, each costing the CPU some
//     hundreds of ns. The value is set above the simulator's own costliest
//     write (a BAR1 write through the MMU: 125–150 ns here,
//     BenchmarkMMIOWriteBAR1), so that write-heavy phases measure the
//     model, not Go; it was 60 ns, below the simulator's cost.
//   - DMABytesPerSec 5.5e9: PCIe 2.0 x16 carries 8 GB/s each way after
//     8b/10b encoding (16 lanes × 5 GT/s × 8/10), ~6.4 GB/s after TLP
//     overhead; cudaMemcpy from pinned memory reaches ~5.5–6 GB/s.
//   - VRAMBytesPerSec 144e9: the Quadro 6000's specified memory bandwidth
//     (384 bit × 3 Gbps).
//   - ComputeOpsPerSec 1e12: 448 cores × 1.15 GHz × 2 (FMA) ≈ 1.03 Tflop/s
//     single-precision peak.
//   - LaunchOverheadNs 5000: a Fermi kernel launch costs ~5 µs end to end
//     (CUDA 4-era measurements of empty-kernel launch latency).
func TimingFermi() Timing {
	return Timing{
		Name:             "fermi",
		MMIOReadNs:       800,
		MMIOWriteNs:      250,
		LaunchOverheadNs: 5000,
		DMABytesPerSec:   5.5e9,
		VRAMBytesPerSec:  144e9,
		ComputeOpsPerSec: 1e12,
	}
}

// TimingFermiXen is TimingFermi on a Xen host: each trapped guest access
// also pays the hypervisor's share of a trap, TrapNs 5000. That share is a
// VM exit and entry (hundreds to a few thousand cycles on 2010s hardware;
// Agesen et al., "Software Techniques for Avoiding Hardware Virtualization
// Exits", USENIX ATC 2012) plus the ioreq's trip to the dom0 device model
// and back (an event-channel notification, a dom0 thread wakeup and the
// reply notification: several µs). 5 µs is an estimate of the sum on the
// Fermi-era hosts GPUvm used; the GPUvm thesis publishes no per-trap
// figure. The emulated Xen test bed on this machine costs ~1 ms per trap
// (TCG emulation, not Xen), which is not a model of a real host. The
// profile is the default for comparisons with GPUvm; `--trap-cost`
// overrides TrapNs.
func TimingFermiXen() Timing {
	t := TimingFermi()
	t.Name = "fermi-xen"
	t.TrapNs = 5000
	return t
}

// TimingFermiSmall is a smaller board of the same GF100 family, for hosts
// with boards of different speeds: the Quadro 4000 (256 CUDA cores at a
// 0.95 GHz shader clock, 2 GiB GDDR5 on a 256-bit bus at 2.8 Gbps; NVIDIA's
// Quadro 4000 data sheet) in the same PCIe 2.0 x16 slot.
//
//   - ComputeOpsPerSec 486e9: 256 cores × 0.95 GHz × 2 (FMA) ≈ 486 Gflop/s
//     single-precision peak, 0.49 of the Quadro 6000's.
//   - VRAMBytesPerSec 89.6e9: 256 bit × 2.8 Gbps, 0.62 of the Quadro 6000's.
//   - MMIO, DMA and launch costs as TimingFermi: the same bus and driver path.
func TimingFermiSmall() Timing {
	t := TimingFermi()
	t.Name = "fermi-small"
	t.ComputeOpsPerSec = 486e9
	t.VRAMBytesPerSec = 89.6e9
	return t
}

// TimingFermiX4 is TimingFermi's board (the Quadro 6000) in a slot wired
// for four PCIe 2.0 lanes instead of sixteen, as a dom0 host's second GPU
// often is (an x16 connector with x4 electrical, fed by the chipset): the
// same chip, slower only over the bus, so it is slower for copy-heavy work.
//
//   - DMABytesPerSec 1.375e9: PCIe 2.0 signals at 5 GT/s per lane with
//     8b/10b encoding, 500 MB/s per lane and direction (PCI Express Base
//     Specification 2.0), so x4 carries 2 GB/s where x16 carries 8 GB/s.
//     The per-lane overheads (TLP headers, flow control) do not depend on
//     the width, so the x16 profile's 5.5 GB/s (cudaMemcpy from pinned
//     memory, above) scales with the lanes: 5.5e9 × 4/16 = 1.375e9.
//   - MMIO, VRAM, compute and launch costs as TimingFermi: a register
//     round trip's latency is set by the link's hops, not its width (a
//     4-byte read's packets take a few ns longer to serialise on 4 lanes,
//     far below the 800 ns round trip), and the chip is the same.
func TimingFermiX4() Timing {
	t := TimingFermi()
	t.Name = "fermi-x4"
	t.DMABytesPerSec = 5.5e9 * 4 / 16
	return t
}

// TimingNames lists the profiles TimingByName knows.
func TimingNames() []string { return []string{"none", "fermi", "fermi-xen", "fermi-small", "fermi-x4"} }

// TimingByName returns the named profile: "none", "fermi", "fermi-xen",
// "fermi-small" or "fermi-x4".
func TimingByName(name string) (Timing, error) {
	switch name {
	case "none", "":
		return TimingNone(), nil
	case "fermi":
		return TimingFermi(), nil
	case "fermi-xen":
		return TimingFermiXen(), nil
	case "fermi-small":
		return TimingFermiSmall(), nil
	case "fermi-x4":
		return TimingFermiX4(), nil
	}
	return Timing{}, fmt.Errorf("sim: unknown timing profile %q (want none, fermi, fermi-xen, fermi-small or fermi-x4)", name)
}

// isNone reports whether the profile adds no delay at all.
func (t Timing) isNone() bool {
	return t.MMIOReadNs == 0 && t.MMIOWriteNs == 0 && t.LaunchOverheadNs == 0 &&
		t.DMABytesPerSec == 0 && t.VRAMBytesPerSec == 0 && t.ComputeOpsPerSec == 0 && t.TrapNs == 0
}

func (t Timing) validate() error {
	if t.MMIOReadNs < 0 || t.MMIOWriteNs < 0 || t.LaunchOverheadNs < 0 ||
		t.DMABytesPerSec < 0 || t.VRAMBytesPerSec < 0 || t.ComputeOpsPerSec < 0 || t.TrapNs < 0 {
		return fmt.Errorf("sim: timing profile %q has a negative value", t.Name)
	}
	return nil
}

// perSec returns the time n units take at rate units per second (0 = unlimited).
func perSec(n uint64, rate float64) time.Duration {
	if rate <= 0 || n == 0 {
		return 0
	}
	return time.Duration(float64(n) / rate * float64(time.Second))
}

// kernelTime is the modelled duration of a kernel of the given cost.
func (t Timing) kernelTime(ops, bytes uint64) time.Duration {
	return time.Duration(t.LaunchOverheadNs) + max(perSec(ops, t.ComputeOpsPerSec), perSec(bytes, t.VRAMBytesPerSec))
}

// copyTime is the modelled duration of a copy of n bytes.
func (t Timing) copyTime(n uint64, sys bool) time.Duration {
	if sys {
		return perSec(n, t.DMABytesPerSec)
	}
	return perSec(n, t.VRAMBytesPerSec)
}

// hostAccess is the modelled cost of host-side access to n bytes of VRAM:
// one uncached bus access per 32-bit word.
func (t Timing) hostAccess(n int, write bool) time.Duration {
	per := t.MMIOReadNs
	if write {
		per = t.MMIOWriteNs
	}
	return time.Duration(int64((n+3)/4) * per)
}
