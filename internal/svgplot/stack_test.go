package svgplot

import (
	"encoding/xml"
	"errors"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

func TestStackedBarChartErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		c    StackedBarChart
		want error
	}{
		"empty":     {StackedBarChart{}, ErrNoData},
		"negative":  {StackedBarChart{Segments: []Segment{{"a", "x", -1}}}, ErrInvalidValue},
		"nan":       {StackedBarChart{Segments: []Segment{{"a", "x", math.NaN()}}}, ErrInvalidValue},
		"duplicate": {StackedBarChart{Segments: []Segment{{"a", "x", 1}, {"a", "x", 2}}}, ErrDuplicateBar},
		"tiny":      {StackedBarChart{Segments: []Segment{{"a", "x", 1}}, Width: 50, Height: 50}, ErrInvalidSize},
	} {
		if _, err := tc.c.SVG(); !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", name, err, tc.want)
		}
	}
}

// rectHeights returns the heights of the bar rectangles, in document order.
func rectHeights(t *testing.T, svg []byte) []float64 {
	t.Helper()
	re := regexp.MustCompile(`<rect class="bar" x="[^"]*" y="[^"]*" width="[^"]*" height="([^"]*)"`)
	var hs []float64
	for _, m := range re.FindAllSubmatch(svg, -1) {
		h, err := strconv.ParseFloat(string(m[1]), 64)
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
	}
	return hs
}

func TestStackedBarChartNormalizes(t *testing.T) {
	c := StackedBarChart{Title: "breakdown", YLabel: "fraction", Normalize: true, Segments: []Segment{
		{"native", "init", 1}, {"native", "launch", 3},
		{"fv", "init", 30}, {"fv", "launch", 10}, {"fv", "close", 60},
		{"empty", "init", 0},
	}}
	svg, err := c.SVG()
	if err != nil {
		t.Fatal(err)
	}
	if err := xml.Unmarshal(svg, new(struct{})); err != nil {
		t.Fatalf("not well-formed XML: %v", err)
	}
	hs := rectHeights(t, svg)
	if len(hs) != 5 {
		t.Fatalf("got %d segments drawn, want 5 (zero values are not drawn): %v", len(hs), hs)
	}
	native, fv := hs[0]+hs[1], hs[2]+hs[3]+hs[4]
	if d := native - fv; d > 0.05 || d < -0.05 {
		t.Errorf("normalised bars differ in height: native %v, fv %v", native, fv)
	}
	if r := hs[1] / hs[0]; r < 2.95 || r > 3.05 {
		t.Errorf("native launch/init height ratio %v, want 3", r)
	}
	if !strings.Contains(string(svg), "fv / close: 60") {
		t.Error("a segment's tooltip does not give its unscaled value")
	}
}

func TestStackedBarChartAbsolute(t *testing.T) {
	svg, err := StackedBarChart{Segments: []Segment{{"1", "a", 2}, {"1", "b", 2}, {"2", "a", 1}}}.SVG()
	if err != nil {
		t.Fatal(err)
	}
	hs := rectHeights(t, svg)
	if len(hs) != 3 {
		t.Fatalf("got %d rects", len(hs))
	}
	if r := (hs[0] + hs[1]) / hs[2]; r < 3.95 || r > 4.05 {
		t.Errorf("bar 1 (total 4) over bar 2 (total 1) height ratio %v, want 4", r)
	}
}
