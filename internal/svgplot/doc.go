// Package svgplot renders small, dependency-free SVG charts for benchmark
// reports: line charts (for example the GPU usage of each VM over time,
// sampled in 500 ms or 100 ms windows) and grouped bar charts (for example
// execution time normalised to native, one group per workload and one bar
// per virtualisation mode).
//
// The output is a standalone SVG 1.1 document (XML declaration, xmlns,
// width/height and viewBox) with a title, axes with "nice" tick values
// (steps of 1, 2 or 5 times a power of ten, or powers of ten on a
// logarithmic axis), grid lines, axis labels and a legend. Series and bars
// are coloured from a fixed colour-blind-friendly palette (Okabe–Ito, see
// [Color]), cycling when there are more entries than colours; line series
// that reuse a colour also get a different dash pattern.
//
// All user-supplied text (titles, labels, series, group and bar names) is
// XML-escaped, so names such as "<a&b>" are safe. Rendering is
// deterministic: the same input always produces the same bytes. Numbers are
// written with limited precision (coordinates with at most two decimals).
//
// Charts are plain values; SVG does not modify them and keeps no state, so
// charts may be rendered concurrently. Invalid input is reported with an
// error wrapping one of the Err* constants, which can be tested with
// errors.Is.
//
// The elements the package draws carry class attributes so that they can
// be found or styled: each line series is one <polyline class="series">,
// each bar one <rect class="bar">, legend swatches of bar charts are
// <rect class="swatch">, and the background is <rect class="background">.
package svgplot
