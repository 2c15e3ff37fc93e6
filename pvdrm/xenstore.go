package pvdrm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Where a xenstore connection is opened: dom0's daemon socket, or the
// kernel's xenbus device (in any domain).
const (
	XenstoredSocketPath = "/run/xenstored/socket"
	XenbusDevPath       = "/dev/xen/xenbus"
)

// Client tuning.
const (
	// xsWatchBuffer is how many watch events wait for a slow consumer
	// before more are dropped (see XenstoreWatch.Events).
	xsWatchBuffer = 16
	// xsTransactionRetries bounds the restarts of a transaction the
	// daemon ended with EAGAIN (a conflicting commit).
	xsTransactionRetries = 16
	// xsEndTimeout bounds ending a transaction whose context is done.
	xsEndTimeout = 5 * time.Second
)

// Xenstore is a xenstore client over one connection (the daemon's Unix
// socket or /dev/xen/xenbus). Requests may be issued concurrently; each
// carries its own request id, and one reader goroutine hands each reply to
// its request and each watch event to its watch. Safe for concurrent use.
type Xenstore struct {
	w      io.Writer
	closer io.Closer
	wmu    sync.Mutex // one message written at a time

	mu      sync.Mutex
	nextReq uint32
	nextTok uint64
	pending map[uint32]chan xsMsg
	watches map[string]*XenstoreWatch // by token
	err     error                     // why the connection ended, once it has
	done    chan struct{}             // closed when it ended
}

// ErrXenstoreClosed is returned for requests after Close.
var ErrXenstoreClosed = errors.New("xenstore connection closed")

// NewXenstore runs the protocol over rw (closed by Close if it is an
// io.Closer; if it is not, the reader goroutine ends only when a read
// fails).
func NewXenstore(rw io.ReadWriter) *Xenstore {
	c := &Xenstore{
		w:       rw,
		pending: make(map[uint32]chan xsMsg),
		watches: make(map[string]*XenstoreWatch),
		done:    make(chan struct{}),
	}
	if cl, ok := rw.(io.Closer); ok {
		c.closer = cl
	}
	go c.readLoop(bufio.NewReaderSize(rw, xsHeaderSize+XenstorePayloadMax))
	return c
}

// OpenXenstore connects to xenstore: to the daemon's socket if there is one
// (dom0), otherwise through the kernel's /dev/xen/xenbus.
func OpenXenstore() (*Xenstore, error) {
	conn, sockErr := net.Dial("unix", XenstoredSocketPath)
	if sockErr == nil {
		return NewXenstore(conn), nil
	}
	f, devErr := os.OpenFile(XenbusDevPath, os.O_RDWR, 0)
	if devErr != nil {
		return nil, fmt.Errorf("xenstore: no xenstore here (is this a Xen domain?): %w; %w", sockErr, devErr)
	}
	return NewXenstore(f), nil
}

// Close ends the connection: pending requests fail and watch channels are
// closed.
func (c *Xenstore) Close() error {
	c.shutdown(ErrXenstoreClosed)
	if c.closer != nil {
		return c.closer.Close()
	}
	return nil
}

// Err returns why the connection ended, or nil while it is up.
func (c *Xenstore) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// shutdown ends the client once, with err.
func (c *Xenstore) shutdown(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return
	}
	c.err = err
	close(c.done)
	for tok, w := range c.watches {
		close(w.ch)
		delete(c.watches, tok)
	}
}

// readLoop demultiplexes what the daemon sends: watch events to their
// watches, replies to their requests by req_id. A malformed message ends
// the connection.
func (c *Xenstore) readLoop(r io.Reader) {
	for {
		m, err := readXsMsg(r)
		if err != nil {
			c.shutdown(fmt.Errorf("xenstore connection: %w", err))
			return
		}
		if m.Type == xsWatchEvent {
			c.deliverWatch(m.Payload)
			continue
		}
		c.mu.Lock()
		ch, ok := c.pending[m.ReqID]
		delete(c.pending, m.ReqID)
		c.mu.Unlock()
		if ok {
			ch <- m // buffered: never blocks
		} // else a reply to a request abandoned by its context
	}
}

