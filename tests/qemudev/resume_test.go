package qemudev

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/ipc"
)

// parking is a first daemon's handler: it runs ran writes, then parks on
// the next — a held vGPU's access waiting in the aggregator — until the
// test lets it go, and fails it (the save destroyed the vGPU: the write
// never ran). Reads of PMC_BOOT_0 answer.
type parking struct {
	mu      sync.Mutex
	ran     int
	writes  []uint32
	blocked chan struct{}
	release chan struct{}
	once    sync.Once
}

func (p *parking) Read32(bar int, off uint64) (uint32, error) {
	if bar == nvc0.BAR0 && off == 0 {
		return nvc0.Boot0Value, nil
	}
	return 0, nil
}

func (p *parking) Write32(bar int, off uint64, v uint32) error {
	p.mu.Lock()
	n := len(p.writes)
	if n < p.ran {
		p.writes = append(p.writes, v)
		p.mu.Unlock()
		return nil
	}
	p.mu.Unlock()
	p.once.Do(func() { close(p.blocked) })
	<-p.release
	return errors.New("vGPU destroyed by its save")
}

func (p *parking) Call(uint16, []uint64) (ipc.CallResult, error) { return ipc.CallResult{}, nil }

// resumeServer is a daemon that hands out one vGPU, answers each later
// Hello with next (a Reject reason, or "" to welcome it with welcome
// and serve it with the returned handler), and records the Hellos.
type resumeServer struct {
	sock   string
	mu     sync.Mutex
	hellos []ipc.Hello
	conns  []*ipc.ServerConn
	served chan struct{} // a connection was welcomed
}

func (rs *resumeServer) hello(i int) ipc.Hello {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.hellos[i]
}

func (rs *resumeServer) helloCount() int {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return len(rs.hellos)
}

func (rs *resumeServer) conn(i int) *ipc.ServerConn {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.conns[i]
}

func startResumeServer(t *testing.T, answer func(i int, h ipc.Hello) (reject string, w ipc.Welcome, handler ipc.Handler)) *resumeServer {
	t.Helper()
	rs := &resumeServer{sock: filepath.Join(t.TempDir(), "gpuvm.sock"), served: make(chan struct{}, 8)}
	ln, err := ipc.Listen(rs.sock, &ipc.ListenOptions{HandshakeTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			p, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			rs.mu.Lock()
			rs.hellos = append(rs.hellos, p.Hello())
			rs.mu.Unlock()
			reject, w, h := answer(i, p.Hello())
			if reject != "" {
				p.Reject(reject)
				continue
			}
			sc, err := p.Accept(w, nil)
			if err != nil {
				t.Errorf("accept: %v", err)
				return
			}
			rs.mu.Lock()
			rs.conns = append(rs.conns, sc)
			rs.mu.Unlock()
			rs.served <- struct{}{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				sc.Serve(ctx, h)
				sc.Close()
			}()
		}
	}()
	t.Cleanup(func() {
		cancel()
		ln.Close()
		wg.Wait()
	})
	return rs
}

func (rs *resumeServer) waitServed(t *testing.T) {
	t.Helper()
	select {
	case <-rs.served:
	case <-time.After(10 * time.Second):
		t.Fatal("the device was not welcomed")
	}
}

func resumeWelcome() ipc.Welcome {
	return ipc.Welcome{VGPU: 1, VRAMSize: 256 << 20, Channels: 8, Params: map[string]string{
		ipc.ParamBAR1Size: fmt.Sprint(bar1Size), ipc.ParamBAR3Size: fmt.Sprint(bar3Size)}}
}

