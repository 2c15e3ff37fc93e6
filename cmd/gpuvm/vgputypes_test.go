package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/gpuvm/gpuvm/aggregator"
)

// TestVGPUTypes: `gpuvm vgpu types` lists the configured and built-in
// profiles with how many more fit, as a table and as JSON.
func TestVGPUTypes(t *testing.T) {
	dir := t.TempDir()
	sock, ctl := dir+"/agg.sock", dir+"/ctl.sock"
	conf := daemonConfig(t, dir, sock, ctl, `[[profile]]
name = "compute-small"
description = "batch jobs"
vram = "64MiB"
channels = 2
weight = 1
`)
	d := startDaemon(t, conf, ctl)
	defer d.stop(t)
	out, _, err := runApp(t, "vgpu", "types", "--control-socket", ctl)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[0], "NAME ") || !strings.Contains(lines[0], "AVAILABLE") {
		t.Fatalf("table:\n%s", out)
	}
	if f := strings.Fields(lines[1]); f[0] != "compute-small" || f[1] != "64MiB" || f[6] != "2" {
		t.Errorf("compute-small row %q", lines[1])
	}
	out, _, err = runApp(t, "vgpu", "types", "--json", "--control-socket", ctl)
	if err != nil {
		t.Fatal(err)
	}
	var types []aggregator.TypeInfo
	if err := json.Unmarshal([]byte(out), &types); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var names []string
	for _, ty := range types {
		names = append(names, ty.Name)
	}
	if strings.Join(names, " ") != "compute-small vgpu-256m vgpu-128m vgpu-64m" || types[1].Weight != 4 || types[1].Available != 2 {
		t.Errorf("types %+v", types)
	}
}
