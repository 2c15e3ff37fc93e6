// Package config is the TOML configuration of the gpuvm aggregator: the board
// it owns, the daemon's sockets and limits, the static partitioning of the
// board among VMs, the scheduler, and optional per-VM settings.
//
// Parse and Load read a file, fill every missing key from Default, and check
// the result with Validate. Every problem — TOML syntax, unknown keys, type
// mismatches, out-of-range or inconsistent values — is reported, not just the
// first, each as an *Error located by "file:line:col"; together they form an
// ErrorList. Values that were not written in the file (defaults, or fields a
// program set) are reported without a line.
//
// examples/gpuvm.toml in the repository documents every key.
package config

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// Config is the whole configuration file.
type Config struct {
	// Board is the physical GPU the aggregator owns ([board]); with
	// [[boards]], the template every entry takes what it leaves out from.
	Board BoardConfig `toml:"board"`
	// Boards are the physical GPUs of a host with several ([[boards]]), in
	// file order (see AllBoards).
	Boards []BoardEntry `toml:"boards,omitempty"`
	// Daemon is the aggregator daemon's settings ([daemon]).
	Daemon DaemonConfig `toml:"daemon"`
	// Partition is the static partitioning of the board among VMs ([partition]).
	Partition PartitionConfig `toml:"partition"`
	// Scheduler selects and tunes the GPU time scheduler ([scheduler]).
	Scheduler SchedulerConfig `toml:"scheduler"`
	// Metrics is the Prometheus endpoint ([metrics]).
	Metrics MetricsConfig `toml:"metrics"`
	// VMs are optional per-VM settings ([[vm]]), in file order.
	VMs []VMConfig `toml:"vm,omitempty"`
	// Profiles are named vGPU sizes ([[profile]]), in file order, besides
	// the built-in ones (see AllProfiles).
	Profiles []ProfileConfig `toml:"profile,omitempty"`

	// src remembers where each key was written, for error positions. It is
	// nil for a Config that was not parsed from a file.
	src *source
}

// BoardKind says which physical GPU the aggregator drives.
type BoardKind string

// Board kinds.
const (
	// BoardSim is the simulated Fermi board embedded in the aggregator.
	BoardSim BoardKind = "sim"
	// BoardPCI is a real board reached through sysfs PCI resource files.
	BoardPCI BoardKind = "pci"
)

// Valid reports whether k is a known board kind.
func (k BoardKind) Valid() bool { return k == BoardSim || k == BoardPCI }

// Timing names a timing model of the simulated board.
type Timing string

// Timing models.
const (
	// TimingNone runs as fast as possible (tests).
	TimingNone Timing = "none"
	// TimingFermi models a Fermi-class board's latencies and throughput.
	TimingFermi Timing = "fermi"
	// TimingFermiXen is TimingFermi plus the hypervisor's share of each
	// trapped guest access on Xen (VM exit, ioreq delivery, resume).
	TimingFermiXen Timing = "fermi-xen"
	// TimingFermiSmall models a smaller board of the same family (the
	// Quadro 4000: half the compute, 0.62 of the memory bandwidth), for a
	// host whose boards differ in speed.
	TimingFermiSmall Timing = "fermi-small"
	// TimingFermiX4 models the fermi board in a PCIe 2.0 x4 slot (a
	// quarter of the bus bandwidth, 1.375 GB/s), as a host's second GPU
	// often is: slower for copy-heavy work only.
	TimingFermiX4 Timing = "fermi-x4"
)

// Valid reports whether t is a known timing model.
func (t Timing) Valid() bool {
	return t == TimingNone || t == TimingFermi || t == TimingFermiXen || t == TimingFermiSmall || t == TimingFermiX4
}

// LogLevel is the daemon's log verbosity.
type LogLevel string

// Log levels, most verbose first.
const (
	LogDebug LogLevel = "debug"
	LogInfo  LogLevel = "info"
	LogWarn  LogLevel = "warn"
	LogError LogLevel = "error"
)

// Valid reports whether l is a known log level.
func (l LogLevel) Valid() bool {
	return l == LogDebug || l == LogInfo || l == LogWarn || l == LogError
}

