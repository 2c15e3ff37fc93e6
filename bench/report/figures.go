package report

import (
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/gpuvm/gpuvm/bench"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
	"github.com/gpuvm/gpuvm/internal/svgplot"
)

// Figure is one chart of the report: its file name (under figures/), its
// caption and the SVG document.
type Figure struct {
	File    string
	Caption string
	SVG     []byte
}

// chart is anything svgplot draws.
type chart interface{ SVG() ([]byte, error) }

// figures collects the charts of a report; a chart that cannot be drawn
// (no data: a step failed or was not run) is left out and its reason kept.
type figures struct {
	list    []Figure
	missing []string
}

func (f *figures) add(file, caption string, c chart) {
	svg, err := c.SVG()
	if err != nil {
		f.missing = append(f.missing, fmt.Sprintf("%s: %v", file, err))
		return
	}
	f.list = append(f.list, Figure{File: file, Caption: caption, SVG: svg})
}

// modesOf returns the modes of the results in order of first appearance.
func modesOf(r bench.Report) []string {
	var out []string
	for _, res := range r.Results {
		if !slices.Contains(out, res.Mode) {
			out = append(out, res.Mode)
		}
	}
	return out
}

// workloadsOf returns the workloads of the results in order of first
// appearance.
func workloadsOf(r bench.Report) []string {
	var out []string
	for _, res := range r.Results {
		if !slices.Contains(out, res.Workload) {
			out = append(out, res.Workload)
		}
	}
	return out
}

// result finds the (mode, workload) result.
func result(r bench.Report, mode, wl string) (bench.Result, bool) {
	for _, res := range r.Results {
		if res.Mode == mode && res.Workload == wl {
			return res, true
		}
	}
	return bench.Result{}, false
}

// fig48 is the thesis' Fig. 4.8: each mode's execution time normalised to
// native, per workload, on a log scale.
func fig48(f *figures, ev bench.Evaluation) {
	var bars []svgplot.Bar
	for _, res := range ev.Modes.Results {
		if res.VsNative > 0 {
			bars = append(bars, svgplot.Bar{Group: res.Workload, Label: res.Mode, Value: res.VsNative})
		}
	}
	f.add("fig4.8-vs-native.svg", "Fig. 4.8: execution time normalised to native (median of the measured runs; log scale).",
		svgplot.BarChart{Title: "Execution time normalised to native", YLabel: "× native (log)", Bars: bars, LogScale: true, Width: 1280, Height: 440})
}

// fig49 is the thesis' Fig. 4.9: the phase breakdown of each workload's
// run in every mode, one chart per workload.
func fig49(f *figures, ev bench.Evaluation) {
	for _, wl := range workloadsOf(ev.Modes) {
		var segs []svgplot.Segment
		for _, mode := range modesOf(ev.Modes) {
			res, ok := result(ev.Modes, mode, wl)
			if !ok || !res.Verified {
				continue
			}
			for _, ph := range workloads.PhaseNames() {
				segs = append(segs, svgplot.Segment{Group: mode, Label: ph, Value: float64(res.PhasesNs[ph])})
			}
		}
		f.add("fig4.9-breakdown-"+wl+".svg", "Fig. 4.9 ("+wl+"): share of each phase in the run, per mode.",
			svgplot.StackedBarChart{Title: wl + ": phase breakdown", YLabel: "fraction of the run", Segments: segs, Normalize: true, Width: 620, Height: 320})
	}
}

// counterBars draws one counter of several modes side by side per
// workload; the scale is logarithmic when every value is positive.
func counterBars(ev bench.Evaluation, title, ylabel string, series []counterSeries) chart {
	rs := make([]resultSeries, len(series))
	for i, s := range series {
		rs[i] = resultSeries{s.label, s.mode, func(res bench.Result) uint64 { return s.value(res.Counters) }}
	}
	return resultBars(ev, title, ylabel, rs)
}

// resultSeries is one mode's value per result in resultBars.
type resultSeries struct {
	label, mode string
	value       func(bench.Result) uint64
}

// resultBars draws a value of several modes side by side per workload; the
// scale is logarithmic when every value is positive.
func resultBars(ev bench.Evaluation, title, ylabel string, series []resultSeries) chart {
	var bars []svgplot.Bar
	logScale := true
	for _, wl := range workloadsOf(ev.Modes) {
		for _, s := range series {
			res, ok := result(ev.Modes, s.mode, wl)
			if !ok || !res.Verified {
				continue
			}
			v := float64(s.value(res))
			if v <= 0 {
				logScale = false
			}
			bars = append(bars, svgplot.Bar{Group: wl, Label: s.label, Value: v})
		}
	}
	if logScale {
		ylabel += " (log)"
	}
	return svgplot.BarChart{Title: title, YLabel: ylabel, Bars: bars, LogScale: logScale, Width: 1100, Height: 380}
}

