package xen

import (
	"testing"

	"github.com/gpuvm/gpuvm/internal/cprobe"
)

// TestPublicHeaders checks the ranges of doc.go against Xen's public
// headers (Debian's libxen-dev), compiled by gcc.
func TestPublicHeaders(t *testing.T) {
	c := cprobe.Run(t, "libxen-dev", []string{"xen/xen.h", "xen/grant_table.h", "xen/event_channel.h"}, "", `
	P("DOMID_FIRST_RESERVED", DOMID_FIRST_RESERVED);
	P("GNTTAB_NR_RESERVED_ENTRIES", GNTTAB_NR_RESERVED_ENTRIES);
	P("EVTCHN_FIFO_NR_CHANNELS - 1", EVTCHN_FIFO_NR_CHANNELS - 1);`)
	cprobe.Compare(t, c, map[string]int64{
		"DOMID_FIRST_RESERVED":        DomidFirstReserved,
		"GNTTAB_NR_RESERVED_ENTRIES":  GrantRefFirst,
		"EVTCHN_FIFO_NR_CHANNELS - 1": EvtchnPortMax,
	})
}
