package ipc

import (
	"errors"
	"strings"
)

// Surviving a save (docs/protocol.md §13.7). When the operator saves a
// vGPU to a state image, the aggregator ends its connection with a Bye
// whose reason begins ByeSaved: the vGPU's state is in the image, not
// lost, and the device model may keep its guest (RAM, driver state) and
// come back with a Hello whose Resume flag is set, on the daemon where the
// image is restored. Such a Hello is refused with a reason beginning
// RejectNoImage while no image waits for its domain: the device model
// tries again until its own bound.

// ByeSaved begins the reason of the Bye sent to the device model of a vGPU
// saved to a state image.
const ByeSaved = "vgpu-saved: "

// ByeHandoff begins the reason of the Bye sent to the device model of a
// vGPU handed to a new process of the daemon (docs/protocol.md §15): a
// saved Bye (it begins ByeSaved) whose image waits on the same socket.
const ByeHandoff = ByeSaved + "the daemon is restarting (gpuvm serve handoff)"

// IsHandoffBye reports whether err is a Bye saying that the daemon handed
// the vGPU to a new process of itself (its reason begins ByeHandoff).
func IsHandoffBye(err error) bool {
	var b *ByeError
	return errors.As(err, &b) && strings.HasPrefix(b.Reason, ByeHandoff)
}

// RejectNoImage begins the reason of the Reject of a Hello with Resume set
// when no state image waits for its domain (yet).
const RejectNoImage = "no-image: "

// IsSavedBye reports whether err is a Bye saying that the vGPU was saved
// to a state image (its reason begins ByeSaved).
func IsSavedBye(err error) bool {
	var b *ByeError
	return errors.As(err, &b) && strings.HasPrefix(b.Reason, ByeSaved)
}

// IsNoImage reports whether err is the Reject of a resuming Hello for
// which no state image waits (its reason begins RejectNoImage).
func IsNoImage(err error) bool {
	var r *RejectedError
	return errors.As(err, &r) && strings.HasPrefix(r.Reason, RejectNoImage)
}
