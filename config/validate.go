package config

import (
	"fmt"
	"math/bits"
	"strconv"
	"strings"
)

// Limits checked by Validate. The channel, partition and aperture limits are
// those of the reference Fermi board (gpu/nvc0: MaxChannels,
// MaxMemPartitions, BAR1Size, BAR3Size).
const (
	MaxChannels      = 128       // board.channels upper bound
	MaxMemPartitions = 16        // board.mem_partitions upper bound
	MinVRAM          = 64 * MiB  // smallest simulated board.vram
	MaxVRAM          = 64 * GiB  // largest simulated board.vram
	MaxVMs           = 64        // daemon.max_vms upper bound
	MaxWeight        = 10000     // scheduler weight upper bound ([[vm]], [[profile]], xl, toolstacks)
	BAR1Aperture     = 128 * MiB // BAR1 size, shared out by partition.bar1_per_vm
	// BAR1PollReserve is the part of BAR1 the aggregator keeps for the
	// physical poll area (one 4KiB doorbell page per board channel).
	BAR1PollReserve = MaxChannels * 4 * KiB
	BAR3Aperture    = 64 * MiB // BAR3 size, shared out by partition.bar3_per_vm
	// MaxDomID is the largest Xen domain id a guest can have
	// (DOMID_FIRST_RESERVED - 1).
	MaxDomID = 0x7FEF
	// maxSocketPath is the longest Unix socket path (sun_path less its NUL).
	maxSocketPath = 107
)

// Validate checks every value and the consistency between them, and returns
// an ErrorList with every problem, or nil. For a Config returned by Parse or
// Load each problem carries the file position of the value concerned; values
// that were not written in the file are reported without a line.
//
// Beyond the per-key ranges documented in examples/gpuvm.toml it checks that
// the partitioning fits the board: max_vms × vram_per_vm + reserved ≤ board
// vram (sim only: a PCI board's VRAM is known only once it is opened),
// max_vms × channels_per_vm ≤ board channels, max_vms × bar1_per_vm ≤ the
// 128MiB BAR1 aperture less the aggregator's 512KiB poll area and max_vms × bar3_per_vm ≤ the 64MiB BAR3 aperture;
// that each [[vm]] has a name or a domid, stays within its partition, and
// that no two [[vm]] entries share a name or a domid.
func (c Config) Validate() error { return c.validate(nil) }

// validator collects problems; skip holds keys that failed to decode, whose
// values (left at their defaults) are not checked.
type validator struct {
	src  *source
	skip map[string]bool
	errs ErrorList
}

// ok reports whether all of keys decoded.
func (v *validator) ok(keys ...string) bool {
	for _, k := range keys {
		if v.skip[k] {
			return false
		}
	}
	return true
}

// errorf reports a problem about keys, placed at the first of them that was
// written in the file (or at the first one, without a line, if none was).
func (v *validator) errorf(keys []string, format string, args ...any) {
	key := keys[0]
	for _, k := range keys {
		if v.src.written(k) {
			key = k
			break
		}
	}
	v.errs = append(v.errs, v.src.newError(key, false, nil, format, args...))
}

// intRange checks lo ≤ n ≤ hi.
func (v *validator) intRange(key string, n, lo, hi int) bool {
	if !v.ok(key) {
		return false
	}
	if n < lo || n > hi {
		v.errorf([]string{key}, "%d is out of range %d..%d", n, lo, hi)
		return false
	}
	return true
}

// sizeMultiple checks that s is a non-zero multiple of unit.
func (v *validator) sizeMultiple(key string, s, unit Size) bool {
	if !v.ok(key) {
		return false
	}
	switch {
	case s == 0:
		v.errorf([]string{key}, "must be at least %s", unit)
	case s%unit != 0:
		v.errorf([]string{key}, "%d bytes is not a multiple of %s", uint64(s), unit)
	default:
		return true
	}
	return false
}

// product returns n × s and whether it fits in 64 bits.
func product(n int, s Size) (Size, bool) {
	hi, lo := bits.Mul64(uint64(n), uint64(s))
	return Size(lo), hi == 0
}

func (c Config) validate(skip map[string]bool) error {
	v := &validator{src: c.src, skip: skip}
	c.validateBoard(v)
	c.validateBoards(v)
	c.validateVMBoards(v)
	c.validateDaemon(v)
	c.validateBalance(v)
	c.validateOvercommit(v)
	c.validatePartition(v)
	c.validateScheduler(v)
	c.validateMetrics(v)
	c.validateVMs(v)
	c.validateProfiles(v)
	c.validateSLO(v)
	return v.errs.err()
}

