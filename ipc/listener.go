// The listener: the device-model socket, its accept loop and the queue of
// connections whose Hello passed validation.

package ipc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// ListenOptions tune a Listener. The zero value (or nil) gives the defaults.
type ListenOptions struct {
	// Logger receives handshake failures and connection ends; nil discards.
	Logger *slog.Logger
	// HandshakeTimeout bounds how long a new connection may take to send its
	// Hello (default 5s).
	HandshakeTimeout time.Duration
	// MaxHandshakes bounds the connections that are in the handshake or
	// waiting in Accept's queue (default 16). Further connections wait in
	// the kernel's listen backlog.
	MaxHandshakes int
	// RequestEntries and ResponseEntries size the shared-memory rings
	// (powers of two in MinRingEntries..MaxRingEntries; defaults 256 and 16).
	RequestEntries, ResponseEntries uint32
	// Spin is how many times the server polls an empty request ring (or a
	// full response ring) before it sleeps on its futex (default
	// DefaultSpin; negative means never spin).
	Spin int
	// OnHandshakeError, if set, is called (from a handshake goroutine) with
	// the reason each failed handshake was refused.
	OnHandshakeError func(error)
}

// Listener accepts device-model connections on a Unix SOCK_SEQPACKET socket.
type Listener struct {
	ln     *net.UnixListener
	path   string
	file   os.FileInfo // the socket file it created (Close removes only that)
	rmOnce sync.Once
	rmErr  error
	opts   ListenOptions
	log    *slog.Logger

	ready chan *Pending
	sem   chan struct{}
	done  chan struct{}
	wg    sync.WaitGroup

	mu       sync.Mutex
	inflight map[*net.UnixConn]struct{}
	err      error // why the accept loop stopped
	closed   bool
	// paused: the socket is handed off (handoff.go) and not resumed.
	paused bool
}

// Listen creates the socket at path and starts accepting connections; Accept
// returns them after their Hello was validated.
//
// The socket is created in a fresh private directory next to path, made mode
// 0600 (only the aggregator's user may connect: the socket hands out access to
// the GPU), and then linked to path, so it never exists with a wider mode and
// never replaces a socket another server created meanwhile. A stale socket at
// path (one nobody listens on) is removed; a live one, one that cannot be told
// stale, or any other kind of file, is an error. Close removes the socket if
// it is still this listener's.
func Listen(path string, opts *ListenOptions) (*Listener, error) {
	if _, err := listenOptions(opts); err != nil {
		return nil, fmt.Errorf("ipc: listen %s: %w", path, err)
	}
	ln, fi, err := listenUnix("unixpacket", path)
	if err != nil {
		return nil, err
	}
	return newListener(ln, path, fi, opts)
}

// listenOptions fills in opts' defaults and checks them.
func listenOptions(opts *ListenOptions) (ListenOptions, error) {
	var o ListenOptions
	if opts != nil {
		o = *opts
	}
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = 5 * time.Second
	}
	if o.MaxHandshakes <= 0 {
		o.MaxHandshakes = 16
	}
	if o.RequestEntries == 0 {
		o.RequestEntries = 256
	}
	if o.ResponseEntries == 0 {
		o.ResponseEntries = 16
	}
	if o.Spin == 0 {
		o.Spin = DefaultSpin
	} else if o.Spin < 0 {
		o.Spin = 0
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	_, err := newRingLayout(o.RequestEntries, o.ResponseEntries)
	return o, err
}

// newListener serves ln, bound at path (its file fi), and starts its
// accept loop. On error it closes ln.
func newListener(ln *net.UnixListener, path string, fi os.FileInfo, opts *ListenOptions) (*Listener, error) {
	o, err := listenOptions(opts)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("ipc: listen %s: %w", path, err)
	}
	l := &Listener{
		ln: ln, path: path, file: fi, opts: o, log: o.Logger,
		ready:    make(chan *Pending),
		sem:      make(chan struct{}, o.MaxHandshakes),
		done:     make(chan struct{}),
		inflight: make(map[*net.UnixConn]struct{}),
	}
	l.wg.Add(1)
	go l.acceptLoop(ln)
	return l, nil
}

