package ipc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
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

// PeerCred is the peer process's credentials (SO_PEERCRED), for logging and
// policy.
type PeerCred struct {
	PID int32
	UID uint32
	GID uint32
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

// handshake reads and validates one Hello and queues the Pending for Accept.
func (l *Listener) handshake(c *net.UnixConn) {
	defer l.wg.Done()
	defer func() { <-l.sem }()
	p, err := l.readHello(c)
	if err != nil {
		l.refuse(c, err)
		return
	}
	select {
	case l.ready <- p:
		l.forget(c)
	case <-l.done:
		l.forget(c)
		p.Reject("server shutting down")
	}
}

// refuse logs a failed handshake, tells the client why, and closes.
func (l *Listener) refuse(c *net.UnixConn, err error) {
	l.forget(c)
	l.log.Warn("ipc: handshake refused", "err", err)
	if l.opts.OnHandshakeError != nil {
		l.opts.OnHandshakeError(err)
	}
	c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	c.Write(encodeReason(msgReject, err.Error()))
	c.Close()
}

func peerCred(c *net.UnixConn) PeerCred {
	var pc PeerCred
	rc, err := c.SyscallConn()
	if err != nil {
		return pc
	}
	rc.Control(func(fd uintptr) {
		if u, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			pc = PeerCred{PID: u.Pid, UID: u.Uid, GID: u.Gid}
		}
	})
	return pc
}

// recvFiles parses SCM_RIGHTS control data into files. Any fd received is
// returned (so the caller can close it) even when an error is reported.
func recvFiles(oob []byte, flags int) ([]*os.File, error) {
	var files []*os.File
	var perr error
	if len(oob) > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob)
		if err != nil {
			perr = fmt.Errorf("malformed ancillary data: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Level != unix.SOL_SOCKET || m.Header.Type != unix.SCM_RIGHTS {
				perr = fmt.Errorf("unexpected ancillary data (level %d type %d)", m.Header.Level, m.Header.Type)
				continue
			}
			fds, err := unix.ParseUnixRights(&m)
			if err != nil {
				perr = fmt.Errorf("malformed SCM_RIGHTS: %w", err)
				continue
			}
			for _, fd := range fds {
				files = append(files, os.NewFile(uintptr(fd), fmt.Sprintf("fd%d", fd)))
			}
		}
	}
	if flags&unix.MSG_CTRUNC != 0 && perr == nil {
		perr = fmt.Errorf("too many fds attached (at most %d)", 1+MaxExtraFiles)
	}
	return files, perr
}

func closeFiles(fs []*os.File) {
	for _, f := range fs {
		if f != nil {
			f.Close()
		}
	}
}

func (l *Listener) readHello(c *net.UnixConn) (*Pending, error) {
	c.SetReadDeadline(time.Now().Add(l.opts.HandshakeTimeout))
	buf := make([]byte, maxPacket)
	oob := make([]byte, unix.CmsgSpace(4*(1+MaxExtraFiles)))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	files, ferr := recvFiles(oob[:oobn], flags)
	fail := func(err error) (*Pending, error) {
		closeFiles(files)
		return nil, err
	}
	if err != nil {
		return fail(fmt.Errorf("reading hello: %w", err))
	}
	if n == 0 {
		return fail(errors.New("connection closed before hello"))
	}
	if ferr != nil {
		return fail(fmt.Errorf("hello: %w", ferr))
	}
	if len(files) > 1+MaxExtraFiles {
		return fail(fmt.Errorf("hello: too many fds attached (%d, at most %d)", len(files), 1+MaxExtraFiles))
	}
	if flags&unix.MSG_TRUNC != 0 {
		return fail(fmt.Errorf("oversized hello (more than %d bytes, want %d)", len(buf), helloSize))
	}
	h, nExtra, err := decodeHello(buf[:n])
	if err != nil {
		return fail(fmt.Errorf("bad hello: %w", err))
	}
	if len(files) == 0 {
		return fail(errors.New("hello carries no guest RAM fd"))
	}
	if len(files) != 1+nExtra {
		return fail(fmt.Errorf("hello announces 1+%d fds but carries %d", nExtra, len(files)))
	}
	if _, err := checkMemfd(int(files[0].Fd()), "guest RAM", h.RAMSize); err != nil {
		return fail(fmt.Errorf("dom %d (%s): %w", h.DomID, h.Name, err))
	}
	c.SetReadDeadline(time.Time{})
	return &Pending{
		l: l, conn: c, hello: h,
		ram: files[0], extra: files[1:],
		peer: peerCred(c),
	}, nil
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

// Pending is a connection whose Hello was validated, awaiting the
// aggregator's decision. Exactly one of Accept or Reject must be called.
type Pending struct {
	l     *Listener
	conn  *net.UnixConn
	hello Hello
	ram   *os.File
	extra []*os.File
	peer  PeerCred

	mu   sync.Mutex
	done bool
}

// Hello returns the client's validated Hello.
func (p *Pending) Hello() Hello { return p.hello }

// RAM returns the guest RAM memfd (validated: a read-write memfd of at least
// Hello().RAMSize bytes, sealed against shrinking). It belongs to the Pending
// and then to the ServerConn, which close it; mappings made from it outlive
// that.
func (p *Pending) RAM() *os.File { return p.ram }

// Extra returns the extra fds the client attached (unvalidated; at most
// MaxExtraFiles). Ownership is as for RAM.
func (p *Pending) Extra() []*os.File { return p.extra }

// Peer returns the client process's credentials.
func (p *Pending) Peer() PeerCred { return p.peer }

func (p *Pending) finish() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return errors.New("ipc: pending connection already answered")
	}
	p.done = true
	return nil
}

