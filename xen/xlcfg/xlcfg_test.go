package xlcfg

import (
	"errors"
	"strings"
	"testing"

	"github.com/gpuvm/gpuvm/config"
)

const guestCfg = `# an HVM guest with a vGPU
name = "guest1"
type = 'hvm'
memory = 1024 ; vcpus = 2
disk = [ 'format=raw, vdev=xvda, target=/srv/guest1.img',
         # a comment inside a list
         'format=raw, vdev=xvdb, target=/srv/data.img', ]
tsc_mode = "native"
gpuvm = "mode=pv-multicall, vram=256MiB, channels=8, weight=2"
extra = "console=hvc0 \"quoted\""
disk += [ 'vdev=xvdc, target=/srv/c.img' ]
`

func TestParse(t *testing.T) {
	f, err := Parse([]byte(guestCfg), "guest1.cfg")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(f.Keys(), ","); got != "name,type,memory,vcpus,disk,tsc_mode,gpuvm,extra" {
		t.Errorf("keys %s", got)
	}
	if s, _ := f.Get("memory"); s.Value.Kind != Number || s.Value.Num != 1024 || s.Pos != (Pos{4, 1}) {
		t.Errorf("memory %+v", s)
	}
	if s, _ := f.Get("vcpus"); s.Value.Num != 2 || s.Pos != (Pos{4, 17}) {
		t.Errorf("vcpus %+v", s)
	}
	if s, _ := f.Get("disk"); s.Value.Kind != List || len(s.Value.List) != 3 || s.Value.List[1].Pos != (Pos{7, 10}) ||
		s.Value.List[2].Str != "vdev=xvdc, target=/srv/c.img" {
		t.Errorf("disk %+v", s)
	}
	if v, _, _ := f.String("extra"); v != `console=hvc0 "quoted"` {
		t.Errorf("extra %q", v)
	}
	v, ok, err := f.ReadVGPU()
	if err != nil || !ok {
		t.Fatalf("vgpu: %v %v", ok, err)
	}
	want := VGPU{Name: "guest1", Type: "hvm", Mode: config.ModePVMulticall, VRAM: 256 << 20, Channels: 8, Weight: 2}
	if v != want {
		t.Errorf("vgpu %+v, want %+v", v, want)
	}
}

// Syntax errors name the file, line and column.
func TestParseErrors(t *testing.T) {
	for src, want := range map[string]string{
		"name = \"x\nmemory = 1\n":  `c.cfg:1:8: string not closed`,
		"memory 1024\n":             `c.cfg:1:8: memory: expected '=' after the setting name`,
		"a = 1\n= 2\n":              `c.cfg:2:1: expected a setting name, found '='`,
		"disk = [ 'a' 'b' ]\n":      `c.cfg:1:14: expected ',' or ']' in the list, found '\''`,
		"disk = [ 'a',\n":           `c.cfg:1:8: list not closed`,
		"x = 1 2\n":                 `c.cfg:1:7: x: unexpected '2' after the value`,
		"x = \n":                    `c.cfg:1:5: expected a value`,
		"x = 1.2.3\n":               `c.cfg:1:5: bad number "1.2.3"`,
		"x = 'a\\q'\n":              `c.cfg:1:7: unknown escape \q`,
		"x = \"a\"\nx += [ 'b' ]\n": `c.cfg:2:1: x: += appends a list to a list`,
		"x = " + strings.Repeat("[", 9) + strings.Repeat("]", 9): `lists nested deeper than 8`,
	} {
		_, err := Parse([]byte(src), "c.cfg")
		var e *Error
		if !errors.As(err, &e) || !strings.HasPrefix(err.Error(), want) && !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %s", src, err, want)
		}
	}
}

// Bad vGPU items and values are reported where they were written.
func TestVGPUErrors(t *testing.T) {
	for body, want := range map[string]string{
		`gpuvm = "mode=fv-turbo"`:                `g.cfg:3:10: gpuvm: mode "fv-turbo": have fv-naive`,
		`gpuvm = "mode=fv-lazy, vrm=1GiB"`:       `g.cfg:3:24: gpuvm: unknown item "vrm" (have channels, mode, profile, vram, weight)`,
		`gpuvm = "vram=lots"`:                    `g.cfg:3:10: gpuvm: invalid size "lots"`,
		`gpuvm = "weight=0"`:                     `g.cfg:3:10: gpuvm: weight "0": want 1..10000`,
		`gpuvm = "channels=x"`:                   `g.cfg:3:10: gpuvm: channels "x": want 1..4096`,
		`gpuvm = "mode"`:                         `g.cfg:3:10: gpuvm: "mode": want key=value`,
		`gpuvm = "weight=2,weight=3"`:            `g.cfg:3:19: gpuvm: weight given twice`,
		`gpuvm = 3`:                              `g.cfg:3:9: gpuvm: want a string like`,
		`gpuvm = [ "mode=pvdrm", "mode=pvdrm" ]`: `g.cfg:3:9: gpuvm: one vGPU per domain`,
	} {
		src := "name = \"g\"\ntype = \"hvm\"\n" + body + "\n"
		f, err := Parse([]byte(src), "g.cfg")
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		if _, _, err := f.ReadVGPU(); err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("%s: %v\nwant %s", body, err, want)
		}
	}
	for src, want := range map[string]string{
		"type = \"hvm\"\ngpuvm = \"mode=fv-lazy\"\n":              `g.cfg:2:1: gpuvm: the domain has no name`,
		"name = \"g\"\ngpuvm = \"mode=fv-lazy\"\n":                `g.cfg:2:9: gpuvm: mode fv-lazy traps the vGPU's MMIO to a device model, which needs an hvm or pvh domain`,
		"name = \"g\"\ntype = \"hvm2\"\ngpuvm = \"mode=pvdrm\"\n": `g.cfg:2:8: type: unknown domain type "hvm2"`,
	} {
		f, err := Parse([]byte(src), "g.cfg")
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := f.ReadVGPU(); err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("%q: %v\nwant %s", src, err, want)
		}
	}
	// A pv domain may use pvdrm; a file without the key asks for nothing.
	f, _ := Parse([]byte("name = \"g\"\ngpuvm = 'mode=pvdrm'\n"), "g.cfg")
	if v, ok, err := f.ReadVGPU(); err != nil || !ok || v.Type != "pv" || v.Mode != config.ModePVDRM || v.Weight != 0 {
		t.Errorf("pv pvdrm: %+v %v %v", v, ok, err)
	}
	f, _ = Parse([]byte("name = \"g\"\n"), "g.cfg")
	if _, ok, err := f.ReadVGPU(); ok || err != nil {
		t.Errorf("no gpuvm key: %v %v", ok, err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(guestCfg))
	f.Add([]byte("x = [ [ 1, 'a' ], \"b\" ]; y += [2]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse(data, "f.cfg")
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Pos.Line < 1 || e.Pos.Col < 1 {
				t.Fatalf("error without a place: %v", err)
			}
			return
		}
		_, _, _ = cfg.ReadVGPU()
	})
}
