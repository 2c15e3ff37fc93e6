package report

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/bench"
)

// Table is one table of the report.
type Table struct {
	ID, Caption string
	Header      []string
	Rows        [][]string
	Note        string
}

// modeInterface says, per mode, what the guest runs and how it reaches the
// GPU (the thesis' Table 4.3 columns).
func modeInterface(mode string) (guest, iface string) {
	switch {
	case mode == "native":
		return "unmodified driver, no hypervisor", "the board's MMIO, directly"
	case strings.HasPrefix(mode, "fv-"):
		return "unmodified driver", "trapped MMIO (BAR0/1/3), shadow page tables and channels"
	case strings.HasPrefix(mode, "pv-"):
		return "driver makes page-table hypercalls", "trapped MMIO for registers; hypercalls for GPU page tables"
	case strings.HasPrefix(mode, "pvdrm"):
		return "pvdrm front end (no GPU registers)", "DRM requests over a shared ring"
	}
	return "", ""
}

// featureList names a mode's GPUvm optimizations.
func featureList(mode string) string {
	f, err := aggregator.FeaturesFor(mode)
	if err != nil {
		return "–"
	}
	var out []string
	for _, x := range []struct {
		on   bool
		name string
	}{{f.Lazy, "lazy shadowing"}, {f.Remap, "BAR remap"}, {f.Incremental, "incremental shadowing"},
		{f.PV && !f.PVDRM, "PV page tables"}, {f.PVDRM, "DRM split driver"}, {f.Pooling, "GEM pooling"}} {
		if x.on {
			out = append(out, x.name)
		}
	}
	if mode == "pv-multicall" {
		out = append(out, "multicall")
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ", ")
}

// geoRange is a geometric mean with its range over n values.
type geoRange struct {
	n              int
	logSum, lo, hi float64
}

func (g *geoRange) add(v float64) {
	if g.n == 0 {
		g.lo, g.hi = math.Inf(1), math.Inf(-1)
	}
	g.n++
	g.logSum += math.Log(v)
	g.lo, g.hi = min(g.lo, v), max(g.hi, v)
}

func (g geoRange) String() string {
	switch g.n {
	case 0:
		return "–"
	case 1:
		return fmt.Sprintf("%.2f×", g.lo)
	}
	return fmt.Sprintf("%.2f× (%.2f–%.2f×, %d workloads)", math.Exp(g.logSum/float64(g.n)), g.lo, g.hi, g.n)
}

// table43 is the thesis' Table 4.3: one row per mode.
func table43(ev bench.Evaluation) Table {
	t := Table{ID: "table4.3", Caption: "Table 4.3: the modes, what the guest runs, and their cost (geometric mean of the execution time normalised to native over the workloads measured, beside GPUvm's published ratios for the same mode over the workloads it published).",
		Header: []string{"mode", "guest", "interface", "optimizations", "verified", "gpuvm (this run)", "GPUvm (published)"}}
	for _, mode := range modesOf(ev.Modes) {
		var ours, pub geoRange
		verified, total := 0, 0
		for _, res := range ev.Modes.Results {
			if res.Mode != mode {
				continue
			}
			total++
			if res.Verified {
				verified++
			}
			if res.VsNative > 0 {
				ours.add(res.VsNative)
			}
			if res.Published > 0 {
				pub.add(res.Published)
			}
		}
		guest, iface := modeInterface(mode)
		t.Rows = append(t.Rows, []string{mode, guest, iface, featureList(mode), fmt.Sprintf("%d/%d", verified, total), ours.String(), pub.String()})
	}
	return t
}

// table48 gives Fig. 4.8's numbers: per workload and mode, our ratio to
// native and GPUvm's.
func table48(ev bench.Evaluation) Table {
	modes := modesOf(ev.Modes)
	t := Table{ID: "table4.8", Caption: "Fig. 4.8 in numbers: execution time normalised to native, this run (GPUvm's published ratio in brackets where the thesis gives it legibly); native's column is its median run time.",
		Header: append([]string{"workload"}, modes...)}
	for _, wl := range workloadsOf(ev.Modes) {
		row := []string{wl}
		for _, mode := range modes {
			res, ok := result(ev.Modes, mode, wl)
			switch {
			case !ok:
				row = append(row, "")
			case !res.Verified:
				row = append(row, "FAILED")
			case mode == "native":
				row = append(row, bench.FormatDuration(res.TotalNs))
			default:
				cell := fmt.Sprintf("%.2f×", res.VsNative)
				if res.Published > 0 {
					cell += fmt.Sprintf(" (%.2f×)", res.Published)
				}
				row = append(row, cell)
			}
		}
		t.Rows = append(t.Rows, row)
	}
	return t
}

