package svgplot

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"slices"
	"strings"
	"testing"
)

// element is one start element found while parsing an SVG document.
type element struct {
	name  string
	attrs map[string]string
}

// parse checks that b is well-formed XML with an <svg> root in the SVG
// namespace and a viewBox, and returns its start elements and the
// concatenated character data.
func parse(t *testing.T, b []byte) ([]element, string) {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(b))
	var els []element
	var text strings.Builder
	depth := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("output is not well-formed XML: %v\n%s", err, b)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if depth == 0 {
				if tok.Name.Local != "svg" || tok.Name.Space != "http://www.w3.org/2000/svg" {
					t.Fatalf("root element is %v", tok.Name)
				}
			}
			depth++
			e := element{name: tok.Name.Local, attrs: map[string]string{}}
			for _, a := range tok.Attr {
				e.attrs[a.Name.Local] = a.Value
			}
			if depth == 1 {
				if e.attrs["viewBox"] == "" || e.attrs["version"] != "1.1" {
					t.Fatalf("svg root lacks viewBox or version: %v", e.attrs)
				}
			}
			els = append(els, e)
		case xml.EndElement:
			depth--
		case xml.CharData:
			text.Write(tok)
			text.WriteByte('\n')
		}
	}
	if len(els) == 0 {
		t.Fatal("empty document")
	}
	return els, text.String()
}

// count returns how many elements have the given name and, if class is
// not empty, that class.
func count(els []element, name, class string) int {
	n := 0
	for _, e := range els {
		if e.name == name && (class == "" || e.attrs["class"] == class) {
			n++
		}
	}
	return n
}

func ptr(v float64) *float64 { return &v }

func sampleLine() LineChart {
	mk := func(name string, phase float64) Series {
		s := Series{Name: name}
		for i := 0; i <= 50; i++ {
			x := float64(i) * 0.1
			s.X = append(s.X, x)
			s.Y = append(s.Y, 50+40*math.Sin(x+phase))
		}
		return s
	}
	return LineChart{
		Title: "GPU usage", XLabel: "time (s)", YLabel: "usage (%)",
		Series: []Series{mk("VM1", 0), mk("VM2", 1), mk("VM3", 2)},
	}
}

func sampleBars() BarChart {
	return BarChart{
		Title: "Relative time", YLabel: "relative to native",
		Bars: []Bar{
			{"madd", "native", 1}, {"madd", "FV", 389}, {"madd", "PV", 1.2},
			{"mmul", "native", 1}, {"mmul", "FV", 30}, {"mmul", "PV", 1.1},
			{"fmadd", "native", 1}, {"fmadd", "PV", 1.05},
		},
	}
}

func TestLineChartStructure(t *testing.T) {
	c := sampleLine()
	b, err := c.SVG()
	if err != nil {
		t.Fatal(err)
	}
	els, text := parse(t, b)
	if got := count(els, "polyline", ""); got != len(c.Series) {
		t.Errorf("%d polylines, want %d", got, len(c.Series))
	}
	if got := count(els, "path", ""); got != 0 {
		t.Errorf("%d paths, want 0", got)
	}
	for _, want := range []string{"GPU usage", "time (s)", "usage (%)", "VM1", "VM2", "VM3", "0", "100"} {
		if !strings.Contains(text, want+"\n") {
			t.Errorf("text %q missing", want)
		}
	}
	// Series get distinct colours.
	var colours []string
	for _, e := range els {
		if e.name == "polyline" {
			colours = append(colours, e.attrs["stroke"])
		}
	}
	for i, c := range colours {
		if c != Color(i) || slices.Index(colours, c) != i {
			t.Errorf("series colours %v not distinct palette colours", colours)
			break
		}
	}
	// Each polyline has one point per sample.
	for _, e := range els {
		if e.name == "polyline" {
			if n := len(strings.Fields(e.attrs["points"])); n != 51 {
				t.Errorf("polyline has %d points, want 51", n)
			}
		}
	}
}

