//go:build !race

package main

// raceBuild: this test binary has the race detector.
const raceBuild = false