// table41 is the thesis' Table 4.1: hypercalls per run without and with
// multicall, beside GPUvm's.
func table41(ev bench.Evaluation) Table {
	t := Table{ID: "table4.1", Caption: "Table 4.1: hypercalls per run without multicall (pv-naive) and with it (pv-multicall), beside GPUvm's counts.",
		Header: []string{"workload", "pv-naive", "pv-multicall", "reduction", "GPUvm without", "GPUvm with", "GPUvm reduction"}}
	for _, wl := range workloadsOf(ev.Modes) {
		naive, nok := result(ev.Modes, "pv-naive", wl)
		multi, mok := result(ev.Modes, "pv-multicall", wl)
		if !nok && !mok {
			continue
		}
		n, m := bench.CounterValue(naive.Counters, "hypercalls"), bench.CounterValue(multi.Counters, "hypercalls")
		cell := func(v uint64, ok bool) string {
			if !ok {
				return "–"
			}
			return strconv.FormatUint(v, 10)
		}
		red := "–"
		if nok && mok && m > 0 {
			red = fmt.Sprintf("%.0f×", float64(n)/float64(m))
		}
		pw, pm, pok := bench.PublishedHypercalls(wl)
		pred := "–"
		if pok {
			pred = fmt.Sprintf("%.0f×", float64(pw)/float64(pm))
		}
		t.Rows = append(t.Rows, []string{wl, cell(n, nok), cell(m, mok), red, cell(pw, pok), cell(pm, pok), pred})
	}
	return t
}

// tableCounters lists the virtualization counters behind Fig. 4.3-4.5 per
// virtualized run.
func tableCounters(ev bench.Evaluation) Table {
	t := Table{ID: "counters", Caption: "Virtualization counters per measured run (behind Fig. 4.3-4.5 and Table 4.1).",
		Header: []string{"mode", "workload", "BAR0 traps", "BAR1 traps", "BAR3 traps", "TLB flushes", "scans", "PTEs scanned", "hypercalls", "doorbells"}}
	for _, res := range ev.Modes.Results {
		if res.Mode == "native" || !res.Verified {
			continue
		}
		row := []string{res.Mode, res.Workload}
		for _, bar := range []string{"bar0", "bar1", "bar3"} {
			r, w := bench.TrapCounts(res.Counters, bar+"_traps")
			row = append(row, fmt.Sprintf("%d r / %d w", r, w))
		}
		for _, c := range []string{"tlb_flushes", "scans", "ptes_scanned", "hypercalls", "doorbells"} {
			row = append(row, strconv.FormatUint(bench.CounterValue(res.Counters, c), 10))
		}
		t.Rows = append(t.Rows, row)
	}
	return t
}

// table410 gives Fig. 4.10's numbers.
func table410(ev bench.Evaluation) Table {
	t := Table{ID: "table4.10", Caption: fmt.Sprintf("Fig. 4.10 in numbers: mean, fastest and slowest time of a madd application (%d×%d, kernel run %d times) by number of instances.",
		ev.Contexts.MatrixDim, ev.Contexts.MatrixDim, ev.Contexts.Repeat),
		Header: []string{"configuration", "instances", "mean", "fastest", "slowest", "init", "launch", "close", "verified"}}
	for _, p := range ev.Contexts.Points {
		ok := "yes"
		if !p.Verified {
			ok = "NO: " + p.Error
		}
		t.Rows = append(t.Rows, []string{p.Config, strconv.Itoa(p.Count), bench.FormatDuration(p.TotalNs), bench.FormatDuration(p.MinTotalNs),
			bench.FormatDuration(p.MaxTotalNs), bench.FormatDuration(p.PhasesNs["init"]), bench.FormatDuration(p.PhasesNs["launch"]),
			bench.FormatDuration(p.PhasesNs["close"]), ok})
	}
	return t
}

// tableFairness is the fairness table: Jain's index and the strict
// min/max share per window length and over the run, with the overheads
// against FIFO (Fig. 4.11-4.13).
func tableFairness(ev bench.Evaluation) Table {
	t := Table{ID: "fairness", Caption: "GPU time fairness (half the VMs loop madd, half long-madd): Jain's index and the least-served VM's share over the most-served one's (min/max), averaged over 500 ms and 100 ms windows and over the whole run; the overhead against FIFO with every VM running the same load (Fig. 4.13).",
		Header: []string{"policy", "VMs", "Jain 500 ms", "Jain 100 ms", "min/max run", "min/max 500 ms", "min/max 100 ms", "GPU busy", "overhead madd", "overhead long-madd"}}
	for _, r := range ev.Fairness.Runs {
		ov := func(k string) string {
			if v, ok := r.OverheadVsFIFO[k]; ok {
				return fmt.Sprintf("%+.1f %%", 100*v)
			}
			return "–"
		}
		t.Rows = append(t.Rows, []string{r.Policy, strconv.Itoa(r.VMs), fmt.Sprintf("%.3f", r.Jain500), fmt.Sprintf("%.3f", r.Jain100),
			fmt.Sprintf("%.3f", r.MinMaxRun), fmt.Sprintf("%.3f", r.MinMax500), fmt.Sprintf("%.3f", r.MinMax100),
			fmt.Sprintf("%.0f %%", 100*r.GPUBusy), ov("madd"), ov("long-madd")})
	}
	if p := ev.Fairness.Published; len(p) > 0 {
		t.Note = fmt.Sprintf("GPUvm (thesis §4.3.4) reported overheads against FIFO of %s (CREDIT) and %s (BAND) with madd, %s and %s with long-madd.",
			p["credit_vs_fifo_madd"], p["band_vs_fifo_madd"], p["credit_vs_fifo_long_madd"], p["band_vs_fifo_long_madd"])
	}
	return t
}
