package svgplot

import (
	"fmt"
	"hash/fnv"
	"math"
)

// Series is one line of a LineChart: the points (X[i], Y[i]) joined in
// order (X need not be sorted, but usually is, e.g. time in seconds).
// Name appears in the legend and may contain any text.
type Series struct {
	Name string
	X, Y []float64
}

// LineChart is a chart of one or more series drawn as lines, such as the
// GPU usage of each VM over time.
//
// The X axis spans the data, extended to nice tick values. The Y axis
// spans [YMin, YMax]; a nil bound is automatic: the data minimum (or 0 if
// all Y >= 0) and the data maximum (or 0 if all Y <= 0), extended to nice
// tick values. Explicit bounds are used exactly and points outside them are
// clipped. Width and Height are in pixels; 0 means DefaultWidth ×
// DefaultHeight. The legend is drawn right of the plot, one row per series.
type LineChart struct {
	Title, XLabel, YLabel string
	Series                []Series
	YMin, YMax            *float64 // nil = automatic
	Width, Height         int      // 0 = 720×360
}

// SVG renders the chart as a standalone SVG 1.1 document.
//
// It returns an error (wrapping ErrNoData, ErrLengthMismatch,
// ErrInvalidValue, ErrInvalidRange or ErrInvalidSize) if there are no
// series or no points at all, if a series' X and Y lengths differ, if a
// value or bound is NaN or infinite, if YMin >= YMax, or if the size is
// negative or too small for the plot.
func (c LineChart) SVG() ([]byte, error) {
	if len(c.Series) == 0 {
		return nil, wrap(ErrNoData, "line chart has no series")
	}
	xmin, xmax := math.Inf(1), math.Inf(-1)
	ymin, ymax := math.Inf(1), math.Inf(-1)
	for i, s := range c.Series {
		if len(s.X) != len(s.Y) {
			return nil, wrap(ErrLengthMismatch, "series %d (%q) has %d X and %d Y values", i, s.Name, len(s.X), len(s.Y))
		}
		for j := range s.X {
			x, y := s.X[j], s.Y[j]
			if !finite(x) || !finite(y) {
				return nil, wrap(ErrInvalidValue, "series %d (%q) point %d is (%v, %v)", i, s.Name, j, x, y)
			}
			xmin, xmax = min(xmin, x), max(xmax, x)
			ymin, ymax = min(ymin, y), max(ymax, y)
		}
	}
	if xmin > xmax {
		return nil, wrap(ErrNoData, "line chart series have no points")
	}
	ymin, ymax = min(ymin, 0), max(ymax, 0)
	for _, b := range []*float64{c.YMin, c.YMax} {
		if b != nil && !finite(*b) {
			return nil, wrap(ErrInvalidRange, "Y bound %v is not finite", *b)
		}
	}
	if c.YMin != nil && c.YMax != nil && !(*c.YMin < *c.YMax) {
		return nil, wrap(ErrInvalidRange, "YMin %v not below YMax %v", *c.YMin, *c.YMax)
	}
	// With only one bound given the automatic one must stay on its side.
	if c.YMin != nil && c.YMax == nil && ymax <= *c.YMin {
		ymax = *c.YMin
	}
	if c.YMax != nil && c.YMin == nil && ymin >= *c.YMax {
		ymin = *c.YMax
	}

	w, h, err := size(c.Width, c.Height)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(c.Series))
	for i, s := range c.Series {
		names[i] = s.Name
	}
	var f frame
	f.top = 20
	if c.Title != "" {
		f.top = 44
	}
	f.bottom = h - 28
	if c.XLabel != "" {
		f.bottom -= 20
	}
	f.right = w - legendWidth(names, w)
	ys, err := linearScale(ymin, ymax, c.YMin, c.YMax, yTarget(f.height()))
	if err != nil {
		return nil, err
	}
	f.left = yLabelSpace(ys, c.YLabel)
	if f.width() < minPlot || f.height() < minPlot {
		return nil, wrap(ErrInvalidSize, "%vx%v leaves no room for the plot", w, h)
	}
	xs, err := xScale(xmin, xmax, f.width())
	if err != nil {
		return nil, err
	}

	// The data group is rendered first so that the clip-path id can be
	// derived from it: deterministic, yet unlikely to collide when several
	// charts are inlined into one HTML page.
	var data doc
	px := func(x float64) float64 { return f.left + xs.frac(x)*f.width() }
	py := func(y float64) float64 { return f.bottom - ys.frac(y)*f.height() }
	for i, s := range c.Series {
		data.p(`<polyline class="series" fill="none" stroke="`, Color(i), `" stroke-width="2" stroke-linejoin="round"`)
		if d := dash(i); d != "" {
			data.p(` stroke-dasharray="`, d, `"`)
		}
		data.p(` points="`)
		for j := range s.X {
			if j > 0 {
				data.p(" ")
			}
			data.p(num(px(s.X[j])), ",", num(py(s.Y[j])))
		}
		data.p(`"><title>`, esc(s.Name), "</title></polyline>\n")
		if len(s.X) == 1 { // a lone point draws no line; mark it
			data.p(`<circle cx="`, num(px(s.X[0])), `" cy="`, num(py(s.Y[0])), `" r="3" fill="`, Color(i), `"/>`, "\n")
		}
	}
	hash := fnv.New64a()
	hash.Write(data.Bytes())
	clipID := fmt.Sprintf("svgplot-clip-%016x", hash.Sum64())

	var d doc
	d.header(w, h, c.Title)
	d.p("<defs><clipPath id=\"", clipID, `"><rect x="`, num(f.left), `" y="`, num(f.top),
		`" width="`, num(f.width()), `" height="`, num(f.height()), "\"/></clipPath></defs>\n")
	d.yAxis(f, ys, c.YLabel)
	d.xAxis(f, xs, c.XLabel)
	d.p(`<g class="data" clip-path="url(#`, clipID, `)">`, "\n")
	d.Write(data.Bytes())
	d.p("</g>\n")

	d.p(`<g class="legend">`, "\n")
	lx := f.right + 16
	for i, n := range names {
		y := f.top + 8 + float64(i)*18
		d.p(`<line x1="`, num(lx), `" y1="`, num(y), `" x2="`, num(lx+24), `" y2="`, num(y),
			`" stroke="`, Color(i), `" stroke-width="2"`)
		if ds := dash(i); ds != "" {
			d.p(` stroke-dasharray="`, ds, `"`)
		}
		d.p("/>\n")
		d.text(lx+30, y+4, n, "")
	}
	d.p("</g>\n</svg>\n")
	return d.Bytes(), nil
}

