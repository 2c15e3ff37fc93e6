package libvirtwatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"

	"github.com/gpuvm/gpuvm/internal/vgpumeta"
)

// The Watcher's logic against a libvirt of its own making; the real
// libvirtd is cmd/gpuvm's TestLibvirtLifecycle.

// fakeLibvirt is a hypervisor's domains; each connection to it is a fakeConn.
type fakeLibvirt struct {
	mu      sync.Mutex
	domains map[libvirt.UUID]*fakeDomain
	conn    *fakeConn
	nextID  int32
	refuse  error // the next dials fail so
	dials   int
	// failLists is how many connections fail listing the domains, each
	// with an event in flight to the Watcher.
	failLists int
	// forwarders counts the event goroutines of LifecycleEvents running.
	forwarders atomic.Int32
	// hung: calls about domains get no answer until the connection is
	// closed (go-libvirt's calls then fail so).
	hung bool
}

type fakeDomain struct {
	dom     libvirt.Domain // ID -1: not running
	xml     string
	running bool
}

type fakeConn struct {
	lv *fakeLibvirt
	// events are the connection's lifecycle events, which LifecycleEvents
	// forwards.
	events chan libvirt.DomainEventLifecycleMsg
	gone   chan struct{}
	once   sync.Once
}

func (lv *fakeLibvirt) dial(context.Context) (Conn, error) {
	lv.mu.Lock()
	defer lv.mu.Unlock()
	if lv.refuse != nil {
		return nil, lv.refuse
	}
	lv.dials++
	lv.conn = &fakeConn{lv: lv, events: make(chan libvirt.DomainEventLifecycleMsg, 16), gone: make(chan struct{})}
	if lv.failLists > 0 {
		lv.conn.events <- libvirt.DomainEventLifecycleMsg{Dom: libvirt.Domain{Name: "ghost", ID: 99}, Event: int32(libvirt.DomainEventStarted)}
	}
	return lv.conn, nil
}

// start runs a domain (defining it first if new) and sends its event.
func (lv *fakeLibvirt) start(name, metadata string) libvirt.Domain {
	lv.mu.Lock()
	var u libvirt.UUID
	copy(u[:], name)
	d := lv.domains[u]
	if d == nil {
		d = &fakeDomain{xml: "<domain><name>" + name + "</name><metadata>" + metadata + "</metadata></domain>"}
		lv.domains[u] = d
	}
	lv.nextID++
	d.dom, d.running = libvirt.Domain{Name: name, UUID: u, ID: lv.nextID}, true
	dom, c := d.dom, lv.conn
	lv.mu.Unlock()
	c.events <- libvirt.DomainEventLifecycleMsg{Dom: dom, Event: int32(libvirt.DomainEventStarted)}
	return dom
}

// stop stops a running domain and sends its event.
func (lv *fakeLibvirt) stop(dom libvirt.Domain, ev libvirt.DomainEventType) {
	lv.mu.Lock()
	d := lv.domains[dom.UUID]
	d.running, d.dom.ID = false, -1
	c := lv.conn
	lv.mu.Unlock()
	c.events <- libvirt.DomainEventLifecycleMsg{Dom: dom, Event: int32(ev)}
}

// undefine undefines a domain and sends its event: a running domain runs
// on (transient), a stopped one is gone.
func (lv *fakeLibvirt) undefine(dom libvirt.Domain) {
	lv.mu.Lock()
	if !lv.domains[dom.UUID].running {
		delete(lv.domains, dom.UUID)
	}
	c := lv.conn
	lv.mu.Unlock()
	c.events <- libvirt.DomainEventLifecycleMsg{Dom: dom, Event: int32(libvirt.DomainEventUndefined)}
}

// restart drops the connection and every running domain (libvirtd's test
// driver starting afresh).
func (lv *fakeLibvirt) restart() {
	lv.mu.Lock()
	for _, d := range lv.domains {
		d.running, d.dom.ID = false, -1
	}
	c := lv.conn
	lv.mu.Unlock()
	c.once.Do(func() { close(c.gone) })
}

func (c *fakeConn) ConnectListAllDomains(_ int32, _ libvirt.ConnectListAllDomainsFlags) ([]libvirt.Domain, uint32, error) {
	c.lv.mu.Lock()
	if c.lv.failLists > 0 {
		c.lv.failLists--
		c.lv.mu.Unlock()
		for len(c.events) > 0 { // the forwarder has the event in flight
			time.Sleep(time.Millisecond)
		}
		return nil, 0, errors.New("listing failed")
	}
	defer c.lv.mu.Unlock()
	var out []libvirt.Domain
	for _, d := range c.lv.domains {
		if d.running {
			out = append(out, d.dom)
		}
	}
	return out, uint32(len(out)), nil
}