// Mode is how a VM reaches the GPU: one of the full- or para-virtualization
// modes this build serves (docs/design.md).
type Mode string

// Virtualization modes.
const (
	// ModeFVNaive is full virtualization, shadow page tables re-scanned on
	// every TLB flush.
	ModeFVNaive Mode = "fv-naive"
	// ModeFVBARRemap is naive full virtualization plus pass-through of
	// non-sensitive BAR pages.
	ModeFVBARRemap Mode = "fv-bar-remap"
	// ModeFVLazy is full virtualization with lazy shadowing (re-scan at
	// channel activation).
	ModeFVLazy Mode = "fv-lazy"
	// ModeFVOptimized is full virtualization with BAR remap and lazy
	// shadowing together.
	ModeFVOptimized Mode = "fv-optimized"
	// ModeFVIncremental is optimized full virtualization that re-scans only
	// page-table pages written since the last scan.
	ModeFVIncremental Mode = "fv-incremental"
	// ModePVNaive is para-virtualization (GPUvm thesis §4.1.3): the guest
	// driver builds its GPU page tables by hypercalls, one per update, into
	// tables the aggregator owns; BAR remap is on.
	ModePVNaive Mode = "pv-naive"
	// ModePVMulticall is ModePVNaive with the updates of one operation
	// batched into multicalls.
	ModePVMulticall Mode = "pv-multicall"
	// ModePVDRM is the para-virtual DRM split driver (GPUvm thesis
	// §4.1.4): the guest sees no GPU registers; whole DRM operations cross
	// a shared ring to a back end in the aggregator (package pvdrm).
	ModePVDRM Mode = "pvdrm"
	// ModePVDRMPooling is ModePVDRM with GEM pooling: closed mappable
	// buffers are kept per VM and reused without sharing pages again.
	ModePVDRMPooling Mode = "pvdrm-pooling"
)

// Modes returns every mode the aggregator of this build can serve a VM in,
// in documentation order. ([[vm]] mode accepts nothing else: a mode the
// daemon cannot serve would pass the configuration only to have every such
// VM refused when it connects.)
func Modes() []Mode {
	return []Mode{ModeFVNaive, ModeFVBARRemap, ModeFVLazy, ModeFVOptimized, ModeFVIncremental, ModePVNaive, ModePVMulticall, ModePVDRM, ModePVDRMPooling}
}

// IsPV reports whether m is a para-virtualization mode (hypercalls).
func (m Mode) IsPV() bool { return m == ModePVNaive || m == ModePVMulticall }

// IsPVDRM reports whether m is a para-virtual DRM mode (package pvdrm).
func (m Mode) IsPVDRM() bool { return m == ModePVDRM || m == ModePVDRMPooling }

// ModeNames returns the names of Modes(), e.g. for command-line help.
func ModeNames() []string { return names(Modes()) }

// Valid reports whether m is one of Modes().
func (m Mode) Valid() bool { return isOneOf(m, Modes()) }

// modeProblem explains why m is not a mode a VM can be served in.
func modeProblem(m Mode) string {
	served := strings.Join(ModeNames(), ", ")
	switch m {
	case "native":
		return fmt.Sprintf(`mode "native" is the baseline without virtualization (gpuvm bench --mode native); the daemon serves VMs in %s`, served)
	}
	return fmt.Sprintf("unknown mode %q; this build serves %s", m, served)
}

// Policy names a GPU time scheduling policy (package sched).
type Policy string

// Scheduling policies.
const (
	// PolicyFIFO submits in arrival order.
	PolicyFIFO Policy = "fifo"
	// PolicyCredit is Xen-credit-like: charge usage, replenish per period.
	PolicyCredit Policy = "credit"
	// PolicyBand is GPUvm's BAND: credit plus a short wait for the same VM's
	// next submission.
	PolicyBand Policy = "band"
	// PolicyWFQ is weighted fair queueing with per-VM virtual time.
	PolicyWFQ Policy = "wfq"
	// PolicyTimeslice is timeslicing with overuse control.
	PolicyTimeslice Policy = "timeslice"
	// PolicyDFQ is NEON's disengaged fair queueing.
	PolicyDFQ Policy = "dfq"
	// PolicyStrict is time-division multiplexing with fixed slots, whatever
	// the load: the opt-in mode against timing channels between VMs.
	PolicyStrict Policy = "strict"
)

