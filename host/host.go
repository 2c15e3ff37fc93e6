// Package host is a dom0 host with several GPUs: one aggregator per board
// (each with its own scheduler, layout, counters and quotas), one registry of
// vGPU ids and guest identities shared by them, placement of each VM that
// connects on a board, and the control API and metrics over all of them.
//
// A host with one board behaves exactly as that board's aggregator does.
package host

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/ipc"
)

// Board is one physical GPU of the host and its aggregator.
type Board struct {
	// Index is the board's position in the configuration, Name its name.
	Index int
	Name  string
	// Timing names its timing profile ("": none told).
	Timing string
	// Agg owns the board.
	Agg *aggregator.Aggregator
	// Release lets go of the physical board once its aggregator is closed
	// (nil: nothing to do).
	Release func() error
	// FailBus injects the board's falling off the bus (the simulated
	// board's fault injection; nil: the board has none).
	FailBus func()
	// RepairBus puts it back on the bus after FailBus (the simulated
	// board's RepairBus; nil: the board has none).
	RepairBus func() error
	// VRAMFiles returns a new file on each of the board's VRAM segments,
	// in order, for a new daemon process to build the board over (the
	// simulated board's VRAMSegmentFiles; nil: its VRAM cannot be handed
	// over, and a handoff copies it into the images).
	VRAMFiles func() ([]*os.File, error)
	// VRAMSegments are the sizes of those segments.
	VRAMSegments []uint64

	// state is whether placement may choose it (under Host.mu).
	state State
	// ctl is its aggregator's control API.
	ctl http.Handler
}

// State says whether placement may put new vGPUs on a board.
type State string

// Board states.
const (
	// StateActive boards take new vGPUs.
	StateActive State = "active"
	// StateCordoned boards keep their vGPUs but take no new ones (the
	// operator's `gpuvm board cordon`, the first step of a drain).
	StateCordoned State = "cordoned"
	// StateFailed boards stopped answering (their aggregator found them
	// lost): their vGPUs were taken off and nothing is placed on them.
	StateFailed State = "failed"
)

// Options configure a Host.
type Options struct {
	// Pin names the board a guest's configuration pins it to ("": any),
	// given the vGPU profile that sizes it ("": none): that of its
	// running vGPU, or of the settings registered for its domain.
	Pin func(g aggregator.Guest, profile string) string
	// Placement names the placement policy: PlaceSpread ("" too) or
	// PlacePack.
	Placement string
	// Balance configures the load balancer (off unless its Policy is
	// BalanceLoad).
	Balance BalanceOptions
	// FaultInjection lets the control API make a board fall off the bus
	// (POST /v1/boards/NAME/fail): a test facility, off in production.
	FaultInjection bool
	// Xen says the daemon serves Xen domains from dom0: it may run their
	// pvdrm back ends (StartXenPVDRM), with the Xen devices in XenDevDir
	// ("" is /dev/xen).
	Xen       bool
	XenDevDir string
	// Logger receives placement decisions.
	Logger *slog.Logger
}

// Host owns every board of a dom0 host.
type Host struct {
	boards []*Board
	reg    *aggregator.Registry
	opts   Options
	log    *slog.Logger
	load   *loadMeter
	bal    *balancer
	// restoreMu makes image registrations one at a time (restore.go).
	restoreMu sync.Mutex

	// bg is the context of the host's own services (Xen pvdrm back ends),
	// cancelled by Close, which waits for them (bgWait).
	bg     context.Context
	bgStop context.CancelFunc
	bgWait sync.WaitGroup

	mu        sync.Mutex
	decisions []Decision // the latest, oldest first, at most maxDecisions
	pending   map[uint32]aggregator.DomainSettings
	xenPVDRM  map[uint32]*xenPVDRMService // running Xen pvdrm back ends, by domid
	// xenHandoff is open while the Xen pvdrm back ends are handed to a
	// new process (HandOffXenPVDRM); closed when that failed
	// (XenPVDRMHandoffFailed). nil: no handoff.
	xenHandoff chan struct{}
	closed     bool
}

// New makes a host of boards, whose aggregators must share reg (their
// Options.Registry). The host owns the aggregators from now on: Close
// closes them.
func New(reg *aggregator.Registry, boards []*Board, opts Options) (*Host, error) {
	if len(boards) == 0 {
		return nil, errors.New("host: no boards")
	}
	seen := map[string]bool{}
	for i, b := range boards {
		if b.Index != i {
			return nil, fmt.Errorf("host: board %q has index %d at position %d", b.Name, b.Index, i)
		}
		if seen[b.Name] {
			return nil, fmt.Errorf("host: two boards named %q", b.Name)
		}
		seen[b.Name] = true
		b.state = StateActive
		b.ctl = b.Agg.ControlHandler()
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	switch opts.Placement {
	case "":
		opts.Placement = PlaceSpread
	case PlaceSpread, PlacePack:
	default:
		return nil, fmt.Errorf("host: unknown placement %q (have %v)", opts.Placement, Placements())
	}
	bal, err := newBalancer(opts.Balance)
	if err != nil {
		return nil, err
	}
	h := &Host{boards: boards, reg: reg, opts: opts, log: opts.Logger, load: newLoadMeter(len(boards)), bal: bal,
		pending: map[uint32]aggregator.DomainSettings{}, xenPVDRM: map[uint32]*xenPVDRMService{}}
	h.bg, h.bgStop = context.WithCancel(context.Background())
	for _, b := range boards {
		b.Agg.SetRehome(h.rehomer(b))
	}
	h.startBalancer()
	return h, nil
}

// Boards returns the host's boards in configuration order.
func (h *Host) Boards() []*Board { return h.boards }

// Board returns the board called name, or nil.
func (h *Host) Board(name string) *Board {
	for _, b := range h.boards {
		if b.Name == name {
			return b
		}
	}
	return nil
}

// Serve accepts device models on ln until ctx is done: each is placed on a
// board and served by that board's aggregator for as long as its connection
// lasts. Serve returns when ctx is done, after every connection ended.
func (h *Host) Serve(ctx context.Context, ln *ipc.Listener) error {
	sctx, stop := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(sampleEvery)
		defer t.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case now := <-t.C:
				h.load.sample(h.boards, now)
			}
		}
	}()
	err := aggregator.AcceptEach(ctx, ln, h.log, h.serve)
	stop()
	<-sampled
	return err
}

