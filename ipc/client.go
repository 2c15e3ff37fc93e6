package ipc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// DialOptions tune a Client. The zero value (or nil) gives the defaults.
type DialOptions struct {
	// Logger receives the connection's end; nil discards.
	Logger *slog.Logger
	// Spin is how many times the client polls for a response (or for
	// request-ring space) before it sleeps on its futex (default
	// DefaultSpin; negative means never spin).
	Spin int
}

// Client is the device model's end of a connection. It is safe for
// concurrent use: requests are serialized in call order per connection, and a
// Read32 or Call waits for its own reply, so a read observes every write
// issued before it on this Client.
//
// Errors are sticky: after the first transport error (the server hung up, sent
// a Bye, or broke the protocol) or Close, every call returns that error.
// Read32 then returns 0xFFFFFFFF, what a dead PCI device reads as.
type Client struct {
	conn      *net.UnixConn
	transport Transport
	ring      *ringMap
	spin      int
	log       *slog.Logger

	mu      sync.Mutex // serializes requests; guards the fields below
	seq     uint32
	reqProd uint32 // private copies of the indices this side owns
	reqCons uint32 // cached copy of the server's consumer index
	rspCons uint32
	// longSpinOff: the last wait's long spin (await) did not pay, so the
	// next waits sleep after the short spin until one of them ends
	// within longSpin again.
	longSpinOff bool
	out         [EntrySize]byte
	in          [maxPacket]byte

	// irqMu keeps the ring mapped while WaitIRQ sleepers use it: they
	// hold it shared; Close takes it to unmap (irq.go).
	irqMu sync.RWMutex

	rm remapClient // remap updates (remap.go)

	// sent records the last 2N requests queued (replay.go), with a server
	// that publishes req_done; nil otherwise.
	sent []sentEntry

	dead      atomic.Bool
	errMu     sync.Mutex
	err       error
	watchDone chan struct{}
	closeOnce sync.Once
}

// Dial connects to the aggregator at socketPath and performs the handshake:
// it sends hello with ram (the guest RAM memfd: at least hello.RAMSize bytes,
// sealed with F_SEAL_SHRINK — see CreateMemfd) and extra (at most
// MaxExtraFiles) attached, and waits for the Welcome. It returns the Welcome
// and the extra files the server attached, which the caller owns. The caller
// keeps ownership of ram and extra. A refusal is a *RejectedError. With
// hello.RAMSource RAMXen the guest RAM is the Xen domain's own and ram must
// be nil.
//
// hello is validated locally, except Version (zero means ProtocolVersion):
// a version mismatch is the server's to report. ctx bounds the handshake only.
func Dial(ctx context.Context, socketPath string, hello Hello, ram *os.File, extra []*os.File, opts *DialOptions) (*Client, Welcome, []*os.File, error) {
	c, w, files, err := dial(ctx, socketPath, hello, ram, extra, opts)
	if err != nil {
		return nil, Welcome{}, nil, fmt.Errorf("ipc: dial %s: %w", socketPath, err)
	}
	return c, w, files, nil
}

