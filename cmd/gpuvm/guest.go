package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gpuvm/gpuvm/bench"
	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/gpu"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
	"github.com/gpuvm/gpuvm/guest-driver/xenguest"
	"github.com/gpuvm/gpuvm/pvdrm"
)

// guestRoundTrips is how many PMC_BOOT_0 reads time the trap round trip
// by default.
const guestRoundTrips = 1000

func guestCommand() *cli.Command {
	part := config.Default().Partition
	return &cli.Command{
		Name:  "guest",
		Usage: "run the guest driver and workloads inside a Xen guest on its vGPU",
		Description: "Runs inside a Xen HVM or PVH guest (as root, with no kernel driver bound to the vGPU):\n" +
			"opens the virtual GPU that the domain's device model emulates, runs the guest driver on\n" +
			"it and the given workloads, verifying each result, and prints the table (or --json)\n" +
			"that devmodel prints. Every register access is one 32-bit load or store to a BAR,\n" +
			"which traps to Xen and reaches the device model as an ioreq: this is the guest side\n" +
			"of a real deployment, where `gpuvm devmodel` is its stand-in in a process.\n\n" +
			"BARs. By default the vGPU is found in sysfs (--sysfs) by its PCI id (10de:06d8), or\n" +
			"named with --pci, and its memory BARs are mapped from the function's resourceN files.\n" +
			"A PVH guest has no PCI enumeration: give --bars, the guest-physical addresses where\n" +
			"the device model placed BAR0, BAR1 and BAR3 (mapped from --dev-mem), and the first\n" +
			"I/O port of BAR5. BAR5 carries the hypercalls of the pv- modes (reached with ioperm\n" +
			"and IN/OUT, linux/amd64 only); the fv- modes do not use it.\n\n" +
			"DMA memory. The GPU reads and writes guest RAM the driver gives it: --dma BASE:SIZE is\n" +
			"a guest-physical range the guest kernel must have been booted to leave alone, with\n" +
			"memmap=SIZE$BASE on its command line (e.g. memmap=64M$0x10000000 for\n" +
			"--dma 0x10000000:64MiB; in a GRUB configuration write \\$). The range is checked\n" +
			"against --iomem (it must be Reserved, not System RAM) and mapped from --dev-mem. It\n" +
			"must hold each workload's buffers: 16MiB is enough for every workload but pincpy,\n" +
			"which pins two --copy-size buffers on top.\n\n" +
			"Apertures. The vGPU's BAR1 and BAR3 are whole-size PCI BARs of which only the\n" +
			"domain's slice is usable: --bar1-size and --bar3-size must match the daemon's\n" +
			"[partition] bar1_per_vm and bar3_per_vm.\n\n" +
			"Trap cost. At the end, on stderr: the BAR accesses the guest made and the mean time\n" +
			"of one (a trap's round trip through Xen and the device model, measured from inside\n" +
			"the guest), the fills (a run of words the driver clears with one REP STOSL, which\n" +
			"Xen hands the device model as one ioreq per up to 4096 words), and the mean of\n" +
			"--round-trips reads of PMC_BOOT_0 timed before the workloads. Each result's counters\n" +
			"hold the same per run (guest_barN_reads, guest_barN_writes, guest_barN_fills,\n" +
			"guest_fill_words, guest_access_ns, guest_access_mean_ns): the guest's own counts, not\n" +
			"the aggregator's (the guest has no connection to it; `gpuvm vgpu stats` in dom0\n" +
			"shows those).\n\n" +
			"Workloads: " + workloadHelp() + "\n\n" +
			"Exit status: 0 all verified, 1 a run failed or did not verify, 2 usage error.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "mode", Value: string(config.ModeFVOptimized), Usage: "the virtualization mode the daemon serves this domain in ([[vm]] mode): " + strings.Join(guestModes(), ", ") + "; it decides whether the driver makes hypercalls (pv-naive one per update, pv-multicall batched); the pvdrm modes run the pvdrm front end over Xen's grants and event channels instead of a driver on BARs"},
			&cli.StringFlag{Name: "pci", Usage: "the vGPU's PCI address, domain:bus:device.function (default: find the one function with its id)"},
			&cli.PathFlag{Name: "sysfs", Value: xenguest.DefaultSysfsRoot, Usage: "the directory of PCI functions to look in"},
			&cli.BoolFlag{Name: "enable", Usage: "write 1 to the function's sysfs enable file before mapping (normally the kernel has enabled it)"},
			&cli.StringFlag{Name: "bars", Usage: "BAR0ADDR,BAR1ADDR,BAR3ADDR[,IOPORT]: map the BARs from --dev-mem at these guest-physical addresses instead of sysfs (a PVH guest), with the vGPU's sizes (32MiB, 128MiB, 64MiB), and BAR5 at the I/O port (needed by the pv- modes)"},
			&cli.StringFlag{Name: "bar1-size", Value: part.BAR1PerVM.String(), Usage: "the usable part of BAR1: the domain's slice, the daemon's [partition] bar1_per_vm"},
			&cli.StringFlag{Name: "bar3-size", Value: part.BAR3PerVM.String(), Usage: "the usable part of BAR3: the daemon's [partition] bar3_per_vm"},
			&cli.StringFlag{Name: "dma", Usage: "BASE:SIZE, the guest-physical range reserved with memmap=SIZE$BASE for DMA memory, e.g. 0x10000000:64MiB (required)"},
			&cli.PathFlag{Name: "dev-mem", Value: xenguest.DefaultDevMem, Usage: "the physical-memory device the DMA range (and --bars) are mapped from"},
			&cli.PathFlag{Name: "iomem", Value: xenguest.DefaultIOMem, Usage: "the kernel's resource map the DMA range is checked against (not checked if unreadable)"},
			&cli.StringFlag{Name: "workloads", Aliases: []string{"w"}, Value: "nop", Usage: "comma-separated workloads, or all"},
			&cli.IntFlag{Name: "runs", Aliases: []string{"n"}, Value: 1, Usage: "measured runs per workload (after one warm-up run)"},
			&cli.BoolFlag{Name: "json", Usage: "print the results as a JSON list"},
			&cli.IntFlag{Name: "matrix-dim", Value: 1024, Usage: "n of the n×n matrices"},
			&cli.Uint64Flag{Name: "loop-iterations", Value: 1 << 24, Usage: "iterations of the loop kernel"},
			&cli.StringFlag{Name: "copy-size", Value: "64MiB", Usage: "bytes moved each way by cpy and pincpy"},
			&cli.IntFlag{Name: "rodinia-scale", Value: 1, Usage: "divide the linear input sizes of bp, hs, lud, nn, srad and srad2 by this (1: Rodinia's sizes)"},
			&cli.IntFlag{Name: "round-trips", Value: guestRoundTrips, Usage: "PMC_BOOT_0 reads timed before the workloads (0: none)"},
			&cli.BoolFlag{Name: "no-fill", Usage: "clear objects word by word, one trap per word, instead of one REP STOSL per up to 4096 words"},
			&cli.StringFlag{Name: "gart-size", Value: "32MiB", Usage: "pvdrm modes: the GART heap granted to dom0 (the guest's gntalloc must allow that many pages: its module parameter limit, 1024 by default)"},
			&cli.UintFlag{Name: "devid", Usage: "pvdrm modes: the pvdrm device's id in xenstore"},
			&cli.StringFlag{Name: "attack", Usage: "pvdrm modes, an isolation test: act as a hostile front end (" + strings.Join(pvdrmAttackNames(), ", ") + ") and exit 0 only if the back end refuses it"},
			&cli.PathFlag{Name: "xen-dir", Value: "/dev/xen", Usage: "pvdrm modes: where gntalloc and evtchn are"},
			&cli.DurationFlag{Name: "connect-timeout", Value: time.Minute, Usage: "pvdrm modes: how long to wait for the back end (gpuvm serve --xen in dom0)"},
			&cli.DurationFlag{Name: "resume-timeout", Value: defaultResumeTimeout, Usage: "pvdrm modes: when the vGPU is saved (gpuvm xl save, gpuvm vgpu save), let go of the event channel and wait this long for the back end that restores it, here or in the domain xl restore makes, then go on where the save left off (requests wait meanwhile; docs/pvdrm.md §8, A device across a save). 0: a save ends the front end"},
		},
		Action: runGuest,
	}
}

