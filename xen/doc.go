// Package xen is a process's interface to Xen through the Linux kernel:
// the user-space ABI of /dev/xen/gntalloc (a domain grants its own pages
// to another), /dev/xen/gntdev (a domain maps pages another one granted)
// and /dev/xen/evtchn (event channels), and a wrapper for each: Gntalloc
// and GrantedPages, Gntdev and GrantMapping, Evtchn. It also holds the
// numbers of Xen's public headers that every user of those devices checks
// what it is given against (DomidFirstReserved, GrantRefFirst,
// EvtchnPortMax).
//
// The devices exist only in a Xen domain whose kernel has the drivers
// loaded. Without them every Open function fails at once with an error
// that wraps ErrNoXen. The wrappers build on linux/amd64 and linux/arm64
// (see abi.go); the constants and ErrNoXen build everywhere.
//
// The xenstore client is package xen/xenstore, and the split-driver
// handshake over it package xen/xenbus.
package xen

import "errors"

// Ranges of Xen's public headers.
const (
	// DomidFirstReserved is DOMID_FIRST_RESERVED (xen/xen.h): ordinary
	// domains are numbered below it.
	DomidFirstReserved = 0x7FF0
	// GrantRefFirst is GNTTAB_NR_RESERVED_ENTRIES (xen/grant_table.h):
	// references below it are the toolstack's (console, xenstore), never
	// a driver's.
	GrantRefFirst = 8
	// EvtchnPortMax is the highest event channel port (FIFO ABI:
	// EVTCHN_FIFO_NR_CHANNELS - 1, xen/event_channel.h); port 0 is never
	// valid.
	EvtchnPortMax = 1<<17 - 1
)

// DevDir is where Linux puts the Xen devices.
const DevDir = "/dev/xen"

// PageSize is the size of a granted page (XEN_PAGE_SIZE).
const PageSize = 4096

// MaxGrantPages bounds the pages one Gntalloc.Share or Gntdev.Map call
// handles.
const MaxGrantPages = 4096

// ErrNoXen is wrapped when a Xen device is missing: this is not a Xen
// domain, or the kernel driver (xen-gntalloc, xen-gntdev, xen-evtchn) is
// not loaded.
var ErrNoXen = errors.New("no Xen device (not a Xen domain, or the xen-gntalloc, xen-gntdev or xen-evtchn driver is not loaded)")
