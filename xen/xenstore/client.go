// Package xenstore is a client of xenstore, Xen's configuration store: a
// tree of small string values that the domains share, where the ends of a
// split driver find each other. Client speaks the wire protocol of Xen's
// io/xs_wire.h over one connection (dom0's daemon socket, or the kernel's
// /dev/xen/xenbus in any domain): reads and writes, directories,
// permissions, transactions that retry a conflicting commit, and watches.
//
// Nothing the peer sends is trusted: a malformed message ends the
// connection with an error wrapping ErrProtocol, and a refused request
// returns an *Error that errors.Is matches against its errno. The wire
// codec (Msg, ReadMsg) is exported for the other end of the protocol; the
// in-process daemon that tests use is package xenstoretest.
package xenstore

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
	SocketPath = "/run/xenstored/socket"
	DevPath    = "/dev/xen/xenbus"
)

// Client tuning.
const (
	// watchBuffer is how many watch events wait for a slow consumer
	// before more are dropped (see Watch.Events).
	watchBuffer = 16
	// transactionRetries bounds the restarts of a transaction the
	// daemon ended with EAGAIN (a conflicting commit).
	transactionRetries = 16
	// endTimeout bounds ending a transaction whose context is done.
	endTimeout = 5 * time.Second
)

// Client is a xenstore client over one connection (the daemon's Unix
// socket or /dev/xen/xenbus). Requests may be issued concurrently; each
// carries its own request id, and one reader goroutine hands each reply to
// its request and each watch event to its watch. Safe for concurrent use.
type Client struct {
	w      io.Writer
	closer io.Closer
	wmu    sync.Mutex // one message written at a time

	mu      sync.Mutex
	nextReq uint32
	nextTok uint64
	pending map[uint32]chan Msg
	watches map[string]*Watch // by token
	err     error             // why the connection ended, once it has
	done    chan struct{}     // closed when it ended
}

// ErrClosed is returned for requests after Close.
var ErrClosed = errors.New("xenstore connection closed")

// NewClient runs the protocol over rw (closed by Close if it is an
// io.Closer; if it is not, the reader goroutine ends only when a read
// fails).
func NewClient(rw io.ReadWriter) *Client {
	c := &Client{
		w:       rw,
		pending: make(map[uint32]chan Msg),
		watches: make(map[string]*Watch),
		done:    make(chan struct{}),
	}
	if cl, ok := rw.(io.Closer); ok {
		c.closer = cl
	}
	go c.readLoop(bufio.NewReaderSize(rw, headerSize+PayloadMax))
	return c
}

// Open connects to xenstore: to the daemon's socket if there is one
// (dom0), otherwise through the kernel's /dev/xen/xenbus.
func Open() (*Client, error) {
	conn, sockErr := net.Dial("unix", SocketPath)
	if sockErr == nil {
		return NewClient(conn), nil
	}
	f, devErr := os.OpenFile(DevPath, os.O_RDWR, 0)
	if devErr != nil {
		return nil, fmt.Errorf("xenstore: no xenstore here (is this a Xen domain?): %w; %w", sockErr, devErr)
	}
	return NewClient(f), nil
}

// Close ends the connection: pending requests fail and watch channels are
// closed.
func (c *Client) Close() error {
	c.shutdown(ErrClosed)
	if c.closer != nil {
		return c.closer.Close()
	}
	return nil
}