func (c Config) validateBoard(v *validator) {
	b := c.Board
	if v.ok("board.kind") && !b.Kind.Valid() {
		v.errorf([]string{"board.kind"}, "unknown board kind %q (want sim or pci)", b.Kind)
	}
	if v.ok("board.pci_address") {
		switch {
		case b.Kind == BoardPCI && b.PCIAddress == "":
			v.errorf([]string{"board.pci_address", "board.kind"}, `pci_address is required when kind = "pci"`)
		case b.Kind != BoardPCI && b.PCIAddress != "":
			v.errorf([]string{"board.pci_address"}, `only used when kind = "pci" (kind is %q)`, b.Kind)
		case b.PCIAddress != "" && !validPCIAddress(b.PCIAddress):
			v.errorf([]string{"board.pci_address"}, "%q is not a PCI address (want domain:bus:device.function, e.g. 0000:01:00.0)", b.PCIAddress)
		}
	}
	partsOK := v.intRange("board.mem_partitions", b.MemPartitions, 1, MaxMemPartitions)
	v.intRange("board.channels", b.Channels, 1, MaxChannels)
	if v.ok("board.timing") && !b.Timing.Valid() {
		v.errorf([]string{"board.timing"}, "unknown timing model %q (want none, fermi, fermi-xen, fermi-small or fermi-x4)", b.Timing)
	}
	if b.Kind == BoardPCI {
		if v.src.written("board.vram") {
			v.errorf([]string{"board.vram"}, `only used when kind = "sim" (a PCI board reports its own VRAM size)`)
		}
		return
	}
	if !v.ok("board.vram") {
		return
	}
	switch {
	case b.VRAM < MinVRAM:
		v.errorf([]string{"board.vram"}, "%s is below the minimum %s", b.VRAM, MinVRAM)
	case b.VRAM > MaxVRAM:
		v.errorf([]string{"board.vram"}, "%s is above the maximum %s", b.VRAM, MaxVRAM)
	case partsOK && b.VRAM%(Size(b.MemPartitions)*MiB) != 0:
		v.errorf([]string{"board.vram", "board.mem_partitions"},
			"vram %s is not a multiple of mem_partitions (%d) × 1MiB = %s", b.VRAM, b.MemPartitions, Size(b.MemPartitions)*MiB)
	}
}

// validPCIAddress checks the sysfs form DDDD:BB:DD.F.
func validPCIAddress(s string) bool {
	dom, rest, ok1 := strings.Cut(s, ":")
	bus, rest, ok2 := strings.Cut(rest, ":")
	dev, fn, ok3 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || !ok3 || len(dom) != 4 || len(bus) != 2 || len(dev) != 2 || len(fn) != 1 {
		return false
	}
	hex := func(s string, max uint64) bool {
		n, err := strconv.ParseUint(s, 16, 32)
		return err == nil && n <= max
	}
	return hex(dom, 0xffff) && hex(bus, 0xff) && hex(dev, 0x1f) && hex(fn, 7)
}

func (c Config) validateDaemon(v *validator) {
	d := c.Daemon
	for _, s := range []struct{ key, path string }{
		{"daemon.socket", d.Socket},
		{"daemon.control_socket", d.ControlSocket},
	} {
		switch {
		case !v.ok(s.key):
		case s.path == "":
			v.errorf([]string{s.key}, "must not be empty")
		case len(s.path) > maxSocketPath:
			v.errorf([]string{s.key}, "%d bytes long; a Unix socket path has at most %d", len(s.path), maxSocketPath)
		}
	}
	if v.ok("daemon.socket", "daemon.control_socket") && d.Socket != "" && d.Socket == d.ControlSocket {
		v.errorf([]string{"daemon.control_socket", "daemon.socket"}, "control_socket and socket are the same path %q", d.Socket)
	}
	v.intRange("daemon.max_vms", d.MaxVMs, 1, MaxVMs)
	if v.ok("daemon.placement") && d.Placement != "spread" && d.Placement != "pack" {
		v.errorf([]string{"daemon.placement"}, "unknown placement %q (want spread or pack)", d.Placement)
	}
	if v.ok("daemon.log_level") && !d.LogLevel.Valid() {
		v.errorf([]string{"daemon.log_level"}, "unknown log level %q (want debug, info, warn or error)", d.LogLevel)
	}
}

