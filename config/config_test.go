package config

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

const examplePath = "../examples/gpuvm.toml"

// problems returns the messages of err, one per problem.
func problems(t *testing.T, err error) []string {
	t.Helper()
	if err == nil {
		return nil
	}
	var l ErrorList
	if !errors.As(err, &l) {
		t.Fatalf("error %v (%T) is not an ErrorList", err, err)
	}
	var s []string
	for _, e := range l {
		s = append(s, e.Error())
	}
	return s
}

func TestDefaultValid(t *testing.T) {
	if err := Default().Validate(); err != nil {
		t.Fatalf("Default().Validate() = %v", err)
	}
	c, err := Parse(nil, "empty.toml")
	if err != nil {
		t.Fatalf("Parse(empty) = %v", err)
	}
	c.src = nil
	if !reflect.DeepEqual(c, Default()) {
		t.Errorf("Parse(empty) = %+v, want Default() %+v", c, Default())
	}
}

func TestExampleFile(t *testing.T) {
	c, err := Load(examplePath)
	if err != nil {
		t.Fatalf("Load(%s):\n%v", examplePath, err)
	}
	want := Default()
	want.VMs = []VMConfig{{Name: "guest1", DomID: 1, Mode: ModeFVOptimized, Weight: 1, VRAM: 512 * MiB, Channels: 16,
		BAR1: 15 * MiB, BAR3: 2 * MiB, Profile: "vgpu-512m", Board: "gpu0"}}
	want.Profiles = []ProfileConfig{{Name: "compute-small", Description: "batch jobs: little VRAM, a low share",
		VRAM: 128 * MiB, Channels: 4, BAR1: 4 * MiB, BAR3: 1 * MiB, Weight: 1, Board: "gpu0"}}
	got := c
	got.src = nil
	if !reflect.DeepEqual(got, want) {
		t.Errorf("example config = %+v\nwant %+v", got, want)
	}

	// Every key is in the example, and each has a comment right above it.
	data, err := os.ReadFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	keys := []string{"board", "daemon", "partition", "scheduler", "metrics", "vm", "vm[0]", "profile", "profile[0]"}
	for _, tbl := range []struct {
		prefix string
		v      any
	}{
		{"board", BoardConfig{}}, {"daemon", DaemonConfig{}}, {"partition", PartitionConfig{}},
		{"scheduler", SchedulerConfig{}}, {"metrics", MetricsConfig{}}, {"vm[0]", VMConfig{}}, {"profile[0]", ProfileConfig{}},
	} {
		rt := reflect.TypeOf(tbl.v)
		for i := range rt.NumField() {
			name, _, _ := strings.Cut(rt.Field(i).Tag.Get("toml"), ",")
			keys = append(keys, tbl.prefix+"."+name)
		}
	}
	// The sockets' defaults depend on the user: the example shows them
	// commented out, with the rule above them.
	perUser := map[string]string{"daemon.socket": "# socket = ", "daemon.control_socket": "# control_socket = "}
	for _, k := range keys {
		if prefix, ok := perUser[k]; ok {
			found := false
			for i, l := range lines {
				found = found || strings.HasPrefix(l, prefix) && i > 0 && strings.HasPrefix(lines[i-1], "#")
			}
			if !found {
				t.Errorf("example lacks %q with a comment above it", prefix)
			}
			if _, ok := c.src.pos[k]; ok {
				t.Errorf("example sets %s: a non-root user running the README's commands would need /run/gpuvm", k)
			}
			continue
		}
		p, ok := c.src.pos[k]
		if !ok {
			t.Errorf("example lacks key %s", k)
			continue
		}
		if p.line < 2 || !strings.HasPrefix(lines[p.line-2], "#") {
			t.Errorf("example key %s (line %d) has no comment above it", k, p.line)
		}
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []string
	}{
		{
			name: "syntax",
			in: `[board]
kind = "sim"
channels = = 4
`,
			want: []string{"t.toml:3:12: expected value but found '=' instead"},
		},
		{
			name: "unterminated string",
			in: `[daemon]
socket = "/run/x
`,
			want: []string{"t.toml:2:17: strings cannot contain newlines"},
		},
		{
			name: "duplicate key",
			in: `[daemon]
max_vms = 4
max_vms = 5
`,
			want: []string{"t.toml:3:1: Key 'daemon.max_vms' has already been defined."},
		},
		{
			// The toml package places this on line 2 (it has read the
			// newline); the error is on line 1, at the end of the line.
			name: "missing ] on line 1",
			in:   "[board\nvram = \"1GiB\"\n",
			want: []string{"t.toml:1:7: expected '.' or ']' to end table name, but got '\\n' instead"},
		},
		{
			name: "missing ] of a table array, after blank lines",
			in:   "[board]\n\n\n[[vm]\nname = \"a\"\n",
			want: []string{"t.toml:4:5: expected end of table array name delimiter ']', but got '\\n' instead"},
		},
		{
			name: "missing ] after a BOM and CRLF",
			in:   "\ufeffa = 1\r\n[b\r\n",
			want: []string{"t.toml:2:3: expected '.' or ']' to end table name, but got '\\r' instead"},
		},
		{
			name: "unknown key in second vm",
			in: `[[vm]]
name = "a"
domid = 1

[[vm]]
name = "b"
wieght = 2
`,
			want: []string{`t.toml:7:1: vm[1].wieght: unknown key (did you mean "weight"?)`},
		},
		{
			name: "unknown key in both vms",
			in: `[[vm]]
name = "a"
colour = "red"
[[vm]]
   colour = "blue"
name = "b"
`,
			want: []string{
				"t.toml:3:1: vm[0].colour: unknown key",
				"t.toml:5:4: vm[1].colour: unknown key",
			},
		},
		{
			name: "unknown top-level table",
			in: `[board]
kind = "sim"

[gpu]
x = 1
y.z = 2
`,
			want: []string{"t.toml:4:1: gpu: unknown table"},
		},
		{
			name: "unknown sub-table and keys",
			in: `board.kindd = "sim"
top = 1
[board]
foo.bar = 1
Kind = "pci"
[board.extra]
a = 1
[scheduler.sub]
`,
			want: []string{
				`t.toml:1:1: board.kindd: unknown key (did you mean "kind"?)`,
				`t.toml:2:1: top: unknown key`,
				`t.toml:4:1: board.foo: unknown key`,
				`t.toml:5:1: board.Kind: unknown key (did you mean "kind"?)`,
				`t.toml:6:1: board.extra: unknown table`,
				`t.toml:8:1: scheduler.sub: unknown table`,
			},
		},
		{
			name: "inline vm tables",
			in: `vm = [{name = "a"}, {name = "b", bogus = 1}]
`,
			want: []string{"t.toml:1:34: vm[1].bogus: unknown key"},
		},
		{
			name: "multi-line string hides nothing",
			in: `[daemon]
socket = """
[board]
foo = 1
"""
log_level = '''
x = 1'''
bogus = [
  "a", # [gpu]
  { x = 1 },
]
`,
			want: []string{
				"t.toml:6:13: daemon.log_level: unknown log level \"x = 1\" (want debug, info, warn or error)",
				"t.toml:8:1: daemon.bogus: unknown key",
			},
		},
		{
			name: "type mismatches",
			in: `[board]
channels = "many"
vram = true
mem_partitions = 1.5
timing = 3
[daemon]
socket = ["a"]
[scheduler]
period = 100
watchdog = { a = 1 }
[[vm]]
name = 7
domid = "one"
`,
			want: []string{
				`t.toml:2:12: board.channels: expected an integer, got string "many"`,
				`t.toml:3:8: board.vram: expected a size (integer bytes or a string like "512MiB"), got boolean true`,
				`t.toml:4:18: board.mem_partitions: expected an integer, got float 1.5`,
				`t.toml:5:10: board.timing: expected a string, got integer 3`,
				`t.toml:7:10: daemon.socket: expected a string, got an array`,
				`t.toml:9:10: scheduler.period: integer 100 has no unit: write a duration string like "100ms"`,
				`t.toml:10:12: scheduler.watchdog: expected a duration string like "100ms", got a table`,
				`t.toml:12:8: vm[0].name: expected a string, got integer 7`,
				`t.toml:13:9: vm[0].domid: expected an integer, got string "one"`,
			},
		},
		{
			name: "table of the wrong type",
			in: `board = 5
[vm]
name = "a"
`,
			want: []string{
				"t.toml:1:9: board: expected a table, got integer 5",
				"t.toml:2:1: vm: expected an array of tables ([[vm]]), got a table",
			},
		},
		{
			name: "bad sizes and durations",
			in: `[board]
vram = "6GB"
[partition]
vram_per_vm = -1
reserved = "1.5B"
bar1_per_vm = "99999999999TiB"
[scheduler]
period = "-5ms"
band_wait = "5 parsecs"
`,
			want: []string{
				`t.toml:2:8: board.vram: invalid size "6GB": unknown unit "GB" (use B, KiB, MiB, GiB or TiB)`,
				`t.toml:4:15: partition.vram_per_vm: invalid size -1: negative`,
				`t.toml:5:12: partition.reserved: invalid size "1.5B": not a whole number of bytes`,
				`t.toml:6:15: partition.bar1_per_vm: invalid size "99999999999TiB": overflows 64 bits`,
				`t.toml:8:10: scheduler.period: invalid duration "-5ms": negative`,
				`t.toml:9:13: scheduler.band_wait: invalid duration "5 parsecs": time: unknown unit " parsecs" in duration "5 parsecs"`,
			},
		},
		{
			name: "vram not a multiple of the partitions",
			in: `[board]
vram = "100MiB"
`,
			want: []string{
				"t.toml:2:8: board.vram: vram 100MiB is not a multiple of mem_partitions (6) × 1MiB = 6MiB",
				"t.toml:2:8: board.vram: max_vms (8) × vram_per_vm (512MiB) + reserved (256MiB) = 4352MiB exceeds the board's vram (100MiB)",
			},
		},
		{
			name: "partitions not dividing default vram",
			in: `[board]
mem_partitions = 7
`,
			want: []string{"t.toml:2:18: board.mem_partitions: vram 6GiB is not a multiple of mem_partitions (7) × 1MiB = 7MiB"},
		},
		{
			name: "out of range",
			in: `[board]
vram = "32MiB"
channels = 0
mem_partitions = 17
timing = "slow"
[daemon]
max_vms = 65
log_level = "trace"
[partition]
channels_per_vm = 0
bar1_per_vm = "5000"
bar3_per_vm = 0
reserved = 0
[scheduler]
period = "0"
band_poll = "0s"
timeslice = 0
`,
			want: []string{
				"t.toml:2:8: board.vram: 32MiB is below the minimum 64MiB",
				"t.toml:3:12: board.channels: 0 is out of range 1..128",
				"t.toml:4:18: board.mem_partitions: 17 is out of range 1..16",
				`t.toml:5:10: board.timing: unknown timing model "slow" (want none, fermi, fermi-xen, fermi-small or fermi-x4)`,
				"t.toml:7:11: daemon.max_vms: 65 is out of range 1..64",
				`t.toml:8:13: daemon.log_level: unknown log level "trace" (want debug, info, warn or error)`,
				"t.toml:10:19: partition.channels_per_vm: must be at least 1",
				"t.toml:11:15: partition.bar1_per_vm: 5000 bytes is not a multiple of 4KiB",
				"t.toml:12:15: partition.bar3_per_vm: must be at least 4KiB",
				"t.toml:13:12: partition.reserved: must be at least 1MiB",
				"t.toml:15:10: scheduler.period: must be longer than 0",
				"t.toml:16:13: scheduler.band_poll: must be longer than 0",
				"t.toml:17:13: scheduler.timeslice: must be longer than 0",
			},
		},
		{
			name: "vram too large for the VMs",
			in: `[board]
vram = "4GiB"
mem_partitions = 4
[daemon]
max_vms = 8
[partition]
reserved = "1GiB"
`,
			want: []string{
				"t.toml:5:11: daemon.max_vms: max_vms (8) × vram_per_vm (512MiB) + reserved (1GiB) = 5GiB exceeds the board's vram (4GiB)",
			},
		},
		{
			name: "partition exceeds board",
			in: `[daemon]
max_vms = 16
[partition]
vram_per_vm = "512MiB"
channels_per_vm = 16
bar1_per_vm = "16MiB"
bar3_per_vm = "1MiB"
`,
			want: []string{
				"t.toml:4:15: partition.vram_per_vm: max_vms (16) × vram_per_vm (512MiB) + reserved (256MiB) = 8448MiB exceeds the board's vram (6GiB)",
				"t.toml:5:19: partition.channels_per_vm: max_vms (16) × channels_per_vm (16) exceeds the board's 128 channels",
				"t.toml:6:15: partition.bar1_per_vm: max_vms (16) × bar1_per_vm (16MiB) = 256MiB exceeds the 128MiB BAR1 aperture less the aggregator's 512KiB poll area",
			},
		},
		{
			name: "overflowing partition",
			in: `[board]
vram = "64GiB"
mem_partitions = 16
[partition]
vram_per_vm = "16777215TiB"
`,
			want: []string{
				"t.toml:5:15: partition.vram_per_vm: max_vms (8) × vram_per_vm (16777215TiB) + reserved (256MiB) = more than 2^64 bytes exceeds the board's vram (64GiB)",
			},
		},
		{
			name: "pci without address",
			in: `[board]
kind = "pci"
vram = "6GiB"
`,
			want: []string{
				`t.toml:2:8: board.kind: pci_address is required when kind = "pci"`,
				`t.toml:3:8: board.vram: only used when kind = "sim" (a PCI board reports its own VRAM size)`,
			},
		},
		{
			name: "pci address checks",
			in: `[board]
kind = "pcie"
pci_address = "01:00.0"
`,
			want: []string{
				`t.toml:2:8: board.kind: unknown board kind "pcie" (want sim or pci)`,
				`t.toml:3:15: board.pci_address: only used when kind = "pci" (kind is "pcie")`,
			},
		},
		{
			name: "bad pci address",
			in: `[board]
kind = "pci"
pci_address = "0000:01:20.0"
`,
			want: []string{`t.toml:3:15: board.pci_address: "0000:01:20.0" is not a PCI address (want domain:bus:device.function, e.g. 0000:01:00.0)`},
		},
		{
			name: "sockets",
			in: `[daemon]
socket = "/run/gpuvm/x.sock"
control_socket = "/run/gpuvm/x.sock"
[partition]
`,
			want: []string{`t.toml:3:18: daemon.control_socket: control_socket and socket are the same path "/run/gpuvm/x.sock"`},
		},
		{
			name: "scheduler",
			in: `[scheduler]
policy = "lottery"
band_wait = "10us"
band_poll = "50us"
`,
			want: []string{
				`t.toml:2:10: scheduler.policy: unknown policy "lottery" (want one of fifo, credit, band, wfq, timeslice, dfq, strict)`,
				`t.toml:4:13: scheduler.band_poll: band_poll (50µs) is longer than band_wait (10µs)`,
			},
		},
		{
			name: "vm entries",
			in: `[[vm]]
name = "a"
domid = 1
mode = "fv-fast"

[[vm]]
weight = 2

[[vm]]
name = "a"
domid = 1
weight = 0
vram = "1GiB"
channels = 17

[[vm]]
name = ""
domid = 0

[[vm]]
domid = 40000
vram = 0
channels = 0
`,
			want: []string{
				`t.toml:4:8: vm[0].mode: unknown mode "fv-fast"; this build serves fv-naive, fv-bar-remap, fv-lazy, fv-optimized, fv-incremental, pv-naive, pv-multicall, pvdrm, pvdrm-pooling`,
				`t.toml:6:1: vm[1]: needs a name or a domid to match a VM`,
				`t.toml:10:8: vm[2].name: duplicate name "a" (also in vm[0] at line 2)`,
				`t.toml:11:9: vm[2].domid: duplicate domid 1 (also in vm[0] at line 3)`,
				`t.toml:12:10: vm[2].weight: 0 is below 1`,
				`t.toml:13:8: vm[2].vram: 1GiB exceeds partition vram_per_vm (512MiB)`,
				`t.toml:14:12: vm[2].channels: 17 exceeds partition channels_per_vm (16)`,
				`t.toml:17:8: vm[3].name: must not be empty (leave it out to match by domid only)`,
				`t.toml:18:9: vm[3].domid: domid 0 is dom0, which cannot have a vGPU`,
				`t.toml:21:9: vm[4].domid: 40000 is out of range 1..32751`,
				`t.toml:22:8: vm[4].vram: must be at least 1MiB`,
				`t.toml:23:12: vm[4].channels: 0 is below 1 (leave it out for the full channels_per_vm)`,
			},
		},
		{
			name: "decode failure suppresses dependent checks",
			in: `[board]
mem_partitions = "six"
[daemon]
max_vms = "many"
`,
			want: []string{
				`t.toml:2:18: board.mem_partitions: expected an integer, got string "six"`,
				`t.toml:4:11: daemon.max_vms: expected an integer, got string "many"`,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.in), "t.toml")
			got := problems(t, err)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Parse problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

func TestErrorDetails(t *testing.T) {
	_, err := Parse([]byte("[board]\nvram = \"6GB\"\nchannels = = 1\n"), "x.toml")
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("no *Error in %v", err)
	}
	var pe toml.ParseError
	if !errors.As(err, &pe) || pe.Position.Line != 3 {
		t.Errorf("syntax error does not wrap the toml.ParseError: %v", err)
	}

	_, err = Parse([]byte("[board]\nvram = \"6GB\"\n"), "x.toml")
	if !errors.As(err, &e) || e.File != "x.toml" || e.Line != 2 || e.Col != 8 || e.Key != "board.vram" || e.Err == nil {
		t.Errorf("size error = %#v", e)
	}
}

func TestValidateWithoutFile(t *testing.T) {
	c := Default()
	c.Partition.Reserved = 3 * GiB
	c.Scheduler.Policy = "nope"
	c.VMs = []VMConfig{{Name: "a", Mode: ModeFVLazy, Weight: 1}, {DomID: 3, Mode: "x", Weight: 1}, {Mode: ModeFVNaive, Weight: 1}}
	got := problems(t, c.Validate())
	want := []string{
		"partition.vram_per_vm: max_vms (8) × vram_per_vm (512MiB) + reserved (3GiB) = 7GiB exceeds the board's vram (6GiB)",
		`scheduler.policy: unknown policy "nope" (want one of fifo, credit, band, wfq, timeslice, dfq, strict)`,
		`vm[1].mode: unknown mode "x"; this build serves fv-naive, fv-bar-remap, fv-lazy, fv-optimized, fv-incremental, pv-naive, pv-multicall, pvdrm, pvdrm-pooling`,
		"vm[2]: needs a name or a domid to match a VM",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Validate problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// A value changed after parsing keeps its key's position; a value
	// coming from the defaults has none, but keeps the file name.
	c, err := Parse([]byte("[daemon]\nmax_vms = 4\n"), "f.toml")
	if err != nil {
		t.Fatal(err)
	}
	c.Daemon.MaxVMs = 0
	c.Board.Channels = 0
	got = problems(t, c.Validate())
	want = []string{
		"f.toml:2:11: daemon.max_vms: 0 is out of range 1..64",
		"f.toml: board.channels: 0 is out of range 1..128",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Validate problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestLoadMissing(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.toml"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load(missing) = %v, want ErrNotExist", err)
	}
}

func TestKeysInsideValues(t *testing.T) {
	// Dotted keys, quoted keys, inline tables and nested arrays of tables
	// are located correctly.
	in := `board.channels = 64
"daemon".'max_vms' = 4
[partition]
  vram_per_vm = 1073741824 # bytes
[[vm]]
name = "a"
[[vm]]
name = "b"
[vm.extra]
q = 1
[[vm]]
name = "c"
`
	c, err := Parse([]byte(in), "k.toml")
	got := problems(t, err)
	want := []string{"k.toml:9:1: vm[1].extra: unknown table"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if c.Board.Channels != 64 || c.Daemon.MaxVMs != 4 || c.Partition.VRAMPerVM != GiB || len(c.VMs) != 3 || c.VMs[2].Name != "c" {
		t.Errorf("decoded %+v", c)
	}
	wantPos := map[string]position{
		"board.channels":        {line: 1, col: 1, valCol: 18},
		"daemon.max_vms":        {line: 2, col: 1, valCol: 22},
		"partition.vram_per_vm": {line: 4, col: 3, valCol: 17},
		"vm[0]":                 {line: 5, col: 1, header: true},
		"vm[1].name":            {line: 8, col: 1, valCol: 8},
		"vm[1].extra.q":         {line: 10, col: 1, valCol: 5},
		"vm[2]":                 {line: 11, col: 1, header: true},
	}
	for k, w := range wantPos {
		if p := c.src.pos[k]; p != w {
			t.Errorf("position of %s = %+v, want %+v", k, p, w)
		}
	}
}

func TestRoundTrip(t *testing.T) {
	// A Config encoded with BurntSushi/toml parses back to itself, and the
	// typed fields decode with toml.Decode directly too.
	c := Default()
	c.VMs = []VMConfig{{Name: "g", DomID: 7, Mode: ModeFVIncremental, Weight: 3, VRAM: 256 * MiB, Channels: 4}}
	c.Scheduler.Watchdog = Duration{}
	var buf bytes.Buffer
	if err := toml.NewEncoder(&buf).Encode(c); err != nil {
		t.Fatal(err)
	}
	back, err := Parse(buf.Bytes(), "enc.toml")
	if err != nil {
		t.Fatalf("Parse(encoded):\n%v\n%s", err, buf.String())
	}
	back.src = nil
	if !reflect.DeepEqual(back, c) {
		t.Errorf("round trip = %+v\nwant %+v\n%s", back, c, buf.String())
	}

	var direct Config
	if _, err := toml.Decode("[board]\nvram = 1073741824\n[scheduler]\nperiod = \"1s\"\n", &direct); err != nil {
		t.Fatal(err)
	}
	if direct.Board.VRAM != GiB || direct.Scheduler.Period.Duration != time.Second {
		t.Errorf("toml.Decode into Config = %+v", direct)
	}
}

func TestLookupVM(t *testing.T) {
	c := Default()
	c.VMs = []VMConfig{
		{Name: "a", Mode: ModeFVNaive, Weight: 2, VRAM: 128 * MiB},
		{DomID: 5, Mode: ModeFVLazy, Weight: 1, Channels: 2},
	}
	tests := []struct {
		name  string
		domid int
		want  VMConfig
	}{
		{"a", 9, VMConfig{Name: "a", Mode: ModeFVNaive, Weight: 2, VRAM: 128 * MiB, Channels: 16, BAR1: 15 * MiB, BAR3: 2 * MiB}},
		{"x", 5, VMConfig{DomID: 5, Mode: ModeFVLazy, Weight: 1, VRAM: 512 * MiB, Channels: 2, BAR1: 15 * MiB, BAR3: 2 * MiB}},
		{"x", 6, VMConfig{Mode: ModeFVOptimized, Weight: 1, VRAM: 512 * MiB, Channels: 16, BAR1: 15 * MiB, BAR3: 2 * MiB}},
		{"", 0, VMConfig{Mode: ModeFVOptimized, Weight: 1, VRAM: 512 * MiB, Channels: 16, BAR1: 15 * MiB, BAR3: 2 * MiB}},
	}
	for _, tt := range tests {
		if got := c.LookupVM(tt.name, tt.domid); got != tt.want {
			t.Errorf("LookupVM(%q, %d) = %+v, want %+v", tt.name, tt.domid, got, tt.want)
		}
	}
}

func TestNames(t *testing.T) {
	for _, m := range ModeNames() {
		if !Mode(m).Valid() {
			t.Errorf("mode %q not valid", m)
		}
	}
	for _, p := range PolicyNames() {
		if !Policy(p).Valid() {
			t.Errorf("policy %q not valid", p)
		}
	}
	if len(ModeNames()) != 9 || len(PolicyNames()) != 7 || Mode("fv").Valid() || Policy("").Valid() {
		t.Error("mode or policy list wrong")
	}
	// The returned slices are copies.
	ModeNames()[0] = "x"
	if ModeNames()[0] != "fv-naive" {
		t.Error("ModeNames shares state")
	}
}

func TestCRLFAndBOM(t *testing.T) {
	in := "\xef\xbb\xbf[board]\r\nchannels = 128\r\nbogus = 1 # c\r\n[[vm]]\r\nname = \"a\"\r\nmode = \"x\"\r\n"
	_, err := Parse([]byte(in), "w.toml")
	got := problems(t, err)
	want := []string{
		"w.toml:3:1: board.bogus: unknown key",
		`w.toml:6:8: vm[0].mode: unknown mode "x"; this build serves fv-naive, fv-bar-remap, fv-lazy, fv-optimized, fv-incremental, pv-naive, pv-multicall, pvdrm, pvdrm-pooling`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestLimitsMatchBoard(t *testing.T) {
	if MaxChannels != nvc0.MaxChannels || MaxMemPartitions != nvc0.MaxMemPartitions ||
		BAR1Aperture != nvc0.BAR1Size || BAR3Aperture != nvc0.BAR3Size {
		t.Error("config limits differ from gpu/nvc0")
	}
}

func TestSchedulerNEONParameters(t *testing.T) {
	c, err := Parse([]byte("[scheduler]\npolicy = \"dfq\"\nsample_time = \"2ms\"\nsample_requests = 8\nfree_run_factor = 3\npoll = \"500us\"\n"), "s.toml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Scheduler.SampleTime.Duration != 2*time.Millisecond || c.Scheduler.SampleRequests != 8 || c.Scheduler.FreeRunFactor != 3 || c.Scheduler.Poll.Duration != 500*time.Microsecond {
		t.Errorf("scheduler = %+v", c.Scheduler)
	}
	_, err = Parse([]byte("[scheduler]\nsample_requests = 0\nfree_run_factor = 5000\n"), "s.toml")
	for _, want := range []string{"s.toml:2:19: scheduler.sample_requests: 0 is outside 1..1048576", "s.toml:3:19: scheduler.free_run_factor: 5000 is outside 1..1000"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
}

// A [[vm]] mode the daemon cannot serve is refused at load time, with its
// position and the modes this build serves, instead of passing the checks
// and having every such VM refused when it connects.
func TestModesTheBuildCannotServe(t *testing.T) {
	served := "fv-naive, fv-bar-remap, fv-lazy, fv-optimized, fv-incremental, pv-naive, pv-multicall, pvdrm, pvdrm-pooling"
	for mode, want := range map[string]string{
		"pvdrm-turbo": `m.toml:3:8: vm[0].mode: unknown mode "pvdrm-turbo"; this build serves ` + served,
		"native":      `m.toml:3:8: vm[0].mode: mode "native" is the baseline without virtualization (gpuvm bench --mode native); the daemon serves VMs in ` + served,
	} {
		_, err := Parse([]byte("[[vm]]\nname = \"g\"\nmode = \""+mode+"\"\n"), "m.toml")
		if got := problems(t, err); len(got) != 1 || got[0] != want {
			t.Errorf("mode %s: problems %q\nwant %q", mode, got, want)
		}
	}
	for _, m := range ModeNames() {
		if _, err := Parse([]byte("[[vm]]\nname = \"g\"\nmode = \""+m+"\"\n"), "m.toml"); err != nil {
			t.Errorf("mode %s refused: %v", m, err)
		}
	}
}

func TestConfiguredMode(t *testing.T) {
	c, err := Parse([]byte("[[vm]]\nname = \"a\"\nmode = \"fv-naive\"\n[[vm]]\ndomid = 5\nweight = 2\n"), "m.toml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name  string
		domid int
		want  Mode
	}{
		{"a", 0, ModeFVNaive},
		{"x", 5, ""}, // an entry without a mode key leaves the choice to the device model
		{"x", 6, ""},
		{"", 0, ""},
	} {
		if got := c.ConfiguredMode(tt.name, tt.domid); got != tt.want {
			t.Errorf("ConfiguredMode(%q, %d) = %q, want %q", tt.name, tt.domid, got, tt.want)
		}
	}
	c.src = nil // built in code: every entry's mode is set
	if got := c.ConfiguredMode("x", 5); got != ModeFVOptimized {
		t.Errorf("ConfiguredMode without a file = %q", got)
	}
}

func TestDefaultSocketDir(t *testing.T) {
	d := DefaultSocketDir()
	if os.Geteuid() == 0 {
		if d != "/run/gpuvm" {
			t.Errorf("root: %s", d)
		}
		return
	}
	t.Setenv("XDG_RUNTIME_DIR", "/run/user/4242")
	if d := DefaultSocketDir(); d != "/run/user/4242/gpuvm" {
		t.Errorf("with XDG_RUNTIME_DIR: %s", d)
	}
	t.Setenv("XDG_RUNTIME_DIR", "")
	if d := DefaultSocketDir(); d != filepath.Join(os.TempDir(), fmt.Sprintf("gpuvm-%d", os.Geteuid())) {
		t.Errorf("without XDG_RUNTIME_DIR: %s", d)
	}
	if c := Default(); filepath.Dir(c.Daemon.Socket) != DefaultSocketDir() || c.Validate() != nil {
		t.Errorf("Default sockets %s, %s", c.Daemon.Socket, c.Daemon.ControlSocket)
	}
}

func TestBoards(t *testing.T) {
	c, err := Parse([]byte(`[board]
timing = "fermi"
[daemon]
max_vms = 4
[partition]
vram_per_vm = "256MiB"
channels_per_vm = 8
reserved = "128MiB"
[[boards]]
name = "fast"
[[boards]]
name = "slow"
vram = "1GiB"
mem_partitions = 4
timing = "fermi-xen"
max_vms = 2
`), "t.toml")
	if err != nil {
		t.Fatal(err)
	}
	all := c.AllBoards()
	if len(all) != 2 {
		t.Fatalf("%d boards", len(all))
	}
	if b := all[0]; b.Name != "fast" || b.VRAM != 6*GiB || b.Timing != TimingFermi || b.MaxVMs != 4 || b.Channels != 128 {
		t.Errorf("fast = %+v: want [board]'s values and daemon.max_vms", b)
	}
	if b := all[1]; b.Name != "slow" || b.VRAM != GiB || b.MemPartitions != 4 || b.Timing != TimingFermiXen || b.MaxVMs != 2 {
		t.Errorf("slow = %+v", b)
	}
	if _, ok := c.LookupBoard("slow"); !ok {
		t.Error("LookupBoard(slow) not found")
	}
	if got := Default().AllBoards(); len(got) != 1 || got[0].Name != "gpu0" || got[0].VRAM != 6*GiB || got[0].MaxVMs != 8 {
		t.Errorf("default boards = %+v", got)
	}
}

func TestBoardsErrors(t *testing.T) {
	for name, tc := range map[string]struct{ in, want string }{
		"duplicate name": {"[[boards]]\nname = \"a\"\n[[boards]]\nname = \"a\"\n", `t.toml:4:8: boards[1].name: board name "a" is also board 0's`},
		"bad name":       {"[[boards]]\nname = \"A B\"\n", `t.toml:2:8: boards[0].name: board name "A B"`},
		"written zero":   {"[[boards]]\nvram = 0\n", "t.toml:2:8: boards[0].vram: must not be empty or 0"},
		"too small": {"[[boards]]\nname = \"small\"\nvram = \"1536MiB\"\n",
			`t.toml:3:8: boards[0].vram: board "small": max_vms (8) × vram_per_vm (512MiB) + reserved (256MiB) = 4352MiB exceeds its vram (1536MiB)`},
		"channels":    {"[[boards]]\nchannels = 64\n", `t.toml:2:12: boards[0].channels: board "gpu0": max_vms (8) × channels_per_vm (16) exceeds its 64 channels`},
		"unknown key": {"[[boards]]\nvarm = \"1GiB\"\n", `t.toml:2:1: boards[0].varm: unknown key (did you mean "vram"?)`},
		"timing":      {"[[boards]]\ntiming = \"fast\"\n", `t.toml:2:10: boards[0].timing: unknown timing model "fast"`},
		"placement":   {"[daemon]\nplacement = \"random\"\n", `t.toml:2:13: daemon.placement: unknown placement "random" (want spread or pack)`},
		"vm pin":      {"[[boards]]\nname = \"a\"\n[[vm]]\nname = \"g\"\nboard = \"b\"\n", `t.toml:5:9: vm[0].board: no board "b" (have a)`},
		"profile pin": {"[[boards]]\nname = \"a\"\n[[profile]]\nname = \"p\"\nboard = \"b\"\n", `t.toml:5:9: profile[0].board: no board "b" (have a)`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(tc.in), "t.toml")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err:\n%v\nwant it to contain:\n%s", err, tc.want)
			}
		})
	}
}

// TestTimingValid: every timing model the configuration names is valid,
// fermi-x4 (a board in a PCIe 2.0 x4 slot) among them, and nothing else.
func TestTimingValid(t *testing.T) {
	for _, tm := range []Timing{TimingNone, TimingFermi, TimingFermiXen, TimingFermiSmall, TimingFermiX4} {
		if !tm.Valid() {
			t.Errorf("%q not valid", tm)
		}
	}
	for _, tm := range []Timing{"", "x4", "fermi-x8", "FERMI"} {
		if tm.Valid() {
			t.Errorf("%q valid", tm)
		}
	}
	c, err := Parse([]byte("[[boards]]\nname = \"fast\"\ntiming = \"fermi\"\n[[boards]]\nname = \"slot-x4\"\ntiming = \"fermi-x4\"\n"), "t.toml")
	if err != nil {
		t.Fatal(err)
	}
	if all := c.AllBoards(); len(all) != 2 || all[1].Timing != TimingFermiX4 {
		t.Errorf("boards = %+v", all)
	}
}

// TestProfilePinsBoard: a [[vm]] entry that names a profile with a board
// and no board of its own is pinned to the profile's; its own board wins.
func TestProfilePinsBoard(t *testing.T) {
	c, err := Parse([]byte(`
[[boards]]
name = "fast"
[[boards]]
name = "slow"
[[profile]]
name = "batch"
board = "slow"
[[vm]]
name = "follows"
profile = "batch"
[[vm]]
name = "own"
profile = "batch"
board = "fast"
[[vm]]
name = "free"
`), "t.toml")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"follows": "slow", "own": "fast", "free": ""} {
		if got := c.LookupVM(name, 0).Board; got != want {
			t.Errorf("%s: pinned to %q, want %q", name, got, want)
		}
	}
}
