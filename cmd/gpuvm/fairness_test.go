package main

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// TestFairnessVMCounts: --vms takes what its help says, even counts (half
// the VMs loop madd, half long-madd), and refuses the rest as usage errors.
func TestFairnessVMCounts(t *testing.T) {
	if got, err := parseVMCounts("2, 4,64", false); err != nil || !slices.Equal(got, []int{2, 4, 64}) {
		t.Errorf("parseVMCounts(2,4,64) = %v, %v", got, err)
	}
	for _, bad := range []string{"3", "2,5", "0", "1", "66", "x", ""} {
		if _, err := parseVMCounts(bad, false); err == nil {
			t.Errorf("parseVMCounts(%q) accepted", bad)
		}
		_, _, err := runApp(t, "bench", "fairness", "--vms", bad)
		var ee *exitError
		if !errors.As(err, &ee) || ee.code != exitUsage || !strings.Contains(err.Error(), "even") {
			t.Errorf("--vms %q: %v, want a usage error asking for even counts", bad, err)
		}
	}
	if got, err := parseVMCounts("3", true); err != nil || !slices.Equal(got, []int{3}) {
		t.Errorf("a mixed board of 3 VMs: %v, %v", got, err)
	}
	if !strings.Contains(fairnessCommand().Flags[0].String(), "each even") {
		t.Errorf("--vms help does not say the counts are even: %s", fairnessCommand().Flags[0])
	}
}
