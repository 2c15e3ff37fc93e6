package svgplot_test

import (
	"fmt"
	"math"

	"github.com/gpuvm/gpuvm/internal/svgplot"
)

// GPU usage of two VMs sampled in 500 ms windows.
func ExampleLineChart() {
	var vm1, vm2 svgplot.Series
	vm1.Name, vm2.Name = "VM1", "VM2"
	for i := 0; i <= 20; i++ {
		t := float64(i) * 0.5
		vm1.X, vm1.Y = append(vm1.X, t), append(vm1.Y, 50+10*math.Sin(t))
		vm2.X, vm2.Y = append(vm2.X, t), append(vm2.Y, 50-10*math.Sin(t))
	}
	yMin, yMax := 0.0, 100.0
	svg, err := svgplot.LineChart{
		Title:  "GPU usage (500 ms windows)",
		XLabel: "time (s)",
		YLabel: "GPU usage (%)",
		Series: []svgplot.Series{vm1, vm2},
		YMin:   &yMin,
		YMax:   &yMax,
	}.SVG()
	fmt.Println(len(svg) > 0, err)
	// Output: true <nil>
}

// Execution time normalised to native, one group per workload.
func ExampleBarChart() {
	svg, err := svgplot.BarChart{
		Title:  "Execution time relative to native",
		YLabel: "relative time",
		Bars: []svgplot.Bar{
			{Group: "madd", Label: "native", Value: 1},
			{Group: "madd", Label: "FV", Value: 3.2},
			{Group: "madd", Label: "PV", Value: 1.4},
			{Group: "mmul", Label: "native", Value: 1},
			{Group: "mmul", Label: "FV", Value: 1.1},
			{Group: "mmul", Label: "PV", Value: 1.02},
		},
		LogScale: true,
	}.SVG()
	fmt.Println(len(svg) > 0, err)
	// Output: true <nil>
}
