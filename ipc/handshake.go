// The handshake: reading and validating a Hello with its fds, and the
// aggregator's answer to it (Pending.Accept sends the Welcome, Reject the
// reason).

package ipc

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// PeerCred is the peer process's credentials (SO_PEERCRED), for logging and
// policy.
type PeerCred struct {
	PID int32
	UID uint32
	GID uint32
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
	if h.RAMSource == RAMXen {
		// The domain's own memory: every fd is an extra one.
		if len(files) != nExtra {
			return fail(fmt.Errorf("hello (RAM of Xen domain %d) announces %d fds but carries %d", h.DomID, nExtra, len(files)))
		}
		c.SetReadDeadline(time.Time{})
		return &Pending{l: l, conn: c, hello: h, extra: files, peer: peerCred(c)}, nil
	}
	if len(files) == 0 {
		return fail(errors.New("hello carries no guest RAM fd"))
	}
	if len(files) != 1+nExtra {
		return fail(fmt.Errorf("hello announces 1+%d fds but carries %d", nExtra, len(files)))
	}
	if _, err := CheckMemfd(int(files[0].Fd()), "guest RAM", h.RAMSize); err != nil {
		return fail(fmt.Errorf("dom %d (%s): %w", h.DomID, h.Name, err))
	}
	c.SetReadDeadline(time.Time{})
	return &Pending{
		l: l, conn: c, hello: h,
		ram: files[0], extra: files[1:],
		peer: peerCred(c),
	}, nil
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
// that. It is nil when the Hello's RAMSource is RAMXen: the RAM is then the
// Xen domain's own, for the aggregator to map.
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