// Policies returns every valid policy, in documentation order.
func Policies() []Policy {
	return []Policy{PolicyFIFO, PolicyCredit, PolicyBand, PolicyWFQ, PolicyTimeslice, PolicyDFQ, PolicyStrict}
}

// PolicyNames returns the names of Policies(), e.g. for command-line help.
func PolicyNames() []string { return names(Policies()) }

// Valid reports whether p is one of Policies().
func (p Policy) Valid() bool { return isOneOf(p, Policies()) }

func names[T ~string](vs []T) []string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = string(v)
	}
	return s
}

func isOneOf[T comparable](v T, vs []T) bool {
	for _, x := range vs {
		if v == x {
			return true
		}
	}
	return false
}

// BoardConfig is the [board] table.
type BoardConfig struct {
	// Kind is "sim" or "pci".
	Kind BoardKind `toml:"kind"`
	// PCIAddress is the board's PCI address ("0000:01:00.0"); required
	// when Kind is "pci", unused otherwise.
	PCIAddress string `toml:"pci_address"`
	// VRAM is the simulated board's VRAM size (sim only): a multiple of
	// MemPartitions MiB, 64MiB..64GiB.
	VRAM Size `toml:"vram"`
	// Channels is the number of PFIFO channels, 1..128.
	Channels int `toml:"channels"`
	// MemPartitions is the number of memory partitions, 1..16.
	MemPartitions int `toml:"mem_partitions"`
	// Timing is the simulated board's timing model.
	Timing Timing `toml:"timing"`
	// Overcommit lets the board hold vGPUs whose VRAM sums to this many
	// times its slots' VRAM, 1..8 (1: none); they take turns by eviction
	// (overcommit.go).
	Overcommit float64 `toml:"overcommit"`
}

// DaemonConfig is the [daemon] table.
type DaemonConfig struct {
	// Socket is the aggregator's Unix socket for device models.
	Socket string `toml:"socket"`
	// ControlSocket is the Unix socket of the control API.
	ControlSocket string `toml:"control_socket"`
	// MaxVMs is the most VMs served at once, 1..64.
	MaxVMs int `toml:"max_vms"`
	// LogLevel is the log verbosity.
	LogLevel LogLevel `toml:"log_level"`
	// Placement is how VMs are placed on several boards: "spread" or
	// "pack" (package host).
	Placement string `toml:"placement"`
	// Balance is the load balancer: "off" or "load"; BalanceInterval,
	// BalanceThreshold and BalanceHold tune it (balance.go).
	Balance          string   `toml:"balance"`
	BalanceInterval  Duration `toml:"balance_interval"`
	BalanceThreshold float64  `toml:"balance_threshold"`
	BalanceHold      Duration `toml:"balance_hold"`
	// EvictIdle, RestoreWait and MinResidency tune eviction on an
	// overcommitted board (overcommit.go).
	EvictIdle    Duration `toml:"evict_idle"`
	RestoreWait  Duration `toml:"restore_wait"`
	MinResidency Duration `toml:"min_residency"`
}

// PartitionConfig is the [partition] table: what each VM slot gets.
type PartitionConfig struct {
	// VRAMPerVM is each VM's VRAM slice, a multiple of 1MiB.
	VRAMPerVM Size `toml:"vram_per_vm"`
	// ChannelsPerVM is each VM's channel range.
	ChannelsPerVM int `toml:"channels_per_vm"`
	// BAR1PerVM is each VM's slice of the BAR1 aperture, a multiple of 4KiB.
	BAR1PerVM Size `toml:"bar1_per_vm"`
	// BAR3PerVM is each VM's slice of the BAR3 aperture, a multiple of 4KiB.
	BAR3PerVM Size `toml:"bar3_per_vm"`
	// Reserved is VRAM kept by the aggregator for shadow page tables and
	// shadow RAMIN, a multiple of 1MiB.
	Reserved Size `toml:"reserved"`
}