// listenUnix creates a Unix socket of network ("unixpacket" or "unix") at
// path, as Listen documents: made in a fresh private directory next to
// path, mode 0600, then linked to path, which fails if anything appeared
// there meanwhile (two servers starting at once cannot replace each
// other's socket). A stale socket at path is removed first; a live one,
// one it cannot tell is stale, or any other kind of file is an error. It
// returns the listener and the socket file's identity, for removeOwn.
func listenUnix(network, path string) (*net.UnixListener, os.FileInfo, error) {
	if err := removeStale(network, path); err != nil {
		return nil, nil, err
	}
	dir, err := os.MkdirTemp(filepath.Dir(path), ".gpuvm-sock-")
	if err != nil {
		return nil, nil, fmt.Errorf("ipc: listen %s: %w", path, err)
	}
	defer os.RemoveAll(dir)
	tmp := filepath.Join(dir, "s")
	ln, err := net.ListenUnix(network, &net.UnixAddr{Name: tmp, Net: network})
	if err != nil {
		return nil, nil, fmt.Errorf("ipc: listen %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(false)
	fail := func(err error) (*net.UnixListener, os.FileInfo, error) {
		ln.Close()
		return nil, nil, fmt.Errorf("ipc: listen %s: %w", path, err)
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		return fail(fmt.Errorf("chmod: %w", err))
	}
	if err := os.Link(tmp, path); errors.Is(err, os.ErrExist) {
		return fail(errors.New("another server created a socket there meanwhile"))
	} else if err != nil {
		// A file system without hard links: replace instead (the stale
		// check above is then the only guard).
		if err := os.Rename(tmp, path); err != nil {
			return fail(err)
		}
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return fail(err)
	}
	return ln, fi, nil
}

// removeStale removes a socket at path that nobody listens on (a dial
// is refused). A live socket, a socket it cannot tell is stale (a dial of
// network fails otherwise, e.g. a socket of another type: the device
// socket of another daemon given as this one's control socket), and any
// other kind of file are left alone and reported.
func removeStale(network, path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("ipc: listen %s: %w", path, err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("ipc: listen %s: exists and is not a socket", path)
	}
	c, err := net.DialTimeout(network, path, time.Second)
	switch {
	case err == nil:
		c.Close()
		return fmt.Errorf("ipc: listen %s: another server is listening there", path)
	case !errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("ipc: listen %s: a socket is there and it cannot be told stale (%v); remove it if no server uses it", path, err)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("ipc: listen %s: remove stale socket: %w", path, err)
	}
	return nil
}

// removeOwn removes the socket at path if it is still the one fi describes
// (a server never removes a socket it does not own). Call it while the
// listener is open: that keeps the inode from being reused.
func removeOwn(path string, fi os.FileInfo) error {
	cur, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi != nil && !os.SameFile(cur, fi) {
		return nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// ListenStream creates a Unix stream socket at path with the same care as
// Listen takes with the device-model socket (mode 0600 from the start, a
// live socket at path refused, a stale one replaced, creation exclusive),
// for the aggregator's control API. Closing the listener removes the
// socket if it is still its own.
func ListenStream(path string) (net.Listener, error) {
	ln, fi, err := listenUnix("unix", path)
	if err != nil {
		return nil, err
	}
	return &streamListener{UnixListener: ln, path: path, file: fi}, nil
}

type streamListener struct {
	*net.UnixListener
	path string
	file os.FileInfo
	once sync.Once
	err  error
}

// Close removes the socket (if still its own) and stops listening: in that
// order, because the open listener pins the socket's inode, so the identity
// check cannot be fooled by a new socket that reuses the inode number.
func (l *streamListener) Close() error {
	l.once.Do(func() { l.err = removeOwn(l.path, l.file) })
	return errors.Join(l.err, l.UnixListener.Close())
}

// Addr returns the socket path.
func (l *Listener) Addr() string { return l.path }

// acceptLoop accepts on ln until the listener closes or hands ln off
// (handoff.go).
func (l *Listener) acceptLoop(ln *net.UnixListener) {
	defer l.wg.Done()
	for {
		select {
		case l.sem <- struct{}{}:
		case <-l.done:
			return
		}
		c, err := ln.AcceptUnix()
		if err != nil {
			<-l.sem
			select {
			case <-l.done:
				return
			default:
			}
			if l.handedOff(ln) {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.ECONNABORTED) {
				l.log.Warn("ipc: accept", "err", err)
				time.Sleep(50 * time.Millisecond)
				continue
			}
			l.mu.Lock()
			l.err = fmt.Errorf("ipc: accept on %s: %w", l.path, err)
			l.mu.Unlock()
			l.shutdown()
			return
		}
		l.mu.Lock()
		if l.closed || l.ln != ln || l.paused {
			l.mu.Unlock()
			c.Close()
			<-l.sem
			return
		}
		l.inflight[c] = struct{}{}
		l.mu.Unlock()
		l.wg.Add(1)
		go l.handshake(c)
	}
}

func (l *Listener) forget(c *net.UnixConn) {
	l.mu.Lock()
	delete(l.inflight, c)
	l.mu.Unlock()
}

// Accept waits for the next connection whose Hello passed validation: a
// supported version, every field in range, and a guest RAM fd that is a
// read-write memfd of at least RAMSize bytes sealed with F_SEAL_SHRINK.
// Connections that fail are refused (with the reason sent to the client and
// logged) and never returned. The caller must answer the Pending with Accept
// or Reject.
func (l *Listener) Accept(ctx context.Context) (*Pending, error) {
	select {
	case p := <-l.ready:
		return p, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("ipc: accept: %w", ctx.Err())
	case <-l.done:
		l.mu.Lock()
		err := l.err
		l.mu.Unlock()
		if err == nil {
			err = ErrClosed
		}
		return nil, err
	}
}

func (l *Listener) shutdown() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	close(l.done)
	for c := range l.inflight {
		c.Close()
	}
	ln := l.ln
	l.mu.Unlock()
	ln.Close()
}

// Close stops accepting, refuses connections still in the handshake, and
// removes the socket file. Established ServerConns are not affected.
// A listener handed off (HandOff) and not resumed leaves the socket to
// the process it was handed to.
func (l *Listener) Close() error {
	l.mu.Lock()
	handedOff := l.paused
	l.mu.Unlock()
	if !handedOff {
		l.rmOnce.Do(func() { l.rmErr = removeOwn(l.path, l.file) }) // while the socket is open: see streamListener.Close
	}
	l.shutdown()
	l.wg.Wait()
	if l.rmErr != nil {
		return fmt.Errorf("ipc: close listener: %w", l.rmErr)
	}
	return nil
}
