package ipc

import (
	"context"
	"errors"
	"fmt"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestRoundTrip(t *testing.T) {
	forTransports(t, func(t *testing.T, tr Transport) {
		ts := startServer(t, nil)
		c, w, s := dialTest(t, ts, "vm1", tr, nil)
		if w.VGPU == 0 || w.VRAMSize != 1<<30 || w.Channels != 32 || w.Params["scheduler"] != "band" || w.Params["name"] != "vm1" {
			t.Fatalf("welcome = %+v", w)
		}
		if c.Transport() != tr {
			t.Fatalf("transport %v, want %v", c.Transport(), tr)
		}
		cases := []struct {
			bar int
			off uint64
		}{{0, 0}, {0, 0x1700}, {0, 32<<20 - 4}, {1, 0x2000}, {1, 128<<20 - 4}, {3, 0x10}, {3, 16<<20 - 4}, {5, 0}, {5, 124}}
		for i, cs := range cases {
			v := uint32(0xA5A50000 + i)
			if err := c.Write32(cs.bar, cs.off, v); err != nil {
				t.Fatal(err)
			}
			got, err := c.Read32(cs.bar, cs.off)
			if err != nil || got != v {
				t.Fatalf("BAR%d+%#x: read %#x, %v; want %#x", cs.bar, cs.off, got, err, v)
			}
		}
		r, err := c.Call(1, 10, 20, 30, 40, 50, 60)
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != 6 || r.Result != [6]uint64{11, 21, 31, 41, 51, 61} {
			t.Fatalf("call = %+v", r)
		}
		r, err = c.Call(1)
		if err != nil || r.Status != 0 || r.Result != [6]uint64{} {
			t.Fatalf("call() = %+v, %v", r, err)
		}
		r, err = c.Call(77, 1)
		if err != nil || r.Status != -38 {
			t.Fatalf("call(77) = %+v, %v", r, err)
		}
		// Client-side argument checks do not hurt the connection.
		if _, err := c.Call(1, 1, 2, 3, 4, 5, 6, 7); err == nil {
			t.Fatal("7 call args accepted")
		}
		for _, bad := range []struct {
			bar int
			off uint64
		}{{2, 0}, {4, 0}, {6, 0}, {-1, 0}, {0, 2}, {0, 32 << 20}, {5, 128}, {1, 1<<64 - 4}} {
			if err := c.Write32(bad.bar, bad.off, 1); err == nil {
				t.Fatalf("write BAR%d+%#x accepted", bad.bar, bad.off)
			}
			if v, err := c.Read32(bad.bar, bad.off); err == nil || v != 0xFFFFFFFF {
				t.Fatalf("read BAR%d+%#x = %#x, %v", bad.bar, bad.off, v, err)
			}
		}
		checkHonest(t, c)
		if c.Err() != nil {
			t.Fatal(c.Err())
		}
		c.Close()
		if err := s.wait(t); !errors.Is(err, ErrPeerClosed) {
			t.Fatalf("Serve = %v, want ErrPeerClosed", err)
		}
		if _, err := c.Read32(0, 0); !errors.Is(err, ErrClosed) {
			t.Fatalf("read after close: %v", err)
		}
	})
}

// TestOrdering interleaves posted writes and reads from several goroutines:
// every read must observe every earlier write of the connection, and the
// handler must see each goroutine's writes in issue order.
func TestOrdering(t *testing.T) {
	forTransports(t, func(t *testing.T, tr Transport) {
		// Small rings so that the request ring fills and wraps often.
		ts := startServer(t, &ListenOptions{RequestEntries: 4, ResponseEntries: 2, Spin: 50})
		c, _, s := dialTest(t, ts, "order", tr, &DialOptions{Spin: 50})
		const G, N = 4, 2000
		var wg sync.WaitGroup
		errs := make(chan error, G)
		for g := 0; g < G; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				off := uint64(0x1000 + 4*g)
				for i := 1; i <= N; i++ {
					v := uint32(g<<24 | i)
					if err := c.Write32(0, off, v); err != nil {
						errs <- err
						return
					}
					if i%3 == 0 {
						got, err := c.Read32(0, off)
						if err != nil {
							errs <- err
							return
						}
						if got != v {
							errs <- fmt.Errorf("goroutine %d: read %#x after writing %#x", g, got, v)
							return
						}
					}
				}
			}(g)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		// A final read is ordered after everything: the handler has all writes.
		if _, err := c.Read32(0, 0); err != nil {
			t.Fatal(err)
		}
		s.h.mu.Lock()
		writes := append([]uint32(nil), s.h.writes...)
		s.h.mu.Unlock()
		if len(writes) != G*N {
			t.Fatalf("handler saw %d writes, want %d", len(writes), G*N)
		}
		last := make([]int, G)
		for _, v := range writes {
			g, i := int(v>>24), int(v&0xFFFFFF)
			if i != last[g]+1 {
				t.Fatalf("goroutine %d: write %d arrived after %d", g, i, last[g])
			}
			last[g] = i
		}
	})
}

