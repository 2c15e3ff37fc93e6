package config

import (
	"strings"
	"testing"
	"time"
)

func TestBalanceKeys(t *testing.T) {
	c, err := Parse([]byte("[daemon]\nbalance = \"load\"\nbalance_interval = \"500ms\"\nbalance_threshold = 0.3\nbalance_hold = \"30s\"\n"), "t.toml")
	if err != nil {
		t.Fatal(err)
	}
	d := c.Daemon
	if d.Balance != BalanceLoad || d.BalanceInterval.Duration != 500*time.Millisecond || d.BalanceThreshold != 0.3 || d.BalanceHold.Duration != 30*time.Second {
		t.Errorf("daemon = %+v", d)
	}
	if d := Default().Daemon; d.Balance != BalanceOff || d.BalanceThreshold != DefaultBalanceThreshold {
		t.Errorf("default daemon = %+v", d)
	}
}

func TestBalanceErrors(t *testing.T) {
	for name, tc := range map[string]struct{ in, want string }{
		"policy":         {"[daemon]\nbalance = \"random\"\n", `t.toml:2:11: daemon.balance: unknown balance policy "random" (want off or load)`},
		"interval":       {"[daemon]\nbalance_interval = \"1ms\"\n", `t.toml:2:20: daemon.balance_interval: 1ms: must be at least 10ms`},
		"threshold":      {"[daemon]\nbalance_threshold = 1\n", `t.toml:2:21: daemon.balance_threshold: 1 is outside 0..1 (exclusive)`},
		"zero threshold": {"[daemon]\nbalance_threshold = 0.0\n", `t.toml:2:21: daemon.balance_threshold: 0 is outside 0..1`},
		"threshold type": {"[daemon]\nbalance_threshold = \"high\"\n", `t.toml:2:21: daemon.balance_threshold: expected a number, got string "high"`},
		"hold":           {"[daemon]\nbalance_interval = \"2s\"\nbalance_hold = \"1s\"\n", `t.toml:3:16: daemon.balance_hold: balance_hold 1s is shorter than balance_interval 2s`},
		"pack":           {"[daemon]\nplacement = \"pack\"\nbalance = \"load\"\n", `t.toml:3:11: daemon.balance: balance = "load" spreads vGPUs over the boards that placement = "pack" keeps empty`},
		"unknown key":    {"[daemon]\nbalance_treshold = 0.3\n", `t.toml:2:1: daemon.balance_treshold: unknown key (did you mean "balance_threshold"?)`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(tc.in), "t.toml")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err:\n%v\nwant it to contain:\n%s", err, tc.want)
			}
		})
	}
}
