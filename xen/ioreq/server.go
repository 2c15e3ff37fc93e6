package ioreq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpuvm/gpuvm/internal/ratelog"
)

// Notifier is one vCPU's event channel as a server uses it; *xen.Evtchn
// is one.
type Notifier interface {
	// Wait blocks until an event arrived (and re-arms the channel), ctx
	// is done (its error), or max passes (nil).
	Wait(ctx context.Context, max time.Duration) error
	// Notify sends an event to the hypervisor's end.
	Notify() error
	// Close unbinds the channel.
	Close() error
}

// Handler serves one request: for a read it returns the value (the server
// keeps Size bytes of it), for a write the value is ignored. An error
// answers the access as refused (a read returns all ones). A server calls
// its handler from one goroutine per vCPU, so concurrently.
type Handler func(Request) (uint64, error)

// DefaultPoll is how long a vCPU's goroutine sleeps, without an event,
// before it looks at its slot anyway (a lost event costs at most this).
const DefaultPoll = 100 * time.Millisecond

// MaxClaims bounds the claims of one server.
const MaxClaims = 64

// Config is what a server serves and how.
type Config struct {
	// Handler serves every request within the claims.
	Handler Handler
	// Claims are what the server serves from the start; Claim and
	// Release change them later.
	Claims []Claim
	// Logger receives refused requests, at most a few lines a second.
	Logger *slog.Logger
	// Poll is how long a vCPU waits for an event before looking at its
	// slot anyway (DefaultPoll if 0; at most a second).
	Poll time.Duration
}

// control is the hypervisor behind a server made by Open: it claims and
// releases ranges and tears the server down. NewServer has none.
type control interface {
	claim(Claim) error
	release(Claim) error
	close() error
}

// Stats are a server's counters.
type Stats struct {
	Served        uint64 // requests the handler answered
	Refused       uint64 // requests refused by Decode or outside the claims
	HandlerErrors uint64 // requests whose handler failed or panicked
	BadStates     uint64 // slots seen in a state the protocol does not have
	NotifyErrors  uint64 // answers whose event could not be sent
	Invalidates   uint64 // map-cache invalidations acknowledged
	// HandlerTime is the time spent in the handler on served requests:
	// with a guest's round trip it splits a trap into the hypervisor's
	// part and the device model's (the aggregator's answer over IPC).
	HandlerTime time.Duration
}

// MeanHandlerTime is HandlerTime per served request (0 without any).
func (st Stats) MeanHandlerTime() time.Duration {
	if st.Served == 0 {
		return 0
	}
	return st.HandlerTime / time.Duration(st.Served)
}

// counters are Stats, updated atomically.
type counters struct {
	served, refused, handlerErrors, badStates, notifyErrors, invalidates atomic.Uint64
	handlerNs                                                            atomic.Int64
}

// ErrClosed is returned by Serve, Claim and Release on a closed server.
var ErrClosed = errors.New("ioreq server closed")

// Server serves the requests of one domain's vCPUs from a shared page.
// Its methods are safe for concurrent use.
type Server struct {
	page      *Page
	notifiers []Notifier
	handler   Handler
	log       *slog.Logger
	gripe     *ratelog.Limiter
	poll      time.Duration
	ctl       control // nil without a hypervisor

	claimMu sync.Mutex
	claims  atomic.Pointer[[]Claim] // immutable snapshots

	stats counters

	mu      sync.Mutex
	closed  bool
	serving bool
	cancel  context.CancelFunc
	done    chan struct{}
}

// NewServer returns a server of the requests in page, woken by one
// notifier per vCPU, with no hypervisor behind it: Claim and Release only
// change what the server accepts. Open makes one on Xen; tests use it
// with package ioreqtest. The server owns the notifiers (Close closes
// them); if NewServer fails they stay the caller's.
func NewServer(page *Page, notifiers []Notifier, cfg Config) (*Server, error) {
	s, err := newServer(page, notifiers, cfg, nil)
	if err != nil {
		return nil, err
	}
	if err := s.claimAll(cfg.Claims); err != nil {
		return nil, err // cfg.check makes this unreachable; nothing to undo without a hypervisor
	}
	return s, nil
}

