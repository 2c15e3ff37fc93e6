package nouveau

import (
	"errors"
	"fmt"

	"github.com/gpuvm/gpuvm/gpu/hwseq"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// Errors a caller may classify with errors.Is.
var (
	ErrTimeout      = hwseq.ErrTimeout
	ErrNotSupported = errors.New("GPU not supported")
	ErrNoChannel    = errors.New("no free channel")
	ErrChannelFault = errors.New("channel fault")
	ErrDeviceGone   = hwseq.ErrDeviceGone
	ErrClosed       = errors.New("closed")
)

// FaultError describes a channel that the GPU stopped. It wraps ErrChannelFault.
type FaultError struct {
	Channel int
	Addr    uint64 // faulting GPU virtual address (when the report names this channel)
	Reason  uint32 // nvc0.FaultReason*
	Write   bool
	Known   bool // the fault report registers named this channel
}

func (e *FaultError) Error() string {
	if !e.Known {
		return fmt.Sprintf("channel %d stopped by the GPU", e.Channel)
	}
	op := "read"
	if e.Write {
		op = "write"
	}
	return fmt.Sprintf("channel %d fault: %s at %#x (%s)", e.Channel, op, e.Addr, nvc0.FaultReasonName(e.Reason))
}

// Unwrap makes errors.Is(err, ErrChannelFault) true.
func (e *FaultError) Unwrap() error { return ErrChannelFault }
