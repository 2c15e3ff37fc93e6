package report

import (
	"encoding/json"
	"encoding/xml"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/bench"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
)

// sampleEvaluation is a small evaluation with every part filled in, as a
// run would leave it.
func sampleEvaluation() bench.Evaluation {
	ev := bench.Evaluation{Version: bench.EvaluationVersion, Quick: true, Started: time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC), DurationNs: int64(90 * time.Second),
		Machine: bench.Machine{CPUModel: "test CPU <&>", CPUs: 2}, Commands: []string{"gpuvm bench report --quick --out x"},
		Params: workloads.Params{MatrixDim: 64}, FairnessTiming: "none", FairnessMatrixDim: 256, FairnessRepeat: 15}
	ev.Modes.Board = bench.BoardInfo{Name: "Quadro 6000", Kind: "sim", Timing: "fermi-xen", TimingInfo: map[string]any{"mmio_read_ns": 800}}
	phases := func(scale int64) map[string]int64 {
		return map[string]int64{"init": 10 * scale, "htod": 2 * scale, "launch": 5 * scale, "dtoh": 2 * scale, "close": 3 * scale}
	}
	modes := []string{"native", "fv-naive", "fv-bar-remap", "fv-lazy", "fv-optimized", "pv-naive", "pv-multicall", "pvdrm"}
	for i, mode := range modes {
		for _, wl := range []string{"nop", "madd", "pincpy"} {
			c := map[string]any{}
			if mode != "native" {
				c = map[string]any{"bar0_traps": map[string]any{"read": 10.0, "write": 20.0}, "bar1_traps": map[string]any{"read": 0.0, "write": 3.0},
					"bar3_traps": map[string]any{"read": 1.0, "write": float64(1000 / (i + 1))}, "scans": float64(100 / (i + 1)), "hypercalls": float64(5000 / (i + 1))}
			}
			ev.Modes.Results = append(ev.Modes.Results, bench.Result{Mode: mode, Workload: wl, Runs: 1, Verified: true, PhasesNs: phases(int64(i + 1)),
				TotalNs: 22 * int64(i+1), Counters: c})
		}
	}
	ev.Modes.Normalize()
	for _, cfg := range []struct {
		name string
		one  bool
	}{{"native", false}, {"fv-optimized (apps on 1 VM)", true}, {"fv-optimized", false}} {
		for _, n := range []int{1, 2, 4} {
			ev.Contexts.Points = append(ev.Contexts.Points, bench.ContextsPoint{Config: cfg.name, OneVM: cfg.one, Count: n, PhasesNs: phases(int64(n)), TotalNs: 22 * int64(n), Verified: true})
		}
	}
	ev.Contexts.MatrixDim, ev.Contexts.Repeat = 64, 10
	for _, pol := range []string{"fifo", "band"} {
		ev.Fairness.Runs = append(ev.Fairness.Runs, bench.FairnessRun{Policy: pol, VMs: 2, Jain500: 0.99, Jain100: 0.9, MinMaxRun: 0.97,
			Usage: map[string]map[string][]float64{
				"500ms": {"vm1": {0.4, 0.5, 0.5}, "vm2": {0.5, 0.5, 0.5}},
				"100ms": {"vm1": {0.4, 0.5, 0.5, 0.4, 0.6}, "vm2": {0.5, 0.5, 0.5, 0.5, 0.4}},
			},
			Loads:          []bench.GuestLoad{{Kind: "madd"}, {Kind: "long-madd"}},
			OverheadVsFIFO: map[string]float64{"madd": 0.01 * float64(len(pol)), "long-madd": 0.02},
		})
	}
	ev.Fairness.Published = map[string]string{"band_vs_fifo_madd": "≤30%"}
	return ev
}