func (c *fakeConn) DomainLookupByUUID(u libvirt.UUID) (libvirt.Domain, error) {
	c.lv.mu.Lock()
	if c.lv.hung {
		c.lv.mu.Unlock()
		<-c.gone
		return libvirt.Domain{}, libvirt.ErrInterrupted
	}
	defer c.lv.mu.Unlock()
	if d := c.lv.domains[u]; d != nil {
		return d.dom, nil
	}
	return libvirt.Domain{}, libvirt.Error{Code: uint32(libvirt.ErrNoDomain), Message: "no domain"}
}

func (c *fakeConn) DomainGetState(dom libvirt.Domain, _ uint32) (int32, int32, error) {
	c.lv.mu.Lock()
	defer c.lv.mu.Unlock()
	if c.lv.domains[dom.UUID].running {
		return int32(libvirt.DomainRunning), 0, nil
	}
	return int32(libvirt.DomainShutoff), 0, nil
}

func (c *fakeConn) DomainGetXMLDesc(dom libvirt.Domain, _ libvirt.DomainXMLFlags) (string, error) {
	c.lv.mu.Lock()
	defer c.lv.mu.Unlock()
	return c.lv.domains[dom.UUID].xml, nil
}

func (c *fakeConn) DomainGetInfo(libvirt.Domain) (uint8, uint64, uint64, uint16, uint64, error) {
	return 1, 65536, 65536, 1, 0, nil
}

// LifecycleEvents forwards the connection's events as go-libvirt does: a
// goroutine that sends each event with a plain send, looking at ctx (and
// the connection) only while it waits for the next, and closes the channel
// when it ends.
func (c *fakeConn) LifecycleEvents(ctx context.Context) (<-chan libvirt.DomainEventLifecycleMsg, error) {
	out := make(chan libvirt.DomainEventLifecycleMsg)
	c.lv.forwarders.Add(1)
	go func() {
		defer c.lv.forwarders.Add(-1)
		defer close(out)
		for {
			select {
			case ev := <-c.events:
				out <- ev
			case <-ctx.Done():
				return
			case <-c.gone:
				return
			}
		}
	}()
	return out, nil
}

func (c *fakeConn) Disconnected() <-chan struct{} { return c.gone }
func (c *fakeConn) Disconnect() error {
	c.once.Do(func() { close(c.gone) })
	return nil
}

// record is what the fake registry and launcher saw, in order.
type record struct {
	mu     sync.Mutex
	lines  []string
	models map[string]*fakeModel
}

func (r *record) add(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, fmt.Sprintf(format, args...))
}

func (r *record) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.lines, "\n")
}

func (r *record) Register(_ context.Context, domid uint32, v vgpumeta.VGPU) error {
	r.add("register %d %s %s", domid, v.Mode, v.Profile)
	return nil
}

func (r *record) Forget(_ context.Context, domid uint32) error {
	r.add("forget %d", domid)
	return nil
}

func (r *record) Launch(_ context.Context, d Domain) (Model, error) {
	r.add("launch %s %d", d.Name, d.ID)
	m := &fakeModel{r: r, name: d.Name, done: make(chan struct{})}
	r.mu.Lock()
	r.models[d.Name] = m
	r.mu.Unlock()
	return m, nil
}

type fakeModel struct {
	r    *record
	name string
	done chan struct{}
	once sync.Once
	err  error
}

func (m *fakeModel) Stop(context.Context) error {
	m.once.Do(func() { m.r.add("stop %s", m.name); close(m.done) })
	return nil
}
func (m *fakeModel) Done() <-chan struct{} { return m.done }
func (m *fakeModel) Err() error            { return m.err }
func (m *fakeModel) PID() int              { return 0 }

// end makes the model end by itself.
func (m *fakeModel) end(err error) {
	m.err = err
	m.once.Do(func() { m.r.add("ended %s", m.name); close(m.done) })
}

const meta = `<gpuvm:vgpu xmlns:gpuvm="` + vgpumeta.Namespace + `" mode="pv-multicall" profile="vgpu-64m"/>`

