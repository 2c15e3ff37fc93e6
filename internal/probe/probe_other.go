//go:build !amd64

package probe

// TrapBegin marks the start of a trapped guest access to vGPU vgpu's BAR
// bar (a write if write). There is no tracer on this architecture.
//
//go:noinline
func TrapBegin(vgpu, bar int, write bool) {}

// TrapEnd marks the end of the trapped access begun on the same goroutine.
//
//go:noinline
func TrapEnd(vgpu int) {}

// Release marks a guest submission of vGPU vgpu given to the GPU after
// waiting waitNs nanoseconds since its doorbell.
//
//go:noinline
func Release(vgpu int, waitNs int64) {}
