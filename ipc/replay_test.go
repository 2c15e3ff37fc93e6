package ipc

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// parkingRegs runs the first ranLimit writes, then blocks the next one —
// a parked vGPU's access waiting in the aggregator — until release, and
// fails it: the vGPU was destroyed by the save, the write never ran.
type parkingRegs struct {
	regs
	ranLimit int
	blocked  chan struct{} // closed when a write blocks
	release  chan struct{}
	once     sync.Once
}

func (p *parkingRegs) Write32(bar int, off uint64, v uint32) error {
	p.mu.Lock()
	n := len(p.writes)
	p.mu.Unlock()
	if n >= p.ranLimit {
		p.once.Do(func() { close(p.blocked) })
		<-p.release
		return errors.New("vGPU destroyed by its save")
	}
	return p.regs.Write32(bar, off, v)
}

// TestUnrunPostedAfterSavedBye: a client posts more writes than the ring
// holds; the server runs some, parks on the next and ends the connection
// with a saved Bye. UnrunPosted names exactly the writes that did not run,
// in order — the ring's slots of some of them were reused by later ones —
// and a synchronous read waiting at the end is left to its caller.
func TestUnrunPostedAfterSavedBye(t *testing.T) {
	for _, withRead := range []bool{false, true} {
		name := "posted only"
		if withRead {
			name = "read waiting last"
		}
		t.Run(name, func(t *testing.T) {
			path := t.TempDir() + "/s"
			l, err := Listen(path, &ListenOptions{RequestEntries: 8, ResponseEntries: 4})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			h := &parkingRegs{regs: *newRegs(), ranLimit: 5, blocked: make(chan struct{}), release: make(chan struct{})}
			served := make(chan error, 1)
			go func() {
				p, err := l.Accept(ctx)
				if err != nil {
					served <- err
					return
				}
				sc, err := p.Accept(Welcome{VGPU: 1, VRAMSize: 1 << 20, Channels: 4}, nil)
				if err != nil {
					served <- err
					return
				}
				go func() {
					<-h.blocked
					sc.End(ByeSaved + "test save")
					time.Sleep(20 * time.Millisecond) // the client queues on meanwhile
					close(h.release)
				}()
				served <- sc.Serve(ctx, h)
				sc.Close()
			}()
			c, _, _, err := Dial(ctx, path, testHello("g", TransportShm), testRAM(t, 1<<20), nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if !c.ReplaysPosted() {
				t.Fatal("the server does not offer req_done")
			}
			var queued []uint32
			for v := uint32(0); v < 40; v++ {
				if err := c.Write32(0, uint64(4*v), v); err != nil {
					break
				}
				queued = append(queued, v)
			}
			if withRead {
				if _, err := c.Read32(0, 0); !IsSavedBye(err) {
					t.Fatalf("read: %v, want the saved Bye", err)
				}
			}
			<-served
			for c.Err() == nil {
				time.Sleep(time.Millisecond)
			}
			if _, err := c.Read32(0, 0); !IsSavedBye(err) {
				t.Fatalf("after the Bye: %v, want the saved Bye", err)
			}
			unrun, err := c.UnrunPosted()
			if err != nil {
				t.Fatal(err)
			}
			ran := h.writes
			if len(ran) != 5 {
				t.Fatalf("the server ran %d writes, want 5", len(ran))
			}
			if len(ran)+len(unrun) != len(queued) {
				t.Fatalf("ran %d + unrun %d != queued %d", len(ran), len(unrun), len(queued))
			}
			if len(queued) <= 8 {
				t.Fatalf("only %d writes queued: the ring's slots were never reused", len(queued))
			}
			for i, w := range unrun {
				v := queued[len(ran)+i]
				if w.BAR != 0 || w.Off != uint64(4*v) || w.Value != v {
					t.Fatalf("unrun[%d] = %+v, want bar 0 off %#x value %d", i, w, 4*v, v)
				}
			}
		})
	}
}

// TestUnrunPostedRefusals: on a live connection, and on the socket
// transport (which has no req_done), it fails.
func TestUnrunPostedRefusals(t *testing.T) {
	ts := startServer(t, nil)
	c, _, _ := dialTest(t, ts, "g", TransportShm, nil)
	if _, err := c.UnrunPosted(); err == nil {
		t.Error("a live connection's unrun writes were listed")
	}
	s, _, _ := dialTest(t, ts, "h", TransportSocket, nil)
	if s.ReplaysPosted() {
		t.Error("the socket transport claims req_done")
	}
	s.Close()
	if _, err := s.UnrunPosted(); err == nil {
		t.Error("the socket transport listed unrun writes")
	}
}
