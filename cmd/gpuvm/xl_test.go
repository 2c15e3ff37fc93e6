package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestXLConfigRestarts: a domain that would come back after a reboot or a
// crash comes back without its vGPU, so gpuvm xl create refuses a
// configured restart (file:line:col) and overrides xl's default on_reboot.
func TestXLConfigRestarts(t *testing.T) {
	dir := t.TempDir()
	write := func(body string) string {
		p := filepath.Join(dir, "guest.cfg")
		if err := os.WriteFile(p, []byte("name = \"g\"\ntype = \"pvh\"\nmemory = 256\ngpuvm = \"mode=pv-multicall\"\n"+body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, c := range []struct{ body, want string }{
		{"on_reboot = \"restart\"\n", "guest.cfg:5:13: on_reboot"},
		{"on_crash = \"rename-restart\"\n", "guest.cfg:5:12: on_crash"},
		{"on_watchdog = \"restart\"\n", "guest.cfg:5:15: on_watchdog"},
	} {
		_, err := readXLConfig(write(c.body))
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "without its vGPU") {
			t.Errorf("%q: error %v, want one at %s", c.body, err, c.want)
		}
	}
	d, err := readXLConfig(write(""))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(d.overrides, `on_reboot="destroy"`) {
		t.Errorf("xl's default on_reboot kept: overrides %v", d.overrides)
	}
	d, err = readXLConfig(write("on_reboot = \"destroy\"\non_crash = \"preserve\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(d.overrides) != 0 {
		t.Errorf("overrides %v for a config that destroys on reboot", d.overrides)
	}
}
