package config

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestBuiltinProfiles(t *testing.T) {
	c := Default()
	got := c.BuiltinProfiles()
	var names []string
	for _, p := range got {
		names = append(names, p.Name)
	}
	if want := []string{"vgpu-512m", "vgpu-256m", "vgpu-128m"}; !reflect.DeepEqual(names, want) {
		t.Fatalf("built-in profiles %v, want %v", names, want)
	}
	half := got[1]
	if half.VRAM != 256*MiB || half.Channels != 8 || half.BAR1 != 7680*KiB || half.BAR3 != MiB || half.Weight != 2 {
		t.Errorf("half a slot = %+v", half)
	}
	// A partition too small to halve has fewer built-ins.
	c.Partition.ChannelsPerVM = 1
	if n := len(c.BuiltinProfiles()); n != 1 {
		t.Errorf("one channel per VM: %d built-in profiles, want 1", n)
	}
}

func TestProfilesParse(t *testing.T) {
	c, err := Parse([]byte(`
[[profile]]
name = "vgpu-256m"
vram = "200MiB"
weight = 3

[[profile]]
name = "tiny"
channels = 2

[[vm]]
name = "a"
profile = "vgpu-256m"

[[vm]]
name = "b"
profile = "tiny"
weight = 7
vram = "64MiB"

[[vm]]
name = "c"
profile = "vgpu-128m"
`), "p.toml")
	if err != nil {
		t.Fatal(err)
	}
	names := c.ProfileNames()
	if want := []string{"vgpu-256m", "tiny", "vgpu-512m", "vgpu-128m"}; !reflect.DeepEqual(names, want) {
		t.Errorf("profiles %v, want %v (a configured one replaces the built-in of its name)", names, want)
	}
	a := c.LookupVM("a", 0)
	if a.VRAM != 200*MiB || a.Weight != 3 || a.Channels != 16 || a.BAR1 != 15*MiB {
		t.Errorf("vm a (profile vgpu-256m as configured) = %+v", a)
	}
	b := c.LookupVM("b", 0)
	if b.VRAM != 64*MiB || b.Weight != 7 || b.Channels != 2 {
		t.Errorf("vm b (its own weight and vram over profile tiny) = %+v", b)
	}
	cc := c.LookupVM("c", 0)
	if cc.VRAM != 128*MiB || cc.Channels != 4 || cc.Weight != 1 || cc.BAR3 != 512*KiB {
		t.Errorf("vm c (built-in vgpu-128m) = %+v", cc)
	}
	if p, ok := c.LookupProfile("tiny"); !ok || p.VRAM != 512*MiB || p.Weight != 1 {
		t.Errorf("LookupProfile(tiny) = %+v, %v: left-out sizes are the partition's", p, ok)
	}
}

func TestProfileErrors(t *testing.T) {
	_, err := Parse([]byte(`[[profile]]
name = "Big One"
vram = "1GiB"
[[profile]]
name = "x"
channels = 0
bar1 = "1000B"
bar3 = "4MiB"
weight = 0
colour = "red"
[[profile]]
name = "x"
[[profile]]
vram = "64MiB"
[[vm]]
name = "v"
profile = "nope"
[[vm]]
name = "w"
profile = ""
bar1 = "16MiB"
`), "t.toml")
	got := problems(t, err)
	want := []string{
		`t.toml:10:1: profile[1].colour: unknown key`,
		`t.toml:2:8: profile[0].name: profile name "Big One": use lower-case letters, digits, '.', '_' and '-', starting with a letter or digit, at most 64 bytes`,
		`t.toml:3:8: profile[0].vram: 1GiB exceeds partition vram_per_vm (512MiB)`,
		`t.toml:6:12: profile[1].channels: 0 is below 1 (leave it out for the full channels_per_vm)`,
		`t.toml:7:8: profile[1].bar1: 1000 bytes is not a multiple of 4KiB`,
		`t.toml:8:8: profile[1].bar3: 4MiB exceeds partition bar3_per_vm (2MiB)`,
		`t.toml:9:10: profile[1].weight: 0 is out of range 1..10000`,
		`t.toml:12:8: profile[2].name: duplicate profile "x" (also in profile[1] at line 5)`,
		`t.toml:13:1: profile[3]: a profile needs a name`,
		`t.toml:17:11: vm[0].profile: no profile "nope" (have x, vgpu-512m, vgpu-256m, vgpu-128m)`,
		`t.toml:20:11: vm[1].profile: must not be empty (leave it out for no profile)`,
		`t.toml:21:8: vm[1].bar1: 16MiB exceeds partition bar1_per_vm (15MiB)`,
	}
	// Order within the list follows the checks; compare as sets.
	if strings.Join(slices.Sorted(slices.Values(got)), "\n") != strings.Join(slices.Sorted(slices.Values(want)), "\n") {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