// serve places one VM and hands it to its board.
func (h *Host) serve(ctx context.Context, p *ipc.Pending) {
	hello := p.Hello()
	if hello.Resume && h.refuseResume(p) { // restore.go
		return
	}
	g := aggregator.Guest{DomID: hello.DomID, Name: hello.Name, Mode: hello.Mode}
	h.serveOn(ctx, p, g, h.Place, nil)
}

// serveOn hands p to the board place chooses. If the VM finds the board
// full when it attaches (another VM took the last slot since the choice),
// it is placed again among the boards not yet tried — tried says which —
// and refused only when none takes it.
func (h *Host) serveOn(ctx context.Context, p *ipc.Pending, g aggregator.Guest, place func(aggregator.Guest) (*Board, Decision), tried map[*Board]bool) bool {
	b, d := place(g)
	if r := h.restoreBoard(g.DomID); r != nil && tried == nil {
		b = r // its state image waits there (restore.go)
	}
	if b == nil {
		if tried == nil { // the first choice: refuse here; a retry lets the first board refuse
			h.log.Warn("refused: no board", "domid", g.DomID, "name", g.Name, "reason", d.Reason)
			_ = p.Reject(d.Reason)
		}
		return false
	}
	if s, ok := h.takePending(g.DomID); ok {
		if err := b.Agg.SetDomainSettings(g.DomID, s); err != nil {
			h.log.Warn("refused: domain settings", "domid", g.DomID, "board", b.Name, "err", err)
			_ = p.Reject(err.Error())
			return true
		}
	}
	if tried == nil {
		tried = map[*Board]bool{}
	}
	tried[b] = true
	b.Agg.ServeConnElse(ctx, p, func() bool {
		if len(tried) >= len(h.boards) {
			return false
		}
		return h.serveOn(ctx, p, g, func(g aggregator.Guest) (*Board, Decision) { return h.placeAvoiding(g, tried) }, tried)
	})
	return true
}

// Close stops the load balancer and closes every board's aggregator.
func (h *Host) Close() error {
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
	h.bgStop()
	h.bgWait.Wait()
	h.stopBalancer()
	var errs []error
	for _, b := range h.boards {
		if err := b.Agg.Close(); err != nil {
			errs = append(errs, fmt.Errorf("board %s: %w", b.Name, err))
		}
		if b.Release != nil {
			if err := b.Release(); err != nil {
				errs = append(errs, fmt.Errorf("board %s: %w", b.Name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// VGPUs returns every board's attached vGPUs, board by board.
func (h *Host) VGPUs() []*aggregator.VGPU {
	var out []*aggregator.VGPU
	for _, b := range h.boards {
		out = append(out, b.Agg.VGPUs()...)
	}
	return out
}

// Lookup returns the vGPU with id, or nil.
func (h *Host) Lookup(id int) (*Board, *aggregator.VGPU) {
	for _, b := range h.boards {
		for _, v := range b.Agg.VGPUs() {
			if v.ID == id {
				return b, v
			}
		}
	}
	return nil, nil
}

// SchedStats returns every vGPU's scheduler account (metrics.Source).
func (h *Host) SchedStats() map[*aggregator.VGPU]aggregator.SchedStats {
	out := map[*aggregator.VGPU]aggregator.SchedStats{}
	for _, b := range h.boards {
		for v, s := range b.Agg.SchedStats() {
			out[v] = s
		}
	}
	return out
}

// Layout returns one layout holding every board's slots, board after board
// (metrics.Source counts slots with it); each board's own is its
// aggregator's.
func (h *Host) Layout() aggregator.Layout {
	l := h.boards[0].Agg.Layout()
	l.Slots = nil
	for _, b := range h.boards {
		l.Slots = append(l.Slots, b.Agg.Layout().Slots...)
	}
	return l
}

// OutOfService returns every board's slots out of service, numbered as
// Layout numbers them.
func (h *Host) OutOfService() map[int]string {
	out := map[int]string{}
	base := 0
	for _, b := range h.boards {
		for slot, why := range b.Agg.OutOfService() {
			out[base+slot] = fmt.Sprintf("board %s slot %d: %s", b.Name, slot, why)
		}
		base += len(b.Agg.Layout().Slots)
	}
	return out
}
