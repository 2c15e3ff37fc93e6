// Per-page remap revocation for a client that maps remapped pages into its
// guest (docs/protocol.md §6.8): the server names the table entries it
// took back, the client removes the guest's mappings of them and
// acknowledges.

package ipc

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
)

// RingFeatureRemapMapped is the ring header's feature bit for per-page
// revocation: the server can send RemapRevoke messages. A client that maps
// remapped pages into its guest sets it (with RingFeatureRemap) in the
// ring's client_features word.
const RingFeatureRemapMapped = 4

// MaxRevokeEntries bounds the entries one RemapRevoke names.
const MaxRevokeEntries = 256

const (
	msgRemapRevoke    = 7
	remapRevokeHeader = 16
)

func encodeRemapRevoke(epoch uint32, idx []uint32) []byte {
	b := make([]byte, remapRevokeHeader+4*len(idx))
	putHeader(b, msgRemapRevoke)
	le.PutUint32(b[8:], epoch)
	le.PutUint16(b[12:], uint16(len(idx)))
	for i, x := range idx {
		le.PutUint32(b[remapRevokeHeader+4*i:], x)
	}
	return b
}

func decodeRemapRevoke(b []byte) (epoch uint32, idx []uint32, err error) {
	if len(b) < remapRevokeHeader {
		return 0, nil, fmt.Errorf("remap revoke: %d bytes", len(b))
	}
	n := int(le.Uint16(b[12:]))
	if n < 1 || n > MaxRevokeEntries {
		return 0, nil, fmt.Errorf("remap revoke: count %d, want 1..%d", n, MaxRevokeEntries)
	}
	if err := checkHeader(b, msgRemapRevoke, remapRevokeHeader+4*n); err != nil {
		return 0, nil, err
	}
	if !allZero(b[14:16]) {
		return 0, nil, errors.New("remap revoke: reserved bytes not zero")
	}
	idx = make([]uint32, n)
	for i := range idx {
		idx[i] = le.Uint32(b[remapRevokeHeader+4*i:])
	}
	return le.Uint32(b[8:]), idx, nil
}

// RemapMapped reports whether the client maps remapped pages into its
// guest and takes RemapRevoke messages: it set RingFeatureRemapMapped and
// RingFeatureRemap in its client_features word (the server offers both on
// every shm ring). The word is the client's: a client that sets the bit
// and then does not answer only makes its own vGPU trap and rescan.
func (s *ServerConn) RemapMapped() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.remapOfferedLocked() && s.ring.features&RingFeatureRemapMapped != 0 &&
		atomic.LoadUint32(s.ring.word(ringOffClientFeatures))&RingFeatureRemapMapped != 0
}

// RevokeRemap sends the client RemapRevoke messages naming the remap-table
// entries idx (at most MaxRevokeEntries a message) without waiting for
// its acknowledgement, and returns the epoch of the last one sent: once
// RemapAcked reaches it the client removed its guest's mappings of every
// entry named. It never blocks. Errors: ErrRemapNotOffered (the client
// did not set RingFeatureRemapMapped; nothing was sent) or ErrRemapNoAck
// (a message could not be sent: treat the client as one that does not
// answer). With no entries it returns the last epoch sent.
func (s *ServerConn) RevokeRemap(idx []uint32) (uint32, error) {
	if !s.RemapMapped() {
		return 0, ErrRemapNotOffered
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(idx) > 0 {
		n := min(len(idx), MaxRevokeEntries)
		s.rm.epoch++
		epoch := s.rm.epoch
		if s.rm.revokes == nil {
			s.rm.revokes = make(map[uint32]bool)
		}
		s.rm.revokes[epoch] = true
		if err := s.sendRemapLocked(encodeRemapRevoke(epoch, idx[:n]), nil); err != nil {
			return 0, fmt.Errorf("ipc: remap revoke %d: send: %w: %w", epoch, ErrRemapNoAck, err)
		}
		idx = idx[n:]
	}
	return s.rm.epoch, nil
}

// RemapAcked returns the epoch of the last RemapUpdate or RemapRevoke the
// client acknowledged (acknowledgements come in epoch order; 0: none).
func (s *ServerConn) RemapAcked() uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rm.acked
}

// HandleRemapRevoke registers fn to carry out the server's per-page
// revocations (docs/protocol.md §6.8) and tells the server that the client
// maps remapped pages into its guest. Call it after HandleRemap succeeded
// and before mapping any page; it returns false, and registers nothing,
// when the server does not offer the feature.
//
// fn runs on the client's socket reader with the table indices named.
// Before it returns it must have removed the guest's direct access to
// those pages and waited for any access through them under way; it
// must not wait for trapped accesses. An error (an index past the table)
// fails the connection. The client acknowledges when fn returns.
func (c *Client) HandleRemapRevoke(fn func(idx []uint32) error) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.ring
	if r == nil || fn == nil || r.features&RingFeatureRemapMapped == 0 || c.rm.fn.Load() == nil {
		return false
	}
	c.rm.revoke.Store(&fn)
	atomic.OrUint32(r.word(ringOffClientFeatures), RingFeatureRemapMapped)
	return true
}

// remapRevoke carries out a RemapRevoke the watch goroutine read, and
// acknowledges it. It owns files. An error fails the connection.
func (c *Client) remapRevoke(b []byte, files []*os.File, ferr error) error {
	defer closeFiles(files)
	epoch, idx, err := decodeRemapRevoke(b)
	switch {
	case err != nil:
		return violationf("%v", err)
	case ferr != nil || len(files) != 0:
		return violationf("remap revoke carries fds")
	case epoch != c.rm.epoch+1:
		return violationf("remap revoke %d after %d", epoch, c.rm.epoch)
	}
	fn := c.rm.revoke.Load()
	if fn == nil {
		return violationf("remap revoke %d, but the client does not map remapped pages", epoch)
	}
	c.rm.epoch = epoch
	if err := (*fn)(idx); err != nil {
		return violationf("remap revoke %d: %v", epoch, err)
	}
	return c.sendRemapAck(epoch, RemapDone)
}