func TestReject(t *testing.T) {
	forTransports(t, func(t *testing.T, tr Transport) {
		ts := startServer(t, nil)
		h := testHello("vm", tr)
		h.Mode = "reject-me"
		_, _, _, err := Dial(context.Background(), ts.path, h, testRAM(t, 1<<20), nil, nil)
		var re *RejectedError
		if !errors.As(err, &re) || re.Reason != "mode reject-me is not supported here" {
			t.Fatalf("Dial = %v, want RejectedError with the aggregator's reason", err)
		}
		c, _, _ := dialTest(t, ts, "after", tr, nil)
		checkHonest(t, c)
	})
}

func TestExtraFiles(t *testing.T) {
	forTransports(t, func(t *testing.T, tr Transport) {
		path := t.TempDir() + "/x.sock"
		l, err := Listen(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		vram := testRAM(t, 8192)
		vram.WriteAt([]byte("vram!"), 0)
		got := make(chan string, 1)
		go func() {
			p, err := l.Accept(context.Background())
			if err != nil {
				got <- err.Error()
				return
			}
			var s string
			for _, f := range p.Extra() {
				b := make([]byte, 3)
				f.ReadAt(b, 0)
				s += string(b)
			}
			sc, err := p.Accept(Welcome{VGPU: 9}, []*os.File{vram, vram})
			if err != nil {
				got <- err.Error()
				return
			}
			defer sc.Close()
			got <- s
			sc.Serve(context.Background(), newRegs())
		}()
		var mine []*os.File
		for i := 0; i < MaxExtraFiles; i++ {
			f := testRAM(t, 4096)
			f.WriteAt([]byte(fmt.Sprintf("f%d.", i)), 0)
			mine = append(mine, f)
		}
		c, w, files, err := Dial(context.Background(), path, testHello("x", tr), testRAM(t, 1<<20), mine, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if s := <-got; s != "f0.f1.f2.f3.f4.f5.f6.f7." {
			t.Fatalf("server saw extra files %q", s)
		}
		if w.VGPU != 9 || len(files) != 2 {
			t.Fatalf("welcome %+v, %d files", w, len(files))
		}
		for _, f := range files {
			b := make([]byte, 5)
			f.ReadAt(b, 0)
			if string(b) != "vram!" {
				t.Fatalf("extra file reads %q", b)
			}
			f.Close()
		}
		if _, _, _, err := Dial(context.Background(), path, testHello("x", tr), testRAM(t, 1<<20), append(mine, mine[0]), nil); err == nil {
			t.Fatal("9 extra files accepted")
		}
	})
}

// TestHandshakeValidation sends crafted Hellos; each must be refused with a
// descriptive reason that reaches the client and the server's hook.
func TestHandshakeValidation(t *testing.T) {
	hookErrs := make(chan error, 64)
	ts := startServer(t, &ListenOptions{OnHandshakeError: func(err error) { hookErrs <- err }, HandshakeTimeout: 2 * time.Second})
	good := testHello("vm-1", TransportShm)
	good.Version = ProtocolVersion
	enc := func(mut func(h *Hello), nExtra int) []byte {
		h := good
		if mut != nil {
			mut(&h)
		}
		return encodeHello(&h, nExtra)
	}
	patch := func(b []byte, off int, v ...byte) []byte {
		b = append([]byte(nil), b...)
		copy(b[off:], v)
		return b
	}
	ram := memfdFd(t, 1<<20, unix.F_SEAL_SHRINK)
	small := memfdFd(t, 1<<19, unix.F_SEAL_SHRINK)
	unsealed := memfdFd(t, 1<<20, 0)
	growOnly := memfdFd(t, 1<<20, unix.F_SEAL_GROW)
	writeSealed := memfdFd(t, 1<<20, unix.F_SEAL_SHRINK|unix.F_SEAL_WRITE)
	regular, err := os.CreateTemp(t.TempDir(), "ram")
	if err != nil {
		t.Fatal(err)
	}
	regular.Truncate(1 << 20)
	defer regular.Close()
	rdonly, err := os.Open(fmt.Sprintf("/proc/self/fd/%d", ram))
	if err != nil {
		t.Fatal(err)
	}
	defer rdonly.Close()
	pr, pw, _ := os.Pipe()
	defer pr.Close()
	defer pw.Close()

	cases := []struct {
		name string
		msg  []byte
		fds  []int
		want string
	}{
		{"bad version", patch(enc(nil, 0), 6, 2, 0), []int{ram}, "unsupported protocol version 2"},
		{"bad magic", patch(enc(nil, 0), 0, 'X'), []int{ram}, "bad magic"},
		{"not a hello", patch(enc(nil, 0), 4, 2), []int{ram}, "got welcome, want hello"},
		{"truncated", enc(nil, 0)[:100], []int{ram}, "hello is 100 bytes, want 128"},
		{"tiny", []byte{1, 2, 3}, []int{ram}, "truncated hello"},
		{"oversized", append(enc(nil, 0), make([]byte, 2000)...), []int{ram}, "oversized hello"},
		{"garbage", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), []int{ram}, "bad magic"},
		{"domid 0", enc(func(h *Hello) { h.DomID = 0 }, 0), []int{ram}, "domain id 0"},
		{"domid reserved", enc(func(h *Hello) { h.DomID = 0x7FF0 }, 0), []int{ram}, "domain id 32752"},
		{"empty name", enc(func(h *Hello) { h.Name = "" }, 0), []int{ram}, "domain name length 0"},
		{"name slash", enc(func(h *Hello) { h.Name = "a/b" }, 0), []int{ram}, "without '/'"},
		{"name control", enc(func(h *Hello) { h.Name = "a\nb" }, 0), []int{ram}, "printable"},
		{"name too long", patch(enc(nil, 0), 24, 65), []int{ram}, "domain name length 65"},
		{"name padding", patch(enc(nil, 0), 90, 'x'), []int{ram}, "name padding"},
		{"empty mode", enc(func(h *Hello) { h.Mode = "" }, 0), []int{ram}, "mode length 0"},
		{"mode charset", enc(func(h *Hello) { h.Mode = "FV naive" }, 0), []int{ram}, "mode byte 0"},
		{"mode too long", patch(enc(nil, 0), 25, 33), []int{ram}, "mode length 33"},
		{"reserved", patch(enc(nil, 0), 29, 1), []int{ram}, "reserved"},
		{"unknown flag", patch(enc(nil, 0), 28, 4), []int{ram}, "unknown flags 0x4"},
		{"ram not page multiple", enc(func(h *Hello) { h.RAMSize = 1<<20 + 1 }, 0), []int{ram}, "RAM size"},
		{"ram too small", enc(func(h *Hello) { h.RAMSize = 4096 }, 0), []int{ram}, "RAM size 4096"},
		{"ram too large", enc(func(h *Hello) { h.RAMSize = 128 << 30 }, 0), []int{ram}, "RAM size"},
		{"bad transport", enc(func(h *Hello) { h.Transport = 3 }, 0), []int{ram}, "unknown transport 3"},
		{"bad RAM source", patch(enc(nil, 0), 27, 2), []int{ram}, "unknown RAM source 2"},
		{"xen RAM with a RAM fd", enc(func(h *Hello) { h.RAMSource = RAMXen }, 0), []int{ram}, "announces 0 fds but carries 1"},
		{"missing fd", enc(nil, 0), nil, "no guest RAM fd"},
		{"fd count mismatch", enc(nil, 2), []int{ram, ram}, "announces 1+2 fds but carries 2"},
		{"too many extra announced", patch(enc(nil, 0), 26, 9), []int{ram}, "9 extra fds"},
		{"too many fds", enc(nil, 8), []int{ram, ram, ram, ram, ram, ram, ram, ram, ram, ram}, "too many fds"},
		{"regular file", enc(nil, 0), []int{int(regular.Fd())}, "not a memfd"},
		{"pipe", enc(nil, 0), []int{int(pr.Fd())}, "not a memfd"},
		{"unsealed memfd", enc(nil, 0), []int{unsealed}, "not sealed with F_SEAL_SHRINK"},
		{"grow-sealed only", enc(nil, 0), []int{growOnly}, "not sealed with F_SEAL_SHRINK"},
		{"write-sealed", enc(nil, 0), []int{writeSealed}, "sealed against writing"},
		{"read-only fd", enc(nil, 0), []int{int(rdonly.Fd())}, "not open read-write"},
		{"memfd too small", enc(nil, 0), []int{small}, "memfd is 524288 bytes, need at least 1048576"},
	}
	for _, cs := range cases {
		t.Run(cs.name, func(t *testing.T) {
			reply := rawHello(t, ts.path, cs.msg, cs.fds)
			reason, err := decodeReason(reply, msgReject)
			if err != nil {
				t.Fatalf("reply is not a reject: %v", err)
			}
			wantErrContains(t, errors.New(reason), cs.want)
			select {
			case herr := <-hookErrs:
				wantErrContains(t, herr, cs.want)
			case <-time.After(5 * time.Second):
				t.Fatal("OnHandshakeError not called")
			}
		})
	}
	// The server never accepted any of them; an honest client still works.
	c, _, _ := dialTest(t, ts, "honest", TransportShm, nil)
	checkHonest(t, c)

	// Through Dial: a version the server does not speak is its to report.
	h := good
	h.Version = 99
	_, _, _, err = Dial(context.Background(), ts.path, h, testRAM(t, 1<<20), nil, nil)
	var re *RejectedError
	if !errors.As(err, &re) {
		t.Fatalf("Dial with version 99: %v", err)
	}
	wantErrContains(t, err, "unsupported protocol version 99")
	<-hookErrs
	// Dial checks the other fields locally, before connecting.
	for _, mut := range []func(h *Hello){
		func(h *Hello) { h.Name = "" }, func(h *Hello) { h.Mode = "x y" },
		func(h *Hello) { h.RAMSize = 12345 }, func(h *Hello) { h.DomID = 0 },
	} {
		h := good
		mut(&h)
		if _, _, _, err := Dial(context.Background(), ts.path, h, testRAM(t, 1<<20), nil, nil); err == nil {
			t.Fatalf("Dial accepted %+v", h)
		}
	}
	if _, _, _, err := Dial(context.Background(), ts.path, good, nil, nil, nil); err == nil {
		t.Fatal("Dial without RAM accepted")
	}
	xh := good
	xh.RAMSource = RAMXen
	if _, _, _, err := Dial(context.Background(), ts.path, xh, testRAM(t, 1<<20), nil, nil); err == nil {
		t.Fatal("Dial with a RAM file and the RAM of a Xen domain accepted")
	}
	// A memfd without the shrink seal is refused by the server.
	f, _ := createSealedMemfd("unsealed", 1<<20, 0)
	defer f.Close()
	_, _, _, err = Dial(context.Background(), ts.path, good, f, nil, nil)
	wantErrContains(t, err, "F_SEAL_SHRINK")
}

// TestXenRAMHello: a device model whose guest RAM is the Xen domain's own
// sends no RAM fd; its extra fds arrive as extras, and the server sees the
// source to map the domain's frames.
func TestXenRAMHello(t *testing.T) {
	path := t.TempDir() + "/x.sock"
	l, err := Listen(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	type seen struct {
		h     Hello
		ram   bool
		extra string
		err   error
	}
	got := make(chan seen, 1)
	go func() {
		p, err := l.Accept(context.Background())
		if err != nil {
			got <- seen{err: err}
			return
		}
		s := seen{h: p.Hello(), ram: p.RAM() != nil}
		for _, f := range p.Extra() {
			b := make([]byte, 4)
			f.ReadAt(b, 0)
			s.extra += string(b)
		}
		sc, err := p.Accept(Welcome{VGPU: 3}, nil)
		if err == nil {
			sc.Close()
		}
		s.err = err
		got <- s
	}()
	extra := testRAM(t, 4096)
	extra.WriteAt([]byte("xtra"), 0)
	h := testHello("hvm-1", TransportShm)
	h.RAMSource = RAMXen
	c, w, files, err := Dial(context.Background(), path, h, nil, []*os.File{extra}, nil)
	if err != nil {
		t.Fatal(err)
	}
	closeFiles(files)
	defer c.Close()
	s := <-got
	if s.err != nil {
		t.Fatal(s.err)
	}
	if w.VGPU != 3 || s.h.RAMSource != RAMXen || s.ram || s.extra != "xtra" {
		t.Fatalf("welcome %+v, server saw %+v", w, s)
	}
}

// TestHandshakeTimeout: a client that connects and says nothing is dropped,
// and does not block other handshakes meanwhile.
func TestHandshakeTimeout(t *testing.T) {
	hookErrs := make(chan error, 4)
	ts := startServer(t, &ListenOptions{HandshakeTimeout: 300 * time.Millisecond, OnHandshakeError: func(err error) { hookErrs <- err }})
	fd, _ := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET, 0)
	defer unix.Close(fd)
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: ts.path}); err != nil {
		t.Fatal(err)
	}
	c, _, _ := dialTest(t, ts, "meanwhile", TransportSocket, nil)
	checkHonest(t, c)
	select {
	case err := <-hookErrs:
		wantErrContains(t, err, "reading hello")
	case <-time.After(5 * time.Second):
		t.Fatal("silent client not dropped")
	}
}

