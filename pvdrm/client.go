package pvdrm

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/gpuvm/gpuvm/ipc"
)

// DefaultSpin is how many times each end polls its ring before it sleeps
// on its notification: the device-model IPC's budget (ipc.DefaultSpin),
// so that a request's round trip on the ring and an MMIO round trip on
// the IPC rings compare like for like.
const DefaultSpin = ipc.DefaultSpin

// Spin polls ready up to spin times (yielding now and then) and reports
// whether it became true: what an end does before it sleeps.
func Spin(spin int, ready func() bool) bool {
	for i := range spin {
		if ready() {
			return true
		}
		if i&255 == 255 {
			runtime.Gosched()
		}
	}
	return false
}

// ErrDisconnected is returned by a Client whose connection to the back end
// ended (the back end went away or broke the protocol).
var ErrDisconnected = errors.New("pvdrm: disconnected from the back end")

// StatusError is a request the back end refused: its op and the negative
// errno it answered.
type StatusError struct {
	Op     Op
	Status int32
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("pvdrm %s: %s", opName(e.Op), errnoName(e.Status))
}

func opName(op Op) string {
	for _, s := range Specs() {
		if s.Op == op {
			return s.Name
		}
	}
	return fmt.Sprintf("op %d", op)
}

func errnoName(status int32) string {
	names := map[int32]string{-ENOENT: "ENOENT", -EIO: "EIO", -EBADF: "EBADF", -ENOMEM: "ENOMEM", -EFAULT: "EFAULT",
		-EBUSY: "EBUSY", -EINVAL: "EINVAL", -ENOSPC: "ENOSPC", -ENOSYS: "ENOSYS", -EPROTO: "EPROTO", -ETIMEDOUT: "ETIMEDOUT"}
	if n, ok := names[status]; ok {
		return fmt.Sprintf("%s (%d)", n, status)
	}
	return fmt.Sprintf("error %d", status)
}

// Client is the front end's connection: it sends requests over a
// Transport's ring and matches the responses to them by id. It is safe for
// concurrent use; requests from several goroutines are in flight at once,
// up to the ring's size.
type Client struct {
	t     Transport
	codec *Codec
	ring  *Front
	slots chan struct{} // one token per free ring slot

	mu      sync.Mutex // guards ring pushes and the fields below
	nextID  uint64
	pending map[uint64]chan Response
	err     error

	// Granted in HELLO.
	Version  uint32
	MaxFiles uint32
	Features uint64

	stop context.CancelFunc
	done chan struct{}
	stat ClientStats
}

// ClientStats counts what a front end did.
type ClientStats struct {
	Requests      uint64 // requests sent
	Notifications uint64 // kicks sent to the back end
}

// Connect initialises the ring on t, starts reading responses and says
// HELLO, asking for features; it returns the connected client.
func Connect(ctx context.Context, t Transport, features uint64) (*Client, error) {
	ring, err := NewFront(t.Ring())
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(context.Background())
	c := &Client{t: t, codec: NewCodec(), ring: ring, slots: make(chan struct{}, ring.Size()),
		pending: map[uint64]chan Response{}, stop: cancel, done: make(chan struct{})}
	for range ring.Size() {
		c.slots <- struct{}{}
	}
	go c.readLoop(rctx)
	rsp, err := c.Do(ctx, Request{Op: OpHello, Args: map[string]uint64{"version": Version, "features": features}})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("pvdrm hello: %w", err), c.Close())
	}
	c.Version, c.MaxFiles, c.Features = uint32(rsp.Results["version"]), uint32(rsp.Results["max_files"]), rsp.Results["features"]
	if c.Version == 0 || c.Version > Version || c.Features&^features != 0 {
		return nil, errors.Join(fmt.Errorf("pvdrm hello: the back end answered version %d, features %#x (asked %d, %#x)", c.Version, c.Features, Version, features), c.Close())
	}
	return c, nil
}

// Stats returns what the client has done so far.
func (c *Client) Stats() ClientStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stat
}

// Do sends one request and waits for its response. A response with a
// non-zero status is returned with a *StatusError.
func (c *Client) Do(ctx context.Context, req Request) (Response, error) {
	select {
	case <-c.slots:
	case <-c.done:
		return Response{}, c.failure()
	case <-ctx.Done():
		return Response{}, ctx.Err()
	}
	var slot [SlotSize]byte
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		c.slots <- struct{}{}
		return Response{}, c.err
	}
	c.nextID++
	req.ID = c.nextID
	if err := c.codec.EncodeRequest(slot[:], req); err != nil {
		c.mu.Unlock()
		c.slots <- struct{}{}
		return Response{}, err
	}
	ch := make(chan Response, 1)
	c.pending[req.ID] = ch
	kick, err := c.ring.Push(slot[:])
	c.stat.Requests++
	if kick {
		c.stat.Notifications++
	}
	c.mu.Unlock()
	if err == nil && kick {
		err = c.t.Notify()
	}
	if err != nil {
		c.fail(err)
		return Response{}, c.failure()
	}
	select {
	case rsp := <-ch:
		if rsp.Status != 0 {
			return rsp, &StatusError{Op: req.Op, Status: rsp.Status}
		}
		return rsp, nil
	case <-c.done:
		return Response{}, c.failure()
	case <-ctx.Done():
		// The response will still come and be dropped; its slot returns then.
		return Response{}, ctx.Err()
	}
}

func (c *Client) failure() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return c.err
	}
	return ErrDisconnected
}

func (c *Client) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = fmt.Errorf("%w: %w", ErrDisconnected, err)
	}
	c.mu.Unlock()
}

// readLoop delivers responses to the requests waiting for them.
func (c *Client) readLoop(ctx context.Context) {
	defer close(c.done)
	var slot [SlotSize]byte
	for {
		c.mu.Lock() // the Front is shared with Do's pushes
		ok, err := c.ring.Poll(slot[:])
		c.mu.Unlock()
		if err != nil {
			c.fail(err)
			return
		}
		if ok {
			rsp := c.codec.DecodeResponse(slot[:])
			c.mu.Lock()
			ch := c.pending[rsp.ID]
			delete(c.pending, rsp.ID)
			c.mu.Unlock()
			if ch == nil {
				c.fail(fmt.Errorf("response to request %d, which is not outstanding", rsp.ID))
				return
			}
			ch <- rsp
			c.slots <- struct{}{}
			continue
		}
		if Spin(DefaultSpin, c.ring.Pending) {
			continue
		}
		c.mu.Lock()
		more := c.ring.FinalCheck()
		c.mu.Unlock()
		if more {
			continue
		}
		if err := c.t.Wait(ctx, 100*time.Millisecond); err != nil {
			if ctx.Err() == nil {
				c.fail(err)
			}
			return
		}
	}
}

// holdPushes runs f with no request pushed onto the ring and no response
// taken off it meanwhile (a transport moving the ring's pages).
func (c *Client) holdPushes(f func() error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return f()
}

// Abort ends the connection because of err (the aggregator hung up):
// requests waiting and to come fail with it.
func (c *Client) Abort(err error) {
	c.fail(err)
	c.stop()
}

// Close stops reading responses and closes the transport. Requests still
// waiting fail with ErrDisconnected.
func (c *Client) Close() error {
	c.stop()
	<-c.done
	c.fail(errors.New("closed"))
	return c.t.Close()
}
