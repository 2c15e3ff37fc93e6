package bench

import (
	"bytes"
	"strings"
	"testing"
)

// TestTableAndSummary: the readable table shows the trap counters however
// they arrived (uint64 here, float64 after a VM process's JSON), shadow
// time as a duration, and one summary line per virtualized mode with the
// geometric mean and GPUvm's range.
func TestTableAndSummary(t *testing.T) {
	r := Report{Board: BoardInfo{Name: "b", Kind: "sim", Timing: "fermi-xen"}, Warmup: 1, Results: []Result{
		{Mode: "native", Workload: "nop", Runs: 1, Verified: true, TotalNs: 10e6},
		{Mode: "native", Workload: "madd", Runs: 1, Verified: true, TotalNs: 20e6},
		{Mode: "fv-optimized", Workload: "nop", Runs: 1, Verified: true, TotalNs: 40e6, Counters: map[string]any{
			"scans": uint64(3), "bar3_traps": map[string]uint64{"read": 1, "write": 4644}, "shadow_ns": uint64(2_500_000)}},
		{Mode: "fv-optimized", Workload: "madd", Runs: 1, Verified: true, TotalNs: 160e6, Counters: map[string]any{
			"scans": float64(3), "bar3_traps": map[string]any{"read": float64(2), "write": float64(16932)}, "shadow_ns": float64(4.7e6)}},
	}}
	r.Normalize()
	var b bytes.Buffer
	if err := WriteTable(&b, r); err != nil {
		t.Fatal(err)
	}
	WriteSummary(&b, r)
	out := b.String()
	for _, want := range []string{"1/4644", "2/16932", "2.5 ms", "4.7 ms",
		"summary: fv-optimized runs 5.66× native (geometric mean of 2 workloads, 4.00–8.00×); GPUvm reported 38–52.2× for the 2 of them it published; timing fermi-xen"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "e+06") {
		t.Errorf("a raw float in the table:\n%s", out)
	}
}