func TestListenStaleSocket(t *testing.T) {
	path := t.TempDir() + "/s.sock"
	l, err := Listen(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v, %v; want 0600", fi.Mode(), err)
	}
	if _, err := Listen(path, nil); err == nil {
		t.Fatal("second Listen on a live socket succeeded")
	}
	// Leave a stale socket behind (listener fd closed without unlinking).
	l.ln.Close()
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err)
	}
	l2, err := Listen(path, nil)
	if err != nil {
		t.Fatalf("Listen over stale socket: %v", err)
	}
	l2.Close()
	l.Close()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("socket not removed: %v", err)
	}
	reg := t.TempDir() + "/file"
	os.WriteFile(reg, nil, 0o600)
	if _, err := Listen(reg, nil); err == nil {
		t.Fatal("Listen replaced a regular file")
	}
}

// TestPeerDeath: either side going away ends the other side's calls promptly.
func TestPeerDeath(t *testing.T) {
	forTransports(t, func(t *testing.T, tr Transport) {
		t.Run("client closes", func(t *testing.T) {
			ts := startServer(t, nil)
			c, _, s := dialTest(t, ts, "vm", tr, nil)
			checkHonest(t, c)
			c.Close()
			if err := s.wait(t); !errors.Is(err, ErrPeerClosed) {
				t.Fatalf("Serve = %v", err)
			}
		})
		t.Run("server closes while client waits", func(t *testing.T) {
			ts := startServer(t, nil)
			c, _, s := dialTest(t, ts, "vm", tr, &DialOptions{Spin: 10})
			s.h.delay.Store(int64(300 * time.Millisecond))
			done := make(chan error, 1)
			go func() {
				_, err := c.Call(2) // blocks in the handler
				done <- err
			}()
			time.Sleep(50 * time.Millisecond)
			s.sc.Close()
			select {
			case err := <-done:
				if err == nil {
					// the reply may have raced the close; the next call must fail
					_, err = c.Read32(0, 0)
				}
				if !errors.Is(err, ErrPeerClosed) {
					t.Fatalf("client error %v, want ErrPeerClosed", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("client call hangs after server close")
			}
			for i := 0; i < 3; i++ {
				if err := c.Write32(0, 0, 1); err == nil {
					t.Fatal("write after server close succeeded")
				}
			}
		})
		t.Run("server shutdown", func(t *testing.T) {
			ts := startServer(t, nil)
			c, _, s := dialTest(t, ts, "vm", tr, nil)
			checkHonest(t, c)
			s.sc.Close()
			s.wait(t)
			var err error
			for i := 0; i < 1000 && err == nil; i++ {
				err = c.Write32(0, 4, 1)
			}
			if err == nil {
				_, err = c.Read32(0, 0)
			}
			var be *ByeError
			if !errors.As(err, &be) || !errors.Is(err, ErrPeerClosed) {
				t.Fatalf("client error %v, want ByeError", err)
			}
		})
		t.Run("handler error", func(t *testing.T) {
			ts := startServer(t, nil)
			c, _, s := dialTest(t, ts, "vm", tr, nil)
			_, err := c.Call(0xDEAD)
			wantErrContains(t, err, "op 0xdead always fails")
			var he *HandlerError
			if serr := s.wait(t); !errors.As(serr, &he) || he.Op != "call" {
				t.Fatalf("Serve = %v, want HandlerError", serr)
			}
		})
		t.Run("context cancel", func(t *testing.T) {
			path := t.TempDir() + "/c.sock"
			l, _ := Listen(path, nil)
			defer l.Close()
			ctx, cancel := context.WithCancel(context.Background())
			res := make(chan error, 1)
			go func() {
				p, err := l.Accept(context.Background())
				if err != nil {
					res <- err
					return
				}
				sc, err := p.Accept(Welcome{}, nil)
				if err != nil {
					res <- err
					return
				}
				defer sc.Close()
				res <- sc.Serve(ctx, newRegs())
			}()
			c, _, _, err := Dial(context.Background(), path, testHello("vm", tr), testRAM(t, 1<<20), nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			checkHonest(t, c)
			cancel()
			if err := <-res; !errors.Is(err, context.Canceled) {
				t.Fatalf("Serve = %v, want context.Canceled", err)
			}
			_, err = c.Read32(0, 0)
			wantErrContains(t, err, "server shutting down")
		})
	})
}

// TestSocketFrames: malformed frames on the socket transport each end only
// their own connection, with a descriptive error on both sides.
func TestSocketFrames(t *testing.T) {
	ts := startServer(t, nil)
	honest, _, _ := dialTest(t, ts, "honest", TransportSocket, nil)
	good := make([]byte, EntrySize)
	encodeRequest(good, &request{kind: kindRead32, bar: 0, off: 0x100, seq: 1})
	mod := func(f func(b []byte)) []byte {
		b := append([]byte(nil), good...)
		f(b)
		return b
	}
	cases := []struct {
		name  string
		frame []byte
		fds   bool
		want  string
	}{
		{"truncated", good[:40], false, "truncated frame (40 bytes"},
		{"oversized", append(append([]byte(nil), good...), make([]byte, 100)...), false, "oversized frame"},
		{"one byte over", append(append([]byte(nil), good...), 0), false, "oversized frame"},
		{"garbage", []byte(strings.Repeat("\xff\xfe garbage", 8))[:64], false, "unknown request kind"},
		{"unknown kind", mod(func(b []byte) { b[0] = 9 }), false, "unknown request kind 9"},
		{"bad bar", mod(func(b []byte) { b[2] = 2 }), false, "bad BAR 2"},
		{"bar 4", mod(func(b []byte) { b[2] = 4 }), false, "bad BAR 4"},
		{"unaligned", mod(func(b []byte) { b[16] = 0x2 }), false, "not 4-byte aligned"},
		{"beyond bar", mod(func(b []byte) { le.PutUint64(b[16:], 32<<20) }), false, "beyond BAR size"},
		{"huge offset", mod(func(b []byte) { le.PutUint64(b[16:], 1<<64-4) }), false, "beyond BAR size"},
		{"read with value", mod(func(b []byte) { b[8] = 1 }), false, "value field"},
		{"reserved", mod(func(b []byte) { b[12] = 1 }), false, "reserved"},
		{"trailing bytes", mod(func(b []byte) { b[40] = 1 }), false, "must be zero"},
		{"too many args", mod(func(b []byte) { b[0] = kindCall; b[8] = 7 }), false, "7 arguments"},
		{"unused arg", mod(func(b []byte) { b[0] = kindCall; b[8] = 1; le.PutUint64(b[16:], 0); b[30] = 1 }), false, "unused argument 1"},
		{"fds attached", good, true, "ancillary data"},
	}
	for _, cs := range cases {
		t.Run(cs.name, func(t *testing.T) {
			c, _, s := dialTest(t, ts, "evil", TransportSocket, nil)
			var oob []byte
			if cs.fds {
				oob = unix.UnixRights(int(testRAM(t, 4096).Fd()))
			}
			if _, _, err := c.conn.WriteMsgUnix(cs.frame, oob, nil); err != nil {
				t.Fatal(err)
			}
			err := s.wait(t)
			if !errors.Is(err, ErrProtocolViolation) {
				t.Fatalf("Serve = %v, want a protocol violation", err)
			}
			wantErrContains(t, err, cs.want)
			// The client is told why.
			var rsp response
			rerr := c.recvSocket(&rsp)
			var be *ByeError
			if !errors.As(rerr, &be) {
				t.Fatalf("client got %v, want a Bye", rerr)
			}
			wantErrContains(t, rerr, cs.want)
			checkHonest(t, honest)
		})
	}
}

// TestSocketFlood: a client that floods requests without reading replies
// blocks only its own connection; the server neither grows nor stalls others.
func TestSocketFlood(t *testing.T) {
	ts := startServer(t, nil)
	honest, _, _ := dialTest(t, ts, "honest", TransportSocket, nil)
	c, _, s := dialTest(t, ts, "flood", TransportSocket, nil)
	frame := make([]byte, EntrySize)
	encodeRequest(frame, &request{kind: kindRead32, off: 0})
	c.conn.SetWriteDeadline(time.Now().Add(500 * time.Millisecond))
	sent := 0
	for {
		if _, err := c.conn.Write(frame); err != nil {
			break // socket buffers full: the server stopped reading
		}
		sent++
	}
	if sent == 0 {
		t.Fatal("nothing sent")
	}
	checkHonest(t, honest)
	c.conn.Close()
	if err := s.wait(t); !errors.Is(err, ErrPeerClosed) {
		t.Fatalf("Serve = %v", err)
	}
	checkHonest(t, honest)
}

func TestCloseListener(t *testing.T) {
	path := t.TempDir() + "/l.sock"
	l, err := Listen(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := l.Accept(context.Background())
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	l.Close()
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("Accept after Close = %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := l.Accept(ctx); err == nil {
		t.Fatal("Accept on closed listener succeeded")
	}
}

func TestDialContext(t *testing.T) {
	path := t.TempDir() + "/d.sock"
	l, err := Listen(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// Nobody calls Accept: the handshake waits; ctx must bound it.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, _, _, err = Dial(ctx, path, testHello("vm", TransportShm), testRAM(t, 1<<20), nil, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Dial = %v, want deadline exceeded", err)
	}
	if time.Since(start) > 3*time.Second {
		t.Fatal("Dial ignored its context")
	}
	_ = io.EOF
}

// TestWrite32Sync: a synchronous write returns only once the server has
// handled it (its value is in the handler's register file when the call
// returns, without a read to order it), on both transports; a handler
// failure on it ends the connection.
func TestWrite32Sync(t *testing.T) {
	forTransports(t, func(t *testing.T, tr Transport) {
		ts := startServer(t, nil)
		c, _, s := dialTest(t, ts, "vm1", tr, nil)
		for i := range 200 {
			v := uint32(0x5E000000 + i)
			if err := c.Write32Sync(0, 0x1700, v); err != nil {
				t.Fatal(err)
			}
			s.h.mu.Lock()
			got := s.h.m[[2]uint64{0, 0x1700}]
			s.h.mu.Unlock()
			if got != v {
				t.Fatalf("write %d: Write32Sync returned before the server handled it (register %#x, want %#x)", i, got, v)
			}
		}
		if err := c.Write32Sync(0, 3, 1); err == nil {
			t.Fatal("unaligned sync write accepted")
		}
		s.h.mu.Lock()
		s.h.fail = errors.New("handler broke")
		s.h.mu.Unlock()
		if err := c.Write32Sync(0, 0, 1); err == nil {
			t.Fatal("sync write succeeded although the handler failed")
		}
	})
}

// TestFill32: a fill stores its value to every word of the span through
// the handler, in order, and returns only once they are all stored, on both
// transports. Bad spans are refused by the client, and by the server when a
// hostile client sends them anyway; a handler failure ends the connection.
func TestFill32(t *testing.T) {
	forTransports(t, func(t *testing.T, tr Transport) {
		ts := startServer(t, nil)
		c, _, s := dialTest(t, ts, "vm1", tr, nil)
		if err := c.Write32(1, 0x10, 7); err != nil { // posted, then the fill after it
			t.Fatal(err)
		}
		if err := c.Fill32(1, 0x10, 0xF111, MaxFillCount); err != nil {
			t.Fatal(err)
		}
		s.h.mu.Lock()
		for i := range uint64(MaxFillCount) {
			if got := s.h.m[[2]uint64{1, 0x10 + 4*i}]; got != 0xF111 {
				t.Fatalf("word %d after the fill: %#x", i, got)
			}
		}
		if n := len(s.h.writes); n != 1+MaxFillCount {
			t.Fatalf("%d writes reached the handler, want %d", n, 1+MaxFillCount)
		}
		s.h.mu.Unlock()
		last := nvc0.BARSize(3) - 4
		for _, bad := range []struct {
			bar int
			off uint64
			n   int
		}{{1, 0, 0}, {1, 0, MaxFillCount + 1}, {1, 2, 4}, {3, last, 2}, {2, 0, 1}} {
			if err := c.Fill32(bad.bar, bad.off, 1, bad.n); err == nil {
				t.Errorf("fill of %d words at BAR%d+%#x accepted", bad.n, bad.bar, bad.off)
			}
		}
		if err := c.Fill32(3, last, 9, 1); err != nil {
			t.Fatalf("a one-word fill of the BAR's last word: %v", err)
		}
		s.h.mu.Lock()
		s.h.fail = errors.New("handler broke")
		s.h.mu.Unlock()
		if err := c.Fill32(1, 0, 1, 2); err == nil {
			t.Fatal("fill succeeded although the handler failed")
		}
	})
}

// TestFill32TornDown: a handler that fails in the middle of a fill (the
// vGPU torn down while the fill runs) stops it at that word: nothing is
// stored after the failure, the client gets an error, and the connection
// ends.
func TestFill32TornDown(t *testing.T) {
	forTransports(t, func(t *testing.T, tr Transport) {
		ts := startServer(t, nil)
		c, _, s := dialTest(t, ts, "vm1", tr, nil)
		s.h.mu.Lock()
		s.h.writeLimit = 100
		s.h.mu.Unlock()
		if err := c.Fill32(1, 0, 7, MaxFillCount); err == nil {
			t.Fatal("a fill the handler failed in the middle returned no error")
		}
		s.h.mu.Lock()
		n := len(s.h.writes)
		_, past := s.h.m[[2]uint64{1, 4 * 100}]
		s.h.mu.Unlock()
		if n != 100 || past {
			t.Fatalf("%d words stored (word 100 stored: %v), want the 100 before the failure", n, past)
		}
		if err := c.Write32Sync(1, 0, 1); err == nil {
			t.Fatal("the connection outlived a failed fill")
		}
	})
}

// TestFill32Decode: the server refuses fills the client would not send.
func TestFill32Decode(t *testing.T) {
	enc := func(r request) []byte {
		b := make([]byte, EntrySize)
		encodeRequest(b, &r)
		return b
	}
	last := nvc0.BARSize(1) - 4
	for name, b := range map[string][]byte{
		"count 0":          enc(request{kind: kindFill32, bar: 1, count: 0}),
		"count too large":  enc(request{kind: kindFill32, bar: 1, count: MaxFillCount + 1}),
		"past the BAR":     enc(request{kind: kindFill32, bar: 1, off: last, count: 2}),
		"wrapping":         enc(request{kind: kindFill32, bar: 1, off: ^uint64(3), count: 2}),
		"unaligned":        enc(request{kind: kindFill32, bar: 1, off: 2, count: 1}),
		"no such BAR":      enc(request{kind: kindFill32, bar: 4, count: 1}),
		"trailing garbage": append(enc(request{kind: kindFill32, bar: 1, count: 1})[:EntrySize-1], 1),
	} {
		var r request
		if err := decodeRequest(b, &r); err == nil {
			t.Errorf("%s: accepted %+v", name, r)
		}
	}
	var r request
	if err := decodeRequest(enc(request{kind: kindFill32, bar: 1, off: last, count: 1, value: 5, seq: 9}), &r); err != nil || r.count != 1 || r.value != 5 {
		t.Fatalf("a good fill: %+v, %v", r, err)
	}
}
