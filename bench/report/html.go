// Package report renders a bench.Evaluation — the whole of the GPUvm
// thesis' §4.3 as `gpuvm bench report` measured it — as a self-contained
// HTML page (inline SVG figures, tables, GPUvm's published values beside
// ours, the machine, the timing profile and the commands), the same figures
// as SVG files, and the JSON behind it.
package report

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/gpuvm/gpuvm/bench"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
)

// Files written by Write, relative to its directory.
const (
	IndexFile   = "index.html"
	JSONFile    = "evaluation.json"
	FiguresDir  = "figures"
	svgXMLDecl  = `<?xml version="1.0" encoding="UTF-8" standalone="no"?>`
	reportTitle = "gpuvm: the GPUvm evaluation"
)

// section is a part of the page: text, tables and figures.
type section struct {
	ID, Title string
	Intro     string
	Tables    []Table
	Figures   []inlineFigure
}

// inlineFigure is a figure as the page embeds it.
type inlineFigure struct {
	File, Caption string
	SVG           template.HTML
}

// page is the template's data.
type page struct {
	Title      string
	Generated  string
	Took       string
	Quick      bool
	Machine    bench.Machine
	Memory     string
	VRAM       string
	Board      bench.BoardInfo
	Timing     []kv
	Params     []kv
	Commands   []string
	Failures   []string
	Missing    []string
	Sections   []section
	JSONFile   string
	FiguresDir string
}

type kv struct{ K, V string }

// rodiniaSizes describes the Rodinia-like workloads' inputs at p's scale.
func rodiniaSizes(p workloads.Params) string {
	var parts []string
	for _, n := range []string{"bp", "hs", "lud", "nn", "srad", "srad2"} {
		if w, err := workloads.New(n, p); err == nil {
			parts = append(parts, n+": "+w.Description())
		}
	}
	return fmt.Sprintf("scale 1/%d; ", max(p.RodiniaScale, 1)) + strings.Join(parts, "; ")
}

// gib prints a byte count in GiB.
func gib(n uint64) string { return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30)) }

// Write renders ev into dir: index.html, evaluation.json, tables.md and
// figures/*.svg. It returns the figures it could not draw (no data) in
// words; those are also listed on the page.
func Write(dir string, ev bench.Evaluation) (missing []string, err error) {
	if err := os.MkdirAll(filepath.Join(dir, FiguresDir), 0o755); err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	js, err := json.MarshalIndent(ev, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("report: encode JSON: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, JSONFile), append(js, '\n'), 0o644); err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	figs := allFigures(ev)
	for _, f := range figs.list {
		if err := os.WriteFile(filepath.Join(dir, FiguresDir, f.File), f.SVG, 0o644); err != nil {
			return nil, fmt.Errorf("report: %w", err)
		}
	}
	html, err := Render(ev, figs)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, IndexFile), html, 0o644); err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, MarkdownFile), Markdown(ev), 0o644); err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	return figs.missing, nil
}

