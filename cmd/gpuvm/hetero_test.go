package main

import (
	"encoding/json"
	"testing"
)

// TestBenchHeteroUsage: every bad flag of gpuvm bench hetero is a usage
// error naming the flag, before any VM starts.
func TestBenchHeteroUsage(t *testing.T) {
	expectUsageErrors(t, []string{"bench", "hetero"}, []usageCase{
		{[]string{"--duration", "500ms"}, "--duration 500ms: want at least 1s"},
		{[]string{"--vms", "9"}, "--vms 9: want 1..8"},
		{[]string{"--modes", "pvdrm"}, "--modes \"pvdrm\""},
		{[]string{"--phases", "static,nope"}, "--phases \"nope\""},
		{[]string{"--phases", "static,static"}, "--phases \"static\""},
		{[]string{"--slow", "fermi-x2"}, "--slow: sim: unknown timing profile \"fermi-x2\""},
		{[]string{"--copy-size", "64MiB"}, "--copy-size 64MiB"},
		{[]string{"--balance-threshold", "1"}, "--balance-threshold 1: want between 0 and 1"},
	})
}

// TestBenchHeteroJSON: gpuvm bench hetero end to end at small sizes, the
// static, balanced and slow-then-balanced phases: the JSON's shape, every
// result verified, each VM placed on one of the two boards and ended on
// one, the cordoned fast board taking no VM at attach. No assertion on
// speed: the balancer's moves and the ratios depend on the machine.
func TestBenchHeteroJSON(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 6 VM processes")
	}
	out, stderr, err := runApp(t, "bench", "hetero", "--duration", "1s", "--vms", "2", "--phases", "static,balanced,slow-then-balanced",
		"--matrix-dim", "32", "--copy-size", "256KiB", "--balance-interval", "200ms", "--json")
	if err != nil {
		t.Fatalf("bench hetero: %v\n%s\n%s", err, out, stderr)
	}
	type place struct {
		VM    string `json:"vm"`
		VGPU  *int   `json:"vgpu"`
		Board string `json:"board"`
	}
	type rate struct {
		Total  *float64           `json:"runs_per_s"`
		Boards map[string]float64 `json:"board_runs_per_s"`
		VMs    map[string]float64 `json:"vm_runs_per_s"`
	}
	var rep struct {
		VMs  int `json:"vms"`
		Fast struct {
			Timing string  `json:"timing"`
			DMA    float64 `json:"dma_bytes_per_s"`
		} `json:"fast"`
		Slow struct {
			Timing string  `json:"timing"`
			DMA    float64 `json:"dma_bytes_per_s"`
		} `json:"slow"`
		Results []struct {
			Mode     string `json:"mode"`
			Workload string `json:"workload"`
			Runs     int    `json:"runs"`
			Verified bool   `json:"verified"`
		} `json:"results"`
		Phases []struct {
			Name    string  `json:"name"`
			Balance bool    `json:"balance"`
			Start   []place `json:"start"`
			End     []place `json:"end"`
			Moves   []struct {
				VM   string `json:"vm"`
				From string `json:"from"`
				To   string `json:"to"`
			} `json:"moves"`
			Whole    rate               `json:"whole"`
			Before   *rate              `json:"before_uncordon"`
			Runs     []any              `json:"board_runs"`
			Verified bool               `json:"verified"`
			Looks    map[string]int     `json:"balancer_looks"`
			Loads    map[string]float64 `json:"balancer_mean_load"`
		} `json:"phases"`
		Ratios   map[string]float64 `json:"ratios"`
		Problems []string           `json:"problems"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if len(rep.Results) == 0 || len(rep.Problems) > 0 {
		t.Fatalf("%d results, problems %q", len(rep.Results), rep.Problems)
	}
	if rep.VMs != 2 || rep.Fast.Timing != "fermi" || rep.Slow.Timing != "fermi-x4" || rep.Slow.DMA*4 != rep.Fast.DMA {
		t.Errorf("boards: %d VMs, fast %+v, slow %+v", rep.VMs, rep.Fast, rep.Slow)
	}
	for _, r := range rep.Results {
		if !r.Verified || r.Runs < 1 || r.Mode != "fv-optimized" || (r.Workload != "madd" && r.Workload != "cpy") {
			t.Errorf("result %+v", r)
		}
	}
	if len(rep.Phases) != 3 {
		t.Fatalf("%d phases", len(rep.Phases))
	}
	boards := map[string]bool{"fast": true, "slow": true}
	for _, p := range rep.Phases {
		if !p.Verified || len(p.Start) != 2 || len(p.End) != 2 || p.Whole.Total == nil || p.Whole.VMs == nil || p.Runs == nil || p.Moves == nil {
			t.Errorf("phase %s: %+v", p.Name, p)
		}
		if p.Balance != (p.Name != "static") || (p.Balance && (p.Looks == nil || len(p.Loads) != 2)) {
			t.Errorf("phase %s: balance %v, looks %v", p.Name, p.Balance, p.Looks)
		}
		for i := range p.Start {
			if p.Start[i].VGPU == nil || !boards[p.Start[i].Board] || !boards[p.End[i].Board] {
				t.Errorf("phase %s: VM %+v ended %+v", p.Name, p.Start[i], p.End[i])
			}
			if p.Name == "slow-then-balanced" && p.Start[i].Board != "slow" {
				t.Errorf("slow-then-balanced: %s placed on %s with the fast board cordoned", p.Start[i].VM, p.Start[i].Board)
			}
		}
		for _, m := range p.Moves {
			if !boards[m.From] || !boards[m.To] || m.From == m.To || m.VM == "" {
				t.Errorf("phase %s: move %+v", p.Name, m)
			}
		}
		if (p.Name == "slow-then-balanced") != (p.Before != nil) {
			t.Errorf("phase %s: before_uncordon %v", p.Name, p.Before)
		}
	}
	if _, ok := rep.Ratios["balanced_over_static"]; !ok {
		t.Errorf("ratios %v: no balanced_over_static", rep.Ratios)
	}
}
