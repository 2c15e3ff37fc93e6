package svgplot

import (
	"math"
	"strconv"
)

// Bar is one bar of a BarChart. Bars are grouped by Group (e.g. the
// workload) and, within a group, told apart by Label (e.g. the mode:
// native, full virtualisation, para-virtualisation), which selects the
// bar's colour and legend entry.
type Bar struct {
	Group, Label string
	Value        float64
}

// BarChart is a grouped bar chart, such as execution times normalised to
// native. Groups appear left to right, and labels within each group, in the
// order of their first appearance in Bars. Every group reserves a slot for
// every label, so a bar missing from a group leaves a gap and bars of the
// same label line up across groups.
//
// On a linear axis bars start at 0 and the axis spans 0 and all values,
// extended to nice tick values; negative values are drawn downwards. With
// LogScale the axis is base-10 logarithmic, spans from the power of ten at
// or below half the smallest value (so that a bar of the smallest value,
// e.g. a native baseline of 1, stays visible) to the power of ten at or
// above the largest value, has ticks at powers of ten, and all values must
// be > 0; bars start at the bottom of the axis. Width and Height are in pixels;
// 0 means DefaultWidth × DefaultHeight.
type BarChart struct {
	Title, YLabel string
	Bars          []Bar
	LogScale      bool
	Width, Height int // 0 = 720×360
}

// SVG renders the chart as a standalone SVG 1.1 document.
//
// It returns an error (wrapping ErrNoData, ErrInvalidValue,
// ErrDuplicateBar or ErrInvalidSize) if there are no bars, if a value is
// NaN or infinite (or <= 0 with LogScale), if two bars share Group and
// Label, or if the size is negative or too small for the plot.
func (c BarChart) SVG() ([]byte, error) {
	if len(c.Bars) == 0 {
		return nil, wrap(ErrNoData, "bar chart has no bars")
	}
	var groups, labels []string
	groupIdx := map[string]int{}
	labelIdx := map[string]int{}
	type key struct{ g, l int }
	seen := map[key]bool{}
	vmin, vmax := math.Inf(1), math.Inf(-1)
	for i, b := range c.Bars {
		if !finite(b.Value) {
			return nil, wrap(ErrInvalidValue, "bar %d (%q, %q) has value %v", i, b.Group, b.Label, b.Value)
		}
		if c.LogScale && b.Value <= 0 {
			return nil, wrap(ErrInvalidValue, "bar %d (%q, %q) has value %v, not > 0 as a logarithmic axis needs", i, b.Group, b.Label, b.Value)
		}
		g, ok := groupIdx[b.Group]
		if !ok {
			g = len(groups)
			groupIdx[b.Group] = g
			groups = append(groups, b.Group)
		}
		l, ok := labelIdx[b.Label]
		if !ok {
			l = len(labels)
			labelIdx[b.Label] = l
			labels = append(labels, b.Label)
		}
		if seen[key{g, l}] {
			return nil, wrap(ErrDuplicateBar, "bar %d repeats group %q label %q", i, b.Group, b.Label)
		}
		seen[key{g, l}] = true
		vmin, vmax = min(vmin, b.Value), max(vmax, b.Value)
	}

	w, h, err := size(c.Width, c.Height)
	if err != nil {
		return nil, err
	}
	var f frame
	f.top = 20
	if c.Title != "" {
		f.top = 44
	}
	f.bottom = h - 28
	f.right = w - legendWidth(labels, w)
	var ys scale
	if c.LogScale {
		// Half the smallest value keeps even the smallest bar (often
		// the native baseline, 1) at least log10(2) decades tall.
		ys, err = logScale(vmin/2, vmax)
	} else {
		ys, err = linearScale(min(vmin, 0), max(vmax, 0), nil, nil, yTarget(f.height()))
	}
	if err != nil {
		return nil, err
	}
	f.left = yLabelSpace(ys, c.YLabel)
	slot, rotate := layoutGroups(&f, groups, h)
	if f.width() < minPlot || f.height() < minPlot {
		return nil, wrap(ErrInvalidSize, "%vx%v leaves no room for the plot", w, h)
	}

	var d doc
	d.header(w, h, c.Title)
	d.yAxis(f, ys, c.YLabel)
	py := func(v float64) float64 { return f.bottom - ys.frac(v)*f.height() }
	base := f.bottom
	if !c.LogScale {
		base = py(0)
	}

	d.p(`<g class="bars">`, "\n")
	inner := slot * 0.8
	bw := inner / float64(len(labels))
	for _, b := range c.Bars {
		g, l := groupIdx[b.Group], labelIdx[b.Label]
		x := f.left + float64(g)*slot + (slot-inner)/2 + float64(l)*bw
		y := py(b.Value)
		top, height := min(y, base), math.Abs(y-base)
		d.p(`<rect class="bar" x="`, num(x), `" y="`, num(top), `" width="`, num(bw), `" height="`, num(height),
			`" fill="`, Color(l), `" stroke="#FFFFFF" stroke-width="0.5"><title>`,
			esc(b.Group+" / "+b.Label+": "+strconv.FormatFloat(b.Value, 'g', 6, 64)), "</title></rect>\n")
	}
	d.p("</g>\n")

	d.p(`<g class="x-axis">`, "\n")
	d.p(`<line x1="`, num(f.left), `" y1="`, num(base), `" x2="`, num(f.right), `" y2="`, num(base),
		`" stroke="#000000" stroke-width="1"/>`, "\n")
	if base != f.bottom {
		d.p(`<line x1="`, num(f.left), `" y1="`, num(f.bottom), `" x2="`, num(f.right), `" y2="`, num(f.bottom),
			`" stroke="#000000" stroke-width="1"/>`, "\n")
	}
	d.groupNames(f, groups, slot, rotate)
	d.p("</g>\n")

	d.p(`<g class="legend">`, "\n")
	lx := f.right + 16
	for i, l := range labels {
		y := f.top + 8 + float64(i)*18
		d.p(`<rect class="swatch" x="`, num(lx), `" y="`, num(y-6), `" width="12" height="12" fill="`, Color(i), `"/>`, "\n")
		d.text(lx+18, y+4, l, "")
	}
	d.p("</g>\n</svg>\n")
	return d.Bytes(), nil
}