// TestWriteEveryFigure renders a complete evaluation and checks that every
// figure of §4.3 is drawn, each SVG is well-formed XML, the page names
// every section and escapes what it shows, and the JSON reads back.
func TestWriteEveryFigure(t *testing.T) {
	dir := t.TempDir()
	ev := sampleEvaluation()
	missing, err := Write(dir, ev)
	if err != nil {
		t.Fatal(err)
	}
	if len(missing) > 0 {
		t.Fatalf("figures not drawn: %v", missing)
	}
	files, err := filepath.Glob(filepath.Join(dir, FiguresDir, "*.svg"))
	if err != nil {
		t.Fatal(err)
	}
	for _, prefix := range []string{"fig4.3-", "fig4.4-", "fig4.5-", "fig4.8-", "fig4.9-breakdown-nop", "fig4.9-breakdown-pincpy",
		"fig4.10-native", "fig4.10-fv-optimized-apps-on-1-VM", "fig4.11-band-2vms", "fig4.12-fifo-2vms", "fig4.13-"} {
		found := false
		for _, f := range files {
			if strings.HasPrefix(filepath.Base(f), prefix) {
				found = true
			}
		}
		if !found {
			t.Errorf("no figure %s*.svg among %d", prefix, len(files))
		}
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := xml.Unmarshal(b, new(struct{})); err != nil {
			t.Errorf("%s: not well-formed: %v", filepath.Base(f), err)
		}
	}
	html, err := os.ReadFile(filepath.Join(dir, IndexFile))
	if err != nil {
		t.Fatal(err)
	}
	page := string(html)
	for _, want := range []string{`id="summary"`, `id="overhead"`, `id="breakdown"`, `id="shadowing"`, `id="hypercalls"`, `id="contexts"`, `id="fairness"`,
		"Table 4.3", "Table 4.1", "Fig. 4.10", "Fig. 4.13", "11383", // GPUvm's published nop hypercalls
		"test CPU &lt;&amp;&gt;", "gpuvm bench report --quick --out x", "This is a <b>quick</b> run"} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if strings.Contains(page, "test CPU <&>") {
		t.Error("page shows unescaped text")
	}
	if strings.Count(page, "<svg ") != len(files) {
		t.Errorf("page inlines %d SVGs, %d files written", strings.Count(page, "<svg "), len(files))
	}
	if strings.Contains(page, "<?xml") {
		t.Error("an inlined SVG keeps its XML declaration")
	}
	md, err := os.ReadFile(filepath.Join(dir, MarkdownFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| mode | guest |", "| nop | 833 | 714 | 1× | 11383 |", "| band | 2 | 0.990 |"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("tables.md lacks %q:\n%s", want, md)
		}
	}
	js, err := os.ReadFile(filepath.Join(dir, JSONFile))
	if err != nil {
		t.Fatal(err)
	}
	var back bench.Evaluation
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Modes.Results) != len(ev.Modes.Results) || len(back.Fairness.Runs) != 2 || back.Version != bench.EvaluationVersion {
		t.Errorf("JSON does not round-trip: %d results, %d fairness runs, version %d", len(back.Modes.Results), len(back.Fairness.Runs), back.Version)
	}
}

// TestWriteSaysWhatIsMissing: an evaluation whose steps failed still
// renders, lists its failures, and names the figures it could not draw.
func TestWriteSaysWhatIsMissing(t *testing.T) {
	ev := sampleEvaluation()
	ev.Fairness = bench.FairnessReport{}
	ev.Failures = []string{"GPU time fairness of the schedulers: boom"}
	dir := t.TempDir()
	missing, err := Write(dir, ev)
	if err != nil {
		t.Fatal(err)
	}
	if len(missing) != 1 || !strings.Contains(missing[0], "fig4.13") {
		t.Errorf("missing = %v, want only the overhead figure (the usage figures have no runs to draw)", missing)
	}
	html, err := os.ReadFile(filepath.Join(dir, IndexFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Failures", "boom", "Figures not drawn"} {
		if !strings.Contains(string(html), want) {
			t.Errorf("page lacks %q", want)
		}
	}
}

func TestTable41Reduction(t *testing.T) {
	tb := table41(sampleEvaluation())
	if len(tb.Rows) != 3 {
		t.Fatalf("rows %v", tb.Rows)
	}
	// pv-naive is mode 5 (5000/6 = 833 calls), pv-multicall mode 6 (714).
	if got := tb.Rows[0]; got[0] != "nop" || got[1] != "833" || got[2] != "714" || got[3] != "1×" || got[4] != "11383" {
		t.Errorf("nop row %v", got)
	}
}
