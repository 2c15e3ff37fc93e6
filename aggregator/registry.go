package aggregator

import (
	"context"
	"fmt"
	"sync"

	"github.com/gpuvm/gpuvm/ipc"
)

// Registry hands out vGPU ids and holds the guests' identities for every
// board of one daemon. A vGPU's id is not its slot: it is taken at attach,
// kept for the vGPU's whole life wherever it is placed, and given back only
// when the vGPU is gone, so an operator's `gpuvm vgpu ... ID` names the same
// vGPU on whichever board it runs. The lowest free id is reused, as slots
// are. One guest identity (domid, and name) holds one vGPU on the whole
// host, not one per board.
//
// Boards that share a Registry (Options.Registry) can never attach the same
// domain twice, whichever of them its device model reaches first.
//
// It also bounds the state images moving through the daemon at once
// (saves and restores, TryImageTransfer): each holds up to a few times the
// VRAM it carries in dom0's memory.
type Registry struct {
	mu     sync.Mutex
	guests map[int]Guest // by vGPU id: held from claim to release
	// transfers has a token per image transfer under way.
	transfers chan struct{}
}

// MaxImageTransfers is how many saves and restores a daemon serves at
// once; another is refused (busy) until one ends.
const MaxImageTransfers = 2

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{guests: map[int]Guest{}, transfers: make(chan struct{}, MaxImageTransfers)}
}

// TryImageTransfer takes one of the daemon's MaxImageTransfers for a save
// or a restore: done gives it back. ok is false when all are taken.
func (r *Registry) TryImageTransfer() (done func(), ok bool) {
	select {
	case r.transfers <- struct{}{}:
		var once sync.Once
		return func() { once.Do(func() { <-r.transfers }) }, true
	default:
		return nil, false
	}
}

// ErrTransfersBusy is a save or restore refused because MaxImageTransfers
// are under way.
var ErrTransfersBusy = fmt.Errorf("%d state images are being saved or restored already: try again when one ends", MaxImageTransfers)

// claim takes the lowest free id for g, or refuses g (ErrDuplicate) when its
// domid or its name holds a vGPU already — one being built or torn down
// included.
func (r *Registry) claim(g Guest) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, h := range r.guests {
		switch {
		case h.DomID == g.DomID:
			return -1, fmt.Errorf("domid %d %w (vGPU %d, guest %q)", g.DomID, ErrDuplicate, id, h.Name)
		case h.Name == g.Name:
			return -1, fmt.Errorf("name %q %w (vGPU %d, domid %d)", g.Name, ErrDuplicate, id, h.DomID)
		}
	}
	id := 0
	for ; ; id++ {
		if _, used := r.guests[id]; !used {
			break
		}
	}
	r.guests[id] = g
	return id, nil
}

// release gives id back. Releasing an id that is not held does nothing.
func (r *Registry) release(id int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.guests, id)
}

// Len is how many ids are held.
func (r *Registry) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.guests)
}

// ServeConn attaches the VM of one accepted device model, serves it until
// its connection ends or ctx is done, and detaches it; a VM that may not
// attach is rejected with the reason. Serve does this for each device model
// it accepts; a host of several boards calls it on the board it placed the
// VM on (package host).
func (a *Aggregator) ServeConn(ctx context.Context, p *ipc.Pending) { a.serveVM(ctx, p, nil) }

// ServeConnElse is ServeConn for a VM placed on this board by a host whose
// other boards may take it: if the board has no slot left when the VM
// attaches (another VM took the last one since placement chose this
// board), the VM is not rejected but elsewhere is called; it reports
// whether it served the VM on another board (it returns once that VM's
// connection ended), else the VM is rejected as ServeConn would.
func (a *Aggregator) ServeConnElse(ctx context.Context, p *ipc.Pending, elsewhere func() bool) {
	a.serveVM(ctx, p, elsewhere)
}

// Board names the board v is on: its index among the daemon's boards and
// its configured name ("": none given).
func (v *VGPU) Board() (int, string) {
	a, _ := v.where()
	return a.opts.Board, a.opts.BoardName
}