func TestWatcher(t *testing.T) {
	lv := &fakeLibvirt{domains: map[libvirt.UUID]*fakeDomain{}}
	rec := &record{models: map[string]*fakeModel{}}
	var logs strings.Builder
	var logMu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		logMu.Lock()
		defer logMu.Unlock()
		return logs.Write(p)
	}), nil))
	w, err := New(Config{Dial: lv.dial, Registry: rec, Launcher: rec, Logger: log, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	lv.refuse = errors.New("connection refused") // libvirtd not up yet: waited for
	go func() { done <- w.Run(ctx) }()
	time.Sleep(20 * time.Millisecond)
	lv.mu.Lock()
	lv.refuse = nil
	lv.mu.Unlock()

	expect := func(want ...string) {
		t.Helper()
		joined := strings.Join(want, "\n")
		for end := time.Now().Add(10 * time.Second); rec.String() != joined; time.Sleep(time.Millisecond) {
			if time.Now().After(end) {
				logMu.Lock()
				t.Fatalf("saw:\n%s\nwant:\n%s\nlog:\n%s", rec, joined, logs.String())
			}
		}
	}
	for func() bool { lv.mu.Lock(); defer lv.mu.Unlock(); return lv.conn == nil }() {
		time.Sleep(time.Millisecond)
	}
	a := lv.start("a", meta)
	lv.start("plain", "")
	lv.start("bad", `<gpuvm:vgpu xmlns:gpuvm="`+vgpumeta.Namespace+`" vram="lots"/>`)
	expect("register 1 pv-multicall vgpu-64m", "launch a 1")
	lv.stop(a, libvirt.DomainEventCrashed)
	expect("register 1 pv-multicall vgpu-64m", "launch a 1", "stop a", "forget 1")

	// A device model that ends by itself is not launched again while its
	// domain runs; started again (a new domain id), the domain gets one.
	b := lv.start("b", meta)
	expect("register 1 pv-multicall vgpu-64m", "launch a 1", "stop a", "forget 1", "register 4 pv-multicall vgpu-64m", "launch b 4")
	rec.mu.Lock()
	mb := rec.models["b"]
	rec.mu.Unlock()
	mb.end(errors.New("vGPU destroyed"))
	expect("register 1 pv-multicall vgpu-64m", "launch a 1", "stop a", "forget 1", "register 4 pv-multicall vgpu-64m", "launch b 4", "ended b", "forget 4")
	lv.mu.Lock()
	lv.conn.events <- libvirt.DomainEventLifecycleMsg{Dom: b, Event: int32(libvirt.DomainEventResumed)}
	lv.mu.Unlock()
	lv.stop(b, libvirt.DomainEventStopped)
	lv.start("c", meta)
	base := []string{"register 1 pv-multicall vgpu-64m", "launch a 1", "stop a", "forget 1", "register 4 pv-multicall vgpu-64m", "launch b 4", "ended b", "forget 4",
		"register 5 pv-multicall vgpu-64m", "launch c 5"}
	expect(base...)

	// libvirtd restarts with nothing running: c's vGPU goes; a domain
	// started after the reconnection gets one.
	lv.restart()
	base = append(base, "stop c", "forget 5")
	expect(base...)
	for func() bool { lv.mu.Lock(); defer lv.mu.Unlock(); return lv.conn.gone == nil || isClosed(lv.conn.gone) }() {
		time.Sleep(time.Millisecond)
	}
	d := lv.start("d", meta)
	base = append(base, "register 6 pv-multicall vgpu-64m", "launch d 6")
	expect(base...)

	// Undefined while it runs, d runs on (transient) and keeps its vGPU
	// (e, started next, shows the event was handled); undefined once
	// stopped, e is gone: its vGPU goes.
	lv.undefine(d)
	e := lv.start("e", meta)
	base = append(base, "register 7 pv-multicall vgpu-64m", "launch e 7")
	expect(base...)
	lv.mu.Lock()
	lv.domains[e.UUID].running = false
	lv.mu.Unlock()
	lv.undefine(e)
	base = append(base, "stop e", "forget 7")
	expect(base...)

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	expect(append(base, "stop d", "forget 6")...)
	logMu.Lock()
	defer logMu.Unlock()
	for _, want := range []string{`domain left without a vGPU" domain=bad`, `attribute vram: invalid size \"lots\"`, "connection lost; reconnecting", "cannot connect; retrying"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
}

// TestWatcherRefused: a libvirtd that answers the first connection with an
// error of its own (no driver for the URI) ends Run with that error.
func TestWatcherRefused(t *testing.T) {
	refusal := libvirt.Error{Code: uint32(libvirt.ErrNoConnect), Message: "no connection driver available for xen:///system"}
	rec := &record{models: map[string]*fakeModel{}}
	w, err := New(Config{Dial: func(context.Context) (Conn, error) { return nil, fmt.Errorf("libvirt: %w", refusal) }, Registry: rec, Launcher: rec})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(context.Background()); !errors.Is(err, refusal) {
		t.Errorf("Run: %v, want the refusal", err)
	}
}

// TestWatcherReleasesEventStream: a connection given up with an event in
// flight (here: the reconciliation fails) leaves no event goroutine, and
// so no client, behind.
func TestWatcherReleasesEventStream(t *testing.T) {
	lv := &fakeLibvirt{domains: map[libvirt.UUID]*fakeDomain{}, failLists: 3}
	rec := &record{models: map[string]*fakeModel{}}
	w, err := New(Config{Dial: lv.dial, Registry: rec, Launcher: rec, MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	for end := time.Now().Add(10 * time.Second); func() bool { lv.mu.Lock(); defer lv.mu.Unlock(); return lv.dials < 4 }(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the Watcher did not reconnect after failed reconciliations")
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	for end := time.Now().Add(5 * time.Second); lv.forwarders.Load() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%d event goroutines of given-up connections still run", lv.forwarders.Load())
		}
	}
}

// TestWatcherHung: stopped while libvirtd does not answer a call, Run
// disconnects, which fails the call, and stops the device models.
func TestWatcherHung(t *testing.T) {
	lv := &fakeLibvirt{domains: map[libvirt.UUID]*fakeDomain{}}
	rec := &record{models: map[string]*fakeModel{}}
	w, err := New(Config{Dial: lv.dial, Registry: rec, Launcher: rec})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	for func() bool { lv.mu.Lock(); defer lv.mu.Unlock(); return lv.conn == nil }() {
		time.Sleep(time.Millisecond)
	}
	a := lv.start("a", meta)
	expectRecord(t, rec, "register 1 pv-multicall vgpu-64m", "launch a 1")
	lv.mu.Lock()
	lv.hung = true
	lv.mu.Unlock()
	lv.conn.events <- libvirt.DomainEventLifecycleMsg{Dom: a, Event: int32(libvirt.DomainEventResumed)}
	time.Sleep(50 * time.Millisecond) // the lookup waiting
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run still runs after its context ended, waiting for libvirtd")
	}
	expectRecord(t, rec, "register 1 pv-multicall vgpu-64m", "launch a 1", "stop a", "forget 1")
}

// TestWatcherStaleStop: the Stopped event of an earlier run of a domain
// (queued before a reconnection, say) leaves the vGPU of its current run
// alone.
func TestWatcherStaleStop(t *testing.T) {
	lv := &fakeLibvirt{domains: map[libvirt.UUID]*fakeDomain{}}
	rec := &record{models: map[string]*fakeModel{}}
	w, err := New(Config{Dial: lv.dial, Registry: rec, Launcher: rec})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	for func() bool { lv.mu.Lock(); defer lv.mu.Unlock(); return lv.conn == nil }() {
		time.Sleep(time.Millisecond)
	}
	run1 := lv.start("a", meta)
	expectRecord(t, rec, "register 1 pv-multicall vgpu-64m", "launch a 1")
	// a stops and starts again; its Started event is seen before the
	// Stopped event of its first run.
	lv.mu.Lock()
	lv.domains[run1.UUID].running = false
	lv.mu.Unlock()
	lv.start("a", meta)
	lv.conn.events <- libvirt.DomainEventLifecycleMsg{Dom: run1, Event: int32(libvirt.DomainEventStopped)}
	lv.start("b", meta) // handled after the stale event
	expectRecord(t, rec, "register 1 pv-multicall vgpu-64m", "launch a 1", "stop a", "forget 1", "register 2 pv-multicall vgpu-64m", "launch a 2",
		"register 3 pv-multicall vgpu-64m", "launch b 3")
}

// expectRecord waits for rec to be want.
func expectRecord(t *testing.T, rec *record, want ...string) {
	t.Helper()
	joined := strings.Join(want, "\n")
	for end := time.Now().Add(10 * time.Second); rec.String() != joined; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("saw:\n%s\nwant:\n%s", rec, joined)
		}
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// TestValidNameBounded: a domain name too long for a vGPU is quoted only
// in part.
func TestValidNameBounded(t *testing.T) {
	for _, name := range []string{strings.Repeat("n", 1<<16), strings.Repeat("/", 1<<16)} {
		if err := validName(name); err == nil || len(err.Error()) > 200 {
			t.Errorf("a name of %d bytes: %.300v", len(name), err)
		}
	}
	if err := validName("a/b"); err == nil || !strings.Contains(err.Error(), `"a/b"`) {
		t.Errorf("a/b: %v", err)
	}
}