// guestModes are the modes a guest driver can run in: those with GPU
// registers.
func guestModes() []string {
	var out []string
	for _, m := range config.Modes() {
		out = append(out, string(m))
	}
	return out
}

// guestFlags are the command's flags, parsed and checked before any device
// is touched.
type guestFlags struct {
	mode       string
	pv         nouveau.PVMode
	pci        string
	bars       []xenguest.BAR // from --bars; nil: sysfs
	bar1, bar3 uint64         // usable aperture sizes
	dmaBase    uint64
	dmaSize    uint64
	work       []workloads.Workload
	runs       int
	roundTrips int
	gartSize   uint64 // pvdrm modes: the GART heap granted to dom0
}

func parseGuestFlags(c *cli.Context) (*guestFlags, error) {
	f := &guestFlags{mode: c.String("mode"), runs: c.Int("runs"), roundTrips: c.Int("round-trips")}
	pvdrmMode := config.Mode(f.mode).IsPVDRM()
	if !config.Mode(f.mode).Valid() {
		return nil, usageError("--mode %q: want one of %s", f.mode, strings.Join(guestModes(), ", "))
	}
	f.pv = bench.DriverPVMode(f.mode)
	names, err := workloads.Parse(c.String("workloads"))
	if err != nil {
		return nil, usageError("--workloads: %v", err)
	}
	if f.runs < 1 {
		return nil, usageError("--runs %d: want at least 1", f.runs)
	}
	if f.roundTrips < 0 {
		return nil, usageError("--round-trips %d: want 0 or more", f.roundTrips)
	}
	copySize, err := parseSize(c.String("copy-size"))
	if err != nil {
		return nil, usageError("--copy-size: %v", err)
	}
	params := workloads.Params{MatrixDim: c.Int("matrix-dim"), LoopIterations: c.Uint64("loop-iterations"), CopyBytes: copySize, RodiniaScale: c.Int("rodinia-scale")}
	for _, name := range names {
		w, err := workloads.New(name, params)
		if err != nil {
			return nil, usageError("%v", err)
		}
		f.work = append(f.work, w)
	}
	if c.IsSet("attack") && !pvdrmMode {
		return nil, usageError("--attack: the attacks are on the pvdrm back end; give --mode pvdrm or pvdrm-pooling")
	}
	if pvdrmMode {
		for _, name := range []string{"dma", "bars", "pci", "enable", "no-fill"} {
			if c.IsSet(name) {
				return nil, usageError("--%s: the pvdrm modes give the guest no GPU registers or DMA range (its front end sends DRM operations over a ring)", name)
			}
		}
		if f.gartSize, err = parseSize(c.String("gart-size")); err != nil {
			return nil, usageError("--gart-size: %v", err)
		}
		if f.gartSize == 0 || f.gartSize%4096 != 0 || f.gartSize/4096 > pvdrm.MaxXenGARTPages {
			return nil, usageError("--gart-size %s: want whole pages, at most %d MiB", c.String("gart-size"), pvdrm.MaxXenGARTPages*4096>>20)
		}
		return f, nil
	}
	if !c.IsSet("dma") {
		return nil, usageError("--dma BASE:SIZE is required: the guest-physical range reserved for DMA with memmap=SIZE$BASE on the guest kernel's command line")
	}
	if f.dmaBase, f.dmaSize, err = parseDMA(c.String("dma")); err != nil {
		return nil, usageError("--dma %q: %v", c.String("dma"), err)
	}
	if f.bar1, err = parseAperture(c, "bar1-size", nvc0.BAR1Size); err != nil {
		return nil, err
	}
	if f.bar3, err = parseAperture(c, "bar3-size", nvc0.BAR3Size); err != nil {
		return nil, err
	}
	if c.IsSet("pci") {
		if f.pci, err = xenguest.ParseSBDF(c.String("pci")); err != nil {
			return nil, usageError("--pci: %v", err)
		}
	}
	if c.IsSet("bars") {
		if c.IsSet("pci") {
			return nil, usageError("--bars and --pci: give one (--bars maps the BARs from %s, --pci from sysfs)", c.Path("dev-mem"))
		}
		if f.bars, err = parseBARs(c.String("bars"), f.bar1, f.bar3); err != nil {
			return nil, usageError("--bars %q: %v", c.String("bars"), err)
		}
		if f.pv != nouveau.PVOff && len(f.bars) < 4 {
			return nil, usageError("--bars %q: --mode %s makes hypercalls through BAR5: add its I/O port (BAR0,BAR1,BAR3,IOPORT)", c.String("bars"), f.mode)
		}
		if f.pv == nouveau.PVOff {
			f.bars = f.bars[:3] // full virtualization: BAR5 unused
		}
		for _, b := range f.bars {
			if !b.IO && overlaps(b.Base, b.Size, f.dmaBase, f.dmaSize) {
				return nil, usageError("--dma %q overlaps BAR%d at %#x", c.String("dma"), b.Index, b.Base)
			}
		}
	}
	return f, nil
}

