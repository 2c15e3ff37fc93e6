package config

import (
	"strings"
	"testing"
)

// TestOvercommitKeys: overcommit is inherited by [[boards]] entries, and
// bad values are refused with their key.
func TestOvercommitKeys(t *testing.T) {
	c, err := Parse([]byte(`
[board]
overcommit = 2
[[boards]]
name = "a"
[[boards]]
name = "b"
overcommit = 1.5
`), "t.toml")
	if err != nil {
		t.Fatal(err)
	}
	bs := c.AllBoards()
	if bs[0].Overcommit != 2 || bs[1].Overcommit != 1.5 {
		t.Fatalf("overcommit %v, %v; want 2 (inherited), 1.5", bs[0].Overcommit, bs[1].Overcommit)
	}
	if d := c.Daemon; d.EvictIdle.Duration != DefaultEvictIdle || d.RestoreWait.Duration != DefaultRestoreWait || d.MinResidency.Duration != DefaultMinResidency {
		t.Fatalf("eviction defaults: %+v", d)
	}
	for _, bad := range []struct{ doc, want string }{
		{"[board]\novercommit = 0.5\n", "board.overcommit"},
		{"[board]\novercommit = 9\n", "board.overcommit"},
		{"[[boards]]\nname = \"a\"\novercommit = 0\n", "boards[0].overcommit"},
		{"[daemon]\nevict_idle = \"0s\"\n", "daemon.evict_idle"},
		{"[daemon]\nrestore_wait = \"1ms\"\n", "daemon.restore_wait"},
		{"[board]\nkind = \"pci\"\npci_address = \"0000:01:00.0\"\novercommit = 2\n", "overcommit"},
	} {
		_, err := Parse([]byte(bad.doc), "t.toml")
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: %v, want an error naming %s", bad.doc, err, bad.want)
		}
	}
}
