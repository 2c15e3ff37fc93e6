package config

import (
	"path/filepath"
	"reflect"
	"testing"
)

// packagedPath is the configuration the Debian package and scripts/install
// ship as /etc/gpuvm/gpuvm.toml.
const packagedPath = "../packaging/gpuvm.toml"

// TestPackagedConfig: the shipped /etc/gpuvm/gpuvm.toml loads and
// validates, spells out the built-in defaults (so installing it changes
// nothing but making them editable), and puts both sockets in the
// directory gpuvm.service creates (RuntimeDirectory=gpuvm).
func TestPackagedConfig(t *testing.T) {
	c, err := Load(packagedPath)
	if err != nil {
		t.Fatalf("Load(%s):\n%v", packagedPath, err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("%s does not validate:\n%v", packagedPath, err)
	}
	for _, s := range []string{c.Daemon.Socket, c.Daemon.ControlSocket} {
		if filepath.Dir(s) != "/run/gpuvm" {
			t.Errorf("socket %s is not in /run/gpuvm, gpuvm.service's RuntimeDirectory", s)
		}
	}

	want := Default()
	want.Daemon.Socket, want.Daemon.ControlSocket = "/run/gpuvm/gpuvm.sock", "/run/gpuvm/control.sock"
	got := c
	got.src = nil
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s differs from the built-in defaults:\n got %+v\nwant %+v", packagedPath, got, want)
	}
}
