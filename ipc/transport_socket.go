// The socket transport: one fixed-size frame per SOCK_SEQPACKET packet.

package ipc

import (
	"fmt"

	"golang.org/x/sys/unix"
)

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
