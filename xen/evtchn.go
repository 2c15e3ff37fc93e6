//go:build linux && (amd64 || arm64)

package xen

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// Evtchn is one event channel port, bound through its own /dev/xen/evtchn
// descriptor (non-blocking). Notify and Wait may be called concurrently
// with each other, not with a Bind or Close. A nil *Evtchn is a closed one:
// Notify and Wait fail.
type Evtchn struct {
	fd   int
	port uint32 // local port, 0 until bound
}

// OpenEvtchn opens dir/evtchn (dir "" is DevDir). The channel is bound
// next, with BindUnbound or BindInterdomain.
func OpenEvtchn(dir string) (*Evtchn, error) {
	fd, err := openDev(dir, "evtchn", unix.O_NONBLOCK)
	if err != nil {
		return nil, err
	}
	return &Evtchn{fd: fd}, nil
}

// BindUnbound allocates a local port for domain remote to bind (a split
// driver's front end does, and publishes Port for its back end).
func (e *Evtchn) BindUnbound(remote uint16) error {
	arg := evtchnBindUnboundPort{RemoteDomain: uint32(remote)}
	port, err := evtchnIoctl(uintptr(e.fd), ioctlEvtchnBindUnboundPort, &arg, fmt.Sprintf("allocate a port for domain %d", remote))
	e.port = port
	return err
}

// BindInterdomain binds a local port to port remotePort of domain remote
// (a split driver's back end does, to the port its front end published).
func (e *Evtchn) BindInterdomain(remote uint16, remotePort uint32) error {
	arg := evtchnBindInterdomain{RemoteDomain: uint32(remote), RemotePort: remotePort}
	port, err := evtchnIoctl(uintptr(e.fd), ioctlEvtchnBindInterdomain, &arg, fmt.Sprintf("bind port %d of domain %d", remotePort, remote))
	e.port = port
	return err
}

// Port returns the local port, 0 until the channel is bound.
func (e *Evtchn) Port() uint32 { return e.port }

// Notify sends an event to the other end of the channel.
func (e *Evtchn) Notify() error {
	if e == nil {
		return errors.New("xen evtchn: notify: channel closed")
	}
	arg := evtchnPort{Port: e.port}
	_, err := evtchnIoctl(uintptr(e.fd), ioctlEvtchnNotify, &arg, "notify")
	return err
}

// Wait blocks until an event arrived on the port (and re-enables it),
// ctx is done (its error), or max passes (nil).
func (e *Evtchn) Wait(ctx context.Context, max time.Duration) error {
	if e == nil {
		return errors.New("xen evtchn: wait: channel closed")
	}
	deadline := time.Now().Add(max)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil
		}
		pfd := []unix.PollFd{{Fd: int32(e.fd), Events: unix.POLLIN}}
		n, err := unix.Poll(pfd, int(min(left, 50*time.Millisecond)/time.Millisecond)+1)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("xen evtchn: wait: %w", err)
		}
		if n > 0 {
			return e.drain()
		}
	}
}

// drain reads the pending ports (4 bytes each) and unmasks this one: the
// kernel masks a port as it delivers it. An overflowed event ring
// (EFBIG) is reset.
func (e *Evtchn) drain() error {
	var buf [64]byte
	for range 64 { // bounded: each read takes up to 16 ports, and only one is bound
		n, err := unix.Read(e.fd, buf[:])
		if errors.Is(err, unix.EFBIG) {
			if _, err := ioctl(uintptr(e.fd), ioctlEvtchnReset, nil); err != nil {
				return fmt.Errorf("xen evtchn: reset after overflow: %w", err)
			}
			continue
		}
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) || (err == nil && n == 0) {
			break
		}
		if err != nil {
			return fmt.Errorf("xen evtchn: read: %w", err)
		}
	}
	var p [4]byte
	binary.NativeEndian.PutUint32(p[:], e.port)
	if _, err := unix.Write(e.fd, p[:]); err != nil {
		return fmt.Errorf("xen evtchn: unmask port %d: %w", e.port, err)
	}
	return nil
}

// Close unbinds the port and closes the descriptor.
func (e *Evtchn) Close() error {
	var err error
	if e.port != 0 {
		arg := evtchnPort{Port: e.port}
		_, err = evtchnIoctl(uintptr(e.fd), ioctlEvtchnUnbind, &arg, fmt.Sprintf("unbind port %d", e.port))
		e.port = 0
	}
	return errors.Join(err, closeFd(&e.fd))
}