func (c Config) validatePartition(v *validator) {
	p, b, maxVMs := c.Partition, c.Board, c.Daemon.MaxVMs
	vmsOK := v.ok("daemon.max_vms") && maxVMs >= 1 && maxVMs <= MaxVMs
	vramOK := v.sizeMultiple("partition.vram_per_vm", p.VRAMPerVM, MiB)
	bar1OK := v.sizeMultiple("partition.bar1_per_vm", p.BAR1PerVM, 4*KiB)
	bar3OK := v.sizeMultiple("partition.bar3_per_vm", p.BAR3PerVM, 4*KiB)
	resOK := v.sizeMultiple("partition.reserved", p.Reserved, MiB)
	chOK := v.ok("partition.channels_per_vm")
	if chOK && p.ChannelsPerVM < 1 {
		v.errorf([]string{"partition.channels_per_vm"}, "must be at least 1")
		chOK = false
	}

	boardVRAMOK := b.Kind == BoardSim && v.ok("board.vram", "board.kind") && b.VRAM >= MinVRAM && b.VRAM <= MaxVRAM
	if vmsOK && vramOK && resOK && boardVRAMOK {
		total, fits := product(maxVMs, p.VRAMPerVM)
		total += p.Reserved
		if !fits || total < p.Reserved || total > b.VRAM {
			v.errorf([]string{"partition.vram_per_vm", "daemon.max_vms", "partition.reserved", "board.vram"},
				"max_vms (%d) × vram_per_vm (%s) + reserved (%s) = %s exceeds the board's vram (%s)",
				maxVMs, p.VRAMPerVM, p.Reserved, sizeOrOverflow(total, fits && total >= p.Reserved), b.VRAM)
		}
	}
	if chOK && vmsOK && v.ok("board.channels") && b.Channels >= 1 && b.Channels <= MaxChannels {
		if p.ChannelsPerVM > b.Channels || p.ChannelsPerVM*maxVMs > b.Channels {
			v.errorf([]string{"partition.channels_per_vm", "daemon.max_vms", "board.channels"},
				"max_vms (%d) × channels_per_vm (%d) exceeds the board's %d channels",
				maxVMs, p.ChannelsPerVM, b.Channels)
		}
	}
	for _, bar := range []struct {
		key, name string
		ok        bool
		per, size Size
		note      string
	}{
		{"partition.bar1_per_vm", "bar1_per_vm", bar1OK, p.BAR1PerVM, BAR1Aperture - BAR1PollReserve, "128MiB BAR1 aperture less the aggregator's 512KiB poll area"},
		{"partition.bar3_per_vm", "bar3_per_vm", bar3OK, p.BAR3PerVM, BAR3Aperture, "64MiB BAR3 aperture"},
	} {
		if !bar.ok || !vmsOK {
			continue
		}
		if total, fits := product(maxVMs, bar.per); !fits || total > bar.size {
			v.errorf([]string{bar.key, "daemon.max_vms"},
				"max_vms (%d) × %s (%s) = %s exceeds the %s",
				maxVMs, bar.name, bar.per, sizeOrOverflow(total, fits), bar.note)
		}
	}
}

func sizeOrOverflow(s Size, fits bool) string {
	if !fits {
		return "more than 2^64 bytes"
	}
	return s.String()
}

func (c Config) validateScheduler(v *validator) {
	s := c.Scheduler
	if v.ok("scheduler.policy") && !s.Policy.Valid() {
		v.errorf([]string{"scheduler.policy"}, "unknown policy %q (want one of %s)", s.Policy, strings.Join(PolicyNames(), ", "))
	}
	if v.ok("scheduler.doorbell") && !s.Doorbell.Valid() {
		v.errorf([]string{"scheduler.doorbell"}, "unknown doorbell mode %q (want one of %s)", s.Doorbell, strings.Join(names(Doorbells()), ", "))
	}
	for _, d := range []struct {
		key    string
		d      Duration
		zeroOK bool
	}{
		{"scheduler.period", s.Period, false},
		{"scheduler.doorbell_poll", s.DoorbellPoll, false},
		{"scheduler.band_wait", s.BandWait, true},
		{"scheduler.band_poll", s.BandPoll, false},
		{"scheduler.timeslice", s.Timeslice, false},
		{"scheduler.watchdog", s.Watchdog, true},
		{"scheduler.poll", s.Poll, false},
		{"scheduler.sample_time", s.SampleTime, false},
	} {
		switch {
		case !v.ok(d.key):
		case d.d.Duration < 0:
			v.errorf([]string{d.key}, "%s is negative", d.d)
		case d.d.Duration == 0 && !d.zeroOK:
			v.errorf([]string{d.key}, "must be longer than 0")
		}
	}
	for _, n := range []struct {
		key       string
		v, lo, hi int
	}{{"scheduler.sample_requests", s.SampleRequests, 1, 1 << 20}, {"scheduler.free_run_factor", s.FreeRunFactor, 1, 1000}} {
		if v.ok(n.key) && (n.v < n.lo || n.v > n.hi) {
			v.errorf([]string{n.key}, "%d is outside %d..%d", n.v, n.lo, n.hi)
		}
	}
	if v.ok("scheduler.band_wait", "scheduler.band_poll") && s.BandWait.Duration > 0 && s.BandPoll.Duration > s.BandWait.Duration {
		v.errorf([]string{"scheduler.band_poll", "scheduler.band_wait"},
			"band_poll (%s) is longer than band_wait (%s)", s.BandPoll, s.BandWait)
	}
}

