package xlcfg

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/gpuvm/gpuvm/config"
)

// Key is the xl setting that gives a domain its vGPU. xl ignores keys it
// does not know, silently (xl 4.17 in the test bed: `xl create` of a
// config with gpuvm = "mode=pvdrm, vram=256MiB" and an unknown list key
// prints only "Parsing config" and creates the domain), so the operator's
// one domain file carries it beside xl's own settings; its value is written as xl's device specifications are
// (vif, disk, pci): a string of comma-separated key=value items, e.g.
//
//	gpuvm = "mode=fv-optimized, vram=256MiB, channels=8, weight=2"
//	gpuvm = "mode=pv-multicall, profile=vgpu-256m"
//
// (a list of one such string is accepted too).
const Key = "gpuvm"

// VGPU is a domain's vGPU as its xl configuration asks for it.
type VGPU struct {
	Name     string      // the domain's name (xl's "name")
	Type     string      // the domain's type (xl's "type"): hvm, pvh or pv
	Mode     config.Mode // default fv-optimized
	VRAM     config.Size // 0: the whole slot
	Channels int         // 0: the whole slot (or the profile's)
	Weight   int         // scheduling weight; 0: the profile's, else 1
	Profile  string      // a vGPU profile of the daemon's ("": none)
}

// vgpuItems is the table of the gpuvm key's items.
func vgpuItems() map[string]func(v *VGPU, val string) error {
	return map[string]func(*VGPU, string) error{
		"mode": func(v *VGPU, val string) error {
			m := config.Mode(val)
			if !m.Valid() {
				return fmt.Errorf("mode %q: have %s", val, strings.Join(config.ModeNames(), ", "))
			}
			v.Mode = m
			return nil
		},
		"vram": func(v *VGPU, val string) error {
			s, err := config.ParseSize(val)
			if err == nil && s == 0 {
				err = fmt.Errorf("vram %q: want more than 0", val)
			}
			v.VRAM = s
			return err
		},
		"channels": func(v *VGPU, val string) error {
			n, err := strconv.Atoi(val)
			if err != nil || n < 1 || n > 4096 {
				return fmt.Errorf("channels %q: want 1..4096", val)
			}
			v.Channels = n
			return nil
		},
		"profile": func(v *VGPU, val string) error {
			if !config.ValidProfileName(val) {
				return fmt.Errorf("profile %q: not a profile name (gpuvm vgpu types lists them)", val)
			}
			v.Profile = val
			return nil
		},
		"weight": func(v *VGPU, val string) error {
			n, err := strconv.Atoi(val)
			if err != nil || n < 1 || n > 10000 {
				return fmt.Errorf("weight %q: want 1..10000", val)
			}
			v.Weight = n
			return nil
		},
	}
}

// ReadVGPU returns the vGPU the file asks for, and whether it asks for
// one. Every problem is an *Error at the place it was written.
func (f *File) ReadVGPU() (VGPU, bool, error) {
	s, ok := f.settings[Key]
	if !ok {
		return VGPU{}, false, nil
	}
	v := VGPU{Mode: config.ModeFVOptimized}
	val := s.Value
	if val.Kind == List {
		if len(val.List) != 1 {
			return v, true, f.errorf(s, val.Pos, "one vGPU per domain: want one string, not a list of %d", len(val.List))
		}
		val = val.List[0]
	}
	if val.Kind != String {
		return v, true, f.errorf(s, val.Pos, `want a string like "mode=fv-optimized, vram=256MiB", not a %v`, val.Kind)
	}
	items := vgpuItems()
	seen := map[string]bool{}
	off := 0
	for _, item := range strings.Split(val.Str, ",") {
		at := Pos{val.Pos.Line, val.Pos.Col + 1 + off + len(item) - len(strings.TrimLeft(item, " \t"))}
		off += len(item) + 1
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		k, x, ok := strings.Cut(item, "=")
		k, x = strings.TrimSpace(k), strings.TrimSpace(x)
		if !ok || x == "" {
			return v, true, f.errorf(s, at, "%q: want key=value", item)
		}
		set, known := items[k]
		if !known {
			return v, true, f.errorf(s, at, "unknown item %q (have %s)", k, strings.Join(slices.Sorted(maps.Keys(items)), ", "))
		}
		if seen[k] {
			return v, true, f.errorf(s, at, "%s given twice", k)
		}
		seen[k] = true
		if err := set(&v, x); err != nil {
			return v, true, f.errorf(s, at, "%v", err)
		}
	}
	var err error
	if v.Name, ok, err = f.String("name"); err != nil {
		return v, true, err
	} else if !ok || v.Name == "" {
		return v, true, &Error{Path: f.Path, Pos: s.Pos, Key: Key, Msg: "the domain has no name (xl's name = \"...\"): gpuvm needs it to find the domain"}
	}
	if v.Type, ok, err = f.String("type"); err != nil {
		return v, true, err
	}
	if !ok {
		v.Type = "pv" // xl's default
		if b, bok, _ := f.String("builder"); bok && b == "hvm" {
			v.Type = "hvm"
		}
	}
	if v.Type != "hvm" && v.Type != "pvh" && v.Type != "pv" {
		t, _ := f.Get("type")
		return v, true, f.errorf(t, t.Value.Pos, "unknown domain type %q (hvm, pvh or pv)", v.Type)
	}
	if v.Type == "pv" && !v.Mode.IsPVDRM() {
		// The vGPU's registers are MMIO a device model serves through an
		// ioreq server, which only HVM and PVH domains have.
		return v, true, f.errorf(s, val.Pos, "mode %s traps the vGPU's MMIO to a device model, which needs an hvm or pvh domain (type = %q); a pv domain can use pvdrm", v.Mode, v.Type)
	}
	return v, true, nil
}
