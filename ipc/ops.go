package ipc

// Call operations the aggregator serves (the op argument of Client.Call).
const (
	// OpCounters returns a group of the vGPU's counters: args [group];
	// result words are counters group*MaxCallResults ... in the order of the
	// aggregator's CounterNames. Status 0, or -1 for a group past the end.
	OpCounters uint16 = 1
	// OpReset resets the vGPU as a PCIe function-level reset does: no
	// arguments, no results; status 0 once the reset is complete, -1 if it
	// was refused, -5 if a channel would not stop and the vGPU was
	// destroyed instead (docs/protocol.md §5.4).
	OpReset uint16 = 2
)

// Welcome parameters the aggregator sets (Welcome.Params keys).
const (
	// ParamBAR1Size and ParamBAR3Size are the usable sizes, in bytes, of the
	// VM's BAR1 and BAR3 aperture slices (decimal).
	ParamBAR1Size = "bar1_size"
	ParamBAR3Size = "bar3_size"
	// ParamRemap is "1" when BAR remap is on: the extra files of the Welcome
	// are then the remap table and the VM's VRAM slice, in that order.
	ParamRemap = "remap"
	// ParamMMIOReadNs and ParamMMIOWriteNs are what one access to a
	// passed-through aperture page costs on the physical bus (nanoseconds,
	// decimal): remap removes the trap, not the bus transaction, so a device
	// model in front of a timed (simulated) board charges them itself.
	ParamMMIOReadNs  = "mmio_read_ns"
	ParamMMIOWriteNs = "mmio_write_ns"
	// ParamTrapNs is the hypervisor's share of one trapped access in the
	// aggregator's timing profile (nanoseconds, decimal): a VM exit and the
	// ioreq's trip to the device model and back, which a device model
	// without a hypervisor under it charges itself (0 or absent: none).
	ParamTrapNs = "trap_ns"
	// ParamTiming names the board's timing profile ("none", "fermi",
	// "fermi-xen"), for the device model to report with its results.
	ParamTiming = "timing"
)
