// Package libvirtwatch gives libvirt domains their vGPUs: it follows a
// libvirtd's domain lifecycle events, and a domain whose XML carries
// gpuvm's metadata element (package vgpumeta) gets its vGPU attached when
// it starts — its settings registered with the aggregator, its device
// model launched — and torn down when it stops or crashes. When libvirtd
// goes away (a restart) the Watcher reconnects with backoff and
// reconciles: the vGPUs of domains no longer running are torn down and
// running domains that ask for one get it. docs/libvirt.md describes it.
package libvirtwatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"

	"github.com/gpuvm/gpuvm/internal/vgpumeta"
)

// Conn is what the Watcher uses of a libvirt connection (a connected
// *libvirt.Libvirt has it all). Disconnect may be called more than once,
// and concurrently with calls: it must make the calls waiting for
// libvirtd return, even if libvirtd no longer answers (Dialer's
// connections do; a bare *libvirt.Libvirt waits for libvirtd's answer to
// its close).
type Conn interface {
	ConnectListAllDomains(needResults int32, flags libvirt.ConnectListAllDomainsFlags) ([]libvirt.Domain, uint32, error)
	DomainLookupByUUID(uuid libvirt.UUID) (libvirt.Domain, error)
	DomainGetState(dom libvirt.Domain, flags uint32) (state int32, reason int32, err error)
	DomainGetXMLDesc(dom libvirt.Domain, flags libvirt.DomainXMLFlags) (string, error)
	DomainGetInfo(dom libvirt.Domain) (state uint8, maxMem uint64, memory uint64, nrVirtCPU uint16, cpuTime uint64, err error)
	LifecycleEvents(ctx context.Context) (<-chan libvirt.DomainEventLifecycleMsg, error)
	Disconnected() <-chan struct{}
	Disconnect() error
}

// Registry is the aggregator's side: the vGPU settings registered for a
// domain before its device model connects (the control API's
// /v1/domains/{domid}).
type Registry interface {
	Register(ctx context.Context, domid uint32, v vgpumeta.VGPU) error
	Forget(ctx context.Context, domid uint32) error
}

// The default bounds of the wait between reconnection attempts.
const (
	DefaultMinBackoff = 100 * time.Millisecond
	DefaultMaxBackoff = 5 * time.Second
)

// Config configures a Watcher.
type Config struct {
	// Dial connects to libvirtd (see Dialer). It should give up when ctx
	// ends.
	Dial func(ctx context.Context) (Conn, error)
	// Registry registers a domain's vGPU settings with the aggregator
	// before its device model is launched, and forgets them when it is
	// torn down.
	Registry Registry
	// Launcher starts the device model of a domain that asks for a vGPU.
	Launcher Launcher
	// Logger gets what the Watcher attaches, tears down and fails to do
	// (default: nothing is logged).
	Logger *slog.Logger
	// MinBackoff and MaxBackoff bound the wait between reconnection
	// attempts, which doubles from the one to the other (default 100ms
	// and 5s: DefaultMinBackoff, DefaultMaxBackoff).
	MinBackoff, MaxBackoff time.Duration
}

// Dialer connects to the libvirtd listening on the Unix socket and opens
// uri (test:///default, xen:///system, ...) through it. A libvirtd that
// accepts the connection but does not complete the handshake within 15s
// is given up (and retried by the Watcher). The connection's Disconnect
// returns even if libvirtd no longer answers, failing the calls still
// waiting for it.
func Dialer(socket, uri string) func(ctx context.Context) (Conn, error) {
	return dialer(socket, uri, handshakeTimeout)
}

// How long a connection to libvirtd may take: the socket's, then the
// handshake (authentication, opening the URI).
const (
	dialTimeout      = 5 * time.Second
	handshakeTimeout = 15 * time.Second
)

// closeGrace is how long Disconnect waits for libvirtd to answer the
// polite close before it closes the socket.
const closeGrace = time.Second

