// BAR remap updates on the shared-memory transport: the server takes the
// client's remap mappings away and may hand it new files; the client
// answers once its old mappings are gone (docs/protocol.md §6.7).

package ipc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// RingFeatureRemap is the ring header's feature bit for remap updates: the
// server can send RemapUpdate messages on the socket. A client that
// handles them sets the same bit in the ring's client_features word.
const RingFeatureRemap = 2

const (
	msgRemapUpdate = 5
	msgRemapAck    = 6
	remapMsgSize   = 16

	// ringOffClientFeatures is the client's word of the ring: the
	// RingFeature bits it accepts (only RingFeatureRemap means anything).
	ringOffClientFeatures = 0x240
)

// Remap acknowledgement statuses (RemapAck.status).
const (
	// RemapDone: the old mappings are gone and the new files (if any) are
	// mapped.
	RemapDone uint32 = 0
	// RemapUnmapped: the old mappings are gone, the new files could not be
	// mapped; every aperture access of the client traps.
	RemapUnmapped uint32 = 1
)

// ErrRemapNotOffered is returned by ServerConn.UpdateRemap when the client
// did not say it handles remap updates (or the transport is the socket).
var ErrRemapNotOffered = errors.New("ipc: the client does not handle remap updates")

// ErrRemapNoAck is returned by ServerConn.UpdateRemap when the client did
// not acknowledge the update in time (or could not be sent it).
var ErrRemapNoAck = errors.New("ipc: the client did not acknowledge the remap update")

func encodeRemapUpdate(epoch uint32, nfds int) []byte {
	b := make([]byte, remapMsgSize)
	putHeader(b, msgRemapUpdate)
	le.PutUint32(b[8:], epoch)
	b[12] = byte(nfds)
	return b
}

func decodeRemapUpdate(b []byte) (epoch uint32, nfds int, err error) {
	if err := checkHeader(b, msgRemapUpdate, remapMsgSize); err != nil {
		return 0, 0, err
	}
	epoch, nfds = le.Uint32(b[8:]), int(b[12])
	if nfds != 0 && nfds != 2 {
		return 0, 0, fmt.Errorf("remap update: n_fds %d, want 0 or 2", nfds)
	}
	if !allZero(b[13:16]) {
		return 0, 0, errors.New("remap update: reserved bytes not zero")
	}
	return epoch, nfds, nil
}

func encodeRemapAck(epoch, status uint32) []byte {
	b := make([]byte, remapMsgSize)
	putHeader(b, msgRemapAck)
	le.PutUint32(b[8:], epoch)
	le.PutUint32(b[12:], status)
	return b
}

func decodeRemapAck(b []byte) (epoch, status uint32, err error) {
	if err := checkHeader(b, msgRemapAck, remapMsgSize); err != nil {
		return 0, 0, err
	}
	epoch, status = le.Uint32(b[8:]), le.Uint32(b[12:])
	if status != RemapDone && status != RemapUnmapped {
		return 0, 0, fmt.Errorf("remap ack: status %d, want 0 or 1", status)
	}
	return epoch, status, nil
}

// remapServer is a ServerConn's remap-update state.
type remapServer struct {
	op sync.Mutex // one update outstanding at a time; held across the wait
	// Under the ServerConn's mu:
	epoch uint32      // the last update or revoke sent (0: none yet)
	acked uint32      // the last acknowledged: acks come in epoch order
	want  uint32      // the update awaited (0: none)
	ack   chan uint32 // its status, once acknowledged
	// revokes holds the epochs of RemapRevokes sent and not yet
	// acknowledged (their ack must say RemapDone).
	revokes map[uint32]bool
}

// RemapOffered reports whether UpdateRemap can reach the client: the shm
// transport, whose client set RingFeatureRemap in its client_features
// word. The word is the client's: a client that sets it and then does not
// answer only makes its own updates time out.
func (s *ServerConn) RemapOffered() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.remapOfferedLocked()
}

func (s *ServerConn) remapOfferedLocked() bool {
	r := s.ring
	return r != nil && !s.unmapped && !s.closed && r.features&RingFeatureRemap != 0 &&
		atomic.LoadUint32(r.word(ringOffClientFeatures))&RingFeatureRemap != 0
}

// UpdateRemap sends the client a RemapUpdate — drop every remap mapping
// and, with files (exactly two: the remap table and the VRAM slice, as in
// the Welcome), map those instead — and waits for its acknowledgement,
// until ctx is done. It returns the acknowledged status (RemapDone or
// RemapUnmapped), or an error: ErrRemapNotOffered (nothing was sent),
// ErrRemapNoAck (sent, or the socket would not take it, and not
// acknowledged in time: the client may still hold its old mappings), or
// ErrClosed. The send never blocks. The caller keeps its files.
func (s *ServerConn) UpdateRemap(ctx context.Context, files []*os.File) (uint32, error) {
	if len(files) != 0 && len(files) != 2 {
		return 0, fmt.Errorf("ipc: remap update with %d files, want 0 or 2", len(files))
	}
	s.rm.op.Lock()
	defer s.rm.op.Unlock()
	var oob []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		oob = unix.UnixRights(fds...)
	}
	s.mu.Lock()
	if !s.remapOfferedLocked() {
		s.mu.Unlock()
		return 0, ErrRemapNotOffered
	}
	s.rm.epoch++
	epoch, ch := s.rm.epoch, make(chan uint32, 1)
	s.rm.want, s.rm.ack = epoch, ch
	// Sent under mu, so that updates and revokes go out in epoch order.
	serr := s.sendRemapLocked(encodeRemapUpdate(epoch, len(files)), oob)
	s.mu.Unlock()
	runtime.KeepAlive(files)
	defer func() {
		s.mu.Lock()
		s.rm.want, s.rm.ack = 0, nil // given up on: its ack may still come, and is ignored
		s.mu.Unlock()
	}()
	if serr != nil {
		return 0, fmt.Errorf("ipc: remap update %d: send: %w: %w", epoch, ErrRemapNoAck, serr)
	}
	select {
	case st := <-ch:
		return st, nil
	case <-ctx.Done():
		return 0, fmt.Errorf("ipc: remap update %d: %w: %w", epoch, ErrRemapNoAck, ctx.Err())
	case <-s.done:
		return 0, fmt.Errorf("ipc: remap update %d: %w", epoch, ErrClosed)
	}
}

