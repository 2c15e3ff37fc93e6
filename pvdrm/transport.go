package pvdrm

import (
	"context"
	"time"
)

// Transport carries one ring between a front end and a back end: the
// shared ring memory and a notification in each direction. Local (memfd
// and eventfds) and the xen transport (a granted page and an event
// channel) implement it.
type Transport interface {
	// Ring returns the shared ring memory (whole pages, 8-byte aligned).
	Ring() []byte
	// Notify kicks the other end.
	Notify() error
	// Wait blocks until the other end kicked, ctx is done (its error), or
	// max passes (nil: callers re-check the ring after any wake-up).
	Wait(ctx context.Context, max time.Duration) error
	// Close releases the ring and the notification channel.
	Close() error
}

var _ Transport = (*Local)(nil)