func dialer(socket, uri string, handshake time.Duration) func(ctx context.Context) (Conn, error) {
	return func(ctx context.Context) (Conn, error) {
		nd := net.Dialer{Timeout: dialTimeout}
		raw, err := nd.DialContext(ctx, "unix", socket)
		if err != nil {
			return nil, fmt.Errorf("libvirt %s on %s: %w", uri, socket, err)
		}
		// The client gets the socket already connected, so that closing
		// it can end a handshake or a call that libvirtd never answers
		// (go-libvirt's own calls have no deadline).
		l := libvirt.NewWithDialer(dialers.NewAlreadyConnected(raw))
		done := make(chan error, 1)
		go func() { done <- l.ConnectToURI(libvirt.ConnectURI(uri)) }()
		t := time.NewTimer(handshake)
		defer t.Stop()
		select {
		case err := <-done:
			if err != nil {
				_ = raw.Close()
				return nil, fmt.Errorf("libvirt %s on %s: %w", uri, socket, err)
			}
			return &conn{Libvirt: l, raw: raw}, nil
		case <-t.C:
			// Closed, the socket fails the handshake: ConnectToURI returns.
			_ = raw.Close()
			return nil, fmt.Errorf("libvirt %s on %s: libvirtd did not complete the handshake within %v", uri, socket, handshake)
		case <-ctx.Done():
			_ = raw.Close()
			return nil, ctx.Err()
		}
	}
}

// conn is a connection Dialer made: the client, and its socket.
type conn struct {
	*libvirt.Libvirt
	raw  net.Conn
	once sync.Once
	err  error
}

// Disconnect closes the connection: politely if libvirtd answers within
// closeGrace, and then by closing the socket, which fails every call still
// waiting for libvirtd (go-libvirt's Disconnect alone would wait for ever
// on a libvirtd that does not answer). Calls after the first wait for it
// and return its error.
func (c *conn) Disconnect() error {
	c.once.Do(func() {
		done := make(chan error, 1)
		go func() { done <- c.Libvirt.Disconnect() }()
		t := time.NewTimer(closeGrace)
		defer t.Stop()
		select {
		case c.err = <-done:
		case <-t.C:
			c.err = fmt.Errorf("libvirtd did not answer the disconnection within %v; closed the socket", closeGrace)
		}
		_ = c.raw.Close()
	})
	return c.err
}

// Watcher keeps the vGPUs of one libvirtd's domains. Its state belongs to
// the goroutine running Run.
type Watcher struct {
	cfg      Config
	log      *slog.Logger
	handlers map[libvirt.DomainEventType]handler
	// attached are the domains with a device model, by UUID.
	attached map[libvirt.UUID]*attachment
	// ended are the domain runs (UUID and domid) whose device model
	// ended by itself: not launched again until the domain stops.
	ended map[runKey]string
	// endedCh carries the models that ended, to Run's goroutine.
	endedCh chan ended
	// quit is closed when Run has returned.
	quit chan struct{}
}

// handler is what a lifecycle event does to its domain.
type handler struct {
	name string
	act  func(w *Watcher, ctx context.Context, c Conn, d libvirt.Domain)
}

// attachment is a domain's running device model.
type attachment struct {
	run   runKey
	name  string
	model Model
}

// runKey is one run of a domain: a domain started again gets a new id.
type runKey struct {
	uuid  libvirt.UUID
	domid uint32
}

type ended struct {
	run   runKey
	model Model
}

