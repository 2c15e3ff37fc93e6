// Package pvdrm is gpuvm's para-virtual DRM split driver (GPUvm thesis
// §4.1.4, "PVDRM"): a guest front end sends whole DRM operations over a
// shared ring to a back end in dom0. This file is the ring, laid out as
// Xen's io/ring.h lays out every split driver's ring (blkif, netif,
// sndif…), so that a C front end can use the standard macros
// (DEFINE_RING_TYPES) on it:
//
//	offset 0   u32 req_prod   written by the front end
//	offset 4   u32 req_event  written by the back end: notify when req_prod passes it
//	offset 8   u32 rsp_prod   written by the back end
//	offset 12  u32 rsp_event  written by the front end: notify when rsp_prod passes it
//	offset 16  u8  pvt[4], u8 pad[44]
//	offset 64  slots: a power-of-two count of SlotSize-byte entries,
//	           each a request or (once answered) its response
//
// Indices are free-running 32-bit counters; slot i is entry i mod N. The
// back end treats the front end as hostile: it reads req_prod once per
// batch, refuses a producer more than N entries ahead of its own consumer
// index (a protocol error that disconnects that front end only), and copies
// each request out of the shared page before decoding it, so a request
// rewritten after it was read changes nothing (RING_COPY_REQUEST).
package pvdrm

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"
)

// Ring layout constants.
const (
	// HeaderSize is the shared ring header (io/ring.h's sring up to ring[]).
	HeaderSize = 64
	// SlotSize is the size of one ring entry: a request or a response.
	SlotSize = 128

	offReqProd  = 0
	offReqEvent = 4
	offRspProd  = 8
	offRspEvent = 12
)

// Slots returns the entry count of a ring in size bytes of shared memory:
// the largest power of two that fits after the header (io/ring.h's
// __RING_SIZE), or 0 if none does.
func Slots(size int) uint32 {
	if size < HeaderSize+SlotSize {
		return 0
	}
	n := uint32((size - HeaderSize) / SlotSize)
	for n&(n-1) != 0 {
		n &= n - 1 // clear the lowest set bit until one is left
	}
	return n
}

// ErrOverflow is wrapped when the other end's producer index runs more
// than the ring size ahead of this end's consumer index: a protocol error.
var ErrOverflow = errors.New("ring producer index overflow")

// shared is the ring memory with atomic access to its indices.
type shared struct {
	mem []byte
	n   uint32
}

func newShared(mem []byte) (shared, error) {
	n := Slots(len(mem))
	if n == 0 {
		return shared{}, fmt.Errorf("pvdrm ring: %d bytes hold no slot", len(mem))
	}
	if uintptr(unsafe.Pointer(&mem[0]))%8 != 0 {
		return shared{}, errors.New("pvdrm ring: memory not 8-byte aligned")
	}
	return shared{mem: mem, n: n}, nil
}

func (s shared) idx(off int) *uint32 { return (*uint32)(unsafe.Pointer(&s.mem[off])) }
func (s shared) load(off int) uint32 { return atomic.LoadUint32(s.idx(off)) }
func (s shared) store(off int, v uint32) {
	atomic.StoreUint32(s.idx(off), v)
}

// slot returns entry i's bytes.
func (s shared) slot(i uint32) []byte {
	off := HeaderSize + int(i&(s.n-1))*SlotSize
	return s.mem[off : off+SlotSize]
}

// notify reports whether moving a producer index from old to now passed
// the other end's event threshold (io/ring.h's push-and-check-notify).
func notify(old, now, event uint32) bool { return now-event < now-old }

// Back is the back end's (dom0's) view of a ring: it consumes requests and
// produces responses. A Back is not safe for concurrent use.
type Back struct {
	s          shared
	reqCons    uint32 // next request to read
	rspProdPvt uint32 // next response slot
	broken     error
}

// NewBack attaches the back end to ring memory the front end initialised
// (all indices 0). The back end trusts nothing in it.
func NewBack(mem []byte) (*Back, error) {
	s, err := newShared(mem)
	if err != nil {
		return nil, err
	}
	return &Back{s: s}, nil
}

// Size returns the number of slots.
func (b *Back) Size() uint32 { return b.s.n }

// Quiet returns the ring index the back end stands at when every request
// it consumed was answered (ok false otherwise): a back end that resumes
// the ring later, on another daemon, starts there (Resume).
func (b *Back) Quiet() (idx uint32, ok bool) {
	return b.reqCons, b.broken == nil && b.reqCons == b.rspProdPvt
}

// Resume sets a back end that has consumed nothing yet at ring index idx
// (another back end's Quiet): requests before it were answered already.
// The indices in the ring are the front end's, checked as ever by Next.
func (b *Back) Resume(idx uint32) error {
	if b.reqCons != 0 || b.rspProdPvt != 0 {
		return errors.New("pvdrm ring: resume of a back end that served already")
	}
	b.reqCons, b.rspProdPvt = idx, idx
	return nil
}