// Reject refuses the connection: the client's Dial returns a *RejectedError
// with reason (sanitized to printable ASCII, at most MaxReasonLen bytes). The
// connection and the received fds are closed.
func (p *Pending) Reject(reason string) error {
	if err := p.finish(); err != nil {
		return err
	}
	p.l.log.Info("ipc: rejected", "dom", p.hello.DomID, "name", p.hello.Name, "reason", reason)
	p.conn.SetWriteDeadline(time.Now().Add(time.Second))
	_, err := p.conn.Write(encodeReason(msgReject, reason))
	p.conn.Close()
	closeFiles(p.extra)
	p.ram.Close()
	if err != nil {
		return fmt.Errorf("ipc: reject dom %d: %w", p.hello.DomID, err)
	}
	return nil
}

// Accept admits the connection: it creates the shared-memory rings (for
// TransportShm), sends the Welcome with the ring memfd followed by extra (at
// most MaxExtraFiles; the caller keeps ownership of its files), and returns
// the connection, ready for Serve. On error the connection is closed.
func (p *Pending) Accept(w Welcome, extra []*os.File) (*ServerConn, error) {
	if err := p.finish(); err != nil {
		return nil, err
	}
	s, err := p.accept(w, extra)
	if err != nil {
		p.conn.Close()
		closeFiles(p.extra)
		p.ram.Close()
		return nil, fmt.Errorf("ipc: accept dom %d (%s): %w", p.hello.DomID, p.hello.Name, err)
	}
	return s, nil
}

func (p *Pending) accept(w Welcome, extra []*os.File) (*ServerConn, error) {
	if len(extra) > MaxExtraFiles {
		p.conn.Write(encodeReason(msgReject, "internal error: too many fds"))
		return nil, fmt.Errorf("%d extra fds, at most %d", len(extra), MaxExtraFiles)
	}
	ww := welcomeWire{Welcome: w, transport: p.hello.Transport, nExtra: len(extra)}
	var ring *ringMap
	var fds []int
	if p.hello.Transport == TransportShm {
		l, err := newRingLayout(p.l.opts.RequestEntries, p.l.opts.ResponseEntries)
		if err != nil {
			return nil, err
		}
		r, fd, err := createRing(l)
		if err != nil {
			p.conn.Write(encodeReason(msgReject, "internal error: cannot create ring"))
			return nil, err
		}
		defer unix.Close(fd)
		ring = r
		fds = append(fds, fd)
		ww.reqEntries, ww.rspEntries = l.reqN, l.rspN
	}
	fail := func(err error) (*ServerConn, error) {
		ring.unmap()
		return nil, err
	}
	b, err := encodeWelcome(&ww)
	if err != nil {
		p.conn.Write(encodeReason(msgReject, "internal error: bad welcome"))
		return fail(err)
	}
	for _, f := range extra {
		fds = append(fds, int(f.Fd()))
	}
	p.conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	_, _, err = p.conn.WriteMsgUnix(b, oob, nil)
	for _, f := range extra {
		runtime.KeepAlive(f)
	}
	if err != nil {
		return fail(fmt.Errorf("sending welcome: %w", err))
	}
	p.conn.SetWriteDeadline(time.Time{})
	spin := p.l.opts.Spin
	s := &ServerConn{
		conn: p.conn, hello: p.hello, ram: p.ram, extra: p.extra, peer: p.peer,
		ring: ring, spin: spin, vgpu: w.VGPU,
		log:  p.l.log.With("dom", p.hello.DomID, "name", p.hello.Name, "vgpu", w.VGPU),
		done: make(chan struct{}),
	}
	s.log.Info("ipc: connected", "transport", p.hello.Transport, "mode", p.hello.Mode, "ram", p.hello.RAMSize, "pid", p.peer.PID)
	return s, nil
}

