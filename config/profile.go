package config

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// ProfileConfig is one [[profile]] entry, or a built-in profile: a named
// vGPU size, as GVT-g's vGPU types and NVIDIA's vGPU profiles. A VM (its
// [[vm]] entry, its xl config, its libvirt metadata) names a profile instead
// of setting each size; keys it sets itself override the profile's.
//
// vGPU slots are fixed by [partition]: a profile narrows the VM's slot (the
// guest sees the profile's sizes and reaches nothing beyond), so every
// profile fits every free slot and a smaller profile does not make room
// for more VMs.
type ProfileConfig struct {
	// Name is how VMs name it: lower-case letters, digits, '.', '_' and
	// '-', starting with a letter or digit, at most 64 bytes.
	Name string `toml:"name"`
	// Description is shown by `gpuvm vgpu types`.
	Description string `toml:"description,omitempty"`
	// VRAM is the VM's VRAM, a multiple of 1MiB, ≤ partition.vram_per_vm;
	// 0: the whole slice.
	VRAM Size `toml:"vram,omitempty"`
	// Channels is the VM's channel count, 1..partition.channels_per_vm;
	// 0: the whole range.
	Channels int `toml:"channels,omitempty"`
	// BAR1 and BAR3 are the VM's aperture slices, multiples of 4KiB, ≤ the
	// partition's; 0: the whole slice.
	BAR1 Size `toml:"bar1,omitempty"`
	BAR3 Size `toml:"bar3,omitempty"`
	// Weight is the VM's default scheduler share, ≥ 1 (default 1).
	Weight int `toml:"weight"`
	// SLO is its VMs' default queue-wait objective; 0 = none (slo.go).
	SLO Duration `toml:"slo,omitempty"`
	// Board pins the VMs it sizes — [[vm]] entries that name it and no
	// board of their own, domains registered with it — to the board of
	// that name ([[boards]]). Empty: any.
	Board string `toml:"board,omitempty"`
}

// profileName is what a profile name may look like (it appears in xl
// configs, libvirt XML and URLs).
var profileName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)

// ValidProfileName reports whether s may name a profile.
func ValidProfileName(s string) bool { return profileName.MatchString(s) }

// BuiltinProfiles returns the profiles every configuration has, derived
// from [partition]: the whole slot, half of it and a quarter of it (VRAM,
// channels and aperture slices divided alike, at least 1MiB, one channel
// and 4KiB), named "vgpu-" and the VRAM size ("vgpu-512m"), weighted 4, 2
// and 1 as GVT-g weights its types by size. A fraction too small to
// divide is left out, and so is a duplicate name.
func (c Config) BuiltinProfiles() []ProfileConfig {
	p := c.Partition
	var out []ProfileConfig
	seen := map[string]bool{}
	for _, f := range []struct {
		div, weight int
		what        string
	}{{1, 4, "the whole slot"}, {2, 2, "half a slot"}, {4, 1, "a quarter of a slot"}} {
		vram := p.VRAMPerVM / Size(f.div) &^ (MiB - 1)
		chans := p.ChannelsPerVM / f.div
		bar1 := p.BAR1PerVM / Size(f.div) &^ (4*KiB - 1)
		bar3 := p.BAR3PerVM / Size(f.div) &^ (4*KiB - 1)
		if vram == 0 || chans == 0 || bar1 == 0 || bar3 == 0 {
			continue
		}
		name := "vgpu-" + strings.ToLower(strings.TrimSuffix(strings.TrimSuffix(vram.String(), "iB"), "B"))
		if seen[name] {
			continue
		}
		seen[name] = true
		out = append(out, ProfileConfig{Name: name, VRAM: vram, Channels: chans, BAR1: bar1, BAR3: bar3, Weight: f.weight,
			Description: fmt.Sprintf("built in: %s (%s VRAM, %d channels)", f.what, vram, chans)})
	}
	return out
}

// AllProfiles returns the configured profiles in file order, then the
// built-in ones whose names they do not take, every size filled in (a
// zero size in an entry means the partition's).
func (c Config) AllProfiles() []ProfileConfig {
	var out []ProfileConfig
	taken := map[string]bool{}
	for _, p := range c.Profiles {
		out = append(out, c.filled(p))
		taken[p.Name] = true
	}
	for _, p := range c.BuiltinProfiles() {
		if !taken[p.Name] {
			out = append(out, p)
		}
	}
	return out
}

// filled returns p with its zero sizes replaced by the partition's.
func (c Config) filled(p ProfileConfig) ProfileConfig {
	part := c.Partition
	if p.VRAM == 0 {
		p.VRAM = part.VRAMPerVM
	}
	if p.Channels == 0 {
		p.Channels = part.ChannelsPerVM
	}
	if p.BAR1 == 0 {
		p.BAR1 = part.BAR1PerVM
	}
	if p.BAR3 == 0 {
		p.BAR3 = part.BAR3PerVM
	}
	if p.Weight == 0 {
		p.Weight = 1
	}
	return p
}

// LookupProfile returns the profile called name (see AllProfiles).
func (c Config) LookupProfile(name string) (ProfileConfig, bool) {
	for _, p := range c.AllProfiles() {
		if p.Name == name {
			return p, true
		}
	}
	return ProfileConfig{}, false
}

