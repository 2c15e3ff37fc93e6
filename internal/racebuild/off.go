//go:build !race

// Package racebuild says whether the binary was built with the race
// detector: tests size their workloads by it (the race run is the short
// one, and instrumented code runs several times slower).
package racebuild

// Enabled reports that the binary was built with the race detector.
const Enabled = false
