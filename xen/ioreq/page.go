package ioreq

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/gpuvm/gpuvm/xen"
)

// MaxVCPUs is how many slots one shared page holds (and Xen's
// HVM_MAX_VCPUS).
const MaxVCPUs = xen.PageSize / SlotSize

// stateWordOffset is the offset in a slot of the 32-bit word holding
// _pad0, the bitfields (state among them) and type: the server changes the
// state by storing this word whole.
const stateWordOffset = 28

// Page is the shared ioreq page of a server: one ioreq_t slot per vCPU,
// written by the hypervisor (and, in Xen's legacy mode, writable by the
// guest). Every access to it is atomic and the server's only reads are
// Load's single copy of a slot, so whatever is written there meanwhile
// cannot change a request after it was validated.
type Page struct {
	mem   []byte
	vcpus int
}

// NewPage returns the page in mem (8-byte aligned, a slot per vCPU) for
// vcpus vCPUs.
func NewPage(mem []byte, vcpus int) (*Page, error) {
	if vcpus < 1 || vcpus > MaxVCPUs {
		return nil, fmt.Errorf("ioreq page: %d vCPUs, want 1..%d", vcpus, MaxVCPUs)
	}
	if len(mem) < vcpus*SlotSize {
		return nil, fmt.Errorf("ioreq page: %d bytes for %d vCPUs, want %d", len(mem), vcpus, vcpus*SlotSize)
	}
	if uintptr(unsafe.Pointer(&mem[0]))%8 != 0 {
		return nil, fmt.Errorf("ioreq page: not 8-byte aligned")
	}
	return &Page{mem: mem[:vcpus*SlotSize], vcpus: vcpus}, nil
}

// VCPUs returns the number of slots.
func (p *Page) VCPUs() int { return p.vcpus }

// words returns slot v as four 64-bit words.
func (p *Page) words(v int) *[4]uint64 {
	return (*[4]uint64)(unsafe.Pointer(&p.mem[v*SlotSize]))
}

// Load copies slot v out: the word holding the state first, so the rest
// is read after it (acquire), then the others, each once.
func (p *Page) Load(v int) Raw {
	w := p.words(v)
	var r Raw
	img := (*[4]uint64)(unsafe.Pointer(&r))
	img[3] = atomic.LoadUint64(&w[3])
	img[0] = atomic.LoadUint64(&w[0])
	img[1] = atomic.LoadUint64(&w[1])
	img[2] = atomic.LoadUint64(&w[2])
	return r
}

// Port returns the event channel port Xen gave slot v (its end of the
// vCPU's channel), checked to be a valid port.
func (p *Page) Port(v int) (uint32, error) {
	if v < 0 || v >= p.vcpus {
		return 0, fmt.Errorf("ioreq page: vCPU %d of %d", v, p.vcpus)
	}
	port := p.Load(v).VPEport
	if port == 0 || port > xen.EvtchnPortMax {
		return 0, fmt.Errorf("ioreq page: vCPU %d: event channel port %d, want 1..%d", v, port, xen.EvtchnPortMax)
	}
	return port, nil
}

// setData stores the answer of a read into slot v.
func (p *Page) setData(v int, data uint64) {
	atomic.StoreUint64(&p.words(v)[1], data)
}

// setState moves slot v, whose request r was copied from it, to state:
// the word holding the state is stored whole, from the copy (the
// hypervisor does not write the slot while the server owns it), after
// everything stored before it (release).
func (p *Page) setState(v int, r Raw, state uint8) {
	r.Bits = r.Bits&^bitsStateMask | state
	word := *(*uint32)(unsafe.Add(unsafe.Pointer(&r), stateWordOffset))
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&p.mem[v*SlotSize+stateWordOffset])), word)
}
