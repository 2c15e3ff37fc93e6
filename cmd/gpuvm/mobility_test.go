package main

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
)

// usageCase is a command line and the text its usage error must contain.
type usageCase struct {
	args []string
	want string
}

// expectUsageErrors runs cmd with each case's arguments and expects a
// usage error (exit 2) naming what was wrong.
func expectUsageErrors(t *testing.T, cmd []string, cases []usageCase) {
	t.Helper()
	for _, tc := range cases {
		_, _, err := runApp(t, append(slices.Clone(cmd), tc.args...)...)
		var ee *exitError
		if !errors.As(err, &ee) || ee.code != exitUsage || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %v: %v, want a usage error with %q", strings.Join(cmd, " "), tc.args, err, tc.want)
		}
	}
}

// TestBenchMobilityUsage: every bad flag of gpuvm bench mobility is a usage
// error naming the flag, before any VM starts.
func TestBenchMobilityUsage(t *testing.T) {
	expectUsageErrors(t, []string{"bench", "mobility"}, []usageCase{
		{[]string{"--duration", "500ms"}, "--duration 500ms: want at least 1s"},
		{[]string{"--moves", "0"}, "--moves 0: want 1..1000"},
		{[]string{"--modes", "pvdrm"}, "--modes \"pvdrm\""},
		{[]string{"--modes", "fv-optimized,nope"}, "--modes \"nope\""},
		{[]string{"--overcommit", "5"}, "--overcommit 5: want 1..4"},
		{[]string{"--copy-size", "64MiB"}, "--copy-size 64MiB"},
		{[]string{"--evict-idle", "0s"}, "--evict-idle 0s"},
	})
}

// TestBenchMobilityJSON: gpuvm bench mobility end to end at small sizes:
// every result verified, the moves with their downtime and VRAM, evictions
// in the overcommit phase, the failed board's VMs reported as lost, the
// reset VM recovered.
func TestBenchMobilityJSON(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 17 VM processes")
	}
	out, stderr, err := runApp(t, "bench", "mobility", "--duration", "1s", "--moves", "2", "--matrix-dim", "32", "--copy-size", "64KiB", "--json")
	if err != nil {
		t.Fatalf("bench mobility: %v\n%s\n%s", err, out, stderr)
	}
	var rep struct {
		Results []struct {
			Mode     string `json:"mode"`
			Workload string `json:"workload"`
			Runs     int    `json:"runs"`
			Verified bool   `json:"verified"`
		} `json:"results"`
		Moves []struct {
			VGPU       *int   `json:"vgpu"`
			Phase      string `json:"phase"`
			FromBoard  string `json:"from_board"`
			ToBoard    string `json:"to_board"`
			VRAMBytes  uint64 `json:"vram_bytes"`
			DowntimeNs int64  `json:"downtime_ns"`
			Verified   bool   `json:"verified"`
		} `json:"moves"`
		Overcommit struct {
			Evictions uint64 `json:"evictions"`
			Restores  uint64 `json:"restores"`
		} `json:"overcommit"`
		Ops struct {
			Lost      []string `json:"lost_vms"`
			Survivors []string `json:"surviving_vms"`
			DrainMove int      `json:"drain_moved"`
		} `json:"ops"`
		Problems []string `json:"problems"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if len(rep.Results) == 0 || len(rep.Problems) > 0 {
		t.Fatalf("%d results, problems %q", len(rep.Results), rep.Problems)
	}
	for _, r := range rep.Results {
		if !r.Verified || r.Runs < 1 || !strings.HasPrefix(r.Mode, "fv-") || (r.Workload != "madd" && r.Workload != "cpy") {
			t.Errorf("result %+v", r)
		}
	}
	if len(rep.Moves) < 2 {
		t.Fatalf("%d moves", len(rep.Moves))
	}
	for _, m := range rep.Moves {
		// A VM caught re-initialising (the reset one, drained) may have
		// nothing in use; the moves phase's VMs always have.
		if m.VGPU == nil || m.FromBoard == "" || m.ToBoard == "" || m.FromBoard == m.ToBoard || (m.Phase == "moves" && m.VRAMBytes == 0) || m.DowntimeNs <= 0 || !m.Verified {
			t.Errorf("move %+v", m)
		}
	}
	if rep.Overcommit.Evictions == 0 || rep.Overcommit.Restores == 0 {
		t.Errorf("overcommit %+v: want evictions and restores", rep.Overcommit)
	}
	if len(rep.Ops.Lost) != 2 || len(rep.Ops.Survivors) != 2 || rep.Ops.DrainMove == 0 {
		t.Errorf("ops %+v: want 2 VMs lost with the failed board, 2 surviving, a drain that moved", rep.Ops)
	}
}