// deliverWatch hands a watch event to its watch without blocking the
// reader: a full channel drops the event (the consumer has undelivered
// events and will re-read). Malformed events and unknown tokens are dropped.
func (c *Xenstore) deliverWatch(p []byte) {
	path, tok, err := parseWatchEvent(p)
	if err != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if w := c.watches[tok]; w != nil {
		select {
		case w.ch <- path:
		default:
		}
	}
}

// request sends one message and waits for its reply. An XS_ERROR reply is
// returned as *XenstoreError; a reply of another type than the request's
// is a protocol error.
func (c *Xenstore) request(ctx context.Context, typ xsType, tx uint32, path string, payload []byte) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("xenstore %v %s: %w", typ, path, err)
	}
	m := xsMsg{Type: typ, TxID: tx, Payload: payload}
	ch := make(chan xsMsg, 1)
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return nil, fmt.Errorf("xenstore %v %s: %w", typ, path, c.err)
	}
	for {
		c.nextReq++
		if _, busy := c.pending[c.nextReq]; !busy {
			break
		}
	}
	m.ReqID = c.nextReq
	c.pending[m.ReqID] = ch
	c.mu.Unlock()

	b, err := m.marshal()
	if err == nil {
		c.wmu.Lock()
		_, err = c.w.Write(b)
		c.wmu.Unlock()
	}
	if err != nil {
		c.forget(m.ReqID)
		return nil, fmt.Errorf("xenstore %v %s: send: %w", typ, path, err)
	}
	select {
	case r := <-ch:
		if r.Type == xsError {
			name, err := parseXsError(r.Payload)
			if err != nil {
				return nil, fmt.Errorf("xenstore %v %s: %w", typ, path, err)
			}
			return nil, &XenstoreError{Op: typ.String(), Path: path, Errno: name}
		}
		if r.Type != typ {
			return nil, fmt.Errorf("xenstore %v %s: %w: answered with %v", typ, path, ErrXenstoreProtocol, r.Type)
		}
		return r.Payload, nil
	case <-ctx.Done():
		c.forget(m.ReqID)
		return nil, fmt.Errorf("xenstore %v %s: %w", typ, path, ctx.Err())
	case <-c.done:
		return nil, fmt.Errorf("xenstore %v %s: %w", typ, path, c.err)
	}
}

func (c *Xenstore) forget(id uint32) {
	c.mu.Lock()
	delete(c.pending, id)
	c.mu.Unlock()
}

// expectOK checks the "OK" reply of a request that returns nothing.
func expectOK(typ xsType, path string, p []byte, err error) error {
	if err != nil {
		return err
	}
	if s := string(p); s != "OK\x00" && s != "OK" {
		return fmt.Errorf("xenstore %v %s: %w: reply %q, want OK", typ, path, ErrXenstoreProtocol, s)
	}
	return nil
}

// XenstoreTx reads and writes the store inside one transaction, or outside
// any (its zero id: how the Xenstore methods use it).
type XenstoreTx struct {
	c  *Xenstore
	id uint32
}

// Read returns the value of path.
func (t XenstoreTx) Read(ctx context.Context, path string) (string, error) {
	if err := checkXsPath(path); err != nil {
		return "", err
	}
	p, err := t.c.request(ctx, xsRead, t.id, path, append([]byte(path), 0))
	return string(p), err
}

// Write sets the value of path, creating it (and its parents) if needed.
func (t XenstoreTx) Write(ctx context.Context, path, value string) error {
	if err := checkXsPath(path); err != nil {
		return err
	}
	p, err := t.c.request(ctx, xsWrite, t.id, path, append(append([]byte(path), 0), value...))
	return expectOK(xsWrite, path, p, err)
}