// SchedulerConfig is the [scheduler] table.
type SchedulerConfig struct {
	// Policy is the scheduling policy.
	Policy Policy `toml:"policy"`
	// Period is the credit replenish period (credit, band).
	Period Duration `toml:"period"`
	// BandWait is BAND's longest wait for the same VM's next submission.
	BandWait Duration `toml:"band_wait"`
	// BandPoll is BAND's poll interval while waiting.
	BandPoll Duration `toml:"band_poll"`
	// Timeslice is the slice length of timeslice and the slot length of
	// strict (each times the VM's weight).
	Timeslice Duration `toml:"timeslice"`
	// Poll is how long timeslice keeps the GPU for an idle slice holder
	// (NEON's polling period).
	Poll Duration `toml:"poll"`
	// SampleTime is dfq's longest engaged sampling run per VM.
	SampleTime Duration `toml:"sample_time"`
	// SampleRequests ends a VM's dfq sampling run after this many requests.
	SampleRequests int `toml:"sample_requests"`
	// FreeRunFactor makes dfq's free run FreeRunFactor × sample_time × VMs sampled.
	FreeRunFactor int `toml:"free_run_factor"`
	// Watchdog stops a channel whose submission holds the GPU longer; 0 = off.
	Watchdog Duration `toml:"watchdog"`
	// Doorbell is how guest doorbells reach the scheduler: trapped GP_PUT
	// writes, or the aggregator polling the guests' user areas.
	Doorbell Doorbell `toml:"doorbell"`
	// DoorbellPoll is the polling interval of Doorbell "poll".
	DoorbellPoll Duration `toml:"doorbell_poll"`
	// SLAFeedback raises, for a while, the weight of a VM that missed its
	// queue-wait objective (VMConfig.SLO): Pegasus' SLA feedback (slo.go).
	SLAFeedback bool `toml:"sla_feedback"`
	// SLAWindow is how often SLA feedback looks at each VM's waits.
	SLAWindow Duration `toml:"sla_window"`
	// SLABoost multiplies a missing VM's weight boost each window.
	SLABoost int `toml:"sla_boost"`
	// SLAMaxBoost caps the boost: at most SLAMaxBoost × the VM's weight.
	SLAMaxBoost int `toml:"sla_max_boost"`
}

// Doorbell says how guest doorbells (GP_PUT writes) reach the scheduler.
type Doorbell string

// Doorbell modes.
const (
	// DoorbellTrap traps every GP_PUT write (GPUvm's way).
	DoorbellTrap Doorbell = "trap"
	// DoorbellPoll has the aggregator poll the guests' user areas (GPUvm's
	// "sidecore" future work): no trap per doorbell, a polling thread.
	DoorbellPoll Doorbell = "poll"
)

// Doorbells lists the doorbell modes.
func Doorbells() []Doorbell { return []Doorbell{DoorbellTrap, DoorbellPoll} }

// Valid reports whether d is a doorbell mode.
func (d Doorbell) Valid() bool { return isOneOf(d, Doorbells()) }

// VMConfig is one [[vm]] entry: settings for the VM with this name or domid.
type VMConfig struct {
	// Name is the Xen domain name; empty to match by DomID only.
	Name string `toml:"name,omitempty"`
	// DomID is the Xen domain id, 1..32751; 0 to match by Name only.
	DomID int `toml:"domid,omitempty"`
	// Mode is how the VM reaches the GPU.
	Mode Mode `toml:"mode"`
	// Weight is the VM's scheduler share, ≥ 1.
	Weight int `toml:"weight"`
	// VRAM lowers the VM's VRAM quota below Partition.VRAMPerVM; 0 = the
	// full slice.
	VRAM Size `toml:"vram,omitempty"`
	// Channels lowers the VM's channel quota below Partition.ChannelsPerVM;
	// 0 = the full range.
	Channels int `toml:"channels,omitempty"`
	// BAR1 and BAR3 narrow the VM's aperture slices below the partition's;
	// 0 = the full slices.
	BAR1 Size `toml:"bar1,omitempty"`
	BAR3 Size `toml:"bar3,omitempty"`
	// Profile names a vGPU size (ProfileConfig) that supplies VRAM,
	// channels, aperture slices and weight where the entry leaves them out.
	Profile string `toml:"profile,omitempty"`
	// Board pins the VM to the board of that name ([[boards]]): placement
	// puts it there or nowhere. Empty: any board.
	Board string `toml:"board,omitempty"`
	// SLO is the VM's queue-wait objective (doorbell to release), counted
	// as violated by each submission that waits longer; 0 = none, or the
	// profile's. See slo.go.
	SLO Duration `toml:"slo,omitempty"`
}

