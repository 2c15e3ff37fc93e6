package svgplot

import (
	"math"
	"os"
	"path/filepath"
	"testing"
)

// TestRenderFiles writes sample charts to $SVGPLOT_OUT for visual
// inspection; it is skipped when the variable is unset.
func TestRenderFiles(t *testing.T) {
	dir := os.Getenv("SVGPLOT_OUT")
	if dir == "" {
		t.Skip("SVGPLOT_OUT not set")
	}
	var series []Series
	for v := 0; v < 4; v++ {
		s := Series{Name: "VM" + string(rune('1'+v))}
		for i := 0; i <= 100; i++ {
			x := float64(i) * 0.1
			y := 25 + 20*math.Sin(x+float64(v)) + float64(v)*5
			s.X, s.Y = append(s.X, x), append(s.Y, y)
		}
		series = append(series, s)
	}
	series[3].Name = "VM <4> & co"
	hundred := 100.0
	files := map[string]interface{ SVG() ([]byte, error) }{
		"line.svg":      LineChart{Title: "GPU usage per VM (100 ms windows)", XLabel: "time (s)", YLabel: "GPU usage (%)", Series: series, YMax: &hundred},
		"line_auto.svg": LineChart{Title: "auto", Series: []Series{{Name: "a", X: []float64{0.003, 0.01, 0.02}, Y: []float64{0.1, 0.97, 0.5}}}},
		"bar_log.svg": BarChart{Title: "Execution time normalised to native", YLabel: "relative time (log)", LogScale: true, Bars: []Bar{
			{"madd", "Native", 1}, {"madd", "FV (Naive)", 389}, {"madd", "FV (Optimised)", 12}, {"madd", "PV", 1.2},
			{"mmul", "Native", 1}, {"mmul", "FV (Naive)", 40}, {"mmul", "FV (Optimised)", 3}, {"mmul", "PV", 1.05},
			{"fmadd", "Native", 1}, {"fmadd", "FV (Naive)", 200}, {"fmadd", "FV (Optimised)", 8}, {"fmadd", "PV", 1.1},
		}},
		"stacked.svg": StackedBarChart{Title: "Phase breakdown", YLabel: "fraction of the run", Normalize: true, Segments: []Segment{
			{"native", "init", 10}, {"native", "htod", 5}, {"native", "launch", 30}, {"native", "dtoh", 5}, {"native", "close", 2},
			{"fv-naive", "init", 400}, {"fv-naive", "htod", 50}, {"fv-naive", "launch", 31}, {"fv-naive", "dtoh", 40}, {"fv-naive", "close", 300},
		}},
		"bar_lin.svg": BarChart{Title: "Linear with rotated labels", YLabel: "seconds", Bars: []Bar{
			{"a-very-long-workload-name", "x", 3}, {"another-long-name", "x", -1}, {"third-long-workload", "x", 7},
			{"a-very-long-workload-name", "y", 2}, {"fourth-long-workload", "y", 5}, {"fifth-long-workload", "x", 1},
		}},
	}
	for name, c := range files {
		b, err := c.SVG()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