// Mkdir creates path (with an empty value) if it does not exist.
func (t XenstoreTx) Mkdir(ctx context.Context, path string) error {
	return t.pathOnly(ctx, xsMkdir, path)
}

// Rm removes path and everything under it.
func (t XenstoreTx) Rm(ctx context.Context, path string) error {
	return t.pathOnly(ctx, xsRm, path)
}

func (t XenstoreTx) pathOnly(ctx context.Context, typ xsType, path string) error {
	if err := checkXsPath(path); err != nil {
		return err
	}
	p, err := t.c.request(ctx, typ, t.id, path, append([]byte(path), 0))
	return expectOK(typ, path, p, err)
}

// Directory lists the names of path's children.
func (t XenstoreTx) Directory(ctx context.Context, path string) ([]string, error) {
	if err := checkXsPath(path); err != nil {
		return nil, err
	}
	p, err := t.c.request(ctx, xsDirectory, t.id, path, append([]byte(path), 0))
	if err != nil {
		return nil, err
	}
	names, err := xsStrings(p)
	if err != nil {
		return nil, fmt.Errorf("xenstore XS_DIRECTORY %s: %w", path, err)
	}
	if len(names) == 1 && names[0] == "" {
		return nil, nil
	}
	for _, n := range names {
		if n == "" || strings.IndexByte(n, '/') >= 0 {
			return nil, fmt.Errorf("xenstore XS_DIRECTORY %s: %w: child name %q", path, ErrXenstoreProtocol, n)
		}
	}
	return names, nil
}

// SetPerms replaces path's permission list.
func (t XenstoreTx) SetPerms(ctx context.Context, path string, perms ...XenstorePerm) error {
	if err := checkXsPath(path); err != nil {
		return err
	}
	b, err := setPermsPayload(path, perms)
	if err != nil {
		return err
	}
	p, err := t.c.request(ctx, xsSetPerms, t.id, path, b)
	return expectOK(xsSetPerms, path, p, err)
}

func (c *Xenstore) root() XenstoreTx { return XenstoreTx{c: c} }

// Read returns the value of path.
func (c *Xenstore) Read(ctx context.Context, path string) (string, error) {
	return c.root().Read(ctx, path)
}

// Write sets the value of path, creating it (and its parents) if needed.
func (c *Xenstore) Write(ctx context.Context, path, value string) error {
	return c.root().Write(ctx, path, value)
}

// Mkdir creates path if it does not exist.
func (c *Xenstore) Mkdir(ctx context.Context, path string) error {
	return c.root().Mkdir(ctx, path)
}

// Rm removes path and everything under it.
func (c *Xenstore) Rm(ctx context.Context, path string) error { return c.root().Rm(ctx, path) }

// Directory lists the names of path's children.
func (c *Xenstore) Directory(ctx context.Context, path string) ([]string, error) {
	return c.root().Directory(ctx, path)
}

// SetPerms replaces path's permission list.
func (c *Xenstore) SetPerms(ctx context.Context, path string, perms ...XenstorePerm) error {
	return c.root().SetPerms(ctx, path, perms...)
}

// GetDomainPath returns a domain's home path (/local/domain/<domid>).
func (c *Xenstore) GetDomainPath(ctx context.Context, domid uint16) (string, error) {
	arg := fmt.Sprintf("%d", domid)
	p, err := c.request(ctx, xsGetDomainPath, 0, arg, append([]byte(arg), 0))
	if err != nil {
		return "", err
	}
	s, err := xsOneString(p)
	if err == nil && !strings.HasPrefix(s, "/") {
		err = fmt.Errorf("%w: domain path %q is not absolute", ErrXenstoreProtocol, s)
	}
	if err == nil {
		err = checkXsPath(s)
	}
	if err != nil {
		return "", fmt.Errorf("xenstore XS_GET_DOMAIN_PATH %d: %w", domid, err)
	}
	return s, nil
}

