package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gpuvm/gpuvm/guest-driver/workloads"
	"github.com/gpuvm/gpuvm/internal/svgplot"
)

// WriteJSON writes the report as one indented JSON object.
func WriteJSON(w io.Writer, r Report) error { return WriteJSONValue(w, r) }

// WriteJSONValue writes any value as indented JSON.
func WriteJSONValue(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write JSON: %w", err)
	}
	return nil
}

// WriteTable writes the report as a readable table: per workload, one row per
// phase with the median, minimum and maximum, and the total.
func WriteTable(w io.Writer, r Report) error {
	chans := "" // unknown to a guest, which sees only its vGPU
	if r.Board.Channels > 0 {
		chans = fmt.Sprintf(", %d channels", r.Board.Channels)
	}
	fmt.Fprintf(w, "board: %s (%s), %s VRAM%s, timing %s\n", r.Board.Name, r.Board.Kind,
		formatBytes(r.Board.VRAMBytes), chans, r.Board.Timing)
	if len(r.Results) > 0 {
		fmt.Fprintf(w, "runs: %d measured after %d warm-up; times are median [min – max]\n\n", r.Results[0].Runs, r.Warmup)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "MODE\tWORKLOAD\tRESULT\tPHASE\tMEDIAN\tMIN\tMAX\t×NATIVE\tGPUVM ×NATIVE\t")
	for _, res := range r.Results {
		status := "verified"
		if !res.Verified {
			status = "FAILED"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t", res.Mode, res.Workload, status)
		if res.Error != "" {
			fmt.Fprintf(tw, "(see below)\t\t\t\t\t\t\n")
			continue
		}
		for i, ph := range workloads.PhaseNames() {
			if i > 0 {
				fmt.Fprint(tw, "\t\t\t")
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\t\t\n", ph, FormatDuration(res.PhasesNs[ph]), FormatDuration(res.PhasesMinNs[ph]), FormatDuration(res.PhasesMaxNs[ph]))
		}
		fmt.Fprintf(tw, "\t\t\ttotal\t%s\t%s\t%s\t%s\t%s\t\n", FormatDuration(res.TotalNs), FormatDuration(res.TotalMinNs), FormatDuration(res.TotalMaxNs),
			ratio(res.VsNative), ratio(res.Published))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	for _, res := range r.Results {
		if res.Error != "" {
			fmt.Fprintf(w, "\n%s %s failed: %s\n", res.Mode, res.Workload, res.Error)
		}
	}
	if err := writeCounters(w, r); err != nil {
		return err
	}
	return writeHypercalls(w, r)
}

// writeHypercalls prints the thesis' Table 4.1 view: hypercalls per run of
// each workload in pv-naive and pv-multicall, the reduction, and GPUvm's
// published counts.
func writeHypercalls(w io.Writer, r Report) error {
	calls := map[string]map[string]uint64{} // workload -> mode -> hypercalls per run
	var order []string
	for _, res := range r.Results {
		if res.Mode != "pv-naive" && res.Mode != "pv-multicall" || res.Counters == nil {
			continue
		}
		if calls[res.Workload] == nil {
			calls[res.Workload] = map[string]uint64{}
			order = append(order, res.Workload)
		}
		calls[res.Workload][res.Mode] = counterValue(res.Counters["hypercalls"])
	}
	if len(order) == 0 {
		return nil
	}
	fmt.Fprintln(w, "\nhypercalls per run (GPUvm Table 4.1):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "WORKLOAD\tPV-NAIVE\tPV-MULTICALL\tREDUCTION\tGPUVM WITHOUT\tGPUVM WITH\tGPUVM REDUCTION\t")
	for _, wl := range order {
		c := calls[wl]
		naive, nok := c["pv-naive"]
		multi, mok := c["pv-multicall"]
		cell := func(v uint64, ok bool) string {
			if !ok {
				return "–"
			}
			return fmt.Sprint(v)
		}
		red := "–"
		if nok && mok && multi > 0 {
			red = fmt.Sprintf("%.0f×", float64(naive)/float64(multi))
		}
		pw, pm, pok := PublishedHypercalls(wl)
		pred := "–"
		if pok {
			pred = fmt.Sprintf("%.0f×", float64(pw)/float64(pm))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", wl, cell(naive, nok), cell(multi, mok), red, cell(pw, pok), cell(pm, pok), pred)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write hypercalls: %w", err)
	}
	return nil
}

// writeCounters prints, per virtualized run, the counters behind the
// thesis' Fig. 4.3-4.5: traps per BAR, TLB flushes, page-table scans and
// PTEs scanned, per measured run.
func writeCounters(w io.Writer, r Report) error {
	var rows []Result
	for _, res := range r.Results {
		if _, ok := res.Counters["scans"]; ok {
			rows = append(rows, res)
		}
	}
	if len(rows) == 0 {
		return nil
	}
	fmt.Fprintln(w, "\nvirtualization counters per run:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	cols := []string{"tlb_flushes", "scans", "ptes_scanned", "shadow_ns", "hypercalls", "ptes_mapped", "doorbells", "denied"}
	fmt.Fprint(tw, "MODE\tWORKLOAD\tBAR0 TRAPS R/W\tBAR1 TRAPS R/W\tBAR3 TRAPS R/W\t")
	for _, c := range cols {
		fmt.Fprintf(tw, "%s\t", strings.ToUpper(c))
	}
	fmt.Fprintln(tw)
	for _, res := range rows {
		fmt.Fprintf(tw, "%s\t%s\t", res.Mode, res.Workload)
		for _, bar := range []string{"bar0", "bar1", "bar3"} {
			r, w := trapPair(res.Counters[bar+"_traps"])
			fmt.Fprintf(tw, "%d/%d\t", r, w)
		}
		for _, c := range cols {
			if c == "shadow_ns" {
				fmt.Fprintf(tw, "%s\t", FormatDuration(int64(counterValue(res.Counters[c]))))
				continue
			}
			fmt.Fprintf(tw, "%d\t", counterValue(res.Counters[c]))
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write counters: %w", err)
	}
	return nil
}

// counterValue reads a counter however it arrived: as a uint64 from this
// process, or as a float64 from a VM process's JSON.
func counterValue(v any) uint64 {
	switch x := v.(type) {
	case uint64:
		return x
	case float64:
		return uint64(x)
	case int:
		return uint64(x)
	case int64:
		return uint64(x)
	}
	return 0
}

// trapPair reads a barN_traps {"read", "write"} counter, whichever way it
// arrived (see counterValue).
func trapPair(v any) (r, w uint64) {
	switch t := v.(type) {
	case map[string]uint64:
		return t["read"], t["write"]
	case map[string]any:
		return counterValue(t["read"]), counterValue(t["write"])
	}
	return 0, 0
}

// WriteSummary writes the report's one-line summary per virtualized mode:
// its time normalised to native (geometric mean over the workloads it ran
// with a native run beside it, and the range), and GPUvm's published range
// for the same mode and workloads (thesis Fig. 4.8).
func WriteSummary(w io.Writer, r Report) {
	type acc struct {
		n               int
		logSum, lo, hi  float64
		pubLo, pubHi    float64
		pubN, workloads int
	}
	var order []string
	by := map[string]*acc{}
	for _, res := range r.Results {
		if res.Mode == "native" || res.VsNative == 0 {
			continue
		}
		a := by[res.Mode]
		if a == nil {
			a = &acc{lo: math.Inf(1), pubLo: math.Inf(1)}
			by[res.Mode] = a
			order = append(order, res.Mode)
		}
		a.n++
		a.logSum += math.Log(res.VsNative)
		a.lo, a.hi = min(a.lo, res.VsNative), max(a.hi, res.VsNative)
		if res.Published > 0 {
			a.pubN++
			a.pubLo, a.pubHi = min(a.pubLo, res.Published), max(a.pubHi, res.Published)
		}
	}
	for _, m := range order {
		a := by[m]
		fmt.Fprintf(w, "summary: %s runs %.2f× native", m, math.Exp(a.logSum/float64(a.n)))
		if a.n > 1 {
			fmt.Fprintf(w, " (geometric mean of %d workloads, %.2f–%.2f×)", a.n, a.lo, a.hi)
		}
		switch {
		case a.pubN == 1 && a.n == 1:
			fmt.Fprintf(w, "; GPUvm reported %.3g×", a.pubLo)
		case a.pubN > 0:
			fmt.Fprintf(w, "; GPUvm reported %.3g–%.3g× for the %d of them it published", a.pubLo, a.pubHi, a.pubN)
		}
		fmt.Fprintf(w, "; timing %s\n", r.Board.Timing)
	}
}

func ratio(r float64) string {
	if r == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", r)
}

// FormatDuration prints nanoseconds with three significant digits and a unit.
func FormatDuration(ns int64) string {
	d := time.Duration(ns)
	switch {
	case d < time.Microsecond:
		return fmt.Sprintf("%d ns", ns)
	case d < time.Millisecond:
		return fmt.Sprintf("%.3g µs", float64(ns)/1e3)
	case d < time.Second:
		return fmt.Sprintf("%.3g ms", float64(ns)/1e6)
	}
	return fmt.Sprintf("%.3g s", float64(ns)/1e9)
}

func formatBytes(n uint64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20:
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d B", n)
}

// ChartVsNative returns a grouped bar chart of each mode's execution time
// normalised to native per workload (the thesis' Fig. 4.8), log scale.
func ChartVsNative(r Report) ([]byte, error) {
	var bars []svgplot.Bar
	for _, res := range r.Results {
		if res.VsNative > 0 {
			bars = append(bars, svgplot.Bar{Group: res.Workload, Label: res.Mode, Value: res.VsNative})
		}
	}
	return svgplot.BarChart{Title: "Execution time normalised to native", YLabel: "× native (log)", Bars: bars, LogScale: true}.SVG()
}

// CounterValue reads a result's counter however it arrived (from this
// process or from a VM process's JSON); 0 when absent.
func CounterValue(c map[string]any, name string) uint64 { return counterValue(c[name]) }

// TrapCounts reads a result's barN_traps (or barN_mmio) counter as reads
// and writes.
func TrapCounts(c map[string]any, name string) (reads, writes uint64) { return trapPair(c[name]) }
