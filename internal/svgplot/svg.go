package svgplot

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Error is the type of the sentinel errors returned (wrapped) by the SVG
// methods. Being a string type, its values can be constants.
type Error string

// Error implements the error interface.
func (e Error) Error() string { return string(e) }

// Sentinel errors; the errors returned by SVG wrap one of these with
// details, so use errors.Is to test for them.
const (
	// ErrNoData: a chart without series or bars, or without any point.
	ErrNoData Error = "svgplot: no data"
	// ErrLengthMismatch: a Series whose X and Y have different lengths.
	ErrLengthMismatch Error = "svgplot: X and Y lengths differ"
	// ErrInvalidValue: a NaN or infinite value, or a value <= 0 on a
	// logarithmic axis.
	ErrInvalidValue Error = "svgplot: invalid value"
	// ErrInvalidRange: YMin/YMax are not finite or leave an empty range.
	ErrInvalidRange Error = "svgplot: invalid axis range"
	// ErrInvalidSize: a negative size, or one too small for the plot area.
	ErrInvalidSize Error = "svgplot: invalid chart size"
	// ErrDuplicateBar: two bars with the same Group and Label.
	ErrDuplicateBar Error = "svgplot: duplicate bar"
)

// wrap returns an error wrapping e with a formatted detail message.
func wrap(e Error, format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{e}, args...)...)
}

// Default chart size used when Width or Height is 0.
const (
	DefaultWidth  = 720
	DefaultHeight = 360
)

const (
	fontSize  = 12.0
	charWidth = 0.6 * fontSize // rough average glyph width of sans-serif
	minPlot   = 40.0           // minimum plot-area width and height
)

// PaletteSize is the number of distinct colours in the palette.
const PaletteSize = 12

// palette holds the Okabe–Ito colour-blind-friendly colours, then four of
// Paul Tol's (so that the ten modes of a report get ten colours), 7 bytes
// each. It is a constant so that it cannot be modified.
const palette = "#0072B2#E69F00#009E73#D55E00#56B4E9#CC79A7#000000#F0E442#882255#44AA99#999933#332288"

// Color returns the colour ("#RRGGBB") used for the i-th series or bar
// label: the Okabe–Ito palette blue, orange, bluish green, vermillion, sky
// blue, reddish purple, black and yellow, then Tol's wine, teal, olive and
// indigo, cycling for i >= PaletteSize.
// Negative i is accepted and also cycles.
func Color(i int) string {
	i %= PaletteSize
	if i < 0 {
		i += PaletteSize
	}
	return palette[i*7 : i*7+7]
}

// dash returns the stroke-dasharray for the i-th line series: solid for the
// first cycle through the palette, then dashed, then dotted.
func dash(i int) string {
	if i < 0 {
		i = -i
	}
	switch (i / PaletteSize) % 3 {
	case 1:
		return "7 4"
	case 2:
		return "2 3"
	}
	return ""
}

// num formats a coordinate with at most two decimals and no trailing zeros.
func num(v float64) string {
	s := strconv.FormatFloat(v, 'f', 2, 64)
	if strings.IndexByte(s, '.') >= 0 {
		s = strings.TrimRight(s, "0")
		s = strings.TrimSuffix(s, ".")
	}
	if s == "-0" {
		s = "0"
	}
	return s
}

// esc returns s escaped for use in XML text and attribute values.
func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s)) // never fails on a strings.Builder
	return b.String()
}

// textWidth estimates the rendered width of s in pixels.
func textWidth(s string) float64 {
	return float64(utf8.RuneCountInString(s)) * charWidth
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// size resolves the chart size, applying the defaults.
func size(w, h int) (float64, float64, error) {
	if w < 0 || h < 0 {
		return 0, 0, wrap(ErrInvalidSize, "negative width or height %dx%d", w, h)
	}
	if w == 0 {
		w = DefaultWidth
	}
	if h == 0 {
		h = DefaultHeight
	}
	return float64(w), float64(h), nil
}

// doc accumulates an SVG document.
type doc struct{ bytes.Buffer }

// p writes the parts verbatim.
func (d *doc) p(parts ...string) {
	for _, s := range parts {
		d.WriteString(s)
	}
}

// header writes the XML declaration, the <svg> start tag, the document
// title and a white background.
func (d *doc) header(w, h float64, title string) {
	d.p(`<?xml version="1.0" encoding="UTF-8" standalone="no"?>`, "\n")
	d.p(`<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="`, num(w),
		`" height="`, num(h), `" viewBox="0 0 `, num(w), " ", num(h),
		`" font-family="DejaVu Sans, Arial, Helvetica, sans-serif" font-size="`, num(fontSize), `">`, "\n")
	if title != "" {
		d.p("<title>", esc(title), "</title>\n")
	}
	d.p(`<rect class="background" x="0" y="0" width="`, num(w), `" height="`, num(h), `" fill="#FFFFFF"/>`, "\n")
	if title != "" {
		d.p(`<text class="title" x="`, num(w/2), `" y="24" text-anchor="middle" font-size="15" font-weight="bold">`,
			esc(title), "</text>\n")
	}
}

// text writes a <text> element with escaped content; extra holds further
// attributes (already escaped), e.g. ` text-anchor="end"`.
func (d *doc) text(x, y float64, s, extra string) {
	d.p(`<text x="`, num(x), `" y="`, num(y), `"`, extra, ">", esc(s), "</text>\n")
}

// frame is the plot area inside the chart.
type frame struct{ left, top, right, bottom float64 }

func (f frame) width() float64  { return f.right - f.left }
func (f frame) height() float64 { return f.bottom - f.top }

// yAxis draws horizontal grid lines, tick marks and labels for s, the
// vertical axis line, and the rotated axis label.
func (d *doc) yAxis(f frame, s scale, label string) {
	d.p(`<g class="y-axis">`, "\n")
	for i, t := range s.ticks {
		y := f.bottom - s.frac(t)*f.height()
		d.p(`<line x1="`, num(f.left), `" y1="`, num(y), `" x2="`, num(f.right), `" y2="`, num(y),
			`" stroke="#DDDDDD" stroke-width="1"/>`, "\n")
		d.p(`<line x1="`, num(f.left-5), `" y1="`, num(y), `" x2="`, num(f.left), `" y2="`, num(y),
			`" stroke="#000000" stroke-width="1"/>`, "\n")
		d.text(f.left-8, y+4, s.labels[i], ` text-anchor="end"`)
	}
	d.p(`<line x1="`, num(f.left), `" y1="`, num(f.top), `" x2="`, num(f.left), `" y2="`, num(f.bottom),
		`" stroke="#000000" stroke-width="1"/>`, "\n")
	if label != "" {
		x := f.left - yLabelSpace(s, label) + 16
		y := (f.top + f.bottom) / 2
		d.text(x, y, label, ` text-anchor="middle" transform="rotate(-90 `+num(x)+" "+num(y)+`)"`)
	}
	d.p("</g>\n")
}

// yLabelSpace is the width left of the plot needed for the tick labels of
// s and, if present, the rotated axis label.
func yLabelSpace(s scale, label string) float64 {
	w := 0.0
	for _, l := range s.labels {
		w = max(w, textWidth(l))
	}
	space := w + 14
	if label != "" {
		space += 26
	} else {
		space += 6
	}
	return space
}

// legendWidth is the width reserved right of the plot for a legend with
// the given names, capped at 40% of the chart width.
func legendWidth(names []string, chartWidth float64) float64 {
	w := 0.0
	for _, n := range names {
		w = max(w, textWidth(n))
	}
	return min(w+60, 0.4*chartWidth)
}