func TestLineChartManySeriesCycle(t *testing.T) {
	var c LineChart
	for i := range PaletteSize + 2 {
		c.Series = append(c.Series, Series{Name: "s", X: []float64{0, 1}, Y: []float64{float64(i), 1}})
	}
	c.Height = 600
	b, err := c.SVG()
	if err != nil {
		t.Fatal(err)
	}
	els, _ := parse(t, b)
	var first, wrapped element
	n := 0
	for _, e := range els {
		if e.name == "polyline" {
			if n == 0 {
				first = e
			}
			if n == PaletteSize {
				wrapped = e
			}
			n++
		}
	}
	if n != PaletteSize+2 {
		t.Fatalf("%d polylines", n)
	}
	if first.attrs["stroke"] != wrapped.attrs["stroke"] {
		t.Errorf("palette does not cycle: %q vs %q", first.attrs["stroke"], wrapped.attrs["stroke"])
	}
	if first.attrs["stroke-dasharray"] == wrapped.attrs["stroke-dasharray"] {
		t.Errorf("cycled series not told apart by dashes")
	}
}

func TestLineChartSinglePointAndEmptySeries(t *testing.T) {
	c := LineChart{Series: []Series{{Name: "one", X: []float64{2}, Y: []float64{3}}, {Name: "empty"}}}
	b, err := c.SVG()
	if err != nil {
		t.Fatal(err)
	}
	els, _ := parse(t, b)
	if got := count(els, "polyline", "series"); got != 2 {
		t.Errorf("%d polylines, want 2", got)
	}
	if got := count(els, "circle", ""); got != 1 {
		t.Errorf("%d circles, want 1", got)
	}
}

func TestBarChartStructure(t *testing.T) {
	for _, log := range []bool{false, true} {
		c := sampleBars()
		c.LogScale = log
		b, err := c.SVG()
		if err != nil {
			t.Fatalf("log=%v: %v", log, err)
		}
		els, text := parse(t, b)
		if got := count(els, "rect", "bar"); got != len(c.Bars) {
			t.Errorf("log=%v: %d bars, want %d", log, got, len(c.Bars))
		}
		if got := count(els, "rect", "swatch"); got != 3 {
			t.Errorf("log=%v: %d legend swatches, want 3", log, got)
		}
		for _, want := range []string{"madd", "mmul", "fmadd", "native", "FV", "PV", "Relative time", "relative to native"} {
			if !strings.Contains(text, want+"\n") {
				t.Errorf("log=%v: text %q missing", log, want)
			}
		}
		if log {
			for _, want := range []string{"0.1", "1", "10", "100", "1000"} {
				if !strings.Contains(text, "\n"+want+"\n") {
					t.Errorf("log tick %q missing", want)
				}
			}
		}
		// Same label, same colour; every bar has a positive height, and
		// the "native" bars (value 1) are equally tall.
		fill := map[string]string{}
		var nativeH []string
		i := 0
		for _, e := range els {
			if e.name != "rect" || e.attrs["class"] != "bar" {
				continue
			}
			bar := c.Bars[i]
			i++
			if f, ok := fill[bar.Label]; ok && f != e.attrs["fill"] {
				t.Errorf("label %q has fills %q and %q", bar.Label, f, e.attrs["fill"])
			}
			fill[bar.Label] = e.attrs["fill"]
			if h := e.attrs["height"]; h == "0" || strings.HasPrefix(h, "-") {
				t.Errorf("log=%v: bar %v has height %s", log, bar, h)
			}
			if bar.Label == "native" {
				nativeH = append(nativeH, e.attrs["height"])
			}
		}
		if len(fill) != 3 || fill["native"] == fill["FV"] || fill["FV"] == fill["PV"] || fill["PV"] == fill["native"] {
			t.Errorf("fills not distinct: %v", fill)
		}
		if len(nativeH) != 3 || nativeH[0] != nativeH[1] || nativeH[1] != nativeH[2] {
			t.Errorf("native bar heights %v", nativeH)
		}
	}
}

func TestBarChartNegativeAndRotated(t *testing.T) {
	c := BarChart{Bars: []Bar{
		{"a-rather-long-workload-name-1", "x", 3}, {"a-rather-long-workload-name-2", "x", -2},
		{"a-rather-long-workload-name-3", "x", 1}, {"a-rather-long-workload-name-4", "x", 2},
		{"a-rather-long-workload-name-5", "x", 5}, {"a-rather-long-workload-name-6", "x", 4},
	}}
	b, err := c.SVG()
	if err != nil {
		t.Fatal(err)
	}
	els, text := parse(t, b)
	if got := count(els, "rect", "bar"); got != 6 {
		t.Errorf("%d bars", got)
	}
	if !strings.Contains(text, "\n-2\n") {
		t.Errorf("no negative tick")
	}
	if !bytes.Contains(b, []byte("rotate(-35")) {
		t.Errorf("long group names not rotated")
	}
}

