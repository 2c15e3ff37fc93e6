//go:build linux && amd64

package xenguest

import (
	"fmt"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// inl and outl are one IN and one OUT instruction of 32 bits
// (ioport_amd64.s). The calling thread needs the I/O permission for the
// port, or the instruction faults (SIGSEGV).
func inl(port uint16) uint32
func outl(port uint16, v uint32)

// portWindow is the I/O BAR: a range of ports reached with IN and OUT.
//
// ioperm(2) grants a thread, not a process: Linux keeps the I/O bitmap per
// thread (threads created later share their creator's), and a Go program's
// goroutines move between threads it already has. So an access pins its
// goroutine to its thread for the instruction and grants the thread the
// ports the first time that thread makes an access; the set of threads
// granted is keyed by thread id. The check (a gettid system call, a lock)
// falls inside the access's measured time: a fraction of a microsecond,
// against a trap's several.
type portWindow struct {
	base, n uint64
	mu      sync.Mutex
	granted map[int]bool // thread ids with the permission
	closed  bool
	fail    func(error) // records a refused grant (BARs.fail)
}

func openPorts(base, size uint64) (window, error) {
	if base+size > 1<<16 {
		return nil, fmt.Errorf("I/O ports %#x+%#x: beyond the 64 Ki port space", base, size)
	}
	w := &portWindow{base: base, n: size, granted: map[int]bool{}}
	// Ask once here, so that a guest without the right (not root, no
	// CAP_SYS_RAWIO, a kernel without CONFIG_X86_IOPL_IOPERM) fails at open
	// rather than on its first hypercall.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := w.grant(); err != nil {
		return nil, err
	}
	return w, nil
}

// grant gives the current thread the ports, once. The caller holds its
// goroutine on the thread.
func (w *portWindow) grant() error {
	tid := unix.Gettid()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return fmt.Errorf("I/O ports %#x+%#x: closed", w.base, w.n)
	}
	if w.granted[tid] {
		return nil
	}
	if err := unix.Ioperm(int(w.base), int(w.n), 1); err != nil {
		why := ""
		switch err {
		case unix.EPERM:
			why = " (run the guest program as root: it needs CAP_SYS_RAWIO)"
		case unix.ENOSYS:
			why = " (the kernel has no ioperm: CONFIG_X86_IOPL_IOPERM is off, or this is a sandbox)"
		}
		return fmt.Errorf("ioperm(%#x, %d): %w%s", w.base, w.n, err, why)
	}
	w.granted[tid] = true
	return nil
}

func (w *portWindow) load32(off uint64) uint32 {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := w.grant(); err != nil {
		w.refused(err)
		return 0xFFFFFFFF
	}
	return inl(uint16(w.base + off))
}

func (w *portWindow) store32(off uint64, v uint32) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := w.grant(); err != nil {
		w.refused(err)
		return
	}
	outl(uint16(w.base+off), v)
}

// onFail sets where a refused grant is recorded (BARs.fail).
func (w *portWindow) onFail(f func(error)) { w.fail = f }

func (w *portWindow) refused(err error) {
	if w.fail != nil {
		w.fail(err)
	}
}

func (w *portWindow) size() uint64 { return w.n }

// close drops the permission of the calling thread; the threads granted
// before keep theirs until they exit (nothing can reach into them), but no
// access goes through the window any more.
func (w *portWindow) close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil
	}
	w.closed = true
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if w.granted[unix.Gettid()] {
		return unix.Ioperm(int(w.base), int(w.n), 0)
	}
	return nil
}