// Default returns the built-in configuration: the simulated 6GiB Quadro
// 6000-like board, sockets in DefaultSocketDir, eight VM slots, FIFO
// scheduling and no [[vm]] entries.
func Default() Config {
	return Config{
		Board: BoardConfig{
			Kind:          BoardSim,
			VRAM:          6 * GiB,
			Channels:      128,
			MemPartitions: 6,
			Timing:        TimingNone,
			Overcommit:    1,
		},
		Daemon: DaemonConfig{
			Socket:           filepath.Join(DefaultSocketDir(), "gpuvm.sock"),
			ControlSocket:    filepath.Join(DefaultSocketDir(), "control.sock"),
			MaxVMs:           8,
			LogLevel:         LogInfo,
			Placement:        "spread",
			Balance:          BalanceOff,
			BalanceInterval:  Duration{DefaultBalanceInterval},
			BalanceThreshold: DefaultBalanceThreshold,
			BalanceHold:      Duration{DefaultBalanceHold},
			EvictIdle:        Duration{DefaultEvictIdle},
			RestoreWait:      Duration{DefaultRestoreWait},
			MinResidency:     Duration{DefaultMinResidency},
		},
		Partition: PartitionConfig{
			VRAMPerVM:     512 * MiB,
			ChannelsPerVM: 16,
			BAR1PerVM:     15 * MiB,
			BAR3PerVM:     2 * MiB,
			Reserved:      256 * MiB,
		},
		Scheduler: SchedulerConfig{
			Policy:         PolicyFIFO,
			Period:         Duration{100 * time.Millisecond},
			BandWait:       Duration{500 * time.Microsecond},
			BandPoll:       Duration{50 * time.Microsecond},
			Timeslice:      Duration{30 * time.Millisecond},
			Watchdog:       Duration{2 * time.Second},
			Doorbell:       DoorbellTrap,
			DoorbellPoll:   Duration{50 * time.Microsecond},
			Poll:           Duration{time.Millisecond},
			SampleTime:     Duration{5 * time.Millisecond},
			SampleRequests: 32,
			FreeRunFactor:  5,
			SLAWindow:      Duration{DefaultSLAWindow},
			SLABoost:       DefaultSLABoost,
			SLAMaxBoost:    DefaultSLAMaxBoost,
		},
	}
}

// DefaultSocketDir is where the daemon's sockets are unless the
// configuration says otherwise, so that `gpuvm serve`, `gpuvm devmodel` and
// `gpuvm vgpu` find each other without flags: /run/gpuvm for root (the
// runtime directory of system daemons; Xen's own use /run/xen); for any
// other user $XDG_RUNTIME_DIR/gpuvm (the per-user runtime directory, mode
// 0700, that the login manager provides), or <tmp>/gpuvm-<uid> without one.
func DefaultSocketDir() string {
	uid := os.Geteuid()
	if uid == 0 {
		return "/run/gpuvm"
	}
	// A runtime directory too long for a socket path under it is skipped.
	if d := os.Getenv("XDG_RUNTIME_DIR"); filepath.IsAbs(d) && len(d)+len("/gpuvm/control.sock") <= maxSocketPath {
		return filepath.Join(d, "gpuvm")
	}
	return filepath.Join(os.TempDir(), "gpuvm-"+strconv.Itoa(uid))
}

// DefaultVM returns the settings of a [[vm]] entry whose keys are all
// missing (and of a VM without an entry): mode fv-optimized, weight 1, the
// full partition quotas.
func DefaultVM() VMConfig {
	return VMConfig{Mode: ModeFVOptimized, Weight: 1}
}

