package xenbus

import (
	"testing"

	"github.com/gpuvm/gpuvm/internal/cprobe"
)

// TestStateABI checks the states against Xen's io/xenbus.h (Debian's
// libxen-dev), compiled by gcc.
func TestStateABI(t *testing.T) {
	c := cprobe.Run(t, "libxen-dev", []string{"xen/io/xenbus.h"}, "", `
	P("XenbusStateUnknown", XenbusStateUnknown); P("XenbusStateInitialising", XenbusStateInitialising);
	P("XenbusStateInitWait", XenbusStateInitWait); P("XenbusStateInitialised", XenbusStateInitialised);
	P("XenbusStateConnected", XenbusStateConnected); P("XenbusStateClosing", XenbusStateClosing);
	P("XenbusStateClosed", XenbusStateClosed); P("XenbusStateReconfiguring", XenbusStateReconfiguring);
	P("XenbusStateReconfigured", XenbusStateReconfigured);`)
	cprobe.Compare(t, c, map[string]int64{
		"XenbusStateUnknown": int64(StateUnknown), "XenbusStateInitialising": int64(StateInitialising),
		"XenbusStateInitWait": int64(StateInitWait), "XenbusStateInitialised": int64(StateInitialised),
		"XenbusStateConnected": int64(StateConnected), "XenbusStateClosing": int64(StateClosing),
		"XenbusStateClosed": int64(StateClosed), "XenbusStateReconfiguring": int64(StateReconfiguring),
		"XenbusStateReconfigured": int64(StateReconfigured),
	})
}
