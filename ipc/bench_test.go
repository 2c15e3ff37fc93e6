package ipc

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// benchSpin is the spin budget of both peers in the benchmarks
// (go test -bench . -args -ipc.spin=N).
var benchSpin = flag.Int("ipc.spin", DefaultSpin, "ipc benchmarks: spin iterations before a peer sleeps")

// benchClient dials a server running in a helper process.
func benchClient(b *testing.B, tr Transport) *Client {
	b.Helper()
	path := b.TempDir() + "/bench.sock"
	startHelper(b, "server", nil, "SOCK="+path, fmt.Sprintf("SPIN=%d", *benchSpin))
	c, _, files, err := Dial(context.Background(), path, testHello("bench", tr), testRAM(b, 1<<20), nil, &DialOptions{Spin: *benchSpin})
	if err != nil {
		b.Fatal(err)
	}
	closeFiles(files)
	b.Cleanup(func() { c.Close() })
	// Warm up both sides.
	for i := 0; i < 1000; i++ {
		if _, err := c.Read32(0, 0); err != nil {
			b.Fatal(err)
		}
	}
	return c
}

// BenchmarkRead32RoundTrip: one Read32 and its reply, server in another
// process.
func BenchmarkRead32RoundTrip(b *testing.B) {
	for _, tr := range transports {
		b.Run(tr.String(), func(b *testing.B) {
			c := benchClient(b, tr)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := c.Read32(0, 0x1700); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkWrite32Posted: posted writes, server in another process. The
// final Read32 (included) waits until the server executed all of them.
func BenchmarkWrite32Posted(b *testing.B) {
	for _, tr := range transports {
		b.Run(tr.String(), func(b *testing.B) {
			c := benchClient(b, tr)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := c.Write32(0, 0x1700, uint32(i)); err != nil {
					b.Fatal(err)
				}
			}
			if v, err := c.Read32(0, 0x1700); err != nil || v != uint32(b.N-1) {
				b.Fatalf("final read %d, %v", v, err)
			}
		})
	}
}

// BenchmarkWrite32Sync: non-posted writes (the device model's default, as a
// Xen ioreq blocks the vCPU until the write is done), server in another
// process.
func BenchmarkWrite32Sync(b *testing.B) {
	for _, tr := range transports {
		b.Run(tr.String(), func(b *testing.B) {
			c := benchClient(b, tr)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := c.Write32Sync(0, 0x1700, uint32(i)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRead32InProcess: the same round trip with both ends in this
// process (two goroutines).
func BenchmarkRead32InProcess(b *testing.B) {
	for _, tr := range transports {
		b.Run(tr.String(), func(b *testing.B) {
			ts := startServer(b, &ListenOptions{Spin: *benchSpin})
			c, _, _ := dialTest(b, ts, "bench", tr, &DialOptions{Spin: *benchSpin})
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := c.Read32(0, 0x1700); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkBarePingPong is the baseline without the protocol: a sequence
// number bounced through two cache lines of a shared memfd by two spinning
// processes, and a 64-byte packet bounced over a SOCK_SEQPACKET socketpair
// (through Go's netpoller, like the socket transport).
func BenchmarkBarePingPong(b *testing.B) {
	b.Run("shm", func(b *testing.B) {
		f, err := CreateMemfd("pingpong", 4096)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		mem, err := unix.Mmap(int(f.Fd()), 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			b.Fatal(err)
		}
		defer unix.Munmap(mem)
		ping := (*uint32)(unsafe.Pointer(&mem[0]))
		pong := (*uint32)(unsafe.Pointer(&mem[64]))
		quit := (*uint32)(unsafe.Pointer(&mem[128]))
		defer atomic.StoreUint32(quit, 1)
		startHelper(b, "pingpong-shm", []*os.File{f})
		round := func(v uint32) {
			atomic.StoreUint32(ping, v)
			for atomic.LoadUint32(pong) != v {
			}
		}
		for i := uint32(1); i <= 1000; i++ {
			round(i)
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			round(uint32(i) + 1001)
		}
	})
	b.Run("socket", func(b *testing.B) {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			b.Fatal(err)
		}
		peer := os.NewFile(uintptr(fds[1]), "peer")
		startHelper(b, "pingpong-sock", []*os.File{peer})
		peer.Close()
		mine := os.NewFile(uintptr(fds[0]), "mine")
		nc, err := net.FileConn(mine)
		mine.Close()
		if err != nil {
			b.Fatal(err)
		}
		defer nc.Close()
		buf := make([]byte, EntrySize)
		round := func() {
			if _, err := nc.Write(buf); err != nil {
				b.Fatal(err)
			}
			if _, err := nc.Read(buf); err != nil {
				b.Fatal(err)
			}
		}
		for i := 0; i < 1000; i++ {
			round()
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			round()
		}
	})
}