// Render returns the HTML page of ev with the given figures.
func Render(ev bench.Evaluation, figs figures) ([]byte, error) {
	byPrefix := func(prefixes ...string) []inlineFigure {
		var out []inlineFigure
		for _, f := range figs.list {
			for _, p := range prefixes {
				if strings.HasPrefix(f.File, p) {
					svg := strings.TrimSpace(strings.TrimPrefix(string(f.SVG), svgXMLDecl))
					// The SVG comes from svgplot, which escapes every text it draws.
					out = append(out, inlineFigure{File: f.File, Caption: f.Caption, SVG: template.HTML(svg)})
					break
				}
			}
		}
		return out
	}
	p := page{
		Title: reportTitle, Generated: ev.Started.Format(time.RFC3339), Took: time.Duration(ev.DurationNs).Round(time.Second).String(),
		Quick: ev.Quick, Machine: ev.Machine, Board: ev.Modes.Board, Commands: ev.Commands, Failures: ev.Failures, Missing: figs.missing,
		JSONFile: JSONFile, FiguresDir: FiguresDir, Memory: gib(ev.Machine.MemBytes), VRAM: gib(ev.Modes.Board.VRAMBytes),
		Params: []kv{
			{"matrix dimension (madd, mmul, fmadd, fmmul)", fmt.Sprint(ev.Params.MatrixDim)},
			{"loop iterations", fmt.Sprint(ev.Params.LoopIterations)},
			{"copy size (cpy, pincpy)", fmt.Sprintf("%d bytes", ev.Params.CopyBytes)},
			{"Rodinia-like workloads (bp, hs, lud, nn, srad, srad2)", rodiniaSizes(ev.Params)},
			{"fairness and overhead runs (Fig. 4.11-4.13)", fmt.Sprintf("timing %s; madd %d×%d, long-madd %d kernels per submission", ev.FairnessTiming, ev.FairnessMatrixDim, ev.FairnessMatrixDim, ev.FairnessRepeat)},
			{"contexts (Fig. 4.10)", fmt.Sprintf("timing %s; madd %d×%d, kernel run %d times per instance", ev.ContextsTiming, ev.Contexts.MatrixDim, ev.Contexts.MatrixDim, ev.Contexts.Repeat)},
		},
	}
	if len(ev.Modes.Results) > 0 {
		p.Params = append(p.Params, kv{"measured runs per workload", fmt.Sprintf("%d, after %d warm-up run(s)", ev.Modes.Results[0].Runs, ev.Modes.Warmup)})
	}
	var keys []string
	for k := range ev.Modes.Board.TimingInfo {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		p.Timing = append(p.Timing, kv{k, fmt.Sprint(ev.Modes.Board.TimingInfo[k])})
	}
	p.Sections = []section{
		{ID: "summary", Title: "Modes (Table 4.3)", Tables: []Table{table43(ev)},
			Intro: "Every mode ran every workload in a VM process of its own, over the real IPC protocol, on the simulated board; native ran the same guest driver straight on a board. Every result is verified against a host reference."},
		{ID: "overhead", Title: "Execution time against native (Fig. 4.8)", Tables: []Table{table48(ev)}, Figures: byPrefix("fig4.8")},
		{ID: "breakdown", Title: "Phase breakdown (Fig. 4.9)", Figures: byPrefix("fig4.9"),
			Intro: "init: context, channel and buffers set up; htod and dtoh: copies; launch: the kernels and the wait for them; close: everything torn down."},
		{ID: "shadowing", Title: "Shadow page-table scans and BAR traps (Fig. 4.3-4.5)", Figures: byPrefix("fig4.3", "fig4.4", "fig4.5"), Tables: []Table{tableCounters(ev)}},
		{ID: "hypercalls", Title: "Hypercalls (Table 4.1)", Tables: []Table{table41(ev)}},
		{ID: "contexts", Title: "Contexts in one VM against VMs (Fig. 4.10)", Figures: byPrefix("fig4.10"), Tables: []Table{table410(ev)},
			Intro: "The same madd application, 1, 2, 4 and 8 at once: natively, all in one VM (each in its own GPU context), and one per VM."},
		{ID: "fairness", Title: "GPU time fairness (Fig. 4.11-4.13)", Figures: byPrefix("fig4.11", "fig4.12", "fig4.13"), Tables: []Table{tableFairness(ev)}},
	}
	var buf bytes.Buffer
	if err := pageTemplate.Execute(&buf, p); err != nil {
		return nil, fmt.Errorf("report: render HTML: %w", err)
	}
	return buf.Bytes(), nil
}

