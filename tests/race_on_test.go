//go:build race

package tests

// raceBuild: this test binary has the race detector.
const raceBuild = true
