package ioreq

import (
	"errors"
	"fmt"

	"github.com/gpuvm/gpuvm/xen/privcmd"
)

// Request states (STATE_*): Xen moves a slot NONE → READY, the server
// READY → INPROCESS → IORESP_READY, Xen IORESP_READY → NONE. A state never
// goes backwards: Xen crashes the domain if it sees that.
const (
	StateNone        = 0 // STATE_IOREQ_NONE: the slot is free
	StateReady       = 1 // STATE_IOREQ_READY: a request for the server
	StateInProcess   = 2 // STATE_IOREQ_INPROCESS: the server is on it
	StateRespReady   = 3 // STATE_IORESP_READY: the answer is in the slot
	typePIO          = 0 // IOREQ_TYPE_PIO
	typeCopy         = 1 // IOREQ_TYPE_COPY: MMIO
	typePCIConfig    = 2 // IOREQ_TYPE_PCI_CONFIG
	typeInvalidate   = 8 // IOREQ_TYPE_INVALIDATE: drop cached mappings of guest RAM
	dirRead          = 1 // IOREQ_READ
	dirWrite         = 0 // IOREQ_WRITE
	pciConfigSize    = 4096
	portSpace        = 0x10000
	bitsStateMask    = 0x0f // state:4
	bitsDataIsPtr    = 0x10 // data_is_ptr:1
	bitsDir          = 0x20 // dir:1
	bitsDF           = 0x40 // df:1
	bitsOffsetInSlot = 30   // offsetof(ioreq_t, type) - 1
)

// SlotSize is sizeof(ioreq_t): the shared page holds one per vCPU.
const SlotSize = 32

// Raw is struct ioreq (ioreq_t) exactly as Xen lays it out in the shared
// page. Bits holds the bitfields state:4, data_is_ptr:1, dir:1, df:1 from
// the least significant bit up (GCC's order on the little-endian machines
// Xen runs on; TestABI checks it).
type Raw struct {
	Addr    uint64 // guest-physical address, port, or SBDF<<32 | register
	Data    uint64 // the value (or, with data_is_ptr, its guest address)
	Count   uint32 // repetitions (rep prefix)
	Size    uint32 // bytes per access
	VPEport uint32 // the vCPU's event channel port (Xen's end)
	Pad0    uint16
	Bits    uint8 // state, data_is_ptr, dir, df
	Type    uint8 // IOREQ_TYPE_*
}

// State returns the state bits.
func (r Raw) State() uint8 { return r.Bits & bitsStateMask }

// DataIsPtr reports data_is_ptr: Data is a guest address.
func (r Raw) DataIsPtr() bool { return r.Bits&bitsDataIsPtr != 0 }

// Read reports dir == IOREQ_READ.
func (r Raw) Read() bool { return r.Bits&bitsDir != 0 }

// DF reports the direction flag of a string operation.
func (r Raw) DF() bool { return r.Bits&bitsDF != 0 }

// Kind is what a request accesses; the values are Xen's IOREQ_TYPE_*.
type Kind uint8

// The kinds of request a Server serves.
const (
	// KindPIO is an x86 I/O port access (IOREQ_TYPE_PIO).
	KindPIO Kind = typePIO
	// KindMMIO is a guest-physical memory access (IOREQ_TYPE_COPY).
	KindMMIO Kind = typeCopy
	// KindPCIConfig is a PCI config space access (IOREQ_TYPE_PCI_CONFIG;
	// Xen turns the guest's 0xcf8/0xcfc cycles into these).
	KindPCIConfig Kind = typePCIConfig
)

// String names the kind.
func (k Kind) String() string {
	switch k {
	case KindPIO:
		return "pio"
	case KindMMIO:
		return "mmio"
	case KindPCIConfig:
		return "pci-config"
	}
	return fmt.Sprintf("ioreq type %d", uint8(k))
}

// Request is one validated access: what a Handler serves.
type Request struct {
	VCPU  int  // the vCPU that made it (its slot)
	Kind  Kind // port, memory or config space
	Write bool // a write of Data; else a read
	// Addr is the guest-physical address (KindMMIO), the port (KindPIO)
	// or the register offset in the function's config space, 0..4095
	// (KindPCIConfig).
	Addr uint64
	// Device is the PCI function of a KindPCIConfig access.
	Device privcmd.SBDF
	// Size is the access width in bytes: 1, 2, 4 or 8 (MMIO only).
	Size int
	// Data is the value written (Size bytes), 0 for a read.
	Data uint64
	// Count is how many times the access repeats (a REP STOS or MOVS
	// with immediate data: 1..MaxReps, MMIO only), each Size bytes
	// further on, or back with Down (the direction flag). Zero means 1.
	Count int
	Down  bool
}

// MaxReps bounds a repeated access: Xen clips a string instruction's
// repetitions to 4096 per ioreq (hvmemul_virtual_to_linear).
const MaxReps = 4096

// Reps returns how many accesses the request makes (Count, at least 1).
func (r Request) Reps() int { return max(r.Count, 1) }

// Span returns the lowest address the request touches and its length in
// bytes, all repetitions included.
func (r Request) Span() (lo, n uint64) {
	n = uint64(r.Reps()) * uint64(r.Size)
	lo = r.Addr
	if r.Down {
		lo = r.Addr - n + uint64(r.Size)
	}
	return lo, n
}

