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
	ln   *net.UnixListener
	path string
	opts ListenOptions
	log  *slog.Logger

	ready chan *Pending
	sem   chan struct{}
	done  chan struct{}
	wg    sync.WaitGroup

	mu       sync.Mutex
	inflight map[*net.UnixConn]struct{}
	err      error // why the accept loop stopped
	closed   bool
}

// Listen creates the socket at path and starts accepting connections; Accept
// returns them after their Hello was validated.
//
// The socket is created in a fresh private directory next to path, made mode
// 0600 (only the aggregator's user may connect: the socket hands out access to
// the GPU), and then renamed to path, so it never exists with a wider mode. A
// stale socket at path (one nobody listens on) is removed; a live one, or any
// other kind of file, is an error.
func Listen(path string, opts *ListenOptions) (*Listener, error) {
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
	if _, err := newRingLayout(o.RequestEntries, o.ResponseEntries); err != nil {
		return nil, fmt.Errorf("ipc: listen %s: %w", path, err)
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := removeStale(path); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(filepath.Dir(path), ".gpuvm-sock-")
	if err != nil {
		return nil, fmt.Errorf("ipc: listen %s: %w", path, err)
	}
	defer os.RemoveAll(dir)
	tmp := filepath.Join(dir, "s")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: tmp, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("ipc: listen %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("ipc: listen %s: chmod: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		ln.Close()
		return nil, fmt.Errorf("ipc: listen %s: %w", path, err)
	}
	l := &Listener{
		ln: ln, path: path, opts: o, log: log,
		ready:    make(chan *Pending),
		sem:      make(chan struct{}, o.MaxHandshakes),
		done:     make(chan struct{}),
		inflight: make(map[*net.UnixConn]struct{}),
	}
	l.wg.Add(1)
	go l.acceptLoop()
	return l, nil
}

func removeStale(path string) error {
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
	c, err := net.DialTimeout("unixpacket", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("ipc: listen %s: another server is listening there", path)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("ipc: listen %s: remove stale socket: %w", path, err)
	}
	return nil
}

// Addr returns the socket path.
func (l *Listener) Addr() string { return l.path }

func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	for {
		select {
		case l.sem <- struct{}{}:
		case <-l.done:
			return
		}
		c, err := l.ln.AcceptUnix()
		if err != nil {
			<-l.sem
			select {
			case <-l.done:
				return
			default:
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
		if l.closed {
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
	l.mu.Unlock()
	l.ln.Close()
}

// Close stops accepting, refuses connections still in the handshake, and
// removes the socket file. Established ServerConns are not affected.
func (l *Listener) Close() error {
	l.shutdown()
	l.wg.Wait()
	if err := os.Remove(l.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("ipc: close listener: %w", err)
	}
	return nil
}