// Transaction runs fn in a transaction and commits it. If fn fails the
// transaction is abandoned and fn's error returned; if the daemon refuses
// the commit with EAGAIN (another commit touched the same nodes) fn runs
// again, up to a bound. fn must not keep tx.
func (c *Xenstore) Transaction(ctx context.Context, fn func(tx XenstoreTx) error) error {
	for attempt := 1; ; attempt++ {
		p, err := c.request(ctx, xsTransactionStart, 0, "", []byte{0})
		if err != nil {
			return err
		}
		s, err := xsOneString(p)
		var id uint64
		if err == nil {
			id, err = parseXsUint(s, 1<<32-1)
		}
		if err == nil && id == 0 {
			err = errors.New("transaction id 0")
		}
		if err != nil {
			return fmt.Errorf("xenstore XS_TRANSACTION_START: %w: %w", ErrXenstoreProtocol, err)
		}
		tx := XenstoreTx{c: c, id: uint32(id)}
		ferr := fn(tx)
		if ferr == nil && ctx.Err() != nil {
			ferr = fmt.Errorf("xenstore transaction: %w", ctx.Err())
		}
		if ferr != nil {
			// Abandon it even past ctx, or the daemon keeps it open.
			endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), xsEndTimeout)
			_, _ = c.request(endCtx, xsTransactionEnd, tx.id, "", []byte("F\x00"))
			cancel()
			return ferr // an abandoned transaction's end error changes nothing
		}
		p, err = c.request(ctx, xsTransactionEnd, tx.id, "", []byte("T\x00"))
		err = expectOK(xsTransactionEnd, "", p, err)
		if errors.Is(err, unix.EAGAIN) && attempt < xsTransactionRetries {
			continue
		}
		return err
	}
}

// XenstoreWatch is a registered watch on a path and everything under it.
type XenstoreWatch struct {
	c     *Xenstore
	path  string
	token string
	ch    chan string
}

// Watch registers a watch on path. The daemon sends one event at once, and
// one for each later change to path or below it.
func (c *Xenstore) Watch(ctx context.Context, path string) (*XenstoreWatch, error) {
	if err := checkXsPath(path); err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return nil, fmt.Errorf("xenstore XS_WATCH %s: %w", path, c.err)
	}
	c.nextTok++
	w := &XenstoreWatch{c: c, path: path, token: fmt.Sprintf("pvdrm-%d", c.nextTok), ch: make(chan string, xsWatchBuffer)}
	c.watches[w.token] = w // before the request: the first event may precede its reply
	c.mu.Unlock()
	payload := append(append(append([]byte(path), 0), w.token...), 0)
	p, err := c.request(ctx, xsWatch, 0, path, payload)
	if err = expectOK(xsWatch, path, p, err); err != nil {
		c.dropWatch(w)
		return nil, err
	}
	return w, nil
}

// Events returns the watch's events: the path that changed. The channel
// is closed when the watch is stopped or the connection ends (see Err).
// Events beyond a small buffer are dropped while the consumer lags, so a
// consumer re-reads what it watches on every event rather than count them.
func (w *XenstoreWatch) Events() <-chan string { return w.ch }

// Stop removes the watch.
func (w *XenstoreWatch) Stop(ctx context.Context) error {
	if !w.c.dropWatch(w) {
		return nil
	}
	payload := append(append(append([]byte(w.path), 0), w.token...), 0)
	p, err := w.c.request(ctx, xsUnwatch, 0, w.path, payload)
	return expectOK(xsUnwatch, w.path, p, err)
}

// dropWatch unregisters w and closes its channel; it reports whether w
// was still registered.
func (c *Xenstore) dropWatch(w *XenstoreWatch) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.watches[w.token] != w {
		return false
	}
	delete(c.watches, w.token)
	close(w.ch)
	return true
}