// parseDMA parses BASE:SIZE: BASE a number (0x for hex), SIZE a number or a
// size with a unit (64MiB).
func parseDMA(s string) (base, size uint64, err error) {
	b, sz, ok := strings.Cut(s, ":")
	if !ok {
		return 0, 0, errors.New("want BASE:SIZE, e.g. 0x10000000:64MiB")
	}
	if base, err = strconv.ParseUint(strings.TrimSpace(b), 0, 64); err != nil {
		return 0, 0, fmt.Errorf("base %q is not a number", b)
	}
	if size, err = parseNumberOrSize(sz); err != nil {
		return 0, 0, err
	}
	return base, size, xenguest.CheckRange(base, size)
}

// parseNumberOrSize accepts 0x-prefixed and plain numbers of bytes and
// sizes with a unit.
func parseNumberOrSize(s string) (uint64, error) {
	s = strings.TrimSpace(s)
	if n, err := strconv.ParseUint(s, 0, 64); err == nil {
		return n, nil
	}
	return parseSize(s)
}

// parseAperture reads a usable aperture size: a page multiple, no larger
// than the BAR.
func parseAperture(c *cli.Context, name string, barSize uint64) (uint64, error) {
	n, err := parseNumberOrSize(c.String(name))
	if err != nil {
		return 0, usageError("--%s: %v", name, err)
	}
	if n == 0 || n%nvc0.PageSize != 0 || n > barSize {
		return 0, usageError("--%s %s: want a positive multiple of 4KiB up to the BAR's %dMiB", name, c.String(name), barSize>>20)
	}
	return n, nil
}