func TestEscaping(t *testing.T) {
	const nasty = `VM <1> & "x" 'y'`
	lc := LineChart{Title: nasty, XLabel: nasty, YLabel: nasty,
		Series: []Series{{Name: nasty, X: []float64{0, 1}, Y: []float64{0, 1}}}}
	bc := BarChart{Title: nasty, YLabel: nasty, Bars: []Bar{{Group: nasty, Label: nasty, Value: 1}}}
	for name, c := range map[string]interface{ SVG() ([]byte, error) }{"line": lc, "bar": bc} {
		b, err := c.SVG()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if bytes.Contains(b, []byte("<1>")) || bytes.Contains(b, []byte("& ")) {
			t.Errorf("%s: unescaped text in output", name)
		}
		_, text := parse(t, b)
		if !strings.Contains(text, nasty+"\n") {
			t.Errorf("%s: name does not round-trip through XML", name)
		}
	}
}

func TestDeterminism(t *testing.T) {
	for name, c := range map[string]interface{ SVG() ([]byte, error) }{
		"line": sampleLine(), "bar": sampleBars(), "barlog": BarChart{Bars: sampleBars().Bars, LogScale: true},
	} {
		a, err := c.SVG()
		if err != nil {
			t.Fatal(err)
		}
		for range 5 {
			b, err := c.SVG()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(a, b) {
				t.Fatalf("%s: output differs between calls", name)
			}
		}
	}
}

func TestNumberPrecision(t *testing.T) {
	c := LineChart{Series: []Series{{Name: "p", X: []float64{0, 1.0 / 3, 2}, Y: []float64{math.Pi, 1e-12, 2.0 / 3}}}}
	b, err := c.SVG()
	if err != nil {
		t.Fatal(err)
	}
	els, _ := parse(t, b)
	for _, e := range els {
		for k, v := range e.attrs {
			for _, f := range strings.FieldsFunc(v, func(r rune) bool { return r == ' ' || r == ',' }) {
				if i := strings.IndexByte(f, '.'); i >= 0 && len(f)-i-1 > 2 && strings.Trim(f, "0123456789.-") == "" {
					t.Errorf("%s %s=%q has more than 2 decimals", e.name, k, v)
				}
			}
		}
	}
}

func TestSize(t *testing.T) {
	c := sampleLine()
	b, err := c.SVG()
	if err != nil {
		t.Fatal(err)
	}
	els, _ := parse(t, b)
	if els[0].attrs["viewBox"] != "0 0 720 360" || els[0].attrs["width"] != "720" {
		t.Errorf("default size: %v", els[0].attrs)
	}
	c.Width, c.Height = 1000, 500
	b, err = c.SVG()
	if err != nil {
		t.Fatal(err)
	}
	els, _ = parse(t, b)
	if els[0].attrs["viewBox"] != "0 0 1000 500" {
		t.Errorf("size: %v", els[0].attrs)
	}
}