// remapAcked handles a RemapAck read from the socket: the awaited one is
// delivered, a late one ignored; anything else is a violation.
func (s *ServerConn) remapAcked(b []byte) error {
	epoch, status, err := decodeRemapAck(b)
	if err != nil {
		return violationf("%v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if epoch != s.rm.acked+1 || epoch > s.rm.epoch {
		return violationf("remap ack for update %d, last sent %d, last acknowledged %d", epoch, s.rm.epoch, s.rm.acked)
	}
	s.rm.acked = epoch
	switch {
	case s.rm.revokes[epoch]:
		delete(s.rm.revokes, epoch)
		if status != RemapDone {
			return violationf("remap ack for revoke %d with status %d", epoch, status)
		}
	case epoch == s.rm.want:
		s.rm.ack <- status // buffered, one per update
		s.rm.want = 0
	default:
		s.log.Info("ipc: late remap ack ignored", "epoch", epoch)
	}
	return nil
}

// sendRemapLocked sends one remap message without blocking. Called with
// the ServerConn's mu held.
func (s *ServerConn) sendRemapLocked(msg, oob []byte) error {
	rc, err := s.conn.SyscallConn()
	if err != nil {
		return ErrClosed
	}
	var serr error
	if err := rc.Write(func(fd uintptr) bool {
		serr = unix.Sendmsg(int(fd), msg, oob, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
		return true
	}); err != nil {
		serr = err
	}
	return serr
}

// remapClient is a Client's remap-update state.
type remapClient struct {
	fn     atomic.Pointer[func([]*os.File) error]
	revoke atomic.Pointer[func([]uint32) error] // HandleRemapRevoke's
	epoch  uint32                               // the last update handled (watch goroutine only)
}

// HandleRemap registers fn to carry out the server's remap updates
// (docs/protocol.md §6.7) and tells the server so. It returns false, and
// registers nothing, when the server does not offer them (the socket
// transport, or a server that predates them).
//
// fn runs on the client's socket reader. It is called with no files to
// revoke, or with two (the new remap table and VRAM slice, closed after fn
// returns: map them). Before it returns it must have stopped serving
// accesses from the old mappings, waited for any such access under way
// and unmapped them — also when it returns an error, which says only that
// the new files could not be mapped (the client then traps every aperture
// access). The client acknowledges when fn returns. fn must not wait for
// trapped accesses (they may be waiting for the acknowledgement).
// Call HandleRemap before Close.
func (c *Client) HandleRemap(fn func(files []*os.File) error) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.ring
	if r == nil || fn == nil || r.features&RingFeatureRemap == 0 {
		return false
	}
	c.rm.fn.Store(&fn)
	atomic.OrUint32(r.word(ringOffClientFeatures), RingFeatureRemap)
	return true
}

// remapUpdate carries out a RemapUpdate the watch goroutine read, and
// acknowledges it. It owns files. An error fails the connection.
func (c *Client) remapUpdate(b []byte, files []*os.File, ferr error) error {
	defer closeFiles(files)
	epoch, nfds, err := decodeRemapUpdate(b)
	switch {
	case err != nil:
		return violationf("%v", err)
	case ferr != nil:
		return violationf("remap update: %v", ferr)
	case len(files) != nfds:
		return violationf("remap update announces %d fds, carries %d", nfds, len(files))
	case epoch != c.rm.epoch+1:
		return violationf("remap update %d after %d", epoch, c.rm.epoch)
	}
	fn := c.rm.fn.Load()
	if fn == nil {
		return violationf("remap update %d, but the client does not handle them", epoch)
	}
	c.rm.epoch = epoch
	status := RemapDone
	if err := (*fn)(files); err != nil {
		c.log.Warn("ipc: remap update: new mappings refused, every aperture access traps", "epoch", epoch, "err", err)
		status = RemapUnmapped
	}
	return c.sendRemapAck(epoch, status)
}

// sendRemapAck acknowledges the remap message with epoch.
func (c *Client) sendRemapAck(epoch, status uint32) error {
	if _, err := c.conn.Write(encodeRemapAck(epoch, status)); err != nil {
		if isEOF(err) {
			return peerClosed(err)
		}
		return fmt.Errorf("ipc: remap ack %d: %w", epoch, err)
	}
	return nil
}