// counterSeries is one mode's counter in counterBars.
type counterSeries struct {
	label, mode string
	value       func(map[string]any) uint64
}

func counter(name string) func(map[string]any) uint64 {
	return func(c map[string]any) uint64 { return bench.CounterValue(c, name) }
}

func traps(bar string) func(map[string]any) uint64 {
	return func(c map[string]any) uint64 {
		r, w := bench.TrapCounts(c, bar+"_traps")
		return r + w
	}
}

// fig43 is the thesis' Fig. 4.3: shadow page-table scans per run without
// and with lazy shadowing.
func fig43(f *figures, ev bench.Evaluation) {
	f.add("fig4.3-scans.svg", "Fig. 4.3: shadow page-table scans per run without lazy shadowing (fv-naive) and with it (fv-lazy, fv-optimized).",
		counterBars(ev, "Page-table scans per run, with and without lazy shadowing", "scans per run", []counterSeries{
			{"without lazy (fv-naive)", "fv-naive", counter("scans")},
			{"with lazy (fv-lazy)", "fv-lazy", counter("scans")},
			{"with lazy and remap (fv-optimized)", "fv-optimized", counter("scans")},
		}))
}

// thesisPhases are the phases of Fig. 4.4 and 4.5 and the run phases
// each is made of: the thesis' compute is our htod, launch and dtoh.
func thesisPhases() []struct {
	name string
	of   []string
} {
	return []struct {
		name string
		of   []string
	}{
		{"init", []string{workloads.PhaseInit}},
		{"compute", []string{workloads.PhaseHtoD, workloads.PhaseLaunch, workloads.PhaseDtoH}},
		{"close", []string{workloads.PhaseClose}},
	}
}

// phaseTraps sums a BAR's traps (reads and writes) over the given run
// phases of a result's per-phase counters.
func phaseTraps(bar string, phases []string) func(bench.Result) uint64 {
	return func(res bench.Result) uint64 {
		var n uint64
		for _, ph := range phases {
			r, w := bench.TrapCounts(res.PhaseCounters[ph], bar+"_traps")
			n += r + w
		}
		return n
	}
}

// fig44 is the thesis' Fig. 4.4: BAR0, BAR1 and BAR3 accesses per run in
// each phase (init, compute, close), counted as traps in fv-naive, where
// every access traps.
func fig44(f *figures, ev bench.Evaluation) {
	for _, ph := range thesisPhases() {
		f.add("fig4.4-bar-accesses-"+ph.name+".svg", "Fig. 4.4 ("+ph.name+"): BAR0, BAR1 and BAR3 accesses per run in the "+ph.name+" phase, all trapped (fv-naive).",
			resultBars(ev, "BAR accesses per run, "+ph.name+" phase (fv-naive)", "accesses per run", []resultSeries{
				{"BAR0", "fv-naive", phaseTraps("bar0", ph.of)},
				{"BAR1", "fv-naive", phaseTraps("bar1", ph.of)},
				{"BAR3", "fv-naive", phaseTraps("bar3", ph.of)},
			}))
	}
}

// fig45 is the thesis' Fig. 4.5: BAR3 traps per run in each phase without
// and with BAR remap.
func fig45(f *figures, ev bench.Evaluation) {
	for _, ph := range thesisPhases() {
		f.add("fig4.5-bar3-traps-"+ph.name+".svg", "Fig. 4.5 ("+ph.name+"): BAR3 traps per run in the "+ph.name+" phase without BAR remap (fv-naive) and with it (fv-bar-remap).",
			resultBars(ev, "BAR3 traps per run, "+ph.name+" phase", "traps per run", []resultSeries{
				{"without remap (fv-naive)", "fv-naive", phaseTraps("bar3", ph.of)},
				{"with remap (fv-bar-remap)", "fv-bar-remap", phaseTraps("bar3", ph.of)},
			}))
	}
}