// Handler executes a connection's requests. Serve calls it from one
// goroutine, in request order. An error ends the connection: Serve returns a
// *HandlerError and the client gets the error text as the Bye reason.
type Handler interface {
	// Read32 reads a 32-bit register; bar and off are already validated.
	Read32(bar int, off uint64) (uint32, error)
	// Write32 performs a posted 32-bit write; bar and off are validated.
	Write32(bar int, off uint64, v uint32) error
	// Call performs a generic call; len(args) <= MaxCallArgs.
	Call(op uint16, args []uint64) (CallResult, error)
}

// ServerConn is an accepted connection.
type ServerConn struct {
	conn  *net.UnixConn
	hello Hello
	ram   *os.File
	extra []*os.File
	peer  PeerCred
	ring  *ringMap
	spin  int
	vgpu  uint32
	log   *slog.Logger

	mu       sync.Mutex
	serving  bool
	closed   bool
	ending   bool  // Serve is finishing: cancellation must not touch deadlines
	stopErr  error // first reason to stop
	unmapped bool  // Close released the ring
	stopped  atomic.Bool
	done     chan struct{} // closed when Serve returns
	closeErr error
}

// Hello returns the client's Hello.
func (s *ServerConn) Hello() Hello { return s.hello }

// RAM returns the guest RAM memfd; it is closed by Close.
func (s *ServerConn) RAM() *os.File { return s.ram }

// Extra returns the client's extra fds; they are closed by Close.
func (s *ServerConn) Extra() []*os.File { return s.extra }

// Peer returns the client process's credentials.
func (s *ServerConn) Peer() PeerCred { return s.peer }

// stop records the first reason to stop and interrupts the serving loop.
func (s *ServerConn) stop(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopErr == nil {
		s.stopErr = err
	}
	s.stopped.Store(true)
	// Under s.mu: a late caller (the ctx AfterFunc) must not touch the ring
	// after Close unmapped it.
	if s.ring != nil && !s.unmapped {
		interrupt(s.ring.serverWait)
	}
}

func (s *ServerConn) stopReason() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopErr
}

// Serve executes the client's requests with h until ctx is done, the peer
// hangs up (the socket reaches EOF: the device model died or closed), the
// client violates the protocol, or h returns an error. It returns the reason:
// an error matching ErrPeerClosed, ctx's error, a *ViolationError or a
// *HandlerError. Except for a peer hang-up, the client is sent a Bye with the
// reason. Serve closes the socket but not the rest; call Close afterwards.
// Serve may be called once.
func (s *ServerConn) Serve(ctx context.Context, h Handler) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	if s.serving {
		s.mu.Unlock()
		return errors.New("ipc: Serve called twice")
	}
	s.serving = true
	s.mu.Unlock()
	defer close(s.done)

	stopCancel := context.AfterFunc(ctx, func() {
		s.stop(fmt.Errorf("ipc: serve: %w", ctx.Err()))
		s.mu.Lock()
		if !s.ending {
			s.conn.SetDeadline(time.Unix(1, 0))
		}
		s.mu.Unlock()
	})
	var err error
	if s.ring != nil {
		err = s.serveShm(h)
	} else {
		err = s.serveSocket(h)
	}
	stopCancel()
	s.mu.Lock()
	s.ending = true
	s.mu.Unlock()
	if r := s.stopReason(); r != nil && !errors.Is(err, ErrProtocolViolation) {
		var he *HandlerError
		if !errors.As(err, &he) {
			err = r
		}
	}
	s.end(err)
	return err
}