// pageTemplate is the report page. It is parsed once and never modified.
var pageTemplate = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{{.Title}}</title>
<style>
body { font-family: "DejaVu Sans", Arial, Helvetica, sans-serif; margin: 2em auto; max-width: 1320px; color: #222; padding: 0 1em; }
h1 { font-size: 1.6em; } h2 { margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
caption { caption-side: top; text-align: left; font-style: italic; padding-bottom: 0.4em; }
figure { display: inline-block; margin: 0.5em; vertical-align: top; }
figcaption { font-size: 0.85em; max-width: 600px; }
.warn { color: #a00; } .quick { background: #fff4d0; padding: 0.5em; border: 1px solid #e0c060; }
code, pre { background: #f6f6f6; padding: 0.1em 0.3em; white-space: pre-wrap; }
nav a { margin-right: 1em; }
</style>
</head>
<body>
<h1>{{.Title}}</h1>
<p>Generated {{.Generated}} in {{.Took}}; the numbers behind this page are in <a href="{{.JSONFile}}">{{.JSONFile}}</a>, each figure as SVG under <a href="{{.FiguresDir}}/">{{.FiguresDir}}/</a>.</p>
{{if .Quick}}<p class="quick">This is a <b>quick</b> run (small inputs, short runs) for CI: it shows that every experiment runs and every figure is drawn, not the numbers to quote.</p>{{end}}
<nav>{{range .Sections}}<a href="#{{.ID}}">{{.Title}}</a> {{end}}</nav>
{{if .Failures}}<h2 class="warn">Failures</h2><ul>{{range .Failures}}<li class="warn">{{.}}</li>{{end}}</ul>{{end}}
<h2 id="setup">Machine, board and commands</h2>
<table><caption>Machine</caption>
<tr><th>CPU</th><td>{{.Machine.CPUModel}} ({{.Machine.CPUs}} CPUs)</td></tr>
<tr><th>memory</th><td>{{.Memory}}</td></tr>
<tr><th>kernel</th><td>{{.Machine.Kernel}}</td></tr>
<tr><th>Go</th><td>{{.Machine.GoVersion}} {{.Machine.OS}}</td></tr>
{{if .Machine.Revision}}<tr><th>gpuvm revision</th><td>{{.Machine.Revision}}</td></tr>{{end}}
</table>
<table><caption>Board: {{.Board.Name}} ({{.Board.Kind}}), {{.VRAM}} VRAM, {{.Board.Channels}} channels, timing profile <b>{{.Board.Timing}}</b></caption>
{{range .Timing}}<tr><th>{{.K}}</th><td>{{.V}}</td></tr>{{end}}
</table>
<table><caption>Workload sizes</caption>
{{range .Params}}<tr><th>{{.K}}</th><td>{{.V}}</td></tr>{{end}}
</table>
<p>Commands that reproduce this report:</p>
<pre>{{range .Commands}}{{.}}
{{end}}</pre>
{{range .Sections}}
<h2 id="{{.ID}}">{{.Title}}</h2>
{{if .Intro}}<p>{{.Intro}}</p>{{end}}
{{range .Figures}}<figure id="{{.File}}">{{.SVG}}<figcaption>{{.Caption}} <a href="figures/{{.File}}">SVG</a></figcaption></figure>
{{end}}
{{range .Tables}}<table id="{{.ID}}"><caption>{{.Caption}}</caption>
<tr>{{range .Header}}<th>{{.}}</th>{{end}}</tr>
{{range .Rows}}<tr>{{range .}}<td>{{.}}</td>{{end}}</tr>
{{end}}</table>{{if .Note}}<p>{{.Note}}</p>{{end}}
{{end}}
{{end}}
{{if .Missing}}<h2 class="warn">Figures not drawn</h2><ul>{{range .Missing}}<li>{{.}}</li>{{end}}</ul>{{end}}
</body>
</html>
`))

// MarkdownFile is the report's tables as Markdown, for docs/performance.md.
const MarkdownFile = "tables.md"

// Markdown returns the report's tables as Markdown, each under its
// caption.
func Markdown(ev bench.Evaluation) []byte {
	var b bytes.Buffer
	cell := func(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
	for _, t := range []Table{table43(ev), table48(ev), table41(ev), table410(ev), tableFairness(ev)} {
		if len(t.Rows) == 0 {
			continue
		}
		fmt.Fprintf(&b, "%s\n\n|", t.Caption)
		for _, h := range t.Header {
			fmt.Fprintf(&b, " %s |", cell(h))
		}
		b.WriteString("\n|")
		for range t.Header {
			b.WriteString("---|")
		}
		b.WriteString("\n")
		for _, r := range t.Rows {
			b.WriteString("|")
			for _, c := range r {
				fmt.Fprintf(&b, " %s |", cell(c))
			}
			b.WriteString("\n")
		}
		if t.Note != "" {
			fmt.Fprintf(&b, "\n%s\n", t.Note)
		}
		b.WriteString("\n")
	}
	return b.Bytes()
}
