//go:build !(linux && amd64)

package xenguest

import (
	"fmt"
	"runtime"
)

// openPorts: I/O ports are reached with ioperm and IN/OUT, which this
// package implements on linux/amd64 only.
func openPorts(base, size uint64) (window, error) {
	return nil, fmt.Errorf("I/O ports %#x+%#x: port I/O is implemented on linux/amd64 only (this is %s/%s)", base, size, runtime.GOOS, runtime.GOARCH)
}