// labelAngle is how far group names are rotated when they do not fit side
// by side.
const labelAngle = 35.0

// layoutGroups gives each group an equal slot along the plot's x axis and
// decides whether the group names must be rotated to fit; if so it moves
// f.left so that the first rotated name stays inside the chart and raises
// f.bottom to make room below the plot (at most a third of the height h).
// It returns the slot width and whether names are rotated.
func layoutGroups(f *frame, groups []string, h float64) (slot float64, rotate bool) {
	slot = f.width() / float64(len(groups))
	widest := 0.0
	for _, g := range groups {
		widest = max(widest, textWidth(g))
	}
	rotate = widest+6 > slot
	if rotate {
		// Keep the first rotated label, which extends left of its
		// group's centre, inside the chart.
		reach := widest*math.Cos(labelAngle*math.Pi/180) + 4
		if f.left+slot/2 < reach {
			// Solve left + (right-left)/(2n) = reach for left.
			k := 1 / (2 * float64(len(groups)))
			f.left = (reach - f.right*k) / (1 - k)
			slot = f.width() / float64(len(groups))
		}
		drop := widest*math.Sin(labelAngle*math.Pi/180) + 10
		f.bottom = h - 18 - min(drop, h/3)
	}
	return slot, rotate
}

// groupNames writes each group's name under its slot.
func (d *doc) groupNames(f frame, groups []string, slot float64, rotate bool) {
	for i, g := range groups {
		x := f.left + (float64(i)+0.5)*slot
		if rotate {
			y := f.bottom + 14
			d.text(x, y, g, ` text-anchor="end" transform="rotate(-`+num(labelAngle)+" "+num(x)+" "+num(y)+`)"`)
		} else {
			d.text(x, f.bottom+18, g, ` text-anchor="middle"`)
		}
	}
}