// ProfileNames lists the names of AllProfiles, for error messages (each
// once; a name that is not valid is left out).
func (c Config) ProfileNames() []string {
	var names []string
	for _, p := range c.AllProfiles() {
		if ValidProfileName(p.Name) && !slices.Contains(names, p.Name) {
			names = append(names, p.Name)
		}
	}
	return names
}

// validateProfiles checks the [[profile]] entries: a valid, unique name,
// sizes that fit the partition, a weight ≥ 1.
func (c Config) validateProfiles(v *validator) {
	part := c.Partition
	seen := map[string]int{}
	for i, p := range c.Profiles {
		k := indexKey("profile", i)
		if !v.ok(k) {
			continue
		}
		key := func(name string) string { return joinKey(k, name) }
		if v.ok(key("name")) {
			switch j, dup := seen[p.Name]; {
			case p.Name == "":
				v.errorf([]string{key("name"), k}, "a profile needs a name")
			case !ValidProfileName(p.Name):
				v.errorf([]string{key("name")}, "profile name %q: use lower-case letters, digits, '.', '_' and '-', starting with a letter or digit, at most 64 bytes", p.Name)
			case dup:
				v.errorf([]string{key("name")}, "duplicate profile %q (also in %s%s)", p.Name, indexKey("profile", j), v.lineOf(joinKey(indexKey("profile", j), "name")))
			default:
				seen[p.Name] = i
			}
		}
		// A zero size (left out, or written as 0) is the partition's.
		written := func(name string, zero bool) bool { return v.ok(key(name)) && !zero }
		if written("vram", p.VRAM == 0) && v.sizeMultiple(key("vram"), p.VRAM, MiB) && v.ok("partition.vram_per_vm") && p.VRAM > part.VRAMPerVM {
			v.errorf([]string{key("vram"), "partition.vram_per_vm"}, "%s exceeds partition vram_per_vm (%s)", p.VRAM, part.VRAMPerVM)
		}
		if v.ok(key("channels")) && (p.Channels != 0 || v.src.written(key("channels"))) {
			switch {
			case p.Channels < 1:
				v.errorf([]string{key("channels")}, "%d is below 1 (leave it out for the full channels_per_vm)", p.Channels)
			case v.ok("partition.channels_per_vm") && p.Channels > part.ChannelsPerVM:
				v.errorf([]string{key("channels"), "partition.channels_per_vm"}, "%d exceeds partition channels_per_vm (%d)", p.Channels, part.ChannelsPerVM)
			}
		}
		for _, b := range []struct {
			name     string
			size     Size
			per      Size
			perKey   string
			perTable string
		}{{"bar1", p.BAR1, part.BAR1PerVM, "partition.bar1_per_vm", "bar1_per_vm"}, {"bar3", p.BAR3, part.BAR3PerVM, "partition.bar3_per_vm", "bar3_per_vm"}} {
			if written(b.name, b.size == 0) && v.sizeMultiple(key(b.name), b.size, 4*KiB) && v.ok(b.perKey) && b.size > b.per {
				v.errorf([]string{key(b.name), b.perKey}, "%s exceeds partition %s (%s)", b.size, b.perTable, b.per)
			}
		}
		if v.ok(key("weight")) && (p.Weight != 0 || v.src.written(key("weight"))) && (p.Weight < 1 || p.Weight > MaxWeight) {
			v.errorf([]string{key("weight")}, "%d is out of range 1..%d", p.Weight, MaxWeight)
		}
		if p.Board != "" && v.ok(key("board")) {
			if _, ok := c.LookupBoard(p.Board); !ok {
				v.errorf([]string{key("board")}, "no board %q (have %s)", p.Board, strings.Join(c.BoardNames(), ", "))
			}
		}
	}
	for i, vm := range c.VMs {
		key := joinKey(indexKey("vm", i), "profile")
		if vm.Profile == "" || !v.ok(key) {
			continue
		}
		if _, ok := c.LookupProfile(vm.Profile); !ok {
			v.errorf([]string{key}, "no profile %q (have %s)", vm.Profile, strings.Join(c.ProfileNames(), ", "))
		}
	}
}

// profiles decodes the [[profile]] array.
func (d *decoder) profiles(v any) error {
	entries, err := arrayOfTables("profile", v)
	if err != nil {
		return err
	}
	for i, e := range entries {
		key := indexKey("profile", i)
		var p ProfileConfig
		if m, ok := e.(map[string]any); ok {
			d.fields(key, m, []field{
				{"name", setString(&p.Name)},
				{"description", setString(&p.Description)},
				{"vram", setSize(&p.VRAM)},
				{"channels", setInt(&p.Channels)},
				{"bar1", setSize(&p.BAR1)},
				{"bar3", setSize(&p.BAR3)},
				{"weight", setInt(&p.Weight)},
				{"slo", setDuration(&p.SLO)},
				{"board", setString(&p.Board)},
			})
		} else {
			d.fail(key, false, typeError("a table", e))
		}
		d.c.Profiles = append(d.c.Profiles, p)
	}
	return nil
}