// fig410 is the thesis' Fig. 4.10: the mean phase times of 1, 2, 4 and 8
// madd applications, natively, in one VM, and one per VM; one chart per
// configuration.
func fig410(f *figures, ev bench.Evaluation) {
	var configs []string
	for _, p := range ev.Contexts.Points {
		if !slices.Contains(configs, p.Config) {
			configs = append(configs, p.Config)
		}
	}
	for _, cfg := range configs {
		var segs []svgplot.Segment
		for _, p := range ev.Contexts.Points {
			if p.Config != cfg || !p.Verified {
				continue
			}
			for _, ph := range workloads.PhaseNames() {
				segs = append(segs, svgplot.Segment{Group: strconv.Itoa(p.Count), Label: ph, Value: float64(p.PhasesNs[ph]) / 1e6})
			}
		}
		f.add("fig4.10-"+slug(cfg)+".svg", "Fig. 4.10 ("+cfg+"): mean time of an application instance by phase, against the number of instances.",
			svgplot.StackedBarChart{Title: cfg, YLabel: "mean time per instance (ms)", Segments: segs, Width: 420, Height: 300})
	}
}

// fig411 draws Fig. 4.11 (500 ms windows) and 4.12 (100 ms windows): each
// VM's GPU usage over time, per policy and VM count.
func fig411(f *figures, ev bench.Evaluation) {
	zero, one := 0.0, 1.0
	for _, win := range []string{"500ms", "100ms"} {
		fig := "4.11"
		if win == "100ms" {
			fig = "4.12"
		}
		for _, r := range ev.Fairness.Runs {
			byVM := r.Usage[win]
			step, err := time.ParseDuration(win)
			if err != nil || len(byVM) == 0 {
				continue
			}
			var series []svgplot.Series
			for i := range r.VMs {
				name := "vm" + strconv.Itoa(i+1)
				ys := byVM[name]
				xs := make([]float64, len(ys))
				for k := range ys {
					xs[k] = float64(k) * step.Seconds()
				}
				kind := ""
				if i < len(r.Loads) {
					kind = " (" + r.Loads[i].Kind + ")"
				}
				series = append(series, svgplot.Series{Name: name + kind, X: xs, Y: ys})
			}
			jain, mm := r.Jain500, r.MinMax500
			if win == "100ms" {
				jain, mm = r.Jain100, r.MinMax100
			}
			f.add(fmt.Sprintf("fig%s-%s-%dvms.svg", fig, r.Policy, r.VMs),
				fmt.Sprintf("Fig. %s: GPU usage per %s window, %s with %d VMs (Jain %.3f, min/max %.3f).", fig, win, r.Policy, r.VMs, jain, mm),
				svgplot.LineChart{Title: fmt.Sprintf("%s, %d VMs, %s windows", r.Policy, r.VMs, win), XLabel: "time (s)", YLabel: "GPU usage",
					Series: series, YMin: &zero, YMax: &one, Width: 560, Height: 280})
		}
	}
}

// fig413 is the thesis' Fig. 4.13: each policy's execution-time overhead
// against FIFO, per load and VM count.
func fig413(f *figures, ev bench.Evaluation) {
	var bars []svgplot.Bar
	for _, r := range ev.Fairness.Runs {
		if r.Policy == "fifo" {
			continue
		}
		for _, kind := range bench.FairnessKinds() {
			if v, ok := r.OverheadVsFIFO[kind]; ok {
				bars = append(bars, svgplot.Bar{Group: fmt.Sprintf("%s, %d VMs", kind, r.VMs), Label: r.Policy, Value: 100 * v})
			}
		}
	}
	f.add("fig4.13-overhead-vs-fifo.svg", "Fig. 4.13: mean iteration time with every VM running the same load, over FIFO's, minus one.",
		svgplot.BarChart{Title: "Scheduling overhead against FIFO", YLabel: "overhead (%)", Bars: bars, Width: 900, Height: 360})
}

// slug makes a file-name fragment of s.
func slug(s string) string {
	out := make([]byte, 0, len(s))
	dash := false
	for _, c := range []byte(s) {
		ok := c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c >= 'A' && c <= 'Z'
		if ok {
			out = append(out, c)
			dash = false
		} else if !dash && len(out) > 0 {
			out = append(out, '-')
			dash = true
		}
	}
	for len(out) > 0 && out[len(out)-1] == '-' {
		out = out[:len(out)-1]
	}
	return string(out)
}

// allFigures draws every figure of the evaluation.
func allFigures(ev bench.Evaluation) figures {
	var f figures
	fig43(&f, ev)
	fig44(&f, ev)
	fig45(&f, ev)
	fig48(&f, ev)
	fig49(&f, ev)
	fig410(&f, ev)
	fig411(&f, ev)
	fig413(&f, ev)
	return f
}