// TestResumeRepeatsUnrunPostedWrites: QEMU's device with posted writes
// queues 600 BAR0 writes; the first daemon runs 5, parks on the sixth and
// ends the connection with a saved Bye while the ring is full. The device
// sends a resuming Hello (resume and resumes_handoff set), is told
// no-image once and tries again, is welcomed, and repeats the writes the
// first daemon did not run (req_done, protocol §6.9) before the ones the
// guest goes on with: between the two daemons every write arrives once,
// in order.
func TestResumeRepeatsUnrunPostedWrites(t *testing.T) {
	first := &parking{ran: 5, blocked: make(chan struct{}), release: make(chan struct{})}
	second := &aggregator{regs: map[[2]uint64]uint32{}, ready: make(chan struct{})}
	var order []uint32
	var orderMu sync.Mutex
	rec := &recording{aggregator: second, log: func(v uint32) { orderMu.Lock(); order = append(order, v); orderMu.Unlock() }}
	rs := startResumeServer(t, func(i int, h ipc.Hello) (string, ipc.Welcome, ipc.Handler) {
		switch i {
		case 0:
			return "", resumeWelcome(), first
		case 1:
			return ipc.RejectNoImage + "none waits for domain yet", ipc.Welcome{}, nil
		}
		return "", resumeWelcome(), rec
	})
	q := startQEMU(t, qemuArgs(device(rs.sock, ",posted-writes=on"), true))
	rs.waitServed(t)
	if h := rs.hello(0); h.Resume || !h.ResumesHandoff {
		t.Fatalf("first Hello: resume %v, resumes_handoff %v; want false, true", h.Resume, h.ResumesHandoff)
	}
	q.place(t)
	go func() {
		<-first.blocked
		rs.conn(0).End(ipc.ByeSaved + "saved by the test")
		time.Sleep(20 * time.Millisecond) // the device queues on meanwhile
		close(first.release)
	}()
	const n = 600
	for i := range uint32(n) {
		q.writel(t, bar0Base+0x1000+4*uint64(i%64), i+1)
	}
	if v := q.readl(t, bar0Base); v != nvc0.Boot0Value { // after every write
		t.Fatalf("PMC_BOOT_0 reads %#x after the resume", v)
	}
	if n := rs.helloCount(); n != 3 {
		t.Fatalf("%d Hellos, want 3 (first, no-image, welcomed)", n)
	}
	for i := 1; i < 3; i++ {
		if h := rs.hello(i); !h.Resume || !h.ResumesHandoff || h.DomID != domID || h.Name != vmName || h.Mode != vmMode || h.RAMSize != ramSize {
			t.Errorf("Hello %d: %+v; want a resuming one for the same domain", i, h)
		}
	}
	orderMu.Lock()
	all := append(append([]uint32(nil), first.writes...), order...)
	orderMu.Unlock()
	if len(all) != n {
		t.Fatalf("%d writes arrived (%d on the first daemon), want %d", len(all), len(first.writes), n)
	}
	for i, v := range all {
		if v != uint32(i+1) {
			t.Fatalf("write %d carried %d, want %d (first daemon ran %d)", i, v, i+1, len(first.writes))
		}
	}
	if s := q.stderr.String(); !strings.Contains(s, "gpuvm: resumed on the restored vGPU") || strings.Contains(s, "(0 posted writes repeated)") {
		t.Errorf("QEMU's report: %q", s)
	}
}

// recording is an aggregator handler that also logs each write's value
// in arrival order.
type recording struct {
	*aggregator
	log func(uint32)
}

func (r *recording) Write32(bar int, off uint64, v uint32) error {
	r.log(v)
	return r.aggregator.Write32(bar, off, v)
}

// TestResumeRefused: a resuming Hello refused for good (not no-image), a
// restored vGPU that is not the saved one, or resume-timeout=0 leave a
// device that reads all ones, with a report that says why; with
// resume-timeout=0 the first Hello does not claim to resume after a
// handoff.
func TestResumeRefused(t *testing.T) {
	for _, c := range []struct {
		name, props string
		answer      func(i int) (string, ipc.Welcome)
		report      string
	}{
		{"refused", "", func(int) (string, ipc.Welcome) {
			return "mode fv-naive of the image is not the device's", ipc.Welcome{}
		},
			"did not resume: the aggregator refused the VM: mode fv-naive"},
		{"another vGPU", "", func(int) (string, ipc.Welcome) {
			w := resumeWelcome()
			w.VRAMSize /= 2
			return "", w
		}, "is not the saved one"},
		{"timeout", ",resume-timeout=300", func(int) (string, ipc.Welcome) { return ipc.RejectNoImage + "not yet", ipc.Welcome{} },
			"no daemon restored it for domain 7 within 300 ms"},
		{"off", ",resume-timeout=0", nil, "the aggregator ended the connection: vgpu-saved: "},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := &aggregator{regs: map[[2]uint64]uint32{}, ready: make(chan struct{})}
			rs := startResumeServer(t, func(i int, h ipc.Hello) (string, ipc.Welcome, ipc.Handler) {
				if i == 0 {
					return "", resumeWelcome(), a
				}
				if c.answer == nil {
					t.Errorf("a resuming Hello with resume-timeout=0")
					return "no", ipc.Welcome{}, nil
				}
				r, w := c.answer(i)
				return r, w, a
			})
			q := startQEMU(t, qemuArgs(device(rs.sock, c.props), true))
			rs.waitServed(t)
			if h := rs.hello(0); h.ResumesHandoff != (c.answer != nil) {
				t.Errorf("resumes_handoff %v", h.ResumesHandoff)
			}
			q.place(t)
			if v := q.readl(t, bar0Base); v != nvc0.Boot0Value {
				t.Fatalf("PMC_BOOT_0 reads %#x", v)
			}
			rs.conn(0).End(ipc.ByeSaved + "saved by the test")
			deadline := time.Now().Add(10 * time.Second)
			for q.readl(t, bar0Base) != 0xFFFFFFFF {
				if time.Now().After(deadline) {
					t.Fatal("BAR0 still reads the register 10 s after the saved Bye")
				}
				time.Sleep(10 * time.Millisecond)
			}
			for !strings.Contains(q.stderr.String(), c.report) {
				if time.Now().After(deadline) {
					t.Fatalf("QEMU's report %q lacks %q", q.stderr.String(), c.report)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}
