package ioreq_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/xen/ioreq"
	"github.com/gpuvm/gpuvm/xen/ioreq/ioreqtest"
	"github.com/gpuvm/gpuvm/xen/privcmd"
)

const (
	barBase = 0xe0000000
	barSize = 0x10000
	ioBase  = 0xc000
)

// device is a handler with a register file: MMIO and ports are memory,
// config space reads return the SBDF.
type device struct {
	mu    sync.Mutex
	regs  map[uint64]uint64
	calls atomic.Int64
}

func newDevice() *device { return &device{regs: map[uint64]uint64{}} }

func (d *device) handle(r ioreq.Request) (uint64, error) {
	d.calls.Add(1)
	if r.Kind == ioreq.KindPCIConfig {
		return uint64(r.Device)<<16 | r.Addr, nil
	}
	key := uint64(r.Kind)<<60 | r.Addr
	d.mu.Lock()
	defer d.mu.Unlock()
	if r.Write {
		d.regs[key] = r.Data
		return 0, nil
	}
	return d.regs[key], nil
}

func gpu(t testing.TB) privcmd.SBDF {
	s, err := privcmd.MakeSBDF(0, 0, 5, 0)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func claims(t testing.TB) []ioreq.Claim {
	return []ioreq.Claim{ioreq.MMIO(barBase, barSize), ioreq.Ports(ioBase, 0x80), ioreq.PCIDevice(gpu(t))}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestServeAccesses runs writes and reads of every size through the
// protocol and checks what the guest reads back.
func TestServeAccesses(t *testing.T) {
	x, err := ioreqtest.New(2)
	if err != nil {
		t.Fatal(err)
	}
	dev := newDevice()
	s := x.Serve(t, ioreq.Config{Handler: dev.handle, Claims: claims(t)})
	ctx := ctxT(t)
	for _, size := range []int{1, 2, 4, 8} {
		addr := uint64(barBase + 0x100*size)
		w := ioreq.Request{VCPU: size % 2, Kind: ioreq.KindMMIO, Write: true, Addr: addr, Size: size, Data: 0x8877665544332211}
		if _, err := x.Access(ctx, w); err != nil {
			t.Fatal(err)
		}
		got, err := x.Access(ctx, ioreq.Request{VCPU: size % 2, Kind: ioreq.KindMMIO, Addr: addr, Size: size})
		if want := uint64(0x8877665544332211) & w.Mask(); err != nil || got != want {
			t.Fatalf("mmio%d: read %#x, want %#x (%v)", 8*size, got, want, err)
		}
	}
	if _, err := x.Access(ctx, ioreq.Request{Kind: ioreq.KindPIO, Write: true, Addr: ioBase + 4, Size: 2, Data: 0xbeef}); err != nil {
		t.Fatal(err)
	}
	if got, err := x.Access(ctx, ioreq.Request{Kind: ioreq.KindPIO, Addr: ioBase + 4, Size: 2}); err != nil || got != 0xbeef {
		t.Fatalf("pio read %#x, %v", got, err)
	}
	if got, err := x.Access(ctx, ioreq.Request{VCPU: 1, Kind: ioreq.KindPCIConfig, Device: gpu(t), Addr: 0x2, Size: 2}); err != nil || got != (uint64(gpu(t))<<16|2)&0xffff {
		t.Fatalf("config read %#x, %v", got, err)
	}
	// A read the handler answers with more than Size bytes is cut to Size.
	answered, err := x.Do(ctx, 0, ioreq.Request{Kind: ioreq.KindPCIConfig, Device: gpu(t), Addr: 0x40, Size: 1}.Raw())
	if err != nil || answered.Data != 0x40 {
		t.Fatalf("config byte read: slot data %#x, %v", answered.Data, err)
	}
	st := s.Stats()
	if st.Served != 12 || st.Refused != 0 || st.HandlerErrors != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestServeRefuses posts what gpuvm does not serve: each is answered
// (all ones for a read), counted, and the server goes on.
func TestServeRefuses(t *testing.T) {
	x, err := ioreqtest.New(1)
	if err != nil {
		t.Fatal(err)
	}
	dev := newDevice()
	s := x.Serve(t, ioreq.Config{Handler: dev.handle, Claims: claims(t)})
	ctx := ctxT(t)
	read := ioreq.Request{Kind: ioreq.KindMMIO, Addr: barBase, Size: 4}.Raw()
	for name, r := range map[string]ioreq.Raw{
		"data_is_ptr": func() ioreq.Raw { r := read; r.Bits |= 0x10; r.Count = 4; return r }(),
		"rep":         func() ioreq.Raw { r := read; r.Addr = barBase + barSize - 8; r.Count = 3; return r }(),
		"count 0":     func() ioreq.Raw { r := read; r.Count = 0; return r }(),
		"size 3":      func() ioreq.Raw { r := read; r.Size = 3; return r }(),
		"timeoffset":  func() ioreq.Raw { r := read; r.Type = 7; return r }(),
		"unclaimed":   func() ioreq.Raw { r := read; r.Addr = barBase + barSize; return r }(),
		"straddles":   func() ioreq.Raw { r := read; r.Addr = barBase + barSize - 2; return r }(),
		"other dev":   ioreq.Request{Kind: ioreq.KindPCIConfig, Device: gpu(t) + 8, Size: 4}.Raw(),
		"port":        ioreq.Request{Kind: ioreq.KindPIO, Addr: 0x80, Size: 1}.Raw(),
	} {
		got, err := x.Do(ctx, 0, r)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got.Data != ^uint64(0) {
			t.Errorf("%s: a refused read returned %#x", name, got.Data)
		}
	}
	if st := s.Stats(); st.Refused != 9 || st.Served != 0 || dev.calls.Load() != 0 {
		t.Fatalf("stats %+v, handler called %d times", st, dev.calls.Load())
	}
	// A refused write leaves the slot's data alone and the device untouched.
	w := ioreq.Request{Kind: ioreq.KindMMIO, Write: true, Addr: barBase + barSize - 4, Size: 4, Data: 5}.Raw()
	w.Count = 2 // runs out of the BAR
	if got, err := x.Do(ctx, 0, w); err != nil || got.Data != 5 || len(dev.regs) != 0 {
		t.Fatalf("refused write: %+v, %v", got, err)
	}
	// A map-cache invalidation (sent to every server) is acknowledged,
	// not refused.
	inv := ioreq.Raw{Bits: ioreq.StateReady, Type: 8}
	if got, err := x.Do(ctx, 0, inv); err != nil || got.State() != ioreq.StateRespReady {
		t.Fatalf("invalidate: %+v, %v", got, err)
	}
	if st := s.Stats(); st.Invalidates != 1 || st.Refused != 10 {
		t.Fatalf("stats after an invalidate %+v", st)
	}
	// A slot in a state the protocol does not have is left alone and
	// counted once, however often the server looks.
	x.Post(0, ioreq.Raw{Bits: 9})
	for range 5 {
		x.Kick(0)
		time.Sleep(2 * time.Millisecond)
	}
	waitFor(t, func() bool { return s.Stats().BadStates == 1 })
	if got := x.Slot(0); got.State() != 9 {
		t.Fatalf("the server changed a bad slot to state %d", got.State())
	}
	if v, err := x.Access(ctx, ioreq.Request{Kind: ioreq.KindMMIO, Addr: barBase, Size: 4}); err != nil || v != 0 {
		t.Fatalf("after the bad slot: %#x, %v", v, err)
	}
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
	}
}

// TestHandlerFailures: a failing or panicking handler answers all ones
// and the server keeps serving.
func TestHandlerFailures(t *testing.T) {
	x, err := ioreqtest.New(1)
	if err != nil {
		t.Fatal(err)
	}
	s := x.Serve(t, ioreq.Config{Claims: claims(t), Handler: func(r ioreq.Request) (uint64, error) {
		switch r.Addr {
		case barBase:
			return 0, errors.New("no such register")
		case barBase + 4:
			panic("handler bug")
		}
		return 42, nil
	}})
	ctx := ctxT(t)
	for _, off := range []uint64{0, 4} {
		if v, err := x.Access(ctx, ioreq.Request{Kind: ioreq.KindMMIO, Addr: barBase + off, Size: 4}); err != nil || v != 0xffffffff {
			t.Fatalf("failing handler at +%d: %#x, %v", off, v, err)
		}
	}
	if v, err := x.Access(ctx, ioreq.Request{Kind: ioreq.KindMMIO, Addr: barBase + 8, Size: 4}); err != nil || v != 42 {
		t.Fatalf("after the failures: %#x, %v", v, err)
	}
	if st := s.Stats(); st.HandlerErrors != 2 || st.Served != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestCopiedOnce: the guest rewriting the slot while the handler runs
// changes neither the request served nor the answer's width.
func TestCopiedOnce(t *testing.T) {
	x, err := ioreqtest.New(1)
	if err != nil {
		t.Fatal(err)
	}
	var seen []ioreq.Request
	x.Serve(t, ioreq.Config{Claims: claims(t), Handler: func(r ioreq.Request) (uint64, error) {
		seen = append(seen, r)
		evil := x.Slot(0)
		evil.Addr, evil.Size, evil.Type, evil.Count = 0xdead0000, 8, 2, 9
		x.Post(0, evil) // state stays INPROCESS: the server's
		return 0x1234567890, nil
	}})
	got, err := x.Do(ctxT(t), 0, ioreq.Request{Kind: ioreq.KindMMIO, Addr: barBase + 0x10, Size: 2}.Raw())
	if err != nil {
		t.Fatal(err)
	}
	if got.Data != 0x7890 || len(seen) != 1 || seen[0].Addr != barBase+0x10 || seen[0].Size != 2 {
		t.Fatalf("answer %#x after serving %+v", got.Data, seen)
	}
}

// TestLostEvent: a request whose event never came is served at the next
// poll.
func TestLostEvent(t *testing.T) {
	x, err := ioreqtest.New(1)
	if err != nil {
		t.Fatal(err)
	}
	dev := newDevice()
	x.Serve(t, ioreq.Config{Handler: dev.handle, Claims: claims(t), Poll: 5 * time.Millisecond})
	x.Post(0, ioreq.Request{Kind: ioreq.KindMMIO, Write: true, Addr: barBase, Size: 4, Data: 1}.Raw())
	waitFor(t, func() bool { return x.Slot(0).State() == ioreq.StateRespReady })
}

// TestLifecycle: one Serve at a time, Close stops it, nothing runs after
// Close, a failing event channel ends Serve with its error.
func TestLifecycle(t *testing.T) {
	x, err := ioreqtest.New(2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ioreq.NewServer(x.Page(), x.Notifiers()[:1], ioreq.Config{Handler: newDevice().handle}); err == nil {
		t.Fatal("one notifier for two vCPUs accepted")
	}
	if _, err := ioreq.NewServer(x.Page(), x.Notifiers(), ioreq.Config{}); err == nil {
		t.Fatal("no handler accepted")
	}
	if _, err := ioreq.NewServer(x.Page(), x.Notifiers(), ioreq.Config{Handler: newDevice().handle, Claims: []ioreq.Claim{ioreq.MMIO(0, 2), ioreq.MMIO(1, 2)}}); err == nil {
		t.Fatal("overlapping claims accepted")
	}
	s, err := ioreq.NewServer(x.Page(), x.Notifiers(), ioreq.Config{Handler: newDevice().handle, Claims: claims(t)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(context.Background()) }()
	if _, err := x.Access(ctxT(t), ioreq.Request{Kind: ioreq.KindPIO, Addr: ioBase, Size: 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.Serve(context.Background()); err == nil || errors.Is(err, ioreq.ErrClosed) {
		t.Fatalf("a second Serve: %v", err)
	}
	x.BreakChannel(1, errors.New("evtchn gone"))
	if err := <-done; err == nil || err.Error() != "ioreq server: vCPU 1: wait for an event: evtchn gone" {
		t.Fatalf("serve with a broken channel: %v", err)
	}
	x.BreakChannel(1, nil)
	go func() { done <- s.Serve(context.Background()) }()
	if _, err := x.Access(ctxT(t), ioreq.Request{VCPU: 1, Kind: ioreq.KindPIO, Addr: ioBase, Size: 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("serve after Close: %v", err)
	}
	if err := s.Serve(context.Background()); !errors.Is(err, ioreq.ErrClosed) {
		t.Fatalf("serve on a closed server: %v", err)
	}
	if err := s.Claim(ioreq.MMIO(0, 1)); !errors.Is(err, ioreq.ErrClosed) {
		t.Fatalf("claim on a closed server: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestClaimRelease moves a range as a device model does when the guest
// moves a BAR.
func TestClaimRelease(t *testing.T) {
	x, err := ioreqtest.New(1)
	if err != nil {
		t.Fatal(err)
	}
	s := x.Serve(t, ioreq.Config{Handler: newDevice().handle, Claims: claims(t)})
	ctx := ctxT(t)
	if err := s.Claim(ioreq.MMIO(barBase+barSize-1, 2)); err == nil {
		t.Fatal("overlapping claim accepted")
	}
	if err := s.Release(ioreq.MMIO(barBase, 0x1000)); err == nil {
		t.Fatal("released a range not claimed as such")
	}
	if err := s.Release(ioreq.MMIO(barBase, barSize)); err != nil {
		t.Fatal(err)
	}
	if err := s.Claim(ioreq.MMIO(0xd0000000, barSize)); err != nil {
		t.Fatal(err)
	}
	if v, _ := x.Access(ctx, ioreq.Request{Kind: ioreq.KindMMIO, Addr: barBase, Size: 4}); v != 0xffffffff {
		t.Fatalf("old range still served: %#x", v)
	}
	if v, _ := x.Access(ctx, ioreq.Request{Kind: ioreq.KindMMIO, Addr: 0xd0000000, Size: 4}); v != 0 {
		t.Fatalf("new range refused: %#x", v)
	}
	if n := len(s.Claims()); n != 3 {
		t.Fatalf("%d claims", n)
	}
	for i := len(s.Claims()); i < ioreq.MaxClaims; i++ {
		if err := s.Claim(ioreq.MMIO(uint64(i)<<12, 1)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Claim(ioreq.MMIO(0x100000, 1)); err == nil {
		t.Fatal("claim beyond MaxClaims accepted")
	}
}