func dial(ctx context.Context, socketPath string, hello Hello, ram *os.File, extra []*os.File, opts *DialOptions) (*Client, Welcome, []*os.File, error) {
	var o DialOptions
	if opts != nil {
		o = *opts
	}
	if o.Spin == 0 {
		o.Spin = DefaultSpin
	} else if o.Spin < 0 {
		o.Spin = 0
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if hello.Version == 0 {
		hello.Version = ProtocolVersion
	}
	hv := hello
	hv.Version = ProtocolVersion
	if err := hv.validate(); err != nil {
		return nil, Welcome{}, nil, fmt.Errorf("invalid hello: %w", err)
	}
	switch {
	case hello.RAMSource == RAMXen && ram != nil:
		return nil, Welcome{}, nil, errors.New("a guest RAM file with the RAM of a Xen domain")
	case hello.RAMSource != RAMXen && ram == nil:
		return nil, Welcome{}, nil, errors.New("no guest RAM file")
	}
	if len(extra) > MaxExtraFiles {
		return nil, Welcome{}, nil, fmt.Errorf("%d extra files, at most %d", len(extra), MaxExtraFiles)
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unixpacket", socketPath)
	if err != nil {
		return nil, Welcome{}, nil, err
	}
	conn := nc.(*net.UnixConn)
	ok := false
	defer func() {
		if !ok {
			conn.Close()
		}
	}()
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	var fds []int
	if ram != nil {
		fds = append(fds, int(ram.Fd()))
	}
	for _, f := range extra {
		fds = append(fds, int(f.Fd()))
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	_, _, err = conn.WriteMsgUnix(encodeHello(&hello, len(extra)), oob, nil)
	runtime.KeepAlive(ram)
	runtime.KeepAlive(extra)
	if err != nil {
		return nil, Welcome{}, nil, ctxErr(ctx, fmt.Errorf("sending hello: %w", err))
	}
	buf := make([]byte, maxPacket)
	oob = make([]byte, unix.CmsgSpace(4*(1+MaxExtraFiles)))
	n, oobn, flags, _, err := conn.ReadMsgUnix(buf, oob)
	files, ferr := recvFiles(oob[:oobn], flags)
	defer func() {
		if !ok {
			closeFiles(files)
		}
	}()
	if err != nil {
		if isEOF(err) {
			return nil, Welcome{}, nil, peerClosed(err)
		}
		return nil, Welcome{}, nil, ctxErr(ctx, fmt.Errorf("reading welcome: %w", err))
	}
	if ferr != nil {
		return nil, Welcome{}, nil, violationf("welcome: %v", ferr)
	}
	if n == 0 {
		return nil, Welcome{}, nil, peerClosed(nil)
	}
	if flags&unix.MSG_TRUNC != 0 {
		return nil, Welcome{}, nil, violationf("oversized welcome")
	}
	switch peekType(buf[:n]) {
	case msgReject:
		reason, err := decodeReason(buf[:n], msgReject)
		if err != nil {
			return nil, Welcome{}, nil, violationf("%v", err)
		}
		return nil, Welcome{}, nil, &RejectedError{Reason: reason}
	case msgWelcome:
	default:
		return nil, Welcome{}, nil, violationf("expected welcome, got %d-byte message", n)
	}
	ww, err := decodeWelcome(buf[:n])
	if err != nil {
		return nil, Welcome{}, nil, violationf("%v", err)
	}
	if ww.transport != hello.Transport {
		return nil, Welcome{}, nil, violationf("welcome transport %v, asked for %v", ww.transport, hello.Transport)
	}
	nring := 0
	if hello.Transport == TransportShm {
		nring = 1
	}
	if len(files) != nring+ww.nExtra {
		return nil, Welcome{}, nil, violationf("welcome announces %d+%d fds, carries %d", nring, ww.nExtra, len(files))
	}
	c := &Client{
		conn: conn, transport: hello.Transport, spin: o.Spin,
		log: o.Logger.With("vgpu", ww.VGPU),
	}
	if hello.Transport == TransportShm {
		r, err := mapClientRing(int(files[0].Fd()), ww.reqEntries, ww.rspEntries)
		if err != nil {
			return nil, Welcome{}, nil, violationf("%v", err)
		}
		c.ring = r
		if r.features&RingFeatureReqDone != 0 {
			c.sent = make([]sentEntry, 2*ww.reqEntries)
		}
		files[0].Close()
		files = files[1:]
		c.watchDone = make(chan struct{})
		go c.watch()
	} else if ww.reqEntries != 0 || ww.rspEntries != 0 {
		return nil, Welcome{}, nil, violationf("socket transport welcome has ring sizes")
	}
	stop()
	conn.SetDeadline(time.Time{})
	ok = true
	if len(files) == 0 {
		files = nil
	}
	return c, ww.Welcome, files, nil
}

func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %w", ctx.Err(), err)
	}
	return err
}

// Counters reads the server's counters by name through OpCounters calls:
// names are the server's counter names in its order, MaxCallResults per
// group.
func (c *Client) Counters(names []string) (map[string]uint64, error) {
	out := map[string]uint64{}
	for g := 0; g*MaxCallResults < len(names); g++ {
		r, err := c.Call(OpCounters, uint64(g))
		if err != nil {
			return nil, fmt.Errorf("counters: %w", err)
		}
		if r.Status != 0 {
			return nil, fmt.Errorf("counters group %d: status %d", g, r.Status)
		}
		for i, v := range r.Result {
			if k := g*MaxCallResults + i; k < len(names) {
				out[names[k]] = v
			}
		}
	}
	return out, nil
}

// Done returns a channel closed when the server ends the connection (its
// Bye or hang-up) or Close runs, with the transport TransportShm; with
// TransportSocket it returns nil (a call reports the end).
func (c *Client) Done() <-chan struct{} { return c.watchDone }

// Transport returns the connection's transport.
func (c *Client) Transport() Transport { return c.transport }

// Err returns the sticky error, or nil while the connection is healthy.
func (c *Client) Err() error {
	c.errMu.Lock()
	defer c.errMu.Unlock()
	return c.err
}

// fail records the first error and wakes a waiter.
func (c *Client) fail(err error) error {
	c.errMu.Lock()
	if c.err == nil {
		c.err = err
		switch {
		case errors.Is(err, ErrClosed):
		case IsSavedBye(err):
			c.log.Info("ipc: connection ended: the vGPU was saved", "err", err)
		default:
			c.log.Warn("ipc: connection failed", "err", err)
		}
	}
	err = c.err
	c.errMu.Unlock()
	c.dead.Store(true)
	if r := c.ring; r != nil {
		interrupt(r.clientWait)
		r.interruptIRQ()
	}
	return err
}

// watch runs in shm mode: after the Welcome the server sends on the socket
// only remap updates (remap.go) and a final Bye, and EOF means it is gone.
func (c *Client) watch() {
	defer close(c.watchDone)
	var b [maxPacket]byte
	oob := make([]byte, unix.CmsgSpace(4*(1+MaxExtraFiles)))
	var n int
	var err error
	for {
		var oobn, flags int
		n, oobn, flags, _, err = c.conn.ReadMsgUnix(b[:], oob)
		files, ferr := recvFiles(oob[:oobn], flags)
		if err == nil && n > 0 && flags&unix.MSG_TRUNC == 0 && peekType(b[:n]) == msgRemapUpdate && !c.dead.Load() {
			if err := c.remapUpdate(b[:n], files, ferr); err != nil {
				c.fail(err)
				return
			}
			continue
		}
		if err == nil && n > 0 && flags&unix.MSG_TRUNC == 0 && peekType(b[:n]) == msgRemapRevoke && !c.dead.Load() {
			if err := c.remapRevoke(b[:n], files, ferr); err != nil {
				c.fail(err)
				return
			}
			continue
		}
		closeFiles(files)
		break
	}
	switch {
	case err == nil && n > 0 && peekType(b[:n]) == msgBye:
		if reason, derr := decodeReason(b[:n], msgBye); derr == nil {
			c.fail(&ByeError{Reason: reason})
		} else {
			c.fail(violationf("%v", derr))
		}
	case err == nil && n > 0:
		c.fail(violationf("unexpected %d-byte message from server", n))
	case c.dead.Load():
		c.fail(ErrClosed)
	case err == nil || isEOF(err):
		c.fail(peerClosed(err))
	default:
		c.fail(fmt.Errorf("ipc: socket: %w", err))
	}
}

// Read32 reads the 32-bit register at off in BAR bar.
func (c *Client) Read32(bar int, off uint64) (uint32, error) {
	if err := checkMMIO(bar, off); err != nil {
		return ^uint32(0), fmt.Errorf("ipc: read32: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	req := request{kind: kindRead32, bar: uint16(bar), off: off, seq: c.seq}
	var rsp response
	if err := c.roundTrip(&req, &rsp); err != nil {
		return ^uint32(0), err
	}
	return rsp.value, nil
}

// Write32 writes v to the 32-bit register at off in BAR bar. The write is
// posted: it returns once queued, blocking only while the request ring (or
// socket buffer) is full.
func (c *Client) Write32(bar int, off uint64, v uint32) error {
	if err := checkMMIO(bar, off); err != nil {
		return fmt.Errorf("ipc: write32: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	req := request{kind: kindWrite32, bar: uint16(bar), off: off, value: v, seq: c.seq}
	return c.send(&req)
}

// Write32Sync writes v to the 32-bit register at off in BAR bar and waits
// until the server has handled it, as a Xen ioreq for an MMIO write keeps
// the vCPU blocked until the device model completes it.
func (c *Client) Write32Sync(bar int, off uint64, v uint32) error {
	if err := checkMMIO(bar, off); err != nil {
		return fmt.Errorf("ipc: write32 sync: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	req := request{kind: kindWrite32Sync, bar: uint16(bar), off: off, value: v, seq: c.seq}
	var rsp response
	return c.roundTrip(&req, &rsp)
}

// Fill32 stores v to n consecutive 32-bit words of a BAR from off (what a
// REP STOSL does), as one request, and waits until the aggregator has
// performed them all: n writes for the price of one round trip. n is
// 1..MaxFillCount and every word must be in the BAR.
func (c *Client) Fill32(bar int, off uint64, v uint32, n int) error {
	if err := checkFill(bar, off, n); err != nil {
		return fmt.Errorf("ipc: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	req := request{kind: kindFill32, bar: uint16(bar), off: off, value: v, count: uint32(n), seq: c.seq}
	var rsp response
	return c.roundTrip(&req, &rsp)
}

// Call performs the generic call op with up to MaxCallArgs arguments and
// waits for its result.
func (c *Client) Call(op uint16, args ...uint64) (CallResult, error) {
	if len(args) > MaxCallArgs {
		return CallResult{}, fmt.Errorf("ipc: call %d: %d arguments, at most %d", op, len(args), MaxCallArgs)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	req := request{kind: kindCall, op: op, nargs: len(args), seq: c.seq}
	copy(req.args[:], args)
	var rsp response
	if err := c.roundTrip(&req, &rsp); err != nil {
		return CallResult{}, err
	}
	return CallResult{Status: int32(rsp.value), Result: rsp.result}, nil
}

// roundTrip sends req and receives its response; c.mu is held.
func (c *Client) roundTrip(req *request, rsp *response) error {
	if err := c.send(req); err != nil {
		return err
	}
	if err := c.recv(rsp); err != nil {
		return err
	}
	want := uint16(kindRead32Reply)
	switch req.kind {
	case kindCall:
		want = kindCallReply
	case kindWrite32Sync:
		want = kindWrite32SyncDone
	case kindFill32:
		want = kindFill32Done
	}
	if rsp.kind != want || rsp.seq != req.seq {
		return c.fail(violationf("got %s seq %d, want %s seq %d", kindName(rsp.kind), rsp.seq, kindName(want), req.seq))
	}
	return nil
}

func (c *Client) send(req *request) error {
	if c.dead.Load() {
		return c.Err()
	}
	if c.transport == TransportSocket {
		encodeRequest(c.out[:], req)
		if _, err := c.conn.Write(c.out[:]); err != nil {
			return c.fail(c.byeAfter(err))
		}
		return nil
	}
	r := c.ring
	n := r.l.reqN
	for c.reqProd-c.reqCons >= n {
		cons := atomic.LoadUint32(r.reqCons)
		if c.reqProd-cons > n {
			return c.fail(violationf("request ring: server consumer index %d is ahead of producer index %d", cons, c.reqProd))
		}
		c.reqCons = cons
		if c.reqProd-cons < n {
			break
		}
		c.await(waitReqSpace, func() bool {
			return c.dead.Load() || atomic.LoadUint32(r.reqCons) != cons
		})
		if c.dead.Load() {
			return c.Err()
		}
	}
	encodeRequest(r.reqSlot(c.reqProd), req)
	c.noteSent(c.reqProd, req)
	c.reqProd++
	atomic.StoreUint32(r.reqProd, c.reqProd)
	wakeOn(r.serverWait, waitReq)
	return nil
}

// longSpin bounds how long a client keeps polling for the server's answer
// (or for request-ring space) after its DialOptions.Spin polls (tens of
// microseconds) before it sleeps on its futex: a few scheduler time
// slices.
//
// Polling that long pays when the CPUs are oversubscribed. The server
// answers a trap in microseconds while it runs; when it does not answer
// within the short spin it is usually runnable but preempted (two CPUs, a
// busy process beside the VM and the aggregator), and it runs again within
// a time slice. A client that slept meanwhile had to be woken through the
// futex and then wait for a CPU again, behind the busy process, while the
// server, having answered, spun and slept in turn waiting for the next
// request: on a 2-CPU host with one CPU-burning process beside it, the
// honest VM of TestLongKernelWatchdog (one synchronous trap per
// page-table word) ran 6-12x as long as alone. The long poll yields the
// CPU every 256 polls (spinUntil), so it does not take CPU time from the
// server or from other VMs: a plain busy poll did, and made 64 VMs on 2
// CPUs (gpuvm bench scale) 5x slower.
const longSpin = 5 * time.Millisecond

// await waits for cond (a response, or request-ring space) as waitFor
// does, but polls up to longSpin longer before it sleeps, unless the last
// long poll found nothing (the server is busy for longer than that: a
// long operation, a VM being moved) and no wait since ended within
// longSpin. c.mu is held.
func (c *Client) await(bit uint32, cond func() bool) {
	if spinFor(c.spin, cond) {
		return
	}
	if c.spin == 0 {
		sleepFor(c.ring.clientWait, bit, cond)
		return
	}
	start := time.Now()
	if !c.longSpinOff {
		if spinUntil(start.Add(longSpin), cond) {
			return
		}
		c.longSpinOff = true
	}
	sleepFor(c.ring.clientWait, bit, cond)
	if c.longSpinOff && time.Since(start) < longSpin {
		c.longSpinOff = false
	}
}

func (c *Client) recv(rsp *response) error {
	if c.transport == TransportSocket {
		return c.recvSocket(rsp)
	}
	r := c.ring
	c.await(waitRsp, func() bool {
		return c.dead.Load() || atomic.LoadUint32(r.rspProd) != c.rspCons
	})
	prod := atomic.LoadUint32(r.rspProd)
	if prod == c.rspCons {
		return c.Err()
	}
	if prod-c.rspCons > r.l.rspN {
		return c.fail(violationf("response ring: producer index %d is %d entries past consumer %d", prod, prod-c.rspCons, c.rspCons))
	}
	var ent [EntrySize]byte
	copy(ent[:], r.rspSlot(c.rspCons))
	c.rspCons++
	atomic.StoreUint32(r.rspCons, c.rspCons)
	wakeOn(r.serverWait, waitRspSpace)
	if err := decodeResponse(ent[:], rsp); err != nil {
		return c.fail(violationf("%v", err))
	}
	return nil
}

func (c *Client) recvSocket(rsp *response) error {
	n, err := c.conn.Read(c.in[:])
	if err != nil && errors.Is(err, syscall.ECONNRESET) {
		// The reset is reported before queued data; a Bye may follow.
		c.conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		n, err = c.conn.Read(c.in[:])
	}
	if err != nil {
		if c.dead.Load() {
			return c.Err()
		}
		if isEOF(err) {
			return c.fail(peerClosed(err))
		}
		return c.fail(fmt.Errorf("ipc: reading response: %w", err))
	}
	b := c.in[:n]
	switch {
	case n == 0:
		return c.fail(peerClosed(nil))
	case peekType(b) == msgBye:
		reason, derr := decodeReason(b, msgBye)
		if derr != nil {
			return c.fail(violationf("%v", derr))
		}
		return c.fail(&ByeError{Reason: reason})
	case n != EntrySize:
		return c.fail(violationf("%d-byte response frame, want %d", n, EntrySize))
	}
	if err := decodeResponse(b, rsp); err != nil {
		return c.fail(violationf("%v", err))
	}
	return nil
}

// byeAfter turns a socket write error into the server's Bye reason when one
// is waiting to be read.
func (c *Client) byeAfter(werr error) error {
	if c.dead.Load() {
		return c.Err()
	}
	c.conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	for i := 0; i < 2; i++ {
		n, err := c.conn.Read(c.in[:])
		if err == nil && n > 0 && peekType(c.in[:n]) == msgBye {
			if reason, derr := decodeReason(c.in[:n], msgBye); derr == nil {
				return &ByeError{Reason: reason}
			}
		}
		if err == nil || !errors.Is(err, syscall.ECONNRESET) {
			break
		}
	}
	if isEOF(werr) {
		return peerClosed(werr)
	}
	return fmt.Errorf("ipc: sending request: %w", werr)
}

// Close closes the connection; the server's Serve then returns. Calls in
// progress return ErrClosed.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.fail(ErrClosed)
		c.conn.Close()
		if c.watchDone != nil {
			<-c.watchDone
		}
		c.mu.Lock()
		c.irqMu.Lock() // the IRQ sleepers, woken by fail, have left
		c.ring.unmap()
		c.ring = nil
		c.irqMu.Unlock()
		c.mu.Unlock()
	})
	return nil
}
