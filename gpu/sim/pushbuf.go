package sim

import (
	"context"
	"fmt"
	"time"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// Push-buffer decoding and the host (class 0x906F) methods.

// semState is the channel semaphore's method state.
type semState struct {
	addrHi, addrLo, payload uint32
}

// Semaphore acquire polling backs off from semPollMin to semPollMax.
const (
	semPollMin = time.Microsecond
	semPollMax = time.Millisecond
)

// methodError is a push-buffer or method error, reported on a PBDMA as a
// GF100 does (gf100_runq_intr): the INTR bit, and the offending method and
// data in the PBDMA's method cache.
type methodError struct {
	va     uint64 // the header's GPU virtual address
	pbdma  int
	intr   uint32 // nvc0.PBDMAIntr*
	subc   uint32
	method uint32
	data   uint32
}

func (e *methodError) Error() string {
	return fmt.Sprintf("pbdma %d: intr %#x: subchannel %d method %#x data %#x (push buffer at %#x)",
		e.pbdma, e.intr, e.subc, e.method, e.data, e.va)
}

// cmdError is a malformed push buffer (PBDMA 0 ILLEGAL_CMD).
func cmdError(va uint64, hdr uint32) error {
	return &methodError{va: va, pbdma: nvc0.PBDMAGR, intr: nvc0.PBDMAIntrIllegalCmd, data: hdr}
}

// methodCall is one method with its data, as the PBDMA hands it on.
type methodCall struct {
	hva          uint64 // address of its header
	subc, method uint32
	data         uint32
}

// err returns a method error of this call on the PBDMA that serves its
// subchannel's engine.
func (c *channel) err(m methodCall, intr uint32) error {
	r := nvc0.PBDMAGR
	if m.method >= nvc0.MthdFifoMax {
		switch c.subc[m.subc] {
		case nvc0.ClassFermiCopy:
			r = nvc0.PBDMACE0
		case nvc0.ClassFermiDecompress:
			r = nvc0.PBDMACE1
		}
	}
	return &methodError{va: m.hva, pbdma: r, intr: intr, subc: m.subc, method: m.method, data: m.data}
}

// exec decodes and executes the push buffer pb fetched from pbVA. A zero
// word is a no-op (NV906F_DMA_NOP) and END_PB_SEGMENT ends the buffer.
func (c *channel) exec(ctx context.Context, v *vm, pbVA uint64, pb []byte) error {
	n := len(pb) / 4
	word := func(i int) uint32 { return load32(pb[4*i:]) }
	for i := 0; i < n; {
		if err := ctx.Err(); err != nil {
			return err // preempted: stop at this method boundary
		}
		hva := pbVA + uint64(i)*4
		hw := word(i)
		h := nvc0.DecodeMethodHeader(hw)
		i++
		switch h.Type {
		case nvc0.MthdTypeImmediate:
			if err := c.method(ctx, v, methodCall{hva, h.Subchannel, h.Method, h.Count}); err != nil {
				return err
			}
		case nvc0.MthdTypeIncreasing, nvc0.MthdTypeNonIncreasing, nvc0.MthdTypeIncreaseOnce:
			if int(h.Count) > n-i {
				return cmdError(hva, hw) // the data runs past the push buffer
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
					return cmdError(hva, hw)
				}
				if err := c.method(ctx, v, methodCall{hva, h.Subchannel, m, word(i + j)}); err != nil {
					return err
				}
			}
			i += int(h.Count)
		case nvc0.MthdTypeOldIncreasing:
			if h.Count != 0 {
				return cmdError(hva, hw) // sim: the old formats are not decoded
			}
			// count 0: consumes no data (the all-zero word is NV906F_DMA_NOP)
		case nvc0.MthdTypeEndSegment:
			return nil
		default:
			return cmdError(hva, hw)
		}
	}
	return nil
}

