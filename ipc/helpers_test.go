package ipc

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// regs is a test Handler: a register file per BAR plus a log of writes.
type regs struct {
	mu     sync.Mutex
	m      map[[2]uint64]uint32
	writes []uint32     // values written, in arrival order
	delay  atomic.Int64 // ns, for Call op 2
	fail   error        // returned by every op once set
	// writeLimit, if set, fails every write after that many (a vGPU torn
	// down in the middle of a fill).
	writeLimit int
}

func newRegs() *regs { return &regs{m: make(map[[2]uint64]uint32)} }

func (r *regs) Read32(bar int, off uint64) (uint32, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return 0, r.fail
	}
	return r.m[[2]uint64{uint64(bar), off}], nil
}

func (r *regs) Write32(bar int, off uint64, v uint32) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return r.fail
	}
	if r.writeLimit > 0 && len(r.writes) >= r.writeLimit {
		return errors.New("torn down")
	}
	r.m[[2]uint64{uint64(bar), off}] = v
	r.writes = append(r.writes, v)
	return nil
}

// Call: op 1 returns args+1 and status len(args); op 2 sleeps r.delay;
// op 0xDEAD fails.
func (r *regs) Call(op uint16, args []uint64) (CallResult, error) {
	var res CallResult
	switch op {
	case 1:
		for i, a := range args {
			res.Result[i] = a + 1
		}
		res.Status = int32(len(args))
	case 2:
		time.Sleep(time.Duration(r.delay.Load()))
	case 0xDEAD:
		return res, errors.New("op 0xdead always fails")
	default:
		res.Status = -38 // -ENOSYS
	}
	return res, nil
}

// testServer accepts every connection and serves it with its own regs.
type testServer struct {
	t    testing.TB
	l    *Listener
	path string
	ctx  context.Context

	mu    sync.Mutex
	conns []*served
	next  chan *served
}

type served struct {
	sc   *ServerConn
	h    *regs
	err  error
	done chan struct{}
}

func startServer(t testing.TB, opts *ListenOptions) *testServer {
	t.Helper()
	path := filepath.Join(t.TempDir(), "agg.sock")
	l, err := Listen(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ts := &testServer{t: t, l: l, path: path, ctx: ctx, next: make(chan *served, 16)}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for id := uint32(1); ; id++ {
			p, err := l.Accept(ctx)
			if err != nil {
				return
			}
			if p.Hello().Mode == "reject-me" {
				p.Reject("mode reject-me is not supported here")
				continue
			}
			sc, err := p.Accept(Welcome{VGPU: id, VRAMSize: 1 << 30, Channels: 32,
				Params: map[string]string{"scheduler": "band", "name": p.Hello().Name}}, nil)
			if err != nil {
				t.Errorf("accept: %v", err)
				continue
			}
			s := &served{sc: sc, h: newRegs(), done: make(chan struct{})}
			ts.mu.Lock()
			ts.conns = append(ts.conns, s)
			ts.mu.Unlock()
			ts.next <- s
			wg.Add(1)
			go func() {
				defer wg.Done()
				s.err = sc.Serve(ctx, s.h)
				sc.Close()
				close(s.done)
			}()
		}
	}()
	t.Cleanup(func() {
		cancel()
		l.Close()
		wg.Wait()
	})
	return ts
}

// accepted returns the next served connection.
func (ts *testServer) accepted() *served {
	ts.t.Helper()
	select {
	case s := <-ts.next:
		return s
	case <-time.After(10 * time.Second):
		ts.t.Fatal("no connection accepted")
	}
	return nil
}

// wait waits for Serve to return and returns its error.
func (s *served) wait(t testing.TB) error {
	t.Helper()
	select {
	case <-s.done:
		return s.err
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return")
	}
	return nil
}

func testRAM(t testing.TB, size uint64) *os.File {
	t.Helper()
	f, err := CreateMemfd("test-ram", size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func testHello(name string, tr Transport) Hello {
	return Hello{DomID: 7, Name: name, Mode: "fv-optimized", RAMSize: 1 << 20, Transport: tr}
}

func dialTest(t testing.TB, ts *testServer, name string, tr Transport, opts *DialOptions) (*Client, Welcome, *served) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, w, files, err := Dial(ctx, ts.path, testHello(name, tr), testRAM(t, 1<<20), nil, opts)
	if err != nil {
		t.Fatal(err)
	}
	closeFiles(files)
	t.Cleanup(func() { c.Close() })
	return c, w, ts.accepted()
}

var transports = []Transport{TransportShm, TransportSocket}

func forTransports(t *testing.T, f func(t *testing.T, tr Transport)) {
	for _, tr := range transports {
		t.Run(tr.String(), func(t *testing.T) { f(t, tr) })
	}
}

func wantErrContains(t testing.TB, err error, sub string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got nil error, want one containing %q", sub)
	}
	if !strings.Contains(err.Error(), sub) {
		t.Fatalf("error %q does not contain %q", err, sub)
	}
}

// checkHonest runs a few operations on an honest connection.
func checkHonest(t testing.TB, c *Client) {
	t.Helper()
	for i := uint32(0); i < 50; i++ {
		if err := c.Write32(0, 0x1700, i); err != nil {
			t.Fatalf("honest write: %v", err)
		}
		v, err := c.Read32(0, 0x1700)
		if err != nil || v != i {
			t.Fatalf("honest read = %#x, %v; want %#x", v, err, i)
		}
	}
}

// rawConnect sends a crafted Hello with fds and returns the server's answer.
func rawHello(t testing.TB, path string, b []byte, fds []int) (reply []byte) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if err := unix.Sendmsg(fd, b, oob, nil, unix.MSG_NOSIGNAL); err != nil {
		t.Fatalf("sendmsg: %v", err)
	}
	tv := unix.NsecToTimeval(int64(10 * time.Second))
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	buf := make([]byte, 4096)
	n, _, _, _, err := unix.Recvmsg(fd, buf, nil, 0)
	if err != nil {
		t.Fatalf("recvmsg: %v", err)
	}
	return buf[:n]
}

func memfdFd(t testing.TB, size uint64, seals int) int {
	t.Helper()
	f, err := createSealedMemfd("t", size, seals)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return int(f.Fd())
}
