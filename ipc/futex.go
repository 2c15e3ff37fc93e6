package ipc

import (
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Shared (not FUTEX_PRIVATE_FLAG) futex operations: the word lives in a
// MAP_SHARED memfd mapping and the waker may be another process.
const (
	futexWait = 0 // FUTEX_WAIT
	futexWake = 1 // FUTEX_WAKE
)

// futexWaitWord sleeps while *w == val. Spurious returns (EAGAIN, EINTR, a
// wake meant for a condition already consumed) are expected: callers loop.
//
// The wait is bounded by futexTimeout. No wake is ever expected to depend on
// it; it is defense in depth against a hostile peer that rewrites our wait
// word between a local interrupt's store and our FUTEX_WAIT.
func futexWaitWord(w *uint32, val uint32) {
	ts := unix.NsecToTimespec(int64(futexTimeout))
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWait, uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// futexWaitWordFor sleeps while *w == val, at most d (the caller's own
// timeout, not futexTimeout). Spurious returns are expected as above.
func futexWaitWordFor(w *uint32, val uint32, d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWait, uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// futexTimeout bounds every futex sleep.
const futexTimeout = 250 * time.Millisecond

// futexWakeWord wakes every waiter on w.
func futexWakeWord(w *uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWake, 1<<30, 0, 0, 0)
}