// hostMethods are the class 0x906F methods below nvc0.MthdFifoMax, handled
// by PFIFO itself (a table, never modified). Host methods not listed raise
// ILLEGAL_MTHD.
var hostMethods = map[uint32]func(c *channel, ctx context.Context, v *vm, m methodCall) error{
	nvc0.MthdSetObject: func(c *channel, _ context.Context, _ *vm, m methodCall) error {
		switch m.data & nvc0.SetObjectClassMask {
		case nvc0.ClassFermiCompute, nvc0.ClassFermiCopy, nvc0.ClassFermiDecompress:
			c.subc[m.subc] = m.data & nvc0.SetObjectClassMask
			return nil
		}
		return c.err(m, nvc0.PBDMAIntrIllegalMthd)
	},
	nvc0.MthdIllegal: func(c *channel, _ context.Context, _ *vm, m methodCall) error {
		return c.err(m, nvc0.PBDMAIntrIllegalMthd)
	},
	nvc0.MthdNop:              nopMethod,
	nvc0.MthdSemaphoreAddrHi:  func(c *channel, _ context.Context, _ *vm, m methodCall) error { c.sem.addrHi = m.data; return nil },
	nvc0.MthdSemaphoreAddrLo:  func(c *channel, _ context.Context, _ *vm, m methodCall) error { c.sem.addrLo = m.data; return nil },
	nvc0.MthdSemaphorePayload: func(c *channel, _ context.Context, _ *vm, m methodCall) error { c.sem.payload = m.data; return nil },
	nvc0.MthdSemaphoreTrigger: func(c *channel, ctx context.Context, v *vm, m methodCall) error { return c.semaphore(ctx, v, m) },
	nvc0.MthdNonStall:         nopMethod, // sim: no interrupt is raised
	// The board's writes reach memory at once, so a flush has nothing to do.
	nvc0.MthdFBFlush: nopMethod,
	// sim: MEM_OP (L2 and TLB maintenance) is accepted and does nothing: the
	// board has no L2, and a channel cannot invalidate the MMU's TLB.
	nvc0.MthdMemOpA:       nopMethod,
	nvc0.MthdMemOpB:       nopMethod,
	nvc0.MthdSetReference: func(c *channel, _ context.Context, _ *vm, m methodCall) error { return c.setReference(m.data) },
	nvc0.MthdYield:        nopMethod,
}

func nopMethod(*channel, context.Context, *vm, methodCall) error { return nil }

// method executes one method on a subchannel.
func (c *channel) method(ctx context.Context, v *vm, m methodCall) error {
	if m.method >= nvc0.MthdFifoMax {
		switch c.subc[m.subc] {
		case nvc0.ClassFermiCompute:
			return c.computeMethod(ctx, v, m)
		case nvc0.ClassFermiCopy:
			return c.copyMethod(ctx, v, 0, m)
		case nvc0.ClassFermiDecompress:
			return c.copyMethod(ctx, v, 1, m)
		}
		return c.err(m, nvc0.PBDMAIntrEmptySubc)
	}
	h, ok := hostMethods[m.method]
	if !ok {
		return c.err(m, nvc0.PBDMAIntrIllegalMthd)
	}
	return h(c, ctx, v, m)
}

// setReference writes SET_REFERENCE's value to the user area (+0x48) once
// the channel's earlier work is done (it is: the worker runs in order).
func (c *channel) setReference(v uint32) error {
	if !c.b.physWrite32(phys{addr: c.user + nvc0.UserRef}, v) {
		return &faultError{va: c.user, reason: nvc0.FaultReasonNoMemory, write: true}
	}
	return nil
}

// semaphore executes a semaphore trigger (SEMAPHORED).
func (c *channel) semaphore(ctx context.Context, v *vm, m methodCall) error {
	b := c.b
	va := uint64(c.sem.addrHi)<<32 | uint64(c.sem.addrLo)
	if va%4 != 0 {
		return c.err(m, nvc0.PBDMAIntrIllegalSem)
	}
	op, long := nvc0.SemaphoreTriggerDecode(m.data)
	switch op {
	case nvc0.SemaphoreRelease:
		if long {
			// payload, 0, then the 64-bit PTIMER stamp. The stamp goes
			// first, so whoever sees the payload sees the stamp.
			lo, hi := nvc0.TimerSplit(b.now())
			for i, w := range [3]uint32{0, lo, hi} {
				if err := b.vmWrite32(v, va+uint64(i+1)*4, w); err != nil {
					return err
				}
			}
		}
		return b.vmWrite32(v, va, c.sem.payload)
	case nvc0.SemaphoreAcquireEqual, nvc0.SemaphoreAcquireGEq, nvc0.SemaphoreAcquireAnd:
		want := c.sem.payload
		wait := semPollMin
		for {
			got, err := b.vmRead32(v, va)
			if err != nil {
				return err
			}
			if semaphoreSatisfied(op, got, want) {
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
	return c.err(m, nvc0.PBDMAIntrIllegalSem)
}

// semaphoreSatisfied reports whether an acquire of kind op for want is
// satisfied by the value got (cl906f.h SEMAPHORED_OPERATION: ACQ_GEQ
// compares as a wrapping sequence number).
func semaphoreSatisfied(op, got, want uint32) bool {
	switch op {
	case nvc0.SemaphoreAcquireEqual:
		return got == want
	case nvc0.SemaphoreAcquireGEq:
		return int32(got-want) >= 0
	case nvc0.SemaphoreAcquireAnd:
		return got&want != 0
	}
	return false
}