// LookupVM returns the settings for the VM called name with domain id domid:
// the first [[vm]] entry whose name or domid matches (an empty name or a
// zero domid matches nothing), else DefaultVM(). Zero quotas in the result
// are replaced by the partition's, so VRAM and Channels are the effective
// quotas.
//
// An entry that names a profile takes from it what it leaves out: the
// sizes it leaves at zero, and the weight unless the entry's weight was
// written in the file (for a Config built in code: unless it is not 0).
func (c Config) LookupVM(name string, domid int) VMConfig {
	v := DefaultVM()
	for i, e := range c.VMs {
		if name != "" && e.Name == name || domid != 0 && e.DomID == domid {
			v = e
			if p, ok := c.LookupProfile(e.Profile); ok && e.Profile != "" {
				v.VRAM = cmp.Or(v.VRAM, p.VRAM)
				v.Channels = cmp.Or(v.Channels, p.Channels)
				v.BAR1 = cmp.Or(v.BAR1, p.BAR1)
				v.BAR3 = cmp.Or(v.BAR3, p.BAR3)
				v.SLO = c.profileSLO(i, v.SLO, p)
				v.Board = cmp.Or(v.Board, p.Board)
				if c.src != nil && !c.src.written(joinKey(indexKey("vm", i), "weight")) || c.src == nil && v.Weight == 0 {
					v.Weight = p.Weight
				}
			}
			break
		}
	}
	v.Weight = max(v.Weight, 1)
	v.VRAM = cmp.Or(v.VRAM, c.Partition.VRAMPerVM)
	v.Channels = cmp.Or(v.Channels, c.Partition.ChannelsPerVM)
	v.BAR1 = cmp.Or(v.BAR1, c.Partition.BAR1PerVM)
	v.BAR3 = cmp.Or(v.BAR3, c.Partition.BAR3PerVM)
	return v
}

// ConfiguredMode returns the mode the operator set for the VM called name
// with domain id domid: the mode key of the first [[vm]] entry that matches
// (as LookupVM matches), if that entry has one, else "" — no entry, or an
// entry that leaves mode out, lets the VM's device model choose. For a
// Config not parsed from a file an entry's Mode counts as set.
func (c Config) ConfiguredMode(name string, domid int) Mode {
	for i, e := range c.VMs {
		if name != "" && e.Name == name || domid != 0 && e.DomID == domid {
			if c.src == nil || c.src.written(joinKey(indexKey("vm", i), "mode")) {
				return e.Mode
			}
			return ""
		}
	}
	return ""
}

// Load reads and parses the configuration file at path (see Parse).
func Load(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Default(), fmt.Errorf("config: %w", err)
	}
	return Parse(data, path)
}

// Parse parses a configuration file's contents; filename is only used in
// error positions. Missing keys take their Default values. The result is
// checked with Validate, and the error, if any, is an ErrorList holding
// every problem found: syntax errors (then nothing else is checked), unknown
// keys and tables, type mismatches, bad values and inconsistencies, each
// with its file:line:col.
//
// On error the returned Config holds whatever could be decoded (defaults
// elsewhere) and must not be used to run the daemon.
func Parse(data []byte, filename string) (Config, error) {
	c := Default()
	var doc map[string]any
	if _, err := toml.Decode(string(data), &doc); err != nil {
		e := &Error{File: filename, Msg: err.Error(), Err: err}
		var pe toml.ParseError
		if errors.As(err, &pe) {
			e.Line, e.Col = pe.Position.Line, pe.Position.Col
			e.Msg = pe.Message
			// The toml package counts a line as soon as its lexer has
			// consumed the newline, so an error found at the end of a
			// line (a missing ']' on line 1) is reported on the next one.
			// The error's byte offset (in the text without a BOM, as the
			// package reads it) is exact: place it from that.
			text := strings.TrimPrefix(string(data), "\ufeff")
			if start := pe.Position.Start; start >= 0 && start <= len(text) {
				e.Line = 1 + strings.Count(text[:start], "\n")
				e.Col = start - strings.LastIndexByte(text[:start], '\n')
			}
		}
		return c, ErrorList{e}
	}
	c.src = &source{file: filename, pos: scanPositions(string(data))}
	d := decoder{c: &c, failed: map[string]bool{}}
	d.document(doc)
	errs := d.errs
	if err := c.validate(d.failed); err != nil {
		var l ErrorList
		if errors.As(err, &l) {
			errs = append(errs, l...)
		}
	}
	return c, errs.err()
}
