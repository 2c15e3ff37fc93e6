package config

import (
	"cmp"
	"fmt"
	"regexp"
	"strings"
)

// MaxBoards is the most [[boards]] entries one daemon owns.
const MaxBoards = 16

// BoardEntry is one [[boards]] entry: one of several physical GPUs the
// daemon owns. Keys it leaves out are [board]'s (so [board] is the template
// of a host whose GPUs are alike, and an entry writes only what differs:
// a smaller VRAM, a slower timing profile); MaxVMs left out is
// daemon.max_vms. Every board is partitioned by [partition] alike: a slot is
// the same size on every board, so a vGPU fits any free slot.
type BoardEntry struct {
	// Name is how the operator and placement pins name the board:
	// lower-case letters, digits, '.', '_' and '-' (default "gpu" and its
	// index).
	Name string `toml:"name"`
	// BoardConfig is the board's kind, VRAM, channels, memory partitions
	// and timing; zero fields are [board]'s.
	BoardConfig
	// MaxVMs is how many vGPU slots the board has, 1..64 (0: daemon.max_vms).
	MaxVMs int `toml:"max_vms,omitempty"`

	// index is the entry's position in the file (for error keys); -1 for
	// the board a configuration without [[boards]] has.
	index int
}

// boardName is what a board name may look like (it appears in URLs and on
// the command line).
var boardName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,31}$`)

// key is the configuration key of the entry's field name, or of [board]'s
// (or [daemon]'s) field the entry inherits when it has none of its own.
func (b BoardEntry) keys(name string) []string {
	inherited := "board." + name
	if name == "max_vms" {
		inherited = "daemon.max_vms"
	}
	if b.index < 0 {
		return []string{inherited}
	}
	return []string{joinKey(indexKey("boards", b.index), name), inherited}
}

// AllBoards returns the boards the daemon owns, in configuration order,
// each with every field filled: the [[boards]] entries, or — without any —
// one board named "gpu0" as [board] and daemon.max_vms describe it.
func (c Config) AllBoards() []BoardEntry {
	if len(c.Boards) == 0 {
		return []BoardEntry{{Name: "gpu0", BoardConfig: c.Board, MaxVMs: c.Daemon.MaxVMs, index: -1}}
	}
	out := make([]BoardEntry, len(c.Boards))
	for i, e := range c.Boards {
		b := e.BoardConfig
		b.Kind = cmp.Or(b.Kind, c.Board.Kind)
		b.PCIAddress = cmp.Or(b.PCIAddress, c.Board.PCIAddress)
		b.VRAM = cmp.Or(b.VRAM, c.Board.VRAM)
		b.Channels = cmp.Or(b.Channels, c.Board.Channels)
		b.MemPartitions = cmp.Or(b.MemPartitions, c.Board.MemPartitions)
		b.Timing = cmp.Or(b.Timing, c.Board.Timing)
		b.Overcommit = cmp.Or(b.Overcommit, c.Board.Overcommit)
		out[i] = BoardEntry{Name: cmp.Or(e.Name, fmt.Sprintf("gpu%d", i)), BoardConfig: b, MaxVMs: cmp.Or(e.MaxVMs, c.Daemon.MaxVMs), index: i}
	}
	return out
}

// LookupBoard returns the board called name.
func (c Config) LookupBoard(name string) (BoardEntry, bool) {
	for _, b := range c.AllBoards() {
		if b.Name == name {
			return b, true
		}
	}
	return BoardEntry{}, false
}

// BoardNames lists the boards' names in configuration order.
func (c Config) BoardNames() []string {
	var out []string
	for _, b := range c.AllBoards() {
		out = append(out, b.Name)
	}
	return out
}

// validateBoards checks the [[boards]] entries: names, each value written
// (a written zero is an error, not "inherit"), and that [partition] fits
// every board as it fits [board].
func (c Config) validateBoards(v *validator) {
	if len(c.Boards) > MaxBoards {
		v.errorf([]string{indexKey("boards", MaxBoards)}, "%d boards; at most %d", len(c.Boards), MaxBoards)
	}
	seen := map[string]int{}
	for i, b := range c.AllBoards() {
		if len(c.Boards) == 0 {
			break // [board] itself is validated as before
		}
		nameKeys := b.keys("name")
		if v.ok(nameKeys[0]) {
			if !boardName.MatchString(b.Name) {
				v.errorf(nameKeys[:1], "board name %q: want lower-case letters, digits, '.', '_' or '-', starting with a letter or digit, at most 32 bytes", b.Name)
			} else if j, dup := seen[b.Name]; dup {
				v.errorf(nameKeys[:1], "board name %q is also board %d's", b.Name, j)
			}
			seen[b.Name] = i
		}
		raw := c.Boards[i]
		for _, z := range []struct {
			name string
			zero bool
		}{{"vram", raw.VRAM == 0}, {"channels", raw.Channels == 0}, {"mem_partitions", raw.MemPartitions == 0},
			{"max_vms", raw.MaxVMs == 0}, {"timing", raw.Timing == ""}, {"kind", raw.Kind == ""},
			{"overcommit", raw.Overcommit == 0}} {
			if key := b.keys(z.name)[0]; z.zero && v.ok(key) && v.src.written(key) {
				v.errorf([]string{key}, "must not be empty or 0 (leave the key out to take [board]'s or [daemon]'s)")
				v.skip = withSkip(v.skip, key)
			}
		}
		c.validateBoardEntry(v, b)
	}
}

// withSkip returns skip with key added (skip may be nil).
func withSkip(skip map[string]bool, key string) map[string]bool {
	if skip == nil {
		skip = map[string]bool{}
	}
	skip[key] = true
	return skip
}

// validateVMBoards checks that each [[vm]] board pin names a board.
func (c Config) validateVMBoards(v *validator) {
	for i, vm := range c.VMs {
		key := joinKey(indexKey("vm", i), "board")
		if vm.Board == "" || !v.ok(key) {
			continue
		}
		if _, ok := c.LookupBoard(vm.Board); !ok {
			v.errorf([]string{key}, "no board %q (have %s)", vm.Board, strings.Join(c.BoardNames(), ", "))
		}
	}
}

// validateBoardEntry checks one filled [[boards]] entry.
func (c Config) validateBoardEntry(v *validator, b BoardEntry) {
	k := b.keys
	ok := func(name string) bool { return v.ok(k(name)...) }
	if ok("kind") && !b.Kind.Valid() {
		v.errorf(k("kind"), "unknown board kind %q (want sim or pci)", b.Kind)
	}
	if ok("kind") && b.Kind == BoardPCI && b.PCIAddress == "" {
		v.errorf(append(k("pci_address"), k("kind")...), `pci_address is required when kind = "pci"`)
	}
	if ok("pci_address") && b.PCIAddress != "" && !validPCIAddress(b.PCIAddress) {
		v.errorf(k("pci_address"), "%q is not a PCI address (want domain:bus:device.function, e.g. 0000:01:00.0)", b.PCIAddress)
	}
	partsOK := ok("mem_partitions") && v.intRange(k("mem_partitions")[0], b.MemPartitions, 1, MaxMemPartitions)
	chansOK := ok("channels") && v.intRange(k("channels")[0], b.Channels, 1, MaxChannels)
	vmsOK := ok("max_vms") && v.intRange(k("max_vms")[0], b.MaxVMs, 1, MaxVMs)
	if ok("timing") && !b.Timing.Valid() {
		v.errorf(k("timing"), "unknown timing model %q (want none, fermi, fermi-xen, fermi-small or fermi-x4)", b.Timing)
	}
	vramOK := false
	if b.Kind == BoardSim && ok("vram") {
		switch vram := b.VRAM; {
		case vram < MinVRAM:
			v.errorf(k("vram"), "%s is below the minimum %s", vram, MinVRAM)
		case vram > MaxVRAM:
			v.errorf(k("vram"), "%s is above the maximum %s", vram, MaxVRAM)
		case partsOK && vram%(Size(b.MemPartitions)*MiB) != 0:
			v.errorf(append(k("vram"), k("mem_partitions")...),
				"vram %s is not a multiple of mem_partitions (%d) × 1MiB = %s", vram, b.MemPartitions, Size(b.MemPartitions)*MiB)
		default:
			vramOK = true
		}
	}
	p := c.Partition
	if vramOK && vmsOK && v.ok("partition.vram_per_vm", "partition.reserved") {
		total, fits := product(b.MaxVMs, p.VRAMPerVM)
		total += p.Reserved
		if !fits || total < p.Reserved || total > b.VRAM {
			v.errorf(append(k("max_vms"), append(k("vram"), "partition.vram_per_vm")...),
				"board %q: max_vms (%d) × vram_per_vm (%s) + reserved (%s) = %s exceeds its vram (%s)",
				b.Name, b.MaxVMs, p.VRAMPerVM, p.Reserved, sizeOrOverflow(total, fits && total >= p.Reserved), b.VRAM)
		}
	}
	if chansOK && vmsOK && v.ok("partition.channels_per_vm") && p.ChannelsPerVM*b.MaxVMs > b.Channels {
		v.errorf(append(k("max_vms"), append(k("channels"), "partition.channels_per_vm")...),
			"board %q: max_vms (%d) × channels_per_vm (%d) exceeds its %d channels", b.Name, b.MaxVMs, p.ChannelsPerVM, b.Channels)
	}
	if vmsOK && v.ok("partition.bar1_per_vm", "partition.bar3_per_vm") {
		if t, fits := product(b.MaxVMs, p.BAR1PerVM); !fits || t > BAR1Aperture-BAR1PollReserve {
			v.errorf(append(k("max_vms"), "partition.bar1_per_vm"), "board %q: max_vms (%d) × bar1_per_vm (%s) exceeds the 128MiB BAR1 aperture less the aggregator's 512KiB poll area", b.Name, b.MaxVMs, p.BAR1PerVM)
		}
		if t, fits := product(b.MaxVMs, p.BAR3PerVM); !fits || t > BAR3Aperture {
			v.errorf(append(k("max_vms"), "partition.bar3_per_vm"), "board %q: max_vms (%d) × bar3_per_vm (%s) exceeds the 64MiB BAR3 aperture", b.Name, b.MaxVMs, p.BAR3PerVM)
		}
	}
}

// boards decodes the [[boards]] array. Fields left out stay zero (they are
// [board]'s, filled by AllBoards).
func (d *decoder) boards(v any) error {
	entries, err := arrayOfTables("boards", v)
	if err != nil {
		return err
	}
	for i, e := range entries {
		key := indexKey("boards", i)
		b := BoardEntry{index: i}
		if m, ok := e.(map[string]any); ok {
			d.fields(key, m, []field{
				{"name", setString(&b.Name)},
				{"kind", setString(&b.Kind)},
				{"pci_address", setString(&b.PCIAddress)},
				{"vram", setSize(&b.VRAM)},
				{"channels", setInt(&b.Channels)},
				{"mem_partitions", setInt(&b.MemPartitions)},
				{"timing", setString(&b.Timing)},
				{"max_vms", setInt(&b.MaxVMs)},
				{"overcommit", setFloat(&b.Overcommit)},
			})
		} else {
			d.fail(key, false, typeError("a table", e))
		}
		d.c.Boards = append(d.c.Boards, b)
	}
	return nil
}