// parseBARs parses --bars: the three memory BARs' addresses and optionally
// BAR5's I/O port. BAR1 and BAR3 are mapped as far as their usable
// apertures, bar1 and bar3 bytes: all the device model placed for them.
func parseBARs(s string, bar1, bar3 uint64) ([]xenguest.BAR, error) {
	parts := strings.Split(s, ",")
	if len(parts) != 3 && len(parts) != 4 {
		return nil, errors.New("want BAR0ADDR,BAR1ADDR,BAR3ADDR[,IOPORT]")
	}
	idx := []int{nvc0.BAR0, nvc0.BAR1, nvc0.BAR3, nvc0.BAR5}
	var bars []xenguest.BAR
	for i, p := range parts {
		n, err := strconv.ParseUint(strings.TrimSpace(p), 0, 64)
		if err != nil {
			return nil, fmt.Errorf("BAR%d address %q is not a number", idx[i], p)
		}
		b := xenguest.BAR{Index: idx[i], Base: n, Size: nvc0.BARSize(idx[i]), IO: idx[i] == nvc0.BAR5}
		switch b.Index {
		case nvc0.BAR1:
			b.Size = bar1
		case nvc0.BAR3:
			b.Size = bar3
		}
		switch {
		case b.IO && n+b.Size > 1<<16:
			return nil, fmt.Errorf("BAR5 port %#x: the I/O BAR's 128 ports must fit below 0x10000", n)
		case !b.IO && (n%nvc0.PageSize != 0 || n+b.Size < n):
			return nil, fmt.Errorf("BAR%d address %#x is not page aligned", b.Index, n)
		}
		bars = append(bars, b)
	}
	for i, a := range bars[:3] {
		for _, b := range bars[i+1 : 3] {
			if overlaps(a.Base, a.Size, b.Base, b.Size) {
				return nil, fmt.Errorf("BAR%d and BAR%d overlap", a.Index, b.Index)
			}
		}
	}
	return bars, nil
}

func overlaps(a, an, b, bn uint64) bool { return a < b+bn && b < a+an }

func runGuest(c *cli.Context) (err error) {
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	f, err := parseGuestFlags(c)
	if err != nil {
		return err
	}
	if config.Mode(f.mode).IsPVDRM() {
		if c.IsSet("attack") {
			return runGuestAttack(c, f, c.String("attack"))
		}
		return runGuestPVDRM(c, f)
	}
	bars, err := openGuestBARs(c, f)
	if err != nil {
		return &exitError{code: exitFailure, err: err}
	}
	defer func() { err = errors.Join(err, bars.Close()) }()
	dma, err := xenguest.OpenDMA(xenguest.DMAConfig{Base: f.dmaBase, Size: f.dmaSize, DevMem: c.Path("dev-mem"), IOMem: c.Path("iomem"), Logger: log})
	if err != nil {
		return &exitError{code: exitFailure, err: err}
	}
	defer func() { err = errors.Join(err, dma.Close()) }()
	return guestRun(c, f, bars, dma, log)
}

