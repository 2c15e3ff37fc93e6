// An accepted connection: its lifetime (Serve, the Bye that ends it, Close)
// and the execution of requests, whichever transport carries them.

package ipc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

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
	ending   bool   // Serve is finishing: cancellation must not touch deadlines
	stopErr  error  // first reason to stop
	unmapped bool   // Close released the ring
	irqs     uint64 // virtual interrupts raised (irq.go)
	rm       remapServer
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
// client violates the protocol, h returns an error, or the server calls End.
// It returns the reason: an error matching ErrPeerClosed, ctx's error, a
// *ViolationError, a *HandlerError or an *EndedError. Except for a peer hang-up, the client is sent a Bye with the
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
		// A handler error is the better reason, except after End: then it
		// is likely a consequence of what made the server end (a request
		// meeting the vGPU that is being torn down).
		var he *HandlerError
		var ee *EndedError
		if !errors.As(err, &he) || errors.As(r, &ee) {
			err = r
		}
	}
	s.end(err)
	return err
}

// End ends the connection on the server's initiative: Serve stops (between
// requests), sends the client a Bye with reason, and returns an
// *EndedError with it. It does not wait for Serve. Called before Serve,
// Serve ends at once; after Serve returned, or after Close, it does nothing.
func (s *ServerConn) End(reason string) {
	s.stop(&EndedError{Reason: reason})
	s.mu.Lock()
	if !s.ending && !s.closed {
		s.conn.SetDeadline(time.Unix(1, 0)) // unblock a socket read
	}
	s.mu.Unlock()
}

// end tells the client why (unless it hung up), and closes the socket.
func (s *ServerConn) end(err error) {
	if errors.Is(err, ErrPeerClosed) {
		s.log.Info("ipc: peer closed connection")
	} else {
		s.log.Warn("ipc: closing connection", "err", err)
		reason := err.Error()
		var ve *ViolationError
		var ee *EndedError
		if errors.As(err, &ve) {
			reason = "protocol violation: " + ve.Reason
		} else if errors.As(err, &ee) {
			reason = ee.Reason
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
	case kindFill32:
		// Word by word through the handler, as that many Write32s would
		// be: the aggregator's checks see each store; only the trips
		// between the processes are saved.
		for i := range uint64(req.count) {
			if err := h.Write32(int(req.bar), req.off+4*i, req.value); err != nil {
				return rsp, false, &HandlerError{Op: "fill32", Err: err}
			}
		}
		return response{kind: kindFill32Done, seq: req.seq}, true, nil
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
