package main

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/config"
)

// TestParseSLOs: --slo takes NAME=DURATION pairs naming the run's VMs.
func TestParseSLOs(t *testing.T) {
	got, err := parseSLOs("vm1=2ms, vm3=500us", 3)
	if err != nil || len(got) != 2 || got["vm1"] != 2*time.Millisecond || got["vm3"] != 500*time.Microsecond {
		t.Errorf("parseSLOs = %v, %v", got, err)
	}
	for _, bad := range []string{"vm1", "vm4=2ms", "vm0=2ms", "guest=2ms", "vm1=fast", "vm1=0s", "vm1=-2ms", "vm1=2", "vm1=2ms,vm1=3ms", ""} {
		if got, err := parseSLOs(bad, 3); err == nil {
			t.Errorf("parseSLOs(%q) = %v, want an error", bad, got)
		}
	}
}

// TestBenchSLOUsage: every bad flag of gpuvm bench slo is a usage error
// naming the flag, before any VM starts.
func TestBenchSLOUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--vms", "1"}, "--vms 1: want 2..64"},
		{[]string{"--vms", "65"}, "--vms 65"},
		{[]string{"--policy", "fifo"}, "--policy fifo: want a weighted policy"},
		{[]string{"--policy", "strict"}, "--policy strict"},
		{[]string{"--policy", "nope"}, "--policy nope"},
		{[]string{"--latency-weight", "0"}, "--latency-weight 0"},
		{[]string{"--bulk-weight", "10001"}, "--bulk-weight 10001"},
		{[]string{"--sla-window", "0s"}, "--sla-window 0s"},
		{[]string{"--sla-boost", "1"}, "--sla-boost 1: want 2..16"},
		{[]string{"--sla-max-boost", "1"}, "--sla-max-boost 1"},
		{[]string{"--duration", "500ms"}, "--duration 500ms: want at least 1s"},
		{[]string{"--slo", "vm9=2ms"}, "--slo \"vm9\": name a VM of the run, vm1..vm3"},
		{[]string{"--slo", "vm1=soon"}, "--slo \"soon\""},
	} {
		_, _, err := runApp(t, append([]string{"bench", "slo"}, tc.args...)...)
		var ee *exitError
		if !errors.As(err, &ee) || ee.code != exitUsage || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("bench slo %v: %v, want a usage error with %q", tc.args, err, tc.want)
		}
	}
}

// TestSLOOptionsFromConfig: the daemon's objectives and feedback come from
// the configuration, [[vm]] over profile.
func TestSLOOptionsFromConfig(t *testing.T) {
	cfg, err := config.Parse([]byte(`[scheduler]
policy = "band"
sla_feedback = true
sla_window = "50ms"

[[profile]]
name = "lat"
slo = "3ms"

[[vm]]
name = "a"
profile = "lat"

[[vm]]
name = "b"
slo = "1ms"
`), "t.toml")
	if err != nil {
		t.Fatal(err)
	}
	o := sloOptions(cfg)
	for name, want := range map[string]time.Duration{"a": 3 * time.Millisecond, "b": time.Millisecond, "c": 0} {
		if got := o.Target(aggregator.Guest{Name: name}); got != want {
			t.Errorf("SLO of %s = %v, want %v", name, got, want)
		}
	}
	if f := o.Feedback; f.Window != 50*time.Millisecond || f.Boost != config.DefaultSLABoost || f.MaxBoost != config.DefaultSLAMaxBoost {
		t.Errorf("feedback %+v", f)
	}
	if f := sloOptions(config.Default()).Feedback; f.Window != 0 {
		t.Errorf("default feedback %+v, want off", f)
	}
}

// TestBenchSLOJSON: gpuvm bench slo end to end, small: the policy alone
// and with feedback, each VM's figures in the documented JSON shape.
// (Whether feedback helps is measured, not asserted: a short run on a
// shared machine is too noisy; the model tests in package aggregator
// assert it deterministically.)
func TestBenchSLOJSON(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 4 VM processes")
	}
	out, stderr, err := runApp(t, "bench", "slo", "--vms", "2", "--duration", "1s", "--matrix-dim", "32", "--repeat", "4",
		"--slo", "vm1=1ms", "--sla-window", "20ms", "--json")
	if err != nil {
		t.Fatalf("bench slo: %v\n%s", err, stderr)
	}
	var rep struct {
		WindowNs int64 `json:"sla_window_ns"`
		Runs     []struct {
			Policy   string `json:"policy"`
			Feedback bool   `json:"sla_feedback"`
			VMs      []struct {
				Name        string  `json:"name"`
				Load        string  `json:"load"`
				Weight      int     `json:"weight"`
				SLONs       int64   `json:"slo_ns"`
				Submissions int     `json:"submissions"`
				Violations  int     `json:"violations"`
				P50         int64   `json:"p50_wait_ns"`
				P99         int64   `json:"p99_wait_ns"`
				Throughput  float64 `json:"iterations_per_s"`
				MaxWeight   int     `json:"max_effective_weight"`
			} `json:"vms"`
		} `json:"runs"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if rep.WindowNs != int64(20*time.Millisecond) || len(rep.Runs) != 2 || rep.Runs[0].Feedback || !rep.Runs[1].Feedback {
		t.Fatalf("report %s", out)
	}
	for _, r := range rep.Runs {
		if r.Policy != "band" || len(r.VMs) != 2 {
			t.Fatalf("run %+v", r)
		}
		lat, bulk := r.VMs[0], r.VMs[1]
		if lat.Name != "vm1" || lat.Load != "madd" || lat.Weight != 1 || lat.SLONs != int64(time.Millisecond) || lat.Submissions == 0 ||
			lat.Violations > lat.Submissions || lat.P99 < lat.P50 || lat.Throughput <= 0 || lat.MaxWeight < 1 || lat.MaxWeight > 8 {
			t.Errorf("feedback %v: vm1 %+v", r.Feedback, lat)
		}
		if !r.Feedback && lat.MaxWeight != 1 {
			t.Errorf("without feedback vm1's weight rose to %d", lat.MaxWeight)
		}
		if bulk.Name != "vm2" || bulk.Load != "long-madd" || bulk.Weight != 4 || bulk.SLONs != 0 || bulk.Violations != 0 || bulk.MaxWeight != 4 {
			t.Errorf("feedback %v: vm2 %+v", r.Feedback, bulk)
		}
	}
}