// newServer builds a server with no claims yet.
func newServer(page *Page, notifiers []Notifier, cfg Config, ctl control) (*Server, error) {
	switch {
	case page == nil:
		return nil, errors.New("ioreq server: no page")
	case len(notifiers) != page.VCPUs():
		return nil, fmt.Errorf("ioreq server: %d notifiers for %d vCPUs", len(notifiers), page.VCPUs())
	}
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if cfg.Poll == 0 {
		cfg.Poll = DefaultPoll
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{page: page, notifiers: slices.Clone(notifiers), handler: cfg.Handler, log: cfg.Logger,
		gripe: ratelog.New(2, 10), poll: cfg.Poll, ctl: ctl}
	s.claims.Store(&[]Claim{})
	return s, nil
}

// check refuses a configuration no server can run with.
func (cfg Config) check() error {
	switch {
	case cfg.Handler == nil:
		return errors.New("ioreq server: no handler")
	case cfg.Poll < 0 || cfg.Poll > time.Second:
		return fmt.Errorf("ioreq server: poll %v, want 0..1s", cfg.Poll)
	case len(cfg.Claims) > MaxClaims:
		return fmt.Errorf("ioreq server: %d claims, at most %d", len(cfg.Claims), MaxClaims)
	}
	for i, c := range cfg.Claims {
		if err := c.check(); err != nil {
			return err
		}
		for _, d := range cfg.Claims[:i] {
			if c.overlaps(d) {
				return fmt.Errorf("ioreq server: claim %v overlaps %v", c, d)
			}
		}
	}
	return nil
}

// claimAll claims each of cs.
func (s *Server) claimAll(cs []Claim) error {
	for _, c := range cs {
		if err := s.Claim(c); err != nil {
			return err
		}
	}
	return nil
}

// VCPUs returns the number of vCPUs served.
func (s *Server) VCPUs() int { return s.page.VCPUs() }

// Claims returns what the server serves now.
func (s *Server) Claims() []Claim { return slices.Clone(*s.claims.Load()) }

// Stats returns the counters.
func (s *Server) Stats() Stats {
	return Stats{Served: s.stats.served.Load(), Refused: s.stats.refused.Load(), HandlerErrors: s.stats.handlerErrors.Load(),
		BadStates: s.stats.badStates.Load(), NotifyErrors: s.stats.notifyErrors.Load(), Invalidates: s.stats.invalidates.Load(),
		HandlerTime: time.Duration(s.stats.handlerNs.Load())}
}

// isClosed reports whether Close was called.
func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Serve serves requests until ctx is done or Close is called (nil), or a
// vCPU's event channel fails (that error, after every vCPU stopped). It
// runs one goroutine per vCPU; only one Serve may run at a time.
func (s *Server) Serve(ctx context.Context) error {
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return ErrClosed
	case s.serving:
		s.mu.Unlock()
		return errors.New("ioreq server: already serving")
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	s.serving, s.cancel, s.done = true, cancel, done
	s.mu.Unlock()
	defer func() {
		cancel()
		s.mu.Lock()
		s.serving, s.cancel, s.done = false, nil, nil
		s.mu.Unlock()
		close(done)
	}()

	errs := make([]error, s.page.VCPUs())
	var wg sync.WaitGroup
	for v := range s.page.VCPUs() {
		wg.Go(func() {
			if errs[v] = s.serveVCPU(ctx, v); errs[v] != nil {
				cancel()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// serveVCPU serves vCPU v's slot at every event (and every poll period)
// until ctx is done.
func (s *Server) serveVCPU(ctx context.Context, v int) error {
	n := s.notifiers[v]
	var lastBad uint8
	for {
		s.serveSlot(v, n, &lastBad)
		if err := n.Wait(ctx, s.poll); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("ioreq server: vCPU %d: wait for an event: %w", v, err)
		}
	}
}

// serveSlot answers the request in vCPU v's slot, if there is one. lastBad
// remembers a bad state already counted.
func (s *Server) serveSlot(v int, n Notifier, lastBad *uint8) {
	raw := s.page.Load(v)
	switch st := raw.State(); {
	case st == StateReady:
		*lastBad = 0
	case st <= StateRespReady: // free, or our answer not yet taken
		*lastBad = 0
		return
	default:
		if st != *lastBad {
			s.stats.badStates.Add(1)
			s.gripeLog("ioreq slot in an unknown state, left alone", "vcpu", v, "state", st)
		}
		*lastBad = st
		return
	}
	s.page.setState(v, raw, StateInProcess)
	if raw.Type == typeInvalidate {
		// Xen sends every server this after the guest's memory map
		// changed (a balloon, a decrease_reservation), for QEMU's map
		// cache; the device model keeps no mappings of guest RAM (the
		// aggregator's are of frames the domain holds until it dies),
		// so it only acknowledges it.
		s.stats.invalidates.Add(1)
		s.page.setState(v, raw, StateRespReady)
		if err := n.Notify(); err != nil {
			s.stats.notifyErrors.Add(1)
		}
		return
	}
	val := ^uint64(0)
	req, err := Decode(raw)
	req.VCPU = v
	if err == nil {
		err = s.claimed(req)
	}
	if err != nil {
		s.stats.refused.Add(1)
		s.gripeLog("ioreq refused", "vcpu", v, "type", raw.Type, "addr", fmt.Sprintf("%#x", raw.Addr),
			"size", raw.Size, "count", raw.Count, "bits", fmt.Sprintf("%#x", raw.Bits), "err", err)
	} else if got, herr := s.timedCall(req); herr != nil {
		s.stats.handlerErrors.Add(1)
		s.gripeLog("ioreq handler failed", "request", req.String(), "err", herr)
	} else {
		s.stats.served.Add(1)
		val = got & req.Mask()
	}
	if raw.Read() {
		s.page.setData(v, val)
	}
	s.page.setState(v, raw, StateRespReady)
	if err := n.Notify(); err != nil {
		s.stats.notifyErrors.Add(1)
		s.gripeLog("ioreq answer not notified", "vcpu", v, "err", err)
	}
}

// timedCall is call, its time added to the handler time if it succeeds.
func (s *Server) timedCall(r Request) (uint64, error) {
	t0 := time.Now()
	v, err := s.call(r)
	if err == nil {
		s.stats.handlerNs.Add(int64(time.Since(t0)))
	}
	return v, err
}

// call runs the handler; a panic is its error, so one bad access cannot
// stop the device model.
func (s *Server) call(r Request) (v uint64, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("handler panicked on %v: %v", r, p)
		}
	}()
	return s.handler(r)
}

// gripeLog logs a line caused by the guest, at a bounded rate.
func (s *Server) gripeLog(msg string, args ...any) {
	ok, held := s.gripe.Allow()
	if !ok {
		return
	}
	if held > 0 {
		args = append(args, "suppressed", held)
	}
	s.log.Warn(msg, args...)
}

// Close stops Serve (waiting for it), tears the server down on the
// hypervisor (disable, destroy, unmap) and unbinds every vCPU's channel.
// Closing twice is a no-op.
func (s *Server) Close() error {
	s.claimMu.Lock() // no Claim or Release under way
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.claimMu.Unlock()
		return nil
	}
	s.closed = true
	cancel, done := s.cancel, s.done
	s.mu.Unlock()
	s.claimMu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	var errs []error
	if s.ctl != nil {
		errs = append(errs, s.ctl.close())
	}
	for v, n := range s.notifiers {
		if err := n.Close(); err != nil {
			errs = append(errs, fmt.Errorf("ioreq server: vCPU %d: close event channel: %w", v, err))
		}
	}
	return errors.Join(errs...)
}
