// Posted writes across a saved Bye (docs/protocol.md §6.9). The server
// publishes in the ring's req_done word how many requests it has run; a
// client that posted writes the server never ran when it parked and saved
// the vGPU finds them from there and repeats them on the restored vGPU,
// so a device model with posted writes may resume (§13.7).

package ipc

import (
	"fmt"
	"sync/atomic"
)

// RingFeatureReqDone is the ring header's feature bit for the req_done
// word: the server stores there, after running each request, the index
// after it (so every request before req_done ran, none at or after it
// did while the connection stood).
const RingFeatureReqDone = 8

// ringOffReqDone is the server's req_done word (with RingFeatureReqDone).
const ringOffReqDone = 0x280

// PostedWrite is a posted 32-bit write the client queued (Write32).
type PostedWrite struct {
	BAR   int
	Off   uint64
	Value uint32
}

// sentEntry is the client's private record of a request it queued: what
// UnrunPosted needs of it, kept out of the shared ring (whose slots the
// client reuses once the server consumed them, before it ran them).
type sentEntry struct {
	kind  uint16
	bar   uint16
	value uint32
	off   uint64
}

// noteSent records req, queued at request index i (c.mu held).
func (c *Client) noteSent(i uint32, req *request) {
	if c.sent == nil {
		return
	}
	c.sent[i&uint32(len(c.sent)-1)] = sentEntry{kind: req.kind, bar: req.bar, value: req.value, off: req.off}
}

// ReplaysPosted reports whether UnrunPosted can name the posted writes the
// server did not run before a saved Bye: the shm transport with a server
// that publishes req_done. Without it a device model with posted writes
// cannot resume: one the server had not run would be lost unseen.
func (c *Client) ReplaysPosted() bool { return c.sent != nil }

// UnrunPosted returns, in order, the posted writes this client queued that
// the server had not run when the connection ended — what a device model
// repeats on the restored vGPU after a saved Bye, before it repeats the
// access that met the Bye (a synchronous request waiting for its answer
// is the last one queued and is not returned: its caller repeats it).
// Call it after the connection failed and before Close. It fails without
// ReplaysPosted, or when the server's req_done is not within the requests
// queued (the server's word is read once and checked).
func (c *Client) UnrunPosted() ([]PostedWrite, error) {
	if !c.dead.Load() {
		return nil, fmt.Errorf("ipc: unrun posted writes: the connection is still up")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.irqMu.RLock()
	defer c.irqMu.RUnlock()
	if c.sent == nil || c.ring == nil {
		return nil, fmt.Errorf("ipc: unrun posted writes: the server does not publish req_done")
	}
	done := atomic.LoadUint32(c.ring.word(ringOffReqDone))
	queued := c.reqProd - done
	// The server consumes a request before it runs it: req_cons is at
	// most one past req_done, and at most N requests sit unconsumed.
	if queued > c.ring.l.reqN+1 || int(queued) > len(c.sent) {
		return nil, fmt.Errorf("ipc: unrun posted writes: req_done %d is not within the %d requests before req_prod %d", done, c.ring.l.reqN+1, c.reqProd)
	}
	var out []PostedWrite
	for i := done; i != c.reqProd; i++ {
		e := c.sent[i&uint32(len(c.sent)-1)]
		if e.kind != kindWrite32 {
			if i+1 != c.reqProd {
				return nil, fmt.Errorf("ipc: unrun posted writes: unrun request %d is a %s with requests queued after it", i, kindName(e.kind))
			}
			break // the waiting synchronous request: its caller repeats it
		}
		out = append(out, PostedWrite{BAR: int(e.bar), Off: e.off, Value: e.value})
	}
	return out, nil
}
