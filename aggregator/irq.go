package aggregator

import (
	"sync/atomic"

	"github.com/gpuvm/gpuvm/ipc"
)

// Virtual interrupts. A real GPU interrupts its driver when work ends or
// faults; the aggregator does the same for each VM whose device model
// takes interrupts (ipc feature IRQ, docs/protocol.md §6.6), so that a
// fully virtualized guest sleeps in its fence wait instead of polling its
// fence memory and trapping a fault-register read every millisecond.
//
// A VM's interrupt is raised
//
//   - when one of its submissions ends — completed, faulted, or stopped by
//     the aggregator (watchdog, channel free, teardown): the dispatcher's
//     onEnded hook, which sees every completion as it reaps;
//   - when a fault report is delivered to it (deliverFault, deliverPBDMA;
//     also the watchdog's own report, reportKilled), so that a guest
//     waiting on another channel's fence looks at its fault registers.
//
// Both run under the dispatcher's or the fault collector's lock: raising
// is the connection's Interrupt, an atomic add and, only while one of the
// VM's threads sleeps, one FUTEX_WAKE; it never blocks and allocates
// nothing. Only the VM's own events raise it, so its count tells it
// nothing about other VMs that its own fences do not.

// irqLine is how a VM's interrupt is raised.
type irqLine struct {
	raise func()
}

// vgpuIRQ is the VM's interrupt line, unset while its device model takes
// no interrupts (the socket transport, an older device model, the
// in-process harness).
type vgpuIRQ struct {
	line atomic.Pointer[irqLine]
}

// wireIRQ connects v's interrupt to its device model's connection, if
// that offers interrupts. Under v.mu unless v is torn down already, so its
// teardown's dropVM is still to come and forgets the dispatcher's hook
// (as for a pvdrm back end).
func (a *Aggregator) wireIRQ(v *VGPU, conn *ipc.ServerConn) {
	if !conn.InterruptsOffered() {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.dead {
		return
	}
	v.irq.line.Store(&irqLine{raise: conn.Interrupt})
	a.disp.onEnded(v, conn.Interrupt)
}

// raiseIRQ raises v's virtual interrupt, if its device model takes one.
func (v *VGPU) raiseIRQ() {
	if l := v.irq.line.Load(); l != nil {
		l.raise()
	}
}