// guestBARs is what guestRun needs of the BARs: access, the counts and
// the sticky error (*xenguest.BARs).
type guestBARs interface {
	gpu.MMIO
	Stats() xenguest.Stats
	Err() error
}

// guestRun opens the driver on the BARs and DMA memory, runs the workloads
// and reports: the part of the command after the devices are open.
func guestRun(c *cli.Context, f *guestFlags, bars guestBARs, dma nouveau.HostMemory, log *slog.Logger) (err error) {
	start := bars.Stats()
	rtt := time.Duration(0)
	var results []bench.Result
	defer func() { writeTrapSummary(c.App.ErrWriter, bars.Stats().Sub(start), rtt, f.roundTrips, results) }()

	var mmio gpu.MMIO = bars
	if c.Bool("no-fill") {
		mmio = struct{ gpu.MMIO }{bars} // hides Fill32 from the driver
	}
	drv, err := nouveau.Open(mmio, dma, nouveau.Options{BAR1Size: f.bar1, BAR3Size: f.bar3, PV: f.pv, Logger: log})
	if err != nil {
		if berr := bars.Err(); berr != nil {
			err = fmt.Errorf("%w (BARs: %v)", err, berr)
		}
		return &exitError{code: exitFailure, err: fmt.Errorf("guest driver: %w", err)}
	}
	defer func() { err = errors.Join(err, drv.Close()) }()
	rtt = timeRoundTrip(bars, f.roundTrips)

	progress := newProgress(c.App.ErrWriter)
	counters := func() map[string]uint64 {
		c := bars.Stats().Counters()
		if f.pv != nouveau.PVOff {
			c["hypercalls"] = drv.Hypercalls() // the guest's own count (GPUvm Table 4.1)
		}
		return c
	}
	rep := bench.Report{Warmup: 1, Board: bench.BoardInfo{Name: "virtual GPU", Kind: "in a Xen guest, " + f.mode,
		VRAMBytes: drv.VRAMSize(), Timing: "real (every register access a Xen trap)"}}
	for _, w := range f.work {
		res := bench.RunWorkload(c.Context, f.mode, gdev.Nouveau(drv), w, f.runs, counters, progress.update)
		if n, ok := res.Counters["guest_access_ns"].(uint64); ok {
			if acc := guestAccesses(res.Counters); acc > 0 {
				res.Counters["guest_access_mean_ns"] = n / acc
			}
		}
		if res.Error != "" && bars.Err() != nil {
			res.Error += fmt.Sprintf(" (BARs: %v)", bars.Err())
		}
		rep.Results = append(rep.Results, res)
		results = rep.Results
	}
	progress.done()
	return writeGuestReport(c, rep)
}

// writeGuestReport prints the results (a table, or JSON with --json) and
// fails unless every one verified.
func writeGuestReport(c *cli.Context, rep bench.Report) error {
	if c.Bool("json") {
		list := rep.Results
		if list == nil {
			list = []bench.Result{}
		}
		if err := writeJSONList(c, list); err != nil {
			return err
		}
	} else if err := bench.WriteTable(c.App.Writer, rep); err != nil {
		return err
	}
	for _, r := range rep.Results {
		if !r.Verified {
			return &exitError{code: exitFailure, err: firstFailure(rep.Results)}
		}
	}
	return nil
}

// openGuestBARs maps the vGPU's BARs: from --dev-mem at --bars, or from
// the sysfs function (--pci, or discovered).
func openGuestBARs(c *cli.Context, f *guestFlags) (*xenguest.BARs, error) {
	if f.bars != nil {
		return xenguest.OpenBARs(f.bars, xenguest.MapOptions{DevMem: c.Path("dev-mem")})
	}
	var (
		dev *xenguest.Device
		err error
	)
	if f.pci != "" {
		dev, err = xenguest.Lookup(c.Path("sysfs"), f.pci)
	} else {
		dev, err = xenguest.Discover(c.Path("sysfs"))
	}
	if err != nil {
		return nil, err
	}
	if c.Bool("enable") {
		if err := dev.Enable(); err != nil {
			return nil, err
		}
	}
	ports := f.pv != nouveau.PVOff
	if _, ok := dev.BAR(nvc0.BAR5); ports && !ok {
		return nil, fmt.Errorf("%s has no BAR5, which --mode %s needs for its hypercalls", dev.SBDF, f.mode)
	}
	for _, b := range dev.BARs {
		if !b.IO && overlaps(b.Base, b.Size, f.dmaBase, f.dmaSize) {
			return nil, fmt.Errorf("the DMA range %#x+%#x overlaps %v of %s", f.dmaBase, f.dmaSize, b, dev.SBDF)
		}
	}
	return xenguest.OpenDevice(dev, ports)
}

