//go:build linux && (amd64 || arm64)

package pvdrm

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/xen/xenbus"
)

// TestXenBackWatch: a front end fails when its back end leaves Connected,
// when the back end's directory cannot be read twice running (but not
// when xenstored is only slow), and when a handoff mark stays longer than
// the bound it names; a mark that goes in time, or comes back later, is
// counted afresh.
func TestXenBackWatch(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ok := xenBackLook{state: xenbus.StateConnected}
	marked := xenBackLook{state: xenbus.StateConnected, handingOff: true, mark: xenbus.HandoffMark{Within: 2 * time.Minute, ID: "1"}}
	remarked := marked
	remarked.mark.ID = "2"
	unreadable := xenBackLook{stateErr: errors.New("EACCES")}
	slow := xenBackLook{stateErr: errors.New("deadline"), timedOut: true}
	for _, c := range []struct {
		name  string
		looks []xenBackLook
		at    []time.Duration // each look's time after t0
		want  string          // the last look's error ("" none)
	}{
		{"connected", []xenBackLook{ok, ok}, []time.Duration{0, time.Second}, ""},
		{"closed", []xenBackLook{ok, {state: xenbus.StateClosing}}, []time.Duration{0, time.Second}, "left the device (Closing)"},
		{"unreadable once", []xenBackLook{unreadable, ok, unreadable}, []time.Duration{0, time.Second, 2 * time.Second}, ""},
		{"unreadable twice", []xenBackLook{unreadable, unreadable}, []time.Duration{0, time.Second}, "cannot be read"},
		{"slow", []xenBackLook{slow, slow, slow}, []time.Duration{0, time.Second, 2 * time.Second}, ""},
		{"taken over in time", []xenBackLook{marked, marked, ok}, []time.Duration{0, 119 * time.Second, 120 * time.Second}, ""},
		{"never taken over", []xenBackLook{ok, marked, marked}, []time.Duration{0, time.Second, 122 * time.Second}, "none took it over within 2m0s"},
		{"a second handoff counts afresh", []xenBackLook{marked, ok, marked, marked}, []time.Duration{0, 60 * time.Second, 100 * time.Second, 200 * time.Second}, ""},
		{"a mark written again counts afresh", []xenBackLook{marked, marked, remarked, remarked}, []time.Duration{0, 100 * time.Second, 101 * time.Second, 200 * time.Second}, ""},
		{"a mark written again stays too long", []xenBackLook{marked, remarked, remarked}, []time.Duration{0, 100 * time.Second, 221 * time.Second}, "none took it over"},
		{"a bad mark", []xenBackLook{{state: xenbus.StateConnected, handoffErr: errors.New("bad mark")}, {state: xenbus.StateConnected, handoffErr: errors.New("bad mark")}},
			[]time.Duration{0, time.Second}, "handoff mark cannot be read"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var w xenBackWatch
			var err error
			for i, l := range c.looks {
				if err = w.look(l, t0.Add(c.at[i])); err != nil && i < len(c.looks)-1 {
					t.Fatalf("look %d failed early: %v", i, err)
				}
			}
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("failed: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("got %v, want %q", err, c.want)
			}
		})
	}
}
