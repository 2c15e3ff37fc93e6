// Package ioreq is a Xen ioreq server: the device-model side of Xen's
// I/O emulation protocol (xen/hvm/ioreq.h) for a secondary emulator.
//
// When a guest vCPU touches a port, MMIO range or PCI config space that a
// server claimed, Xen writes an ioreq_t into the vCPU's slot of the
// server's shared page, sets its state to READY, notifies the vCPU's
// event channel and blocks the vCPU. The server copies the request out,
// serves it, writes the result, sets the state to IORESP_READY and
// notifies back; Xen then resumes the vCPU.
//
// Raw is ioreq_t as laid out in the page, and Decode turns one into a
// Request, refusing what gpuvm does not serve (string and rep operations,
// data_is_ptr, sizes other than 1/2/4/8, unknown types, a state other than
// READY) with an error wrapping ErrUnsupported or ErrMalformed. A Server
// serves a Page through a Handler, one goroutine per vCPU, each woken by
// the vCPU's Notifier: Open builds one on Xen (privcmd dm_op and
// MMAP_RESOURCE, /dev/xen/evtchn), NewServer over any page and
// notifiers — package ioreqtest provides an in-memory hypervisor for
// tests on machines without Xen.
//
// The page is written by the hypervisor and, in Xen's legacy mode, by the
// guest: the server reads each slot once, validates the copy, and never
// reads a field again. A refused request is answered (reads return all
// ones, writes are dropped), counted and logged at a bounded rate, so a
// hostile request never stops the vCPU or the server.
package ioreq