func TestErrors(t *testing.T) {
	good := []Series{{Name: "a", X: []float64{0, 1}, Y: []float64{0, 1}}}
	nan, inf := math.NaN(), math.Inf(1)
	lines := []struct {
		name string
		c    LineChart
		want error
	}{
		{"no series", LineChart{}, ErrNoData},
		{"no points", LineChart{Series: []Series{{Name: "a"}}}, ErrNoData},
		{"mismatch", LineChart{Series: []Series{{X: []float64{1, 2}, Y: []float64{1}}}}, ErrLengthMismatch},
		{"NaN y", LineChart{Series: []Series{{X: []float64{1}, Y: []float64{nan}}}}, ErrInvalidValue},
		{"Inf x", LineChart{Series: []Series{{X: []float64{inf}, Y: []float64{1}}}}, ErrInvalidValue},
		{"NaN YMax", LineChart{Series: good, YMax: ptr(nan)}, ErrInvalidRange},
		{"YMin >= YMax", LineChart{Series: good, YMin: ptr(1), YMax: ptr(1)}, ErrInvalidRange},
		{"negative size", LineChart{Series: good, Width: -1}, ErrInvalidSize},
		{"too small", LineChart{Series: good, Width: 50, Height: 50}, ErrInvalidSize},
		{"huge range", LineChart{Series: []Series{{X: []float64{0, 1}, Y: []float64{-math.MaxFloat64, math.MaxFloat64}}}}, ErrInvalidRange},
	}
	for _, tc := range lines {
		if _, err := tc.c.SVG(); !errors.Is(err, tc.want) {
			t.Errorf("line %s: err = %v, want %v", tc.name, err, tc.want)
		}
	}
	bars := []struct {
		name string
		c    BarChart
		want error
	}{
		{"no bars", BarChart{}, ErrNoData},
		{"NaN", BarChart{Bars: []Bar{{"g", "l", nan}}}, ErrInvalidValue},
		{"Inf", BarChart{Bars: []Bar{{"g", "l", -inf}}}, ErrInvalidValue},
		{"log zero", BarChart{LogScale: true, Bars: []Bar{{"g", "l", 1}, {"g", "m", 0}}}, ErrInvalidValue},
		{"log negative", BarChart{LogScale: true, Bars: []Bar{{"g", "l", -1}}}, ErrInvalidValue},
		{"duplicate", BarChart{Bars: []Bar{{"g", "l", 1}, {"g", "l", 2}}}, ErrDuplicateBar},
		{"negative size", BarChart{Bars: []Bar{{"g", "l", 1}}, Height: -5}, ErrInvalidSize},
		{"too small", BarChart{Bars: []Bar{{"g", "l", 1}}, Width: 60, Height: 60}, ErrInvalidSize},
	}
	for _, tc := range bars {
		if _, err := tc.c.SVG(); !errors.Is(err, tc.want) {
			t.Errorf("bar %s: err = %v, want %v", tc.name, err, tc.want)
		}
	}
}

func TestExplicitYRange(t *testing.T) {
	c := sampleLine()
	c.YMin, c.YMax = ptr(0), ptr(60) // data goes up to 90: clipped
	b, err := c.SVG()
	if err != nil {
		t.Fatal(err)
	}
	els, text := parse(t, b)
	if count(els, "clipPath", "") != 1 || !strings.Contains(text, "\n60\n") || strings.Contains(text, "\n80\n") {
		t.Errorf("explicit range not honoured")
	}
	// Only one bound given, beyond the data.
	c.YMin, c.YMax = ptr(200), nil
	if _, err := c.SVG(); err != nil {
		t.Errorf("YMin above data: %v", err)
	}
	c.YMin, c.YMax = nil, ptr(-5)
	if _, err := c.SVG(); err != nil {
		t.Errorf("YMax below data: %v", err)
	}
}

func near(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Abs(a[i]-b[i]) > 1e-12*max(1, math.Abs(b[i])) {
			return false
		}
	}
	return true
}

func TestLinearTicks(t *testing.T) {
	tests := []struct {
		lo, hi     float64
		target     int
		ticks      []float64
		labels     []string
		axLo, axHi float64
	}{
		{0, 1, 5, []float64{0, 0.2, 0.4, 0.6, 0.8, 1}, []string{"0", "0.2", "0.4", "0.6", "0.8", "1.0"}, 0, 1},
		{0, 97, 5, []float64{0, 20, 40, 60, 80, 100}, []string{"0", "20", "40", "60", "80", "100"}, 0, 100},
		{0.003, 0.02, 5, []float64{0, 0.005, 0.01, 0.015, 0.02}, []string{"0", "0.005", "0.010", "0.015", "0.020"}, 0, 0.02},
		{0, 97, 10, []float64{0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100}, nil, 0, 100},
		{-3, 7, 5, []float64{-4, -2, 0, 2, 4, 6, 8}, []string{"-4", "-2", "0", "2", "4", "6", "8"}, -4, 8},
		{5, 5, 5, []float64{5, 5.1, 5.2, 5.3, 5.4, 5.5}, nil, 5, 5.5},
		{0, 0, 5, []float64{0, 0.2, 0.4, 0.6, 0.8, 1}, nil, 0, 1},
		{1e8, 5e8, 4, []float64{1e8, 2e8, 3e8, 4e8, 5e8}, []string{"1e+08", "2e+08", "3e+08", "4e+08", "5e+08"}, 1e8, 5e8},
	}
	for _, tc := range tests {
		s, err := linearScale(tc.lo, tc.hi, nil, nil, tc.target)
		if err != nil {
			t.Errorf("%v..%v: %v", tc.lo, tc.hi, err)
			continue
		}
		if !near(s.ticks, tc.ticks) || (tc.labels != nil && !slices.Equal(s.labels, tc.labels)) {
			t.Errorf("%v..%v: ticks %v %q, want %v %q", tc.lo, tc.hi, s.ticks, s.labels, tc.ticks, tc.labels)
		}
		if !near([]float64{s.lo, s.hi}, []float64{tc.axLo, tc.axHi}) {
			t.Errorf("%v..%v: axis %v..%v, want %v..%v", tc.lo, tc.hi, s.lo, s.hi, tc.axLo, tc.axHi)
		}
	}
	// Fixed bounds are kept exactly, with ticks inside them.
	s, err := linearScale(0.3, 9.7, ptr(0.5), ptr(9.5), 5)
	if err != nil {
		t.Fatal(err)
	}
	if s.lo != 0.5 || s.hi != 9.5 || !near(s.ticks, []float64{2, 4, 6, 8}) {
		t.Errorf("fixed bounds: %v..%v ticks %v", s.lo, s.hi, s.ticks)
	}
}