func (c Config) validateVMs(v *validator) {
	p := c.Partition
	names := map[string]int{}
	domids := map[int]int{}
	for i, vm := range c.VMs {
		k := indexKey("vm", i)
		if !v.ok(k) {
			continue
		}
		key := func(name string) string { return joinKey(k, name) }
		nameOK, domOK := v.ok(key("name")), v.ok(key("domid"))
		switch {
		case !nameOK || !domOK:
		case vm.Name == "" && v.src.written(key("name")):
			v.errorf([]string{key("name")}, "must not be empty (leave it out to match by domid only)")
		case vm.Name == "" && vm.DomID == 0 && !v.src.written(key("domid")):
			v.errorf([]string{k}, "needs a name or a domid to match a VM")
		}
		if domOK && (vm.DomID != 0 || v.src.written(key("domid"))) {
			switch {
			case vm.DomID == 0:
				v.errorf([]string{key("domid")}, "domid 0 is dom0, which cannot have a vGPU")
			case vm.DomID < 0 || vm.DomID > MaxDomID:
				v.errorf([]string{key("domid")}, "%d is out of range 1..%d", vm.DomID, MaxDomID)
			}
		}
		if v.ok(key("mode")) && !vm.Mode.Valid() {
			v.errorf([]string{key("mode")}, "%s", modeProblem(vm.Mode))
		}
		if v.ok(key("weight")) && vm.Weight < 1 {
			v.errorf([]string{key("weight")}, "%d is below 1", vm.Weight)
		} else if v.ok(key("weight")) && vm.Weight > MaxWeight {
			v.errorf([]string{key("weight")}, "%d is above %d", vm.Weight, MaxWeight)
		}
		if v.ok(key("vram")) && (vm.VRAM != 0 || v.src.written(key("vram"))) {
			if v.sizeMultiple(key("vram"), vm.VRAM, MiB) && v.ok("partition.vram_per_vm") && vm.VRAM > p.VRAMPerVM {
				v.errorf([]string{key("vram"), "partition.vram_per_vm"}, "%s exceeds partition vram_per_vm (%s)", vm.VRAM, p.VRAMPerVM)
			}
		}
		if v.ok(key("channels")) && (vm.Channels != 0 || v.src.written(key("channels"))) {
			switch {
			case vm.Channels < 1:
				v.errorf([]string{key("channels")}, "%d is below 1 (leave it out for the full channels_per_vm)", vm.Channels)
			case v.ok("partition.channels_per_vm") && vm.Channels > p.ChannelsPerVM:
				v.errorf([]string{key("channels"), "partition.channels_per_vm"}, "%d exceeds partition channels_per_vm (%d)", vm.Channels, p.ChannelsPerVM)
			}
		}
		for _, b := range []struct {
			name, perKey, perName string
			size, per             Size
		}{{"bar1", "partition.bar1_per_vm", "bar1_per_vm", vm.BAR1, p.BAR1PerVM}, {"bar3", "partition.bar3_per_vm", "bar3_per_vm", vm.BAR3, p.BAR3PerVM}} {
			if v.ok(key(b.name)) && b.size != 0 && // 0: the full slice
				v.sizeMultiple(key(b.name), b.size, 4*KiB) && v.ok(b.perKey) && b.size > b.per {
				v.errorf([]string{key(b.name), b.perKey}, "%s exceeds partition %s (%s)", b.size, b.perName, b.per)
			}
		}
		if v.ok(key("profile")) && vm.Profile == "" && v.src.written(key("profile")) {
			v.errorf([]string{key("profile")}, "must not be empty (leave it out for no profile)")
		}
		if nameOK && vm.Name != "" {
			if j, dup := names[vm.Name]; dup {
				v.errorf([]string{key("name")}, "duplicate name %q (also in %s%s)", vm.Name, indexKey("vm", j), v.lineOf(joinKey(indexKey("vm", j), "name")))
			} else {
				names[vm.Name] = i
			}
		}
		if domOK && vm.DomID != 0 {
			if j, dup := domids[vm.DomID]; dup {
				v.errorf([]string{key("domid")}, "duplicate domid %d (also in %s%s)", vm.DomID, indexKey("vm", j), v.lineOf(joinKey(indexKey("vm", j), "domid")))
			} else {
				domids[vm.DomID] = i
			}
		}
	}
}

// lineOf returns " at line N" for a key written in the file, else "".
func (v *validator) lineOf(key string) string {
	if v.src == nil {
		return ""
	}
	if p, ok := v.src.pos[key]; ok {
		return fmt.Sprintf(" at line %d", p.line)
	}
	return ""
}