// timeRoundTrip times n reads of PMC_BOOT_0, a register the device model
// answers without touching the GPU's engines: the mean is the trap's
// round trip with the least work behind it.
func timeRoundTrip(bars guestBARs, n int) time.Duration {
	if n == 0 {
		return 0
	}
	before := bars.Stats()
	for range n {
		bars.Read32(nvc0.BAR0, nvc0.RegBoot0)
	}
	return bars.Stats().Sub(before).MeanRead()
}

// guestAccesses sums a result's guest_barN_reads and guest_barN_writes
// (the single accesses; fills apart).
func guestAccesses(counters map[string]any) uint64 {
	var n uint64
	for k, v := range counters {
		if strings.HasPrefix(k, "guest_bar") && (strings.HasSuffix(k, "_reads") || strings.HasSuffix(k, "_writes")) {
			if x, ok := v.(uint64); ok {
				n += x
			}
		}
	}
	return n
}

// writeTrapSummary prints the guest's BAR accesses and their mean time:
// per measured run of each workload, and in all (driver start and close,
// warm-up runs and the round-trip probe included).
func writeTrapSummary(w io.Writer, s xenguest.Stats, rtt time.Duration, roundTrips int, results []bench.Result) {
	for _, r := range results {
		n := guestAccesses(r.Counters)
		if !r.Verified || n == 0 {
			continue
		}
		mean, _ := r.Counters["guest_access_mean_ns"].(uint64)
		fmt.Fprintf(w, "guest: %s %s: %d BAR accesses per run, mean %s", r.Mode, r.Workload, n, bench.FormatDuration(int64(mean)))
		if words, _ := r.Counters["guest_fill_words"].(uint64); words > 0 {
			fmt.Fprintf(w, "; %d words stored by fills", words)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "guest: %d BAR accesses (each traps to Xen unless its page is passed through):", s.Accesses())
	for _, bar := range []int{nvc0.BAR0, nvc0.BAR1, nvc0.BAR3, nvc0.BAR5} {
		fmt.Fprintf(w, " BAR%d %d/%d", bar, s.Reads[bar], s.Writes[bar])
	}
	fmt.Fprintln(w, " reads/writes")
	if s.Accesses() > 0 {
		fmt.Fprintf(w, "guest: mean %s per access (reads %s, writes %s), %s in all\n",
			bench.FormatDuration(int64(s.Mean())), bench.FormatDuration(int64(s.MeanRead())), bench.FormatDuration(int64(s.MeanWrite())),
			bench.FormatDuration(int64(s.Time())))
	}
	if s.TotalFills() > 0 {
		fmt.Fprintf(w, "guest: %d fills (one REP STOSL each, one trap per up to 4096 words) stored %d words:", s.TotalFills(), s.TotalFillWords())
		for _, bar := range []int{nvc0.BAR0, nvc0.BAR1, nvc0.BAR3} {
			fmt.Fprintf(w, " BAR%d %d", bar, s.Fills[bar])
		}
		fmt.Fprintf(w, "; mean %s per fill\n", bench.FormatDuration(int64(s.FillTime())/int64(s.TotalFills())))
	}
	if rtt > 0 {
		fmt.Fprintf(w, "guest: PMC_BOOT_0 read round trip %s (mean of %d)\n", bench.FormatDuration(int64(rtt)), roundTrips)
	}
	if s.Accesses() > 0 {
		fmt.Fprintf(w, "guest: timing adds about %s to each (two clock reads, measured empty)\n", bench.FormatDuration(int64(xenguest.ClockOverhead(1000))))
	}
	if s.BadAccesses > 0 {
		fmt.Fprintf(w, "guest: %d accesses refused (outside a BAR, unaligned or to an unmapped BAR)\n", s.BadAccesses)
	}
}
