package main

import (
	"testing"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/config"
)

// TestPinOf: a guest's [[vm]] board wins, then its entry's profile's, then
// the board of the profile its registered settings name; else none.
func TestPinOf(t *testing.T) {
	cfg, err := config.Parse([]byte(`
[[boards]]
name = "fast"
[[boards]]
name = "slow"
[[profile]]
name = "batch"
vram = "128MiB"
board = "slow"
[[profile]]
name = "free"
vram = "128MiB"
[[vm]]
name = "own"
board = "fast"
profile = "batch"
[[vm]]
name = "byprofile"
profile = "batch"
`), "t.toml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, profile, want string
	}{
		{"own", "", "fast"},
		{"byprofile", "", "slow"},
		{"registered", "batch", "slow"},
		{"registered", "free", ""},
		{"registered", "", ""},
		{"registered", "no-such", ""},
	} {
		if got := pinOf(cfg, aggregator.Guest{Name: tc.name, DomID: 9}, tc.profile); got != tc.want {
			t.Errorf("%s with profile %q: pinned to %q, want %q", tc.name, tc.profile, got, tc.want)
		}
	}
}
