package ioreq_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/gpuvm/gpuvm/xen/ioreq"
	"github.com/gpuvm/gpuvm/xen/ioreq/ioreqtest"
)

// TestConcurrentVCPUs has seven vCPUs access their own registers at once
// while an eighth posts random slots (hostile or garbage), the device
// model moves a range back and forth, and the counters are read: every
// honest access reads what it wrote, every hostile one is answered, and
// the server survives. Run it with -race.
func TestConcurrentVCPUs(t *testing.T) {
	const vcpus, honest, rounds = 8, 7, 300
	x, err := ioreqtest.New(vcpus)
	if err != nil {
		t.Fatal(err)
	}
	dev := newDevice()
	s := x.Serve(t, ioreq.Config{Handler: dev.handle, Claims: claims(t)})
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()

	var wg sync.WaitGroup
	errs := make(chan error, vcpus+2)
	for v := range honest {
		wg.Go(func() {
			for i := range rounds {
				size := []int{1, 2, 4, 8}[i%4]
				addr := uint64(barBase + v*0x100 + (i%8)*8)
				val := uint64(v)<<56 | uint64(i)*0x01010101 + 1
				w := ioreq.Request{VCPU: v, Kind: ioreq.KindMMIO, Write: true, Addr: addr, Size: size, Data: val}
				if _, err := x.Access(ctx, w); err != nil {
					errs <- err
					return
				}
				got, err := x.Access(ctx, ioreq.Request{VCPU: v, Kind: ioreq.KindMMIO, Addr: addr, Size: size})
				if err != nil {
					errs <- err
					return
				}
				if want := val & w.Mask(); got != want {
					t.Errorf("vcpu%d round %d: read %#x, wrote %#x", v, i, got, want)
					return
				}
			}
		})
	}
	hostileDone := make(chan struct{})
	wg.Go(func() {
		defer close(hostileDone)
		rng := rand.New(rand.NewPCG(1, 2))
		for range rounds {
			r := ioreq.Raw{Addr: rng.Uint64(), Data: rng.Uint64(), Count: rng.Uint32N(3), Size: rng.Uint32N(10),
				Bits: uint8(rng.Uint32()), Type: uint8(rng.Uint32N(4))}
			if r.Type == uint8(ioreq.KindMMIO) && r.Addr >= barBase && r.Addr < barBase+barSize {
				r.Addr |= 1 << 63 // keep clear of the honest registers
			}
			if r.Type == uint8(ioreq.KindPIO) {
				r.Addr &= 0xff // below the claimed ports
			}
			if rng.IntN(4) == 0 { // garbage state, no answer expected
				r.Bits = r.Bits&^0xf | uint8(4+rng.IntN(12))
				x.Post(honest, r)
				x.Kick(honest)
				continue
			}
			if _, err := x.Do(ctx, honest, r); err != nil {
				errs <- err
				return
			}
		}
	})
	wg.Go(func() { // the guest moves a BAR back and forth
		a, b := ioreq.MMIO(0xd0000000, 0x1000), ioreq.MMIO(0xd1000000, 0x1000)
		if err := s.Claim(a); err != nil {
			errs <- err
			return
		}
		for {
			select {
			case <-hostileDone:
				return
			default:
			}
			if err := s.Release(a); err != nil {
				errs <- err
				return
			}
			if err := s.Claim(b); err != nil {
				errs <- err
				return
			}
			a, b = b, a
			_ = s.Stats()
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	st := s.Stats()
	if st.Served < honest*rounds*2 || st.Served+st.Refused+st.HandlerErrors > honest*rounds*2+rounds {
		t.Fatalf("stats %+v", st)
	}
}
