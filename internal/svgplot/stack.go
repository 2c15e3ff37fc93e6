package svgplot

import (
	"strconv"
)

// Segment is one part of a StackedBarChart's bar: the bar of Group gets a
// segment of Value, coloured and named in the legend by Label (e.g. the
// phase of a run: init, htod, launch, dtoh, close).
type Segment struct {
	Group, Label string
	Value        float64
}

// StackedBarChart draws one bar per group, made of its segments stacked
// bottom to top in the order of their labels' first appearance, such as the
// phase breakdown of a run's execution time (the GPUvm thesis' Fig. 4.9).
// Groups appear left to right in the order of their first appearance.
//
// With Normalize every bar is scaled to a total of 1 (a breakdown into
// fractions; a group whose segments sum to 0 is drawn empty); otherwise the
// axis spans 0 to the tallest bar, extended to nice tick values. Values must
// be finite and >= 0. Width and Height are in pixels; 0 means DefaultWidth
// × DefaultHeight.
type StackedBarChart struct {
	Title, YLabel string
	Segments      []Segment
	Normalize     bool
	Width, Height int
}

// SVG renders the chart as a standalone SVG 1.1 document.
//
// It returns an error (wrapping ErrNoData, ErrInvalidValue, ErrDuplicateBar
// or ErrInvalidSize) if there are no segments, if a value is NaN, infinite
// or negative, if two segments share Group and Label, or if the size is
// negative or too small for the plot.
func (c StackedBarChart) SVG() ([]byte, error) {
	if len(c.Segments) == 0 {
		return nil, wrap(ErrNoData, "stacked bar chart has no segments")
	}
	var groups, labels []string
	groupIdx, labelIdx := map[string]int{}, map[string]int{}
	type key struct{ g, l int }
	value := map[key]float64{}
	for i, s := range c.Segments {
		if !finite(s.Value) || s.Value < 0 {
			return nil, wrap(ErrInvalidValue, "segment %d (%q, %q) has value %v, not a finite value >= 0", i, s.Group, s.Label, s.Value)
		}
		g, ok := groupIdx[s.Group]
		if !ok {
			g = len(groups)
			groupIdx[s.Group] = g
			groups = append(groups, s.Group)
		}
		l, ok := labelIdx[s.Label]
		if !ok {
			l = len(labels)
			labelIdx[s.Label] = l
			labels = append(labels, s.Label)
		}
		if _, dup := value[key{g, l}]; dup {
			return nil, wrap(ErrDuplicateBar, "segment %d repeats group %q label %q", i, s.Group, s.Label)
		}
		value[key{g, l}] = s.Value
	}
	totals := make([]float64, len(groups))
	for k, v := range value {
		totals[k.g] += v
	}
	scaleOf := func(g int) float64 {
		if !c.Normalize {
			return 1
		}
		if totals[g] == 0 {
			return 0
		}
		return 1 / totals[g]
	}
	top := 0.0
	for g, t := range totals {
		top = max(top, t*scaleOf(g))
	}
	if !finite(top) {
		return nil, wrap(ErrInvalidValue, "a bar's total is not finite")
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
	var hi *float64
	if c.Normalize {
		one := 1.0
		hi = &one
	}
	zero := 0.0
	ys, err := linearScale(0, max(top, 1e-12), &zero, hi, yTarget(f.height()))
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
	d.p(`<g class="bars">`, "\n")
	bw := slot * 0.6
	for g, name := range groups {
		x := f.left + float64(g)*slot + (slot-bw)/2
		sum := 0.0
		for l, label := range labels {
			v, ok := value[key{g, l}]
			if !ok || v == 0 {
				continue
			}
			v *= scaleOf(g)
			y0, y1 := py(sum), py(sum+v)
			sum += v
			d.p(`<rect class="bar" x="`, num(x), `" y="`, num(y1), `" width="`, num(bw), `" height="`, num(y0-y1),
				`" fill="`, Color(l), `" stroke="#FFFFFF" stroke-width="0.5"><title>`,
				esc(name+" / "+label+": "+strconv.FormatFloat(value[key{g, l}], 'g', 6, 64)), "</title></rect>\n")
		}
	}
	d.p("</g>\n")

	d.p(`<g class="x-axis">`, "\n")
	d.p(`<line x1="`, num(f.left), `" y1="`, num(f.bottom), `" x2="`, num(f.right), `" y2="`, num(f.bottom),
		`" stroke="#000000" stroke-width="1"/>`, "\n")
	d.groupNames(f, groups, slot, rotate)
	d.p("</g>\n")

	d.p(`<g class="legend">`, "\n")
	lx := f.right + 16
	// Top to bottom in the legend as in the bars: the last label on top.
	for i := range labels {
		l := len(labels) - 1 - i
		y := f.top + 8 + float64(i)*18
		d.p(`<rect class="swatch" x="`, num(lx), `" y="`, num(y-6), `" width="12" height="12" fill="`, Color(l), `"/>`, "\n")
		d.text(lx+18, y+4, labels[l], "")
	}
	d.p("</g>\n</svg>\n")
	return d.Bytes(), nil
}
