package nouveau

import (
	"fmt"
	"time"

	"github.com/gpuvm/gpuvm/gpu"
)

// Fence waits on the GPU's interrupt. A GPU that delivers interrupts
// (gpu.Interrupter: the device model of a vGPU whose aggregator raises
// them) interrupts when work it was given ends — completes, faults, or is
// stopped — and when it reports a fault. A fence wait then sleeps until an
// interrupt instead of napping and trapping a fault-register read every
// FaultPoll: after an interrupt it checks the fence, and if the fence has
// not passed (the interrupt was for other work, or a fault) the channel's
// fault registers; before its first sleep too, if an interrupt came since
// a fence sleep last looked (a fault delivered before the wait began
// raised its interrupt then). Every IRQPoll without an interrupt it checks them too:
// the interrupt is not the only source of truth, and a lost one costs one
// IRQPoll.

// defaultIRQPoll is the safety-net interval of a fence sleep, as pvdrm's
// CPU_PREP waiters poll for faults (far slower than the interrupts it
// backs up).
const defaultIRQPoll = 50 * time.Millisecond

// interrupter returns mmio's interrupt line if it delivers interrupts and
// opts allow them, else nil (the driver polls).
func interrupter(mmio gpu.MMIO, opts Options) gpu.Interrupter {
	it, ok := mmio.(gpu.Interrupter)
	if !ok || opts.PollFences {
		return nil
	}
	if _, ok := it.IRQCount(); !ok {
		return nil
	}
	return it
}

// Before it sleeps, a wait spins for a while, as the polling wait did:
// waking a sleeping thread costs a context switch on each side, more than
// a short wait (a 64×64 madd alone on the GPU: ~30 µs). How long adapts to
// the channel's recent waits, as an adaptive mutex spins: after a wait
// that took w ≤ FenceSpin the next one spins 2w (at most FenceSpin); after
// a longer one, half as long as this one did. A VM alone on the GPU thus
// spins through its short waits, and one of 64 VMs queued behind the
// others (tens of milliseconds) soon sleeps at once.

// defaultFenceSpin is the most a fence wait spins before it sleeps.
const defaultFenceSpin = 200 * time.Microsecond

// nextSpin is the spin budget after a wait that spun for at most budget
// and took w in all: 2w if w ≤ most (at most most), else budget/2.
func nextSpin(budget, w, most time.Duration) time.Duration {
	if w <= most {
		return min(2*w, most)
	}
	return budget / 2
}

// sleepFence waits for seq on the interrupt, from the count seen taken
// before the fence was last checked: it spins for the channel's spin
// budget, then sleeps.
func (c *Channel) sleepFence(seq, seen uint32) error {
	start := time.Now()
	budget := time.Duration(c.spinNs.Load())
	defer func() { c.spinNs.Store(int64(nextSpin(budget, time.Since(start), c.d.opts.FenceSpin))) }()
	for i := 0; budget > 0; i++ {
		if c.fencePassed(seq) {
			return nil
		}
		if i%64 == 63 && time.Since(start) > budget {
			break
		}
	}
	irq := c.d.irq
	// An interrupt raised before seen was taken (the fault came before
	// this wait began) wakes no sleep: if any came since a fence sleep
	// last looked at the fault registers, look now, before sleeping.
	if c.d.faultLook.Swap(seen) != seen {
		if err := c.checkFault(); err != nil {
			return err
		}
	}
	for {
		n, err := irq.WaitIRQ(seen, c.d.opts.IRQPoll)
		if err != nil {
			return fmt.Errorf("channel %d fence %d: %w (%w)", c.id, seq, ErrDeviceGone, err)
		}
		seen = n
		if c.fencePassed(seq) {
			return nil
		}
		if c.isClosed() {
			return fmt.Errorf("channel %d fence %d: channel %w", c.id, seq, ErrClosed)
		}
		c.d.faultLook.Store(n)
		if err := c.checkFault(); err != nil {
			return err
		}
		if time.Since(start) > c.d.opts.Timeout {
			return fmt.Errorf("channel %d fence %d (at %d): %w", c.id, seq, c.fenceValue(), ErrTimeout)
		}
	}
}

// isClosed reports whether Close began on the channel.
func (c *Channel) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}