// yTarget is the number of Y tick intervals to aim for on a plot of the
// given height.
func yTarget(height float64) int { return min(max(int(height/45), 2), 10) }

// xScale builds the X scale, reducing the number of ticks until their
// labels fit side by side.
func xScale(xmin, xmax, width float64) (scale, error) {
	for target := min(max(int(width/90), 2), 10); ; target-- {
		s, err := linearScale(xmin, xmax, nil, nil, target)
		if err != nil || target <= 2 {
			return s, err
		}
		widest := 0.0
		for _, l := range s.labels {
			widest = max(widest, textWidth(l))
		}
		if len(s.ticks) < 2 || widest+10 <= width/float64(len(s.ticks)-1) {
			return s, nil
		}
	}
}

// xAxis draws vertical grid lines, tick marks and labels for s, the
// horizontal axis line at the bottom of the plot, and the axis label.
func (d *doc) xAxis(f frame, s scale, label string) {
	d.p(`<g class="x-axis">`, "\n")
	for i, t := range s.ticks {
		x := f.left + s.frac(t)*f.width()
		d.p(`<line x1="`, num(x), `" y1="`, num(f.top), `" x2="`, num(x), `" y2="`, num(f.bottom),
			`" stroke="#EEEEEE" stroke-width="1"/>`, "\n")
		d.p(`<line x1="`, num(x), `" y1="`, num(f.bottom), `" x2="`, num(x), `" y2="`, num(f.bottom+5),
			`" stroke="#000000" stroke-width="1"/>`, "\n")
		d.text(x, f.bottom+18, s.labels[i], ` text-anchor="middle"`)
	}
	d.p(`<line x1="`, num(f.left), `" y1="`, num(f.bottom), `" x2="`, num(f.right), `" y2="`, num(f.bottom),
		`" stroke="#000000" stroke-width="1"/>`, "\n")
	if label != "" {
		d.text((f.left+f.right)/2, f.bottom+38, label, ` text-anchor="middle"`)
	}
	d.p("</g>\n")
}
