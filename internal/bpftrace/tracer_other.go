//go:build !(linux && amd64)

package bpftrace

import (
	"errors"
	"runtime"
)

// Tracer is not available on this platform: the probe points' arguments
// are read from amd64 registers, and BPF is Linux's.
type Tracer struct{}

// Attach says tracing is not available here.
func Attach(Options) (*Tracer, error) {
	return nil, errors.New("gpuvm trace runs on linux/amd64 only, not " + runtime.GOOS + "/" + runtime.GOARCH)
}

// CheckPrivileges says tracing is not available here.
func CheckPrivileges() error {
	_, err := Attach(Options{})
	return err
}

// SchedVia says how on-CPU time is traced.
func (*Tracer) SchedVia() string { return "" }

// Watch sets the processes whose on-CPU time is counted.
func (*Tracer) Watch([]int) error { return nil }

// Snapshot reads the counters.
func (*Tracer) Snapshot() (Snapshot, error) { return Snapshot{}, errors.New("not supported") }

// Close detaches everything.
func (*Tracer) Close() error { return nil }