// Mask returns the value mask of the request's size.
func (r Request) Mask() uint64 { return sizeMask(r.Size) }

// sizeMask returns the mask of an n-byte value (all ones for 8 or more).
func sizeMask(n int) uint64 {
	if n >= 8 {
		return ^uint64(0)
	}
	return 1<<(8*uint(n)) - 1
}

// String describes the request for logs.
func (r Request) String() string {
	dir := "read"
	if r.Write {
		dir = "write"
	}
	where := fmt.Sprintf("%#x", r.Addr)
	if r.Kind == KindPCIConfig {
		where = fmt.Sprintf("%v+%#x", r.Device, r.Addr)
	}
	s := fmt.Sprintf("vcpu%d %v %s%d %s", r.VCPU, r.Kind, dir, 8*r.Size, where)
	if r.Reps() > 1 {
		s += fmt.Sprintf(" ×%d", r.Reps())
		if r.Down {
			s += " down"
		}
	}
	if r.Write {
		s += fmt.Sprintf(" = %#x", r.Data)
	}
	return s
}

// Raw returns the ioreq_t Xen posts for r: state READY, count 1.
func (r Request) Raw() Raw {
	raw := Raw{Addr: r.Addr, Count: uint32(r.Reps()), Size: uint32(r.Size), Bits: StateReady, Type: uint8(r.Kind)}
	if r.Down {
		raw.Bits |= bitsDF
	}
	if r.Kind == KindPCIConfig {
		raw.Addr = uint64(r.Device)<<32 | r.Addr&0xffffffff
	}
	if r.Write {
		raw.Data = r.Data & sizeMask(r.Size)
	} else {
		raw.Bits |= bitsDir
	}
	return raw
}

// Decoding refuses a request with an error wrapping one of these.
var (
	// ErrMalformed: the request breaks the protocol's own rules (a state
	// other than READY, a size or count Xen never sends, an access beyond
	// the port or config space, an address that wraps).
	ErrMalformed = errors.New("malformed ioreq")
	// ErrUnsupported: a valid request gpuvm does not serve (string and rep
	// operations, data_is_ptr, request types other than port, MMIO and
	// PCI config).
	ErrUnsupported = errors.New("ioreq gpuvm does not serve")
)

// Decode validates a request copied out of the page and returns it
// (VCPU is left 0 for the caller to fill in). Only the copy is read.
func Decode(r Raw) (Request, error) {
	if s := r.State(); s != StateReady {
		return Request{}, fmt.Errorf("%w: state %d, want READY (%d)", ErrMalformed, s, StateReady)
	}
	kind := Kind(r.Type)
	switch kind {
	case KindPIO, KindMMIO, KindPCIConfig:
	default:
		return Request{}, fmt.Errorf("%w: %v (gpuvm serves port, MMIO and PCI config accesses)", ErrUnsupported, kind)
	}
	if r.DataIsPtr() {
		return Request{}, fmt.Errorf("%w: %v string operation (data_is_ptr, count %d): gpuvm serves single accesses with immediate data", ErrUnsupported, kind, r.Count)
	}
	switch {
	case r.Count == 0:
		return Request{}, fmt.Errorf("%w: %v with count 0", ErrMalformed, kind)
	case r.Count > 1 && kind != KindMMIO:
		return Request{}, fmt.Errorf("%w: %v rep operation (count %d): gpuvm serves repeated MMIO only", ErrUnsupported, kind, r.Count)
	case r.Count > MaxReps:
		return Request{}, fmt.Errorf("%w: %v rep operation of count %d (Xen sends at most %d)", ErrMalformed, kind, r.Count, MaxReps)
	}
	size := int(r.Size)
	switch {
	case size != 1 && size != 2 && size != 4 && size != 8:
		return Request{}, fmt.Errorf("%w: %v of size %d, want 1, 2, 4 or 8", ErrMalformed, kind, r.Size)
	case size == 8 && kind != KindMMIO:
		return Request{}, fmt.Errorf("%w: %v of size 8 (port and config accesses are at most 4 bytes)", ErrMalformed, kind)
	}
	req := Request{Kind: kind, Write: !r.Read(), Addr: r.Addr, Size: size, Count: int(r.Count), Down: r.DF() && r.Count > 1}
	switch kind {
	case KindMMIO:
		n := uint64(r.Count) * uint64(size)
		if req.Down && r.Addr < n-uint64(size) || !req.Down && r.Addr+n-1 < r.Addr {
			return Request{}, fmt.Errorf("%w: MMIO %d×%d bytes at %#x wraps", ErrMalformed, r.Count, size, r.Addr)
		}
	case KindPIO:
		if r.Addr+uint64(size) > portSpace {
			return Request{}, fmt.Errorf("%w: port %#x+%d beyond 0xffff", ErrMalformed, r.Addr, size)
		}
	case KindPCIConfig:
		// Bits 63..32 are the SBDF, 31..0 the register (ioreq.h).
		req.Device, req.Addr = privcmd.SBDF(r.Addr>>32), r.Addr&0xffffffff
		if req.Addr+uint64(size) > pciConfigSize {
			return Request{}, fmt.Errorf("%w: config register %#x+%d of %v beyond 4 KiB", ErrMalformed, req.Addr, size, req.Device)
		}
	}
	if req.Write {
		req.Data = r.Data & sizeMask(size)
	}
	return req, nil
}