func TestNiceStepIs125(t *testing.T) {
	for span := 1e-6; span < 1e9; span *= 1.37 {
		for target := 2; target <= 10; target++ {
			step := niceStep(span, target)
			m := step / math.Pow10(int(math.Floor(math.Log10(step)+eps)))
			if math.Abs(m-1) > 1e-9 && math.Abs(m-2) > 1e-9 && math.Abs(m-5) > 1e-9 {
				t.Fatalf("niceStep(%v, %d) = %v (mantissa %v)", span, target, step, m)
			}
			if n := span / step; n > float64(target)+1e-9 || n < float64(target)/5-1e-9 {
				t.Fatalf("niceStep(%v, %d) = %v gives %v intervals", span, target, step, n)
			}
		}
	}
}

func TestLogTicks(t *testing.T) {
	tests := []struct {
		lo, hi float64
		ticks  []float64
		labels []string
	}{
		{1, 389, []float64{1, 10, 100, 1000}, []string{"1", "10", "100", "1000"}},
		{0.5, 389, []float64{0.1, 1, 10, 100, 1000}, []string{"0.1", "1", "10", "100", "1000"}},
		{0.001, 0.02, []float64{0.001, 0.01, 0.1}, []string{"0.001", "0.01", "0.1"}},
		{3, 3, []float64{1, 10}, []string{"1", "10"}},
		{10, 10, []float64{10, 100}, []string{"10", "100"}},
		{1e-9, 1e-7, []float64{1e-9, 1e-8, 1e-7}, []string{"1e-9", "1e-8", "1e-7"}},
	}
	for _, tc := range tests {
		s, err := logScale(tc.lo, tc.hi)
		if err != nil {
			t.Errorf("%v..%v: %v", tc.lo, tc.hi, err)
			continue
		}
		if !near(s.ticks, tc.ticks) || !slices.Equal(s.labels, tc.labels) {
			t.Errorf("%v..%v: ticks %v %q, want %v %q", tc.lo, tc.hi, s.ticks, s.labels, tc.ticks, tc.labels)
		}
	}
	// Wide ranges are thinned out to at most maxLogTicks ticks.
	s, err := logScale(1e-20, 1e20)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.ticks) > maxLogTicks || len(s.ticks) < 2 {
		t.Errorf("1e-20..1e20: %d ticks", len(s.ticks))
	}
	if _, err := logScale(0, 10); !errors.Is(err, ErrInvalidRange) {
		t.Errorf("log scale from 0: %v", err)
	}
}

func TestColor(t *testing.T) {
	seen := map[string]bool{}
	for i := range PaletteSize {
		c := Color(i)
		if len(c) != 7 || c[0] != '#' || seen[c] {
			t.Errorf("Color(%d) = %q", i, c)
		}
		seen[c] = true
	}
	if Color(PaletteSize+1) != Color(1) || Color(-1) != Color(PaletteSize-1) {
		t.Errorf("palette does not cycle")
	}
}

func TestNum(t *testing.T) {
	for in, want := range map[float64]string{0: "0", 1: "1", 1.5: "1.5", 1.234: "1.23", -0.001: "0", 720: "720", 2.005: "2", -3.1: "-3.1"} {
		if got := num(in); got != want {
			t.Errorf("num(%v) = %q, want %q", in, got, want)
		}
	}
}
