package config

import (
	"time"
)

// Load balancing by moves ([daemon] balance, package host's balance.go): an
// optional policy that moves fully virtualized vGPUs from the busiest board
// to the least loaded one with a free slot when their loads (the share of
// each board's time its vGPUs used over the last 2 s) differ by more than
// balance_threshold at two looks in a row, balance_interval apart; a vGPU
// moved stays where it went for balance_hold.

// Balance policies ([daemon] balance).
const (
	// BalanceOff moves nothing (the default).
	BalanceOff = "off"
	// BalanceLoad moves vGPUs off the busiest board.
	BalanceLoad = "load"
)

// Balancer defaults ([daemon] balance_interval, balance_threshold,
// balance_hold).
const (
	// DefaultBalanceInterval is how often the balancer looks: half the
	// 2 s window loads are measured over, so a gap must hold for a whole
	// window's worth of looks.
	DefaultBalanceInterval = time.Second
	// DefaultBalanceThreshold is the load gap that starts a move: a
	// quarter of a board's time, five of placement's 5 % steps.
	DefaultBalanceThreshold = 0.25
	// DefaultBalanceHold is how long a moved vGPU stays where it went:
	// ten looks, five load windows.
	DefaultBalanceHold = 10 * time.Second
	// MinBalanceInterval bounds balance_interval below: each look reads
	// every board's scheduler accounts.
	MinBalanceInterval = 10 * time.Millisecond
)

// validateBalance checks the balance keys of [daemon].
func (c Config) validateBalance(v *validator) {
	d := c.Daemon
	if v.ok("daemon.balance") && d.Balance != BalanceOff && d.Balance != BalanceLoad {
		v.errorf([]string{"daemon.balance"}, "unknown balance policy %q (want off or load)", d.Balance)
	}
	intervalOK := v.ok("daemon.balance_interval")
	if intervalOK && d.BalanceInterval.Duration < MinBalanceInterval {
		v.errorf([]string{"daemon.balance_interval"}, "%s: must be at least %s", d.BalanceInterval, Duration{MinBalanceInterval})
		intervalOK = false
	}
	if t := d.BalanceThreshold; v.ok("daemon.balance_threshold") && !(t > 0 && t < 1) {
		v.errorf([]string{"daemon.balance_threshold"}, "%v is outside 0..1 (exclusive): a share of a board's time, e.g. 0.25", t)
	}
	if intervalOK && v.ok("daemon.balance_hold") && d.BalanceHold.Duration < d.BalanceInterval.Duration {
		v.errorf([]string{"daemon.balance_hold", "daemon.balance_interval"},
			"balance_hold %s is shorter than balance_interval %s: a moved vGPU would be free to move back at the next look",
			d.BalanceHold, d.BalanceInterval)
	}
	if d.Balance == BalanceLoad && d.Placement == "pack" && v.ok("daemon.balance", "daemon.placement") {
		v.errorf([]string{"daemon.balance", "daemon.placement"},
			`balance = "load" spreads vGPUs over the boards that placement = "pack" keeps empty: choose one`)
	}
}

// setFloat stores a TOML number (a float, or an integer).
func setFloat(p *float64) func(any) error {
	return func(v any) error {
		switch x := v.(type) {
		case float64:
			*p = x
		case int64:
			*p = float64(x)
		default:
			return typeError("a number", v)
		}
		return nil
	}
}
