//go:build linux && (amd64 || arm64)

package xen

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestEvtchnDrain plays the kernel's evtchn device with a socket: pending
// ports are read, and this end's port written back to unmask it.
func TestEvtchnDrain(t *testing.T) {
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(sp[1])
	e := &Evtchn{fd: sp[0], port: 42}
	defer closeFd(&e.fd)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if err := e.Wait(ctx, 30*time.Millisecond); err != nil || time.Since(start) < 30*time.Millisecond {
		t.Fatalf("quiet wait: %v after %v", err, time.Since(start))
	}
	var ports [12]byte
	for i := range 3 {
		binary.NativeEndian.PutUint32(ports[4*i:], 42)
	}
	if _, err := unix.Write(sp[1], ports[:]); err != nil {
		t.Fatal(err)
	}
	if err := e.Wait(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	var got [16]byte
	n, err := unix.Read(sp[1], got[:])
	if err != nil || n != 4 || binary.NativeEndian.Uint32(got[:]) != 42 {
		t.Fatalf("unmask: %d bytes %v, %v", n, got[:n], err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := e.Wait(cctx, time.Second); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait: %v", err)
	}
	if e.Port() != 42 {
		t.Fatalf("port %d", e.Port())
	}
	var closed *Evtchn
	if closed.Notify() == nil || closed.Wait(ctx, time.Millisecond) == nil {
		t.Fatal("a closed channel works")
	}
}
