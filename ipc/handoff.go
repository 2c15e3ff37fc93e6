// Handing the listening sockets to a new daemon process (docs/protocol.md
// §15): the socket stays open and keeps its path, so a device model that
// connects while the daemon restarts waits in the kernel's listen backlog
// for the new process instead of being refused.

package ipc

import (
	"errors"
	"fmt"
	"net"
	"os"
)

// HandOff stops l accepting and returns a duplicate of its socket (close
// on exec: the caller clears that for the process it hands it to). The
// socket stays open and its path stays; connections that arrive wait in
// the backlog. Connections still in their handshake are closed. Accept
// blocks meanwhile; Resume accepts again, Close closes as usual.
func (l *Listener) HandOff() (*os.File, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, ErrClosed
	}
	if l.paused {
		l.mu.Unlock()
		return nil, errors.New("ipc: listener already handed off")
	}
	f, err := l.ln.File()
	if err != nil {
		l.mu.Unlock()
		return nil, fmt.Errorf("ipc: hand off %s: %w", l.path, err)
	}
	l.paused = true
	for c := range l.inflight {
		c.Close()
	}
	ln := l.ln
	l.mu.Unlock()
	ln.Close() // the duplicate keeps the socket listening
	return f, nil
}

// Resume accepts again on f, the socket HandOff returned, after a handoff
// that did not happen. l owns f from then on.
func (l *Listener) Resume(f *os.File) error {
	ln, err := fileUnixListener(f)
	if err != nil {
		return fmt.Errorf("ipc: resume %s: %w", l.path, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		ln.Close()
		return ErrClosed
	}
	l.ln, l.paused = ln, false
	l.wg.Add(1)
	go l.acceptLoop(ln)
	return nil
}

// ListenFile is Listen on a socket a previous daemon process handed over
// (HandOff): f is that socket, already bound to path and listening. The
// listener owns f; Close removes path if it is still that socket's.
func ListenFile(path string, f *os.File, opts *ListenOptions) (*Listener, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("ipc: listen %s (inherited): %w", path, err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		f.Close()
		return nil, fmt.Errorf("ipc: listen %s (inherited): not a socket", path)
	}
	ln, err := fileUnixListener(f)
	if err != nil {
		return nil, fmt.Errorf("ipc: listen %s (inherited): %w", path, err)
	}
	return newListener(ln, path, fi, opts)
}

// handedOff reports whether ln is no longer the one l accepts on.
func (l *Listener) handedOff(ln *net.UnixListener) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.paused || l.ln != ln
}

// fileUnixListener makes a listener of f (which it closes: the listener
// holds its own duplicate).
func fileUnixListener(f *os.File) (*net.UnixListener, error) {
	defer f.Close()
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, err
	}
	ul, ok := ln.(*net.UnixListener)
	if !ok {
		ln.Close()
		return nil, fmt.Errorf("%s is not a Unix socket listener", f.Name())
	}
	ul.SetUnlinkOnClose(false)
	return ul, nil
}

// HandOffStream stops ln, a listener ListenStream made, without removing
// its socket, and returns a duplicate of the socket (close on exec). ln's
// Close no longer removes the socket.
func HandOffStream(ln net.Listener) (*os.File, error) {
	sl, ok := ln.(*streamListener)
	if !ok {
		return nil, errors.New("ipc: not a listener of ListenStream")
	}
	f, err := sl.File()
	if err != nil {
		return nil, fmt.Errorf("ipc: hand off %s: %w", sl.path, err)
	}
	sl.once.Do(func() {}) // the socket is the new process's now
	sl.UnixListener.Close()
	return f, nil
}

// ListenStreamFile is ListenStream on a socket a previous daemon process
// handed over (HandOffStream).
func ListenStreamFile(path string, f *os.File) (net.Listener, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("ipc: listen %s (inherited): %w", path, err)
	}
	ln, err := fileUnixListener(f)
	if err != nil {
		return nil, fmt.Errorf("ipc: listen %s (inherited): %w", path, err)
	}
	return &streamListener{UnixListener: ln, path: path, file: fi}, nil
}
