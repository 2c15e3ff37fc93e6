// Package ioreqtest is an in-memory hypervisor for the ioreq protocol: a
// test double for machines without Xen, as net/http/httptest is for HTTP
// servers. A Xen holds a shared ioreq page and one event channel per vCPU;
// Do posts a request into a vCPU's slot the way Xen does (fields, then the
// READY state; an event), waits for the server's IORESP_READY and frees the
// slot again. Post and Kick write and signal without waiting, for tests of
// lost events and hostile slots.
package ioreqtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/gpuvm/gpuvm/xen"
	"github.com/gpuvm/gpuvm/xen/ioreq"
)

// FirstPort is the event channel port slot 0 gets; slot v gets
// FirstPort+v.
const FirstPort = 100

// Xen is the hypervisor's side of one ioreq server. Its methods are safe
// for concurrent use; Do serializes the accesses of each vCPU, as a vCPU
// blocked in an access makes no other.
type Xen struct {
	words []uint64 // the page, as words (8-byte aligned)
	page  *ioreq.Page
	vcpus []*vcpu
}

// vcpu is one vCPU's slot owner and event channel.
type vcpu struct {
	mu       sync.Mutex    // one Do at a time
	toServer chan struct{} // a pending event for the server (capacity 1)
	toXen    chan struct{} // a pending event for the hypervisor
	waitErr  atomic.Pointer[error]
	closed   atomic.Bool
}

// New returns a hypervisor of vcpus vCPUs (1..ioreq.MaxVCPUs) with their
// event channel ports written into the page.
func New(vcpus int) (*Xen, error) {
	if vcpus < 1 || vcpus > ioreq.MaxVCPUs {
		return nil, fmt.Errorf("ioreqtest: %d vCPUs, want 1..%d", vcpus, ioreq.MaxVCPUs)
	}
	x := &Xen{words: make([]uint64, xen.PageSize/8)}
	page, err := ioreq.NewPage(x.bytes(), vcpus)
	if err != nil {
		return nil, err
	}
	x.page = page
	for v := range vcpus {
		x.vcpus = append(x.vcpus, &vcpu{toServer: make(chan struct{}, 1), toXen: make(chan struct{}, 1)})
		x.store(v, ioreq.Raw{VPEport: uint32(FirstPort + v)})
	}
	return x, nil
}

// bytes returns the page as bytes.
func (x *Xen) bytes() []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(&x.words[0])), len(x.words)*8)
}

// Page returns the shared page, for ioreq.NewServer.
func (x *Xen) Page() *ioreq.Page { return x.page }

// Notifiers returns the server's end of each vCPU's event channel.
func (x *Xen) Notifiers() []ioreq.Notifier {
	ns := make([]ioreq.Notifier, len(x.vcpus))
	for v, c := range x.vcpus {
		ns[v] = notifier{c}
	}
	return ns
}

// Serve starts a server on this hypervisor with cfg and stops it when the
// test ends, failing the test if Serve failed.
func (x *Xen) Serve(t testing.TB, cfg ioreq.Config) *ioreq.Server {
	t.Helper()
	s, err := ioreq.NewServer(x.page, x.Notifiers(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(context.Background()) }()
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("ioreqtest: close: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("ioreqtest: serve: %v", err)
		}
	})
	return s
}

// slot returns vCPU v's slot as words.
func (x *Xen) slot(v int) *[4]uint64 {
	return (*[4]uint64)(x.words[v*ioreq.SlotSize/8 : (v+1)*ioreq.SlotSize/8])
}

// store writes r into slot v: the first three words, then the one holding
// the state (release), as Xen publishes a request.
func (x *Xen) store(v int, r ioreq.Raw) {
	img := (*[4]uint64)(unsafe.Pointer(&r))
	w := x.slot(v)
	atomic.StoreUint64(&w[0], img[0])
	atomic.StoreUint64(&w[1], img[1])
	atomic.StoreUint64(&w[2], img[2])
	atomic.StoreUint64(&w[3], img[3])
}

// Slot returns what slot v holds now.
func (x *Xen) Slot(v int) ioreq.Raw { return x.page.Load(v) }

// Post writes r into slot v as it is (its port excepted, which stays the
// slot's) without an event and without waiting.
func (x *Xen) Post(v int, r ioreq.Raw) {
	r.VPEport = uint32(FirstPort + v)
	x.store(v, r)
}

// Kick sends vCPU v's server an event.
func (x *Xen) Kick(v int) {
	select {
	case x.vcpus[v].toServer <- struct{}{}:
	default: // already pending: events coalesce
	}
}

// BreakChannel makes vCPU v's event channel fail every Wait with err
// (nil repairs it).
func (x *Xen) BreakChannel(v int, err error) {
	if err == nil {
		x.vcpus[v].waitErr.Store(nil)
		return
	}
	x.vcpus[v].waitErr.Store(&err)
	x.Kick(v)
}

// Do posts r into vCPU v's slot (state forced to READY), notifies the
// server and waits until it answers or ctx is done; it then frees the
// slot (state NONE) and returns the answered slot.
func (x *Xen) Do(ctx context.Context, v int, r ioreq.Raw) (ioreq.Raw, error) {
	if v < 0 || v >= len(x.vcpus) {
		return ioreq.Raw{}, fmt.Errorf("ioreqtest: vCPU %d of %d", v, len(x.vcpus))
	}
	c := x.vcpus[v]
	c.mu.Lock()
	defer c.mu.Unlock()
	select { // an answer event left over from an abandoned Do
	case <-c.toXen:
	default:
	}
	r.Bits = r.Bits&^0xf | ioreq.StateReady
	x.Post(v, r)
	x.Kick(v)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		got := x.page.Load(v)
		if got.State() == ioreq.StateRespReady {
			free := got
			free.Bits &^= 0xf
			x.store(v, free)
			return got, nil
		}
		select {
		case <-ctx.Done():
			return got, fmt.Errorf("ioreqtest: vCPU %d: no answer (slot in state %d): %w", v, got.State(), ctx.Err())
		case <-c.toXen:
		case <-tick.C:
		}
	}
}

// Access makes access r from vCPU r.VCPU and returns what a read reads
// (Size bytes of the answer; 0 for a write).
func (x *Xen) Access(ctx context.Context, r ioreq.Request) (uint64, error) {
	got, err := x.Do(ctx, r.VCPU, r.Raw())
	if err != nil || r.Write {
		return 0, err
	}
	return got.Data & r.Mask(), nil
}

// notifier is the server's end of a vCPU's event channel.
type notifier struct{ c *vcpu }

// Wait waits for an event, ctx, or max.
func (n notifier) Wait(ctx context.Context, max time.Duration) error {
	if err := n.c.waitErr.Load(); err != nil {
		return *err
	}
	t := time.NewTimer(max)
	defer t.Stop()
	select {
	case <-n.c.toServer:
		if err := n.c.waitErr.Load(); err != nil {
			return *err
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Notify signals the hypervisor.
func (n notifier) Notify() error {
	if n.c.closed.Load() {
		return errors.New("ioreqtest: notify on a closed channel")
	}
	select {
	case n.c.toXen <- struct{}{}:
	default:
	}
	return nil
}

// Close unbinds the channel.
func (n notifier) Close() error {
	n.c.closed.Store(true)
	return nil
}
