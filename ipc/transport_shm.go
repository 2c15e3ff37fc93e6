// The shared-memory transport: request and response rings in a
// server-created memfd, with the socket watched for hang-up.

package ipc

import (
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// watchSocket runs in shm mode: after the handshake the socket carries
// only the client's remap acknowledgements (remap.go), so any other data is
// a violation and EOF means the peer is gone.
func (s *ServerConn) watchSocket(done chan<- struct{}) {
	defer close(done)
	var b [maxPacket]byte
	var oob [64]byte
	for {
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
		case peekType(b[:n]) == msgRemapAck && (oobn > 0 || flags&(unix.MSG_CTRUNC|unix.MSG_TRUNC) != 0):
			s.stop(violationf("remap ack carries ancillary data or is oversized"))
		case peekType(b[:n]) == msgRemapAck:
			if err := s.remapAcked(b[:n]); err != nil {
				s.stop(err)
				return
			}
			continue
		default:
			s.stop(violationf("unexpected %d-byte message on the socket in shm mode", n))
		}
		return
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
			// It ran: a client repeating what the server did not run
			// after a saved Bye starts here (replay.go).
			atomic.StoreUint32(r.reqDone, cons)
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