// New returns a Watcher; Run runs it.
func New(cfg Config) (*Watcher, error) {
	if cfg.Dial == nil || cfg.Registry == nil || cfg.Launcher == nil {
		return nil, errors.New("libvirtwatch: Dial, Registry and Launcher are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = DefaultMinBackoff
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = DefaultMaxBackoff
	}
	cfg.MaxBackoff = max(cfg.MaxBackoff, cfg.MinBackoff)
	sync := handler{"sync", (*Watcher).sync}
	stop := handler{"detach", (*Watcher).stopped}
	return &Watcher{cfg: cfg, log: cfg.Logger,
		// Started attaches, Stopped and Crashed detach; the others only
		// make sure of the domain's state (an event missed in a
		// reconnection, a shutdown still in progress, a running domain
		// undefined: it runs on, transient, and keeps its vGPU).
		// Suspended, PMSuspended and Defined leave the vGPU as it is.
		handlers: map[libvirt.DomainEventType]handler{
			libvirt.DomainEventStarted:   sync,
			libvirt.DomainEventResumed:   sync,
			libvirt.DomainEventShutdown:  sync,
			libvirt.DomainEventUndefined: sync,
			libvirt.DomainEventStopped:   stop,
			libvirt.DomainEventCrashed:   stop,
		},
		attached: map[libvirt.UUID]*attachment{}, ended: map[runKey]string{}, endedCh: make(chan ended), quit: make(chan struct{})}, nil
}

// Run watches until ctx ends, reconnecting whenever the connection is
// lost, and then stops every device model it launched. It returns an
// error only if the first connection is refused by libvirtd itself (a
// URI it has no driver for, say); a libvirtd that cannot be reached is
// waited for.
func (w *Watcher) Run(ctx context.Context) error {
	defer close(w.quit)
	defer w.stopAll()
	backoff := w.cfg.MinBackoff
	connected := false
	for {
		c, err := w.cfg.Dial(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			var lerr libvirt.Error
			if !connected && errors.As(err, &lerr) {
				return err
			}
			w.log.Warn("libvirt: cannot connect; retrying", "err", err, "retry_in", backoff)
			w.wait(ctx, backoff)
			backoff = min(2*backoff, w.cfg.MaxBackoff)
			continue
		}
		backoff = w.cfg.MinBackoff
		w.log.Info("libvirt: connected", "reconnection", connected)
		connected = true
		err = w.serve(ctx, c)
		_ = c.Disconnect()
		if ctx.Err() != nil {
			return nil
		}
		w.log.Warn("libvirt: connection lost; reconnecting", "err", err)
	}
}

// serve handles one connection's events until it is lost or ctx ends.
func (w *Watcher) serve(ctx context.Context, c Conn) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Every libvirt call waits for libvirtd's answer, with no deadline:
	// disconnected when serve ends (ctx ends, say: SIGTERM), a libvirtd
	// that no longer answers fails them, and Run goes on to stop the
	// device models.
	context.AfterFunc(ctx, func() { _ = c.Disconnect() })
	events, err := c.LifecycleEvents(ctx)
	if err != nil {
		return fmt.Errorf("subscribing to lifecycle events: %w", err)
	}
	// go-libvirt's goroutine behind events sends each event with a plain
	// send and looks at ctx only while it waits for the next one: left
	// with an event in flight (serve returning on a lost connection or a
	// failed reconciliation), it would block for ever, and with it its
	// unbounded event queue and the whole client. Cancelled and drained,
	// it closes events and ends.
	defer func() {
		cancel()
		for range events {
		}
	}()
	// Subscribed first, so that nothing that happens while the list is
	// read goes unseen.
	if err := w.reconcile(ctx, c); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-c.Disconnected():
			return errors.New("libvirtd closed the connection")
		case ev, ok := <-events:
			if !ok {
				return errors.New("the event stream ended")
			}
			w.event(ctx, c, ev)
		case e := <-w.endedCh:
			w.modelEnded(ctx, e)
		}
	}
}

// event runs the handler of a lifecycle event.
func (w *Watcher) event(ctx context.Context, c Conn, ev libvirt.DomainEventLifecycleMsg) {
	h, ok := w.handlers[libvirt.DomainEventType(ev.Event)]
	w.log.Debug("libvirt: lifecycle event", "domain", ev.Dom.Name, "id", ev.Dom.ID, "event", ev.Event, "detail", ev.Detail, "action", h.name)
	if ok {
		h.act(w, ctx, c, ev.Dom)
	}
}

// wait waits for d or the end of ctx, taking note of device models that
// end meanwhile.
func (w *Watcher) wait(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			return
		case e := <-w.endedCh:
			w.modelEnded(ctx, e)
		}
	}
}
