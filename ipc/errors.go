package ipc

import (
	"errors"
	"fmt"
)

// ErrClosed is returned by operations on a Client, Listener or ServerConn
// that was closed locally.
var ErrClosed = errors.New("ipc: use of closed connection")

// ErrPeerClosed is matched (errors.Is) by every error that means the other
// side went away: socket EOF or hang-up, a Bye from the server.
var ErrPeerClosed = errors.New("ipc: peer closed the connection")

// ErrProtocolViolation is matched (errors.Is) by every *ViolationError.
var ErrProtocolViolation = errors.New("ipc: protocol violation")

// ViolationError is how the server ends a connection whose client broke the
// protocol (malformed, truncated or oversized frame, bad ring index, unknown
// op, bad BAR or offset, unexpected data or fds), and how the client reports a
// malformed message from the server.
type ViolationError struct {
	Reason string
}

func (e *ViolationError) Error() string { return "ipc: protocol violation: " + e.Reason }

// Is makes errors.Is(err, ErrProtocolViolation) true.
func (e *ViolationError) Is(target error) bool { return target == ErrProtocolViolation }

func violationf(format string, args ...any) error {
	return &ViolationError{Reason: fmt.Sprintf(format, args...)}
}

// RejectedError is returned by Dial when the server refused the Hello: the
// aggregator rejected it, or the package's own validation did.
type RejectedError struct {
	Reason string
}

func (e *RejectedError) Error() string { return "ipc: rejected by server: " + e.Reason }

// ByeError is returned by client calls after the server ended the connection
// with a reason (a Bye message): a protocol violation the server detected, a
// handler error, or the aggregator shutting down. It matches ErrPeerClosed.
type ByeError struct {
	Reason string
}

func (e *ByeError) Error() string { return "ipc: server closed the connection: " + e.Reason }

// Is makes errors.Is(err, ErrPeerClosed) true.
func (e *ByeError) Is(target error) bool { return target == ErrPeerClosed }

// HandlerError wraps an error returned by a Handler; Serve returns it and the
// client receives its text as the Bye reason.
type HandlerError struct {
	Op  string // "read32", "write32" or "call"
	Err error
}

func (e *HandlerError) Error() string { return "ipc: handler " + e.Op + ": " + e.Err.Error() }

// Unwrap returns the handler's error.
func (e *HandlerError) Unwrap() error { return e.Err }

// EndedError is what Serve returns when the server ended the connection with
// ServerConn.End; the client received Reason in the Bye.
type EndedError struct {
	Reason string
}

func (e *EndedError) Error() string { return "ipc: connection ended by the server: " + e.Reason }
