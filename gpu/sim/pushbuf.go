package sim

import (
	"context"
	"time"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// Push-buffer decoding and the PFIFO (channel-class) methods.

// semState is the channel semaphore's method state.
type semState struct {
	addrHi, addrLo, payload uint32
}

// Semaphore acquire polling backs off from semPollMin to semPollMax.
const (
	semPollMin = time.Microsecond
	semPollMax = time.Millisecond
)

// semLongWords is the size in words of a long semaphore release: payload, 0,
// and the 64-bit PTIMER stamp.
const semLongWords = 4

func methodFault(va uint64) error { return &faultError{va: va, reason: nvc0.FaultReasonMethod} }

// exec decodes and executes the push buffer pb fetched from pbVA.
func (c *channel) exec(ctx context.Context, v *vm, pbVA uint64, pb []byte) error {
	n := len(pb) / 4
	word := func(i int) uint32 { return load32(pb[4*i:]) }
	for i := 0; i < n; {
		if err := ctx.Err(); err != nil {
			return err // preempted: stop at this method boundary
		}
		hva := pbVA + uint64(i)*4
		h := nvc0.DecodeMethodHeader(word(i))
		i++
		switch h.Type {
		case nvc0.MthdTypeImmediate:
			if err := c.method(ctx, v, hva, h.Subchannel, h.Method, h.Count); err != nil {
				return err
			}
		case nvc0.MthdTypeIncreasing, nvc0.MthdTypeNonIncreasing, nvc0.MthdTypeIncreaseOnce:
			if int(h.Count) > n-i {
				return methodFault(hva) // the data runs past the push buffer
			}
			for j := range int(h.Count) {
				m := h.Method
				switch {
				case h.Type == nvc0.MthdTypeIncreasing:
					m += uint32(j) * 4
				case h.Type == nvc0.MthdTypeIncreaseOnce && j > 0:
					m += 4
				}
				if m > nvc0.MaxMethod {
					return methodFault(hva)
				}
				if err := c.method(ctx, v, hva, h.Subchannel, m, word(i+j)); err != nil {
					return err
				}
			}
			i += int(h.Count)
		default:
			return methodFault(hva)
		}
	}
	return nil
}

// method executes one method on a subchannel. hva is the header's address,
// reported if the method is invalid.
func (c *channel) method(ctx context.Context, v *vm, hva uint64, subc, m, data uint32) error {
	if m >= nvc0.MthdFifoMax {
		switch c.subc[subc] {
		case nvc0.ClassFermiCompute:
			return c.computeMethod(ctx, v, hva, m, data)
		case nvc0.ClassFermiCopy:
			return c.copyMethod(ctx, v, hva, m, data)
		}
		return methodFault(hva)
	}
	switch m {
	case nvc0.MthdSetObject:
		if data != nvc0.ClassFermiCompute && data != nvc0.ClassFermiCopy {
			return methodFault(hva)
		}
		c.subc[subc] = data
	case nvc0.MthdSemaphoreAddrHi:
		c.sem.addrHi = data
	case nvc0.MthdSemaphoreAddrLo:
		c.sem.addrLo = data
	case nvc0.MthdSemaphorePayload:
		c.sem.payload = data
	case nvc0.MthdSemaphoreTrigger:
		return c.semaphore(ctx, v, hva, data)
	case nvc0.MthdNonStall:
	default:
		return methodFault(hva)
	}
	return nil
}

// semaphore executes a semaphore trigger.
func (c *channel) semaphore(ctx context.Context, v *vm, hva uint64, trigger uint32) error {
	b := c.b
	va := uint64(c.sem.addrHi)<<32 | uint64(c.sem.addrLo)
	if va%4 != 0 {
		return methodFault(hva)
	}
	op, long := nvc0.SemaphoreTriggerDecode(trigger)
	switch op {
	case nvc0.SemaphoreRelease:
		if long {
			lo, hi := nvc0.TimerSplit(b.now())
			// The stamp goes first, so whoever sees the payload sees the stamp.
			for i, w := range [semLongWords]uint32{c.sem.payload, 0, lo, hi} {
				if i == 0 {
					continue
				}
				if err := b.vmWrite32(v, va+uint64(i)*4, w); err != nil {
					return err
				}
			}
		}
		return b.vmWrite32(v, va, c.sem.payload)
	case nvc0.SemaphoreAcquireEqual, nvc0.SemaphoreAcquireGEq:
		want := c.sem.payload
		wait := semPollMin
		for {
			got, err := b.vmRead32(v, va)
			if err != nil {
				return err
			}
			if got == want || (op == nvc0.SemaphoreAcquireGEq && got >= want) {
				return nil
			}
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
			wait = min(2*wait, semPollMax)
		}
	}
	return methodFault(hva)
}
