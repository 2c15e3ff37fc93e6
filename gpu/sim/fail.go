package sim

import "errors"

// ErrBusLost is what host-side VRAM access returns once the board fell off
// the bus (FailBus).
var ErrBusLost = errors.New("sim: the board fell off the bus")

// FailBus injects the failure of a GPU that fell off the bus (a surprise
// removal, a link down, a board that hung hard): from now on every MMIO read
// returns all ones, as a read of an absent PCI device does; writes are
// dropped; the engines stop — the entry a channel was running is abandoned,
// no submission completes, no report or interrupt is raised — and host-side
// VRAM access fails with ErrBusLost. Registering and unregistering system
// memory still work (they are the host's IOMMU bookkeeping, not the
// board's): unregistering a VM's RAM still waits out any DMA in flight, and
// after it the dead board can reach none of it. There is no way back but a
// new board.
func (b *Board) FailBus() {
	if !b.enter() {
		return
	}
	defer b.leave()
	if b.busLost.Swap(true) {
		return
	}
	for _, c := range b.chans {
		c.mu.Lock()
		if c.cancel != nil {
			c.cancel() // abandon the entry in progress; run sees busLost and stops
		}
		c.mu.Unlock()
	}
}

// BusLost reports whether FailBus was called.
func (b *Board) BusLost() bool { return b.busLost.Load() }