// end tells the client why (unless it hung up), and closes the socket.
func (s *ServerConn) end(err error) {
	if errors.Is(err, ErrPeerClosed) {
		s.log.Info("ipc: peer closed connection")
	} else {
		s.log.Warn("ipc: closing connection", "err", err)
		reason := err.Error()
		var ve *ViolationError
		if errors.As(err, &ve) {
			reason = "protocol violation: " + ve.Reason
		} else if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			reason = "server shutting down"
		}
		s.conn.SetDeadline(time.Now().Add(100 * time.Millisecond))
		s.conn.Write(encodeReason(msgBye, reason))
		s.conn.CloseWrite()
		// Drain what the client already queued: closing a Unix socket with
		// unread data makes the peer's next read fail with ECONNRESET
		// before it sees the Bye. Bounded, so a flooding client cannot
		// keep us here.
		var junk [EntrySize]byte
		s.conn.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		for i := 0; i < 4096; i++ {
			if _, err := s.conn.Read(junk[:]); err != nil {
				break
			}
		}
	}
	s.conn.Close()
}

func isEOF(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func peerClosed(err error) error {
	if err == nil {
		return fmt.Errorf("%w (socket EOF)", ErrPeerClosed)
	}
	return fmt.Errorf("%w (%v)", ErrPeerClosed, err)
}

// serveSocket runs the socket transport: one 64-byte frame per packet.
func (s *ServerConn) serveSocket(h Handler) error {
	var (
		in  [EntrySize + 1]byte // one spare byte detects oversized frames
		oob [64]byte
		out [EntrySize]byte
		req request
	)
	for {
		n, oobn, flags, _, err := s.conn.ReadMsgUnix(in[:], oob[:])
		if oobn > 0 || flags&unix.MSG_CTRUNC != 0 {
			files, _ := recvFiles(oob[:oobn], flags)
			closeFiles(files)
			return violationf("MMIO frame carries ancillary data (%d fds)", len(files))
		}
		if err != nil {
			if s.stopped.Load() {
				return s.stopReason()
			}
			if isEOF(err) {
				return peerClosed(err)
			}
			return fmt.Errorf("ipc: reading request: %w", err)
		}
		switch {
		case n == 0:
			return peerClosed(nil)
		case n > EntrySize || flags&unix.MSG_TRUNC != 0:
			return violationf("oversized frame (more than %d bytes, frames are %d)", EntrySize, EntrySize)
		case n < EntrySize:
			return violationf("truncated frame (%d bytes, frames are %d)", n, EntrySize)
		}
		if err := decodeRequest(in[:EntrySize], &req); err != nil {
			return violationf("%v", err)
		}
		rsp, reply, err := s.execute(h, &req)
		if err != nil {
			return err
		}
		if reply {
			encodeResponse(out[:], &rsp)
			if _, err := s.conn.Write(out[:]); err != nil {
				if s.stopped.Load() {
					return s.stopReason()
				}
				if isEOF(err) {
					return peerClosed(err)
				}
				return fmt.Errorf("ipc: writing response: %w", err)
			}
		}
	}
}

// execute runs one validated request; reply says whether rsp must be sent.
func (s *ServerConn) execute(h Handler, req *request) (rsp response, reply bool, err error) {
	switch req.kind {
	case kindWrite32, kindWrite32Sync:
		if err := h.Write32(int(req.bar), req.off, req.value); err != nil {
			return rsp, false, &HandlerError{Op: kindName(req.kind), Err: err}
		}
		if req.kind == kindWrite32Sync {
			return response{kind: kindWrite32SyncDone, seq: req.seq}, true, nil
		}
		return rsp, false, nil
	case kindRead32:
		v, err := h.Read32(int(req.bar), req.off)
		if err != nil {
			return rsp, false, &HandlerError{Op: "read32", Err: err}
		}
		return response{kind: kindRead32Reply, seq: req.seq, value: v}, true, nil
	case kindCall:
		r, err := h.Call(req.op, req.args[:req.nargs])
		if err != nil {
			return rsp, false, &HandlerError{Op: "call", Err: err}
		}
		return response{kind: kindCallReply, seq: req.seq, value: uint32(r.Status), result: r.Result}, true, nil
	}
	return rsp, false, violationf("unknown request kind %d", req.kind)
}

// watchSocket runs in shm mode: the socket carries nothing after the
// handshake, so any data is a violation and EOF means the peer is gone.
func (s *ServerConn) watchSocket(done chan<- struct{}) {
	defer close(done)
	var b [maxPacket]byte
	var oob [64]byte
	n, oobn, flags, _, err := s.conn.ReadMsgUnix(b[:], oob[:])
	if oobn > 0 {
		files, _ := recvFiles(oob[:oobn], flags)
		closeFiles(files)
	}
	switch {
	case s.stopped.Load():
		s.stop(nil)
	case err != nil && !isEOF(err):
		s.stop(fmt.Errorf("ipc: socket: %w", err))
	case err != nil || n == 0:
		s.stop(peerClosed(err))
	default:
		s.stop(violationf("unexpected %d-byte message on the socket in shm mode", n))
	}
}

// serveShm runs the shared-memory transport.
func (s *ServerConn) serveShm(h Handler) error {
	watchDone := make(chan struct{})
	go s.watchSocket(watchDone)
	err := s.shmLoop(h)
	if err != nil {
		s.stop(err)
	}
	// Unblock the watcher (Serve's caller closes the socket later anyway).
	s.conn.SetReadDeadline(time.Unix(1, 0))
	<-watchDone
	if r := s.stopReason(); r != nil {
		return r
	}
	return err
}

func (s *ServerConn) shmLoop(h Handler) error {
	r := s.ring
	var (
		cons    uint32 // private: never re-read from shared memory
		rspProd uint32
		ent     [EntrySize]byte
		req     request
	)
	reqN := r.l.reqN
	for {
		if s.stopped.Load() {
			return s.stopReason()
		}
		prod := atomic.LoadUint32(r.reqProd)
		if prod == cons {
			waitFor(r.serverWait, waitReq, s.spin, func() bool {
				return s.stopped.Load() || atomic.LoadUint32(r.reqProd) != cons
			})
			continue
		}
		if prod-cons > reqN {
			return violationf("request ring: producer index %d is %d entries past consumer index %d (ring has %d)", prod, prod-cons, cons, reqN)
		}
		for cons != prod {
			// RING_COPY_REQUEST: one copy out of shared memory, then
			// decode and validate only the private copy.
			copy(ent[:], r.reqSlot(cons))
			cons++
			atomic.StoreUint32(r.reqCons, cons)
			wakeOn(r.clientWait, waitReqSpace)
			if err := decodeRequest(ent[:], &req); err != nil {
				return violationf("request %d: %v", cons-1, err)
			}
			rsp, reply, err := s.execute(h, &req)
			if err != nil {
				return err
			}
			if reply {
				if err := s.pushResponse(&rspProd, &rsp); err != nil {
					return err
				}
			}
			if s.stopped.Load() {
				return s.stopReason()
			}
		}
	}
}

func (s *ServerConn) pushResponse(prod *uint32, rsp *response) error {
	r := s.ring
	n := r.l.rspN
	for {
		c := atomic.LoadUint32(r.rspCons)
		if *prod-c > n {
			return violationf("response ring: consumer index %d is not within %d entries behind producer index %d", c, n, *prod)
		}
		if *prod-c < n {
			break
		}
		waitFor(r.serverWait, waitRspSpace, s.spin, func() bool {
			return s.stopped.Load() || atomic.LoadUint32(r.rspCons) != c
		})
		if s.stopped.Load() {
			return s.stopReason()
		}
	}
	encodeResponse(r.rspSlot(*prod), rsp)
	*prod++
	atomic.StoreUint32(r.rspProd, *prod)
	wakeOn(r.clientWait, waitRsp)
	return nil
}

// Close ends the connection (interrupting Serve, which then returns) and
// releases the ring mapping, the guest RAM fd and the client's extra fds.
func (s *ServerConn) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return s.closeErr
	}
	s.closed = true
	serving := s.serving
	s.mu.Unlock()
	if serving {
		s.stop(ErrClosed)
		s.mu.Lock()
		if !s.ending {
			s.conn.SetDeadline(time.Unix(1, 0))
		}
		s.mu.Unlock()
		<-s.done
	} else {
		s.conn.Close()
	}
	closeFiles(s.extra)
	s.ram.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unmapped = true
	if err := s.ring.unmap(); err != nil {
		s.closeErr = fmt.Errorf("ipc: close: unmap ring: %w", err)
	}
	return s.closeErr
}
