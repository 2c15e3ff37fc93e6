package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/gpuvm/gpuvm/ipc"
)

// controlServer serves the control API on the control socket; a handoff
// (handoff.go) stops it without closing the socket and, if the handoff
// does not happen, serves it again.
type controlServer struct {
	path    string
	handler http.Handler

	mu  sync.Mutex
	ln  net.Listener
	srv *http.Server
}

// serveControl serves handler on ln, the control socket at path.
func serveControl(path string, ln net.Listener, handler http.Handler) *controlServer {
	c := &controlServer{path: path, handler: handler}
	c.start(ln)
	return c
}

func (c *controlServer) start(ln net.Listener) {
	srv := &http.Server{Handler: c.handler, ReadHeaderTimeout: 5 * time.Second}
	c.mu.Lock()
	c.ln, c.srv = ln, srv
	c.mu.Unlock()
	go func() { _ = srv.Serve(ln) }()
}

// controlDrain bounds the wait for the control requests in flight when
// the socket is handed off.
const controlDrain = 2 * time.Second

// handOff stops serving and returns the socket (ipc.HandOffStream);
// requests in flight get controlDrain to finish.
func (c *controlServer) handOff() (*os.File, error) {
	c.mu.Lock()
	ln, srv := c.ln, c.srv
	c.mu.Unlock()
	f, err := ipc.HandOffStream(ln)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), controlDrain)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		srv.Close()
	}
	return f, nil
}

// resume serves again on f, the socket handOff returned.
func (c *controlServer) resume(f *os.File) error {
	ln, err := ipc.ListenStreamFile(c.path, f)
	if err != nil {
		return err
	}
	c.start(ln)
	return nil
}

// close stops serving and removes the socket.
func (c *controlServer) close() error {
	c.mu.Lock()
	srv := c.srv
	c.mu.Unlock()
	if err := srv.Close(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
