package gpu

import "time"

// Interrupter is an MMIO whose device delivers its interrupt to the
// driver: a count of interrupts raised, which a driver thread can sleep
// on. The device raises it when work it was given ends (completes, faults
// or is stopped) and when it reports a fault, so a driver waiting for a
// fence sleeps until the count moves instead of polling memory and the
// fault registers. Drivers use it when the MMIO offers it and
// IRQCount's ok is true; otherwise they poll.
type Interrupter interface {
	// IRQCount returns the interrupts raised so far (a wrapping counter:
	// compare for equality only), and whether the device delivers any.
	// A driver takes it before checking what an interrupt announces.
	IRQCount() (n uint32, ok bool)
	// WaitIRQ sleeps until the count differs from seen or timeout
	// passed, and returns the count (seen itself on a timeout). An error
	// means the device is gone (or delivers no interrupts): the driver
	// must not wait again.
	WaitIRQ(seen uint32, timeout time.Duration) (uint32, error)
}
