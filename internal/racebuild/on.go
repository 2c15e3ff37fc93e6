//go:build race

package racebuild

// Enabled reports that the binary was built with the race detector.
const Enabled = true