// Err returns why the connection ended, or nil while it is up.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// shutdown ends the client once, with err.
func (c *Client) shutdown(err error) {
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
func (c *Client) readLoop(r io.Reader) {
	for {
		m, err := ReadMsg(r)
		if err != nil {
			c.shutdown(fmt.Errorf("xenstore connection: %w", err))
			return
		}
		if m.Type == MsgWatchEvent {
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
func (c *Client) deliverWatch(p []byte) {
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
// returned as *Error; a reply of another type than the request's
// is a protocol error.
func (c *Client) request(ctx context.Context, typ MsgType, tx uint32, path string, payload []byte) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("xenstore %v %s: %w", typ, path, err)
	}
	m := Msg{Type: typ, TxID: tx, Payload: payload}
	ch := make(chan Msg, 1)
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

	b, err := m.Marshal()
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
		if r.Type == MsgError {
			name, err := parseError(r.Payload)
			if err != nil {
				return nil, fmt.Errorf("xenstore %v %s: %w", typ, path, err)
			}
			return nil, &Error{Op: typ.String(), Path: path, Errno: name}
		}
		if r.Type != typ {
			return nil, fmt.Errorf("xenstore %v %s: %w: answered with %v", typ, path, ErrProtocol, r.Type)
		}
		return r.Payload, nil
	case <-ctx.Done():
		c.forget(m.ReqID)
		return nil, fmt.Errorf("xenstore %v %s: %w", typ, path, ctx.Err())
	case <-c.done:
		return nil, fmt.Errorf("xenstore %v %s: %w", typ, path, c.err)
	}
}

func (c *Client) forget(id uint32) {
	c.mu.Lock()
	delete(c.pending, id)
	c.mu.Unlock()
}

// expectOK checks the "OK" reply of a request that returns nothing.
func expectOK(typ MsgType, path string, p []byte, err error) error {
	if err != nil {
		return err
	}
	if s := string(p); s != "OK\x00" && s != "OK" {
		return fmt.Errorf("xenstore %v %s: %w: reply %q, want OK", typ, path, ErrProtocol, s)
	}
	return nil
}

// Tx reads and writes the store inside one transaction, or outside
// any (its zero id: how the Client methods use it).
type Tx struct {
	c  *Client
	id uint32
}

// Read returns the value of path.
func (t Tx) Read(ctx context.Context, path string) (string, error) {
	if err := checkPath(path); err != nil {
		return "", err
	}
	p, err := t.c.request(ctx, MsgRead, t.id, path, append([]byte(path), 0))
	return string(p), err
}

// Write sets the value of path, creating it (and its parents) if needed.
func (t Tx) Write(ctx context.Context, path, value string) error {
	if err := checkPath(path); err != nil {
		return err
	}
	p, err := t.c.request(ctx, MsgWrite, t.id, path, append(append([]byte(path), 0), value...))
	return expectOK(MsgWrite, path, p, err)
}

// Mkdir creates path (with an empty value) if it does not exist.
func (t Tx) Mkdir(ctx context.Context, path string) error {
	return t.pathOnly(ctx, MsgMkdir, path)
}

// Rm removes path and everything under it.
func (t Tx) Rm(ctx context.Context, path string) error {
	return t.pathOnly(ctx, MsgRm, path)
}

func (t Tx) pathOnly(ctx context.Context, typ MsgType, path string) error {
	if err := checkPath(path); err != nil {
		return err
	}
	p, err := t.c.request(ctx, typ, t.id, path, append([]byte(path), 0))
	return expectOK(typ, path, p, err)
}

// Directory lists the names of path's children.
func (t Tx) Directory(ctx context.Context, path string) ([]string, error) {
	if err := checkPath(path); err != nil {
		return nil, err
	}
	p, err := t.c.request(ctx, MsgDirectory, t.id, path, append([]byte(path), 0))
	if err != nil {
		return nil, err
	}
	names, err := splitStrings(p)
	if err != nil {
		return nil, fmt.Errorf("xenstore XS_DIRECTORY %s: %w", path, err)
	}
	if len(names) == 1 && names[0] == "" {
		return nil, nil
	}
	for _, n := range names {
		if n == "" || strings.IndexByte(n, '/') >= 0 {
			return nil, fmt.Errorf("xenstore XS_DIRECTORY %s: %w: child name %q", path, ErrProtocol, n)
		}
	}
	return names, nil
}

// SetPerms replaces path's permission list.
func (t Tx) SetPerms(ctx context.Context, path string, perms ...Perm) error {
	if err := checkPath(path); err != nil {
		return err
	}
	b, err := setPermsPayload(path, perms)
	if err != nil {
		return err
	}
	p, err := t.c.request(ctx, MsgSetPerms, t.id, path, b)
	return expectOK(MsgSetPerms, path, p, err)
}

func (c *Client) root() Tx { return Tx{c: c} }

// Read returns the value of path.
func (c *Client) Read(ctx context.Context, path string) (string, error) {
	return c.root().Read(ctx, path)
}

// Write sets the value of path, creating it (and its parents) if needed.
func (c *Client) Write(ctx context.Context, path, value string) error {
	return c.root().Write(ctx, path, value)
}

// Mkdir creates path if it does not exist.
func (c *Client) Mkdir(ctx context.Context, path string) error {
	return c.root().Mkdir(ctx, path)
}

// Rm removes path and everything under it.
func (c *Client) Rm(ctx context.Context, path string) error { return c.root().Rm(ctx, path) }

// Directory lists the names of path's children.
func (c *Client) Directory(ctx context.Context, path string) ([]string, error) {
	return c.root().Directory(ctx, path)
}

// SetPerms replaces path's permission list.
func (c *Client) SetPerms(ctx context.Context, path string, perms ...Perm) error {
	return c.root().SetPerms(ctx, path, perms...)
}

// GetDomainPath returns a domain's home path (/local/domain/<domid>).
func (c *Client) GetDomainPath(ctx context.Context, domid uint16) (string, error) {
	arg := fmt.Sprintf("%d", domid)
	p, err := c.request(ctx, MsgGetDomainPath, 0, arg, append([]byte(arg), 0))
	if err != nil {
		return "", err
	}
	s, err := oneString(p)
	if err == nil && !strings.HasPrefix(s, "/") {
		err = fmt.Errorf("%w: domain path %q is not absolute", ErrProtocol, s)
	}
	if err == nil {
		err = checkPath(s)
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
func (c *Client) Transaction(ctx context.Context, fn func(tx Tx) error) error {
	for attempt := 1; ; attempt++ {
		p, err := c.request(ctx, MsgTransactionStart, 0, "", []byte{0})
		if err != nil {
			return err
		}
		s, err := oneString(p)
		var id uint64
		if err == nil {
			id, err = ParseUint(s, 1<<32-1)
		}
		if err == nil && id == 0 {
			err = errors.New("transaction id 0")
		}
		if err != nil {
			return fmt.Errorf("xenstore XS_TRANSACTION_START: %w: %w", ErrProtocol, err)
		}
		tx := Tx{c: c, id: uint32(id)}
		ferr := fn(tx)
		if ferr == nil && ctx.Err() != nil {
			ferr = fmt.Errorf("xenstore transaction: %w", ctx.Err())
		}
		if ferr != nil {
			// Abandon it even past ctx, or the daemon keeps it open.
			endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
			_, _ = c.request(endCtx, MsgTransactionEnd, tx.id, "", []byte("F\x00"))
			cancel()
			return ferr // an abandoned transaction's end error changes nothing
		}
		p, err = c.request(ctx, MsgTransactionEnd, tx.id, "", []byte("T\x00"))
		err = expectOK(MsgTransactionEnd, "", p, err)
		if errors.Is(err, unix.EAGAIN) && attempt < transactionRetries {
			continue
		}
		return err
	}
}

// Watch is a registered watch on a path and everything under it.
type Watch struct {
	c     *Client
	path  string
	token string
	ch    chan string
}

// Watch registers a watch on path. The daemon sends one event at once, and
// one for each later change to path or below it.
func (c *Client) Watch(ctx context.Context, path string) (*Watch, error) {
	if err := checkPath(path); err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return nil, fmt.Errorf("xenstore XS_WATCH %s: %w", path, c.err)
	}
	c.nextTok++
	w := &Watch{c: c, path: path, token: fmt.Sprintf("gpuvm-%d", c.nextTok), ch: make(chan string, watchBuffer)}
	c.watches[w.token] = w // before the request: the first event may precede its reply
	c.mu.Unlock()
	payload := append(append(append([]byte(path), 0), w.token...), 0)
	p, err := c.request(ctx, MsgWatch, 0, path, payload)
	if err = expectOK(MsgWatch, path, p, err); err != nil {
		c.dropWatch(w)
		return nil, err
	}
	return w, nil
}

// Events returns the watch's events: the path that changed. The channel
// is closed when the watch is stopped or the connection ends (see Err).
// Events beyond a small buffer are dropped while the consumer lags, so a
// consumer re-reads what it watches on every event rather than count them.
func (w *Watch) Events() <-chan string { return w.ch }

// Stop removes the watch.
func (w *Watch) Stop(ctx context.Context) error {
	if !w.c.dropWatch(w) {
		return nil
	}
	payload := append(append(append([]byte(w.path), 0), w.token...), 0)
	p, err := w.c.request(ctx, MsgUnwatch, 0, w.path, payload)
	return expectOK(MsgUnwatch, w.path, p, err)
}

// dropWatch unregisters w and closes its channel; it reports whether w
// was still registered.
func (c *Client) dropWatch(w *Watch) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.watches[w.token] != w {
		return false
	}
	delete(c.watches, w.token)
	close(w.ch)
	return true
}
