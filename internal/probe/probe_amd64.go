package probe

// TrapBegin marks the start of a trapped guest access to vGPU vgpu's BAR
// bar (a write if write), as the aggregator's (*VGPU).Read32 and Write32
// begin handling it. Stack at the probe: vgpu 8(SP), bar 16(SP), write
// 24(SP); R14 the goroutine, on which the matching TrapEnd runs.
func TrapBegin(vgpu, bar int, write bool)

// TrapEnd marks the end of the trapped access begun on the same goroutine
// by TrapBegin (the caller defers it: it runs on every return). Stack:
// vgpu 8(SP).
func TrapEnd(vgpu int)

// Release marks a guest submission of vGPU vgpu given to the GPU by the
// dispatcher after waiting waitNs nanoseconds since its doorbell queued it
// (a later doorbell on the same channel joins the queued submission and
// does not restart its wait). Stack: vgpu 8(SP), waitNs 16(SP).
func Release(vgpu int, waitNs int64)
