package config

import (
	"slices"
	"testing"
	"time"
)

// TestSLOLookup: a [[vm]] slo overrides its profile's, "0s" included; a VM
// that leaves it out takes the profile's; SLA feedback keys parse.
func TestSLOLookup(t *testing.T) {
	c, err := Parse([]byte(`[scheduler]
policy = "band"
sla_feedback = true
sla_window = "50ms"
sla_boost = 4
sla_max_boost = 16

[[profile]]
name = "latency"
slo = "5ms"

[[vm]]
name = "own"
profile = "latency"
slo = "2ms"

[[vm]]
name = "inherits"
profile = "latency"

[[vm]]
name = "off"
profile = "latency"
slo = "0s"

[[vm]]
name = "plain"
slo = "750us"
`), "t.toml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		want time.Duration
	}{{"own", 2 * time.Millisecond}, {"inherits", 5 * time.Millisecond}, {"off", 0}, {"plain", 750 * time.Microsecond}, {"nobody", 0}} {
		if got := c.LookupVM(tc.name, 0).SLO.Duration; got != tc.want {
			t.Errorf("LookupVM(%s).SLO = %v, want %v", tc.name, got, tc.want)
		}
	}
	s := c.Scheduler
	if !s.SLAFeedback || s.SLAWindow.Duration != 50*time.Millisecond || s.SLABoost != 4 || s.SLAMaxBoost != 16 {
		t.Errorf("scheduler SLA settings = %+v", s)
	}
	d := Default().Scheduler
	if d.SLAFeedback || d.SLAWindow.Duration != DefaultSLAWindow || d.SLABoost != DefaultSLABoost || d.SLAMaxBoost != DefaultSLAMaxBoost {
		t.Errorf("default SLA settings = %+v", d)
	}
	// A Config built in code: a non-zero slo of the entry wins.
	code := Default()
	code.Profiles = []ProfileConfig{{Name: "p", SLO: Duration{time.Second}}}
	code.VMs = []VMConfig{{Name: "a", Profile: "p", Weight: 1}, {Name: "b", Profile: "p", Weight: 1, SLO: Duration{time.Millisecond}}}
	if got := code.LookupVM("a", 0).SLO.Duration; got != time.Second {
		t.Errorf("code config: a's SLO = %v, want the profile's 1s", got)
	}
	if got := code.LookupVM("b", 0).SLO.Duration; got != time.Millisecond {
		t.Errorf("code config: b's SLO = %v, want its own 1ms", got)
	}
}

// TestSLOErrors: every bad SLO or SLA feedback value is reported at its
// file:line:col, all of them at once.
func TestSLOErrors(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []string
	}{
		{
			name: "bad durations",
			in: `[[vm]]
name = "a"
slo = "2 bananas"

[[vm]]
name = "b"
slo = 2

[[vm]]
name = "c"
slo = "-1ms"

[[profile]]
name = "p"
slo = "fast"
`,
			want: []string{
				`t.toml:3:7: vm[0].slo: invalid duration "2 bananas": time: unknown unit " bananas" in duration "2 bananas"`,
				`t.toml:7:7: vm[1].slo: integer 2 has no unit: write a duration string like "100ms"`,
				`t.toml:11:7: vm[2].slo: invalid duration "-1ms": negative`,
				`t.toml:15:7: profile[0].slo: invalid duration "fast": time: invalid duration "fast"`,
			},
		},
		{
			name: "feedback tunables",
			in: `[scheduler]
policy = "wfq"
sla_feedback = "yes"
sla_window = "0s"
sla_boost = 1
sla_max_boost = 0
`,
			want: []string{
				`t.toml:3:16: scheduler.sla_feedback: expected a boolean (true or false), got string "yes"`,
				`t.toml:4:14: scheduler.sla_window: 0s: must be longer than 0`,
				`t.toml:5:13: scheduler.sla_boost: 1 is outside 2..16`,
				`t.toml:6:17: scheduler.sla_max_boost: 0 is outside 2..10000`,
			},
		},
		{
			name: "feedback needs weights",
			in: `[scheduler]
sla_feedback = true
`,
			want: []string{`t.toml:2:16: scheduler.sla_feedback: SLA feedback acts through weights, and policy "fifo" ignores them`},
		},
		{
			name: "strict refuses feedback",
			in: `[scheduler]
policy = "strict"
sla_feedback = true
`,
			want: []string{`t.toml:3:16: scheduler.sla_feedback: SLA feedback acts through weights, and policy "strict" keeps them fixed (a weight that followed queue waits would reopen the timing channel it closes)`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.in), "t.toml")
			if got := problems(t, err); !slices.Equal(got, tc.want) {
				t.Errorf("problems:\n%q\nwant\n%q", got, tc.want)
			}
		})
	}
	// A negative SLO set in code (not parsed) is still refused.
	c := Default()
	c.VMs = []VMConfig{{Name: "a", Mode: ModeFVOptimized, Weight: 1, SLO: Duration{-time.Millisecond}}}
	if got := problems(t, c.Validate()); !slices.Equal(got, []string{`vm[0].slo: -1ms is negative (leave it out, or write "0s", for no objective)`}) {
		t.Errorf("code config problems = %q", got)
	}
}
