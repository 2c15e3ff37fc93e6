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

// FaultError describes a channel that the GPU stopped: an MMU fault record
// (MMU true: Unit, Addr, Reason, Write) or a PBDMA error (PBDMA, Intr,
// Method, Data). It wraps ErrChannelFault.
type FaultError struct {
	Channel int
	Known   bool // a report named this channel (false: it stopped, cause unknown)

	MMU    bool
	Unit   int    // nvc0.FaultUnit*
	Addr   uint64 // faulting GPU virtual address
	Reason uint32 // nvc0.FaultReason*
	Write  bool

	PBDMA  int
	Intr   uint32 // nvc0.PBDMAIntr*
	Method uint32 // the offending method (byte offset) and its subchannel
	Subc   uint32
	Data   uint32
}

func (e *FaultError) Error() string {
	switch {
	case !e.Known:
		return fmt.Sprintf("channel %d stopped by the GPU", e.Channel)
	case e.MMU:
		op := "read"
		if e.Write {
			op = "write"
		}
		return fmt.Sprintf("channel %d fault: %s at %#x (%s, unit %#x)", e.Channel, op, e.Addr, nvc0.FaultReasonName(e.Reason), e.Unit)
	}
	return fmt.Sprintf("channel %d method error: PBDMA %d intr %#x at subchannel %d method %#x data %#x",
		e.Channel, e.PBDMA, e.Intr, e.Subc, e.Method, e.Data)
}

// Unwrap makes errors.Is(err, ErrChannelFault) true.
func (e *FaultError) Unwrap() error { return ErrChannelFault }