// Next copies the next unread request into dst (SlotSize bytes) and reports
// whether there was one. It reads req_prod once and fails for good with
// ErrOverflow if the front end claims more outstanding requests than the
// ring holds, or more than the responses it left room for.
func (b *Back) Next(dst []byte) (bool, error) {
	if b.broken != nil {
		return false, b.broken
	}
	prod := b.s.load(offReqProd)
	if prod == b.reqCons {
		return false, nil
	}
	// Unanswered requests plus responses not yet consumed can never
	// exceed the ring: io/ring.h's RING_REQUEST_CONS_OVERFLOW and
	// RING_REQUEST_PROD_OVERFLOW.
	if prod-b.rspProdPvt > b.s.n || b.reqCons-b.rspProdPvt >= b.s.n {
		b.broken = fmt.Errorf("pvdrm ring: req_prod %d with %d consumed and %d answered: %w", prod, b.reqCons, b.rspProdPvt, ErrOverflow)
		return false, b.broken
	}
	copy(dst[:SlotSize], b.s.slot(b.reqCons)) // the one read of the shared request
	b.reqCons++
	return true, nil
}

// Respond writes one response (SlotSize bytes) into the next response slot
// and publishes it; it reports whether the front end asked to be notified.
func (b *Back) Respond(rsp []byte) (notifyFront bool) {
	copy(b.s.slot(b.rspProdPvt), rsp[:SlotSize])
	old := b.s.load(offRspProd)
	b.rspProdPvt++
	b.s.store(offRspProd, b.rspProdPvt)
	return notify(old, b.rspProdPvt, b.s.load(offRspEvent))
}

// Pending reports whether the front end published requests not yet read
// (a cheap check for a polling back end; Next validates them).
func (b *Back) Pending() bool { return b.broken == nil && b.s.load(offReqProd) != b.reqCons }

// FinalCheck re-arms the request event after the back end found no more
// requests (io/ring.h's RING_FINAL_CHECK_FOR_REQUESTS): it reports whether
// requests arrived meanwhile, so the back end never sleeps on work.
func (b *Back) FinalCheck() bool {
	b.s.store(offReqEvent, b.reqCons+1)
	return b.s.load(offReqProd) != b.reqCons
}

// Front is the front end's (guest's) view of a ring. A Front is not safe
// for concurrent use.
type Front struct {
	s          shared
	reqProdPvt uint32
	rspCons    uint32
}

// NewFront initialises ring memory (zeroing the header) and attaches the
// front end to it.
func NewFront(mem []byte) (*Front, error) {
	s, err := newShared(mem)
	if err != nil {
		return nil, err
	}
	clear(mem[:HeaderSize])
	s.store(offReqEvent, 1)
	s.store(offRspEvent, 1)
	return &Front{s: s}, nil
}

// Size returns the number of slots.
func (f *Front) Size() uint32 { return f.s.n }

// Free returns how many more requests fit before responses are consumed.
func (f *Front) Free() uint32 { return f.s.n - (f.reqProdPvt - f.rspCons) }

// Push queues one request (SlotSize bytes) and publishes it; it reports
// whether the back end asked to be notified. It fails if the ring is full.
func (f *Front) Push(req []byte) (notifyBack bool, err error) {
	if f.Free() == 0 {
		return false, errors.New("pvdrm ring: full")
	}
	copy(f.s.slot(f.reqProdPvt), req[:SlotSize])
	old := f.s.load(offReqProd)
	f.reqProdPvt++
	f.s.store(offReqProd, f.reqProdPvt)
	return notify(old, f.reqProdPvt, f.s.load(offReqEvent)), nil
}

// Poll copies the next response into dst and reports whether there was
// one. A back end that publishes more responses than requests were made
// is a protocol error.
func (f *Front) Poll(dst []byte) (bool, error) {
	prod := f.s.load(offRspProd)
	if prod == f.rspCons {
		return false, nil
	}
	if prod-f.rspCons > f.reqProdPvt-f.rspCons {
		return false, fmt.Errorf("pvdrm ring: rsp_prod %d beyond the %d requests made: %w", prod, f.reqProdPvt, ErrOverflow)
	}
	copy(dst[:SlotSize], f.s.slot(f.rspCons))
	f.rspCons++
	return true, nil
}

// Pending reports whether the back end published responses not yet read.
func (f *Front) Pending() bool { return f.s.load(offRspProd) != f.rspCons }

// FinalCheck re-arms the response event (RING_FINAL_CHECK_FOR_RESPONSES).
func (f *Front) FinalCheck() bool {
	f.s.store(offRspEvent, f.rspCons+1)
	return f.s.load(offRspProd) != f.rspCons
}
