package ipc

import (
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkInterrupt is what raising a VM's interrupt costs the
// aggregator (under its dispatcher's lock): with no thread of the VM
// asleep, and with one announced (a FUTEX_WAKE each time).
func BenchmarkInterrupt(b *testing.B) {
	ts := startServer(b, nil)
	for _, sleeper := range []bool{false, true} {
		name := "idle"
		if sleeper {
			name = "sleeper"
		}
		b.Run(name, func(b *testing.B) {
			c, _, s := dialTest(b, ts, name, TransportShm, nil)
			if sleeper {
				atomic.StoreUint32(c.ring.irqWaiters, 1)
			}
			b.ReportAllocs()
			for b.Loop() {
				s.sc.Interrupt()
			}
		})
	}
}

// BenchmarkIRQWake is a raise and the wake-up of a thread asleep on the
// interrupt, round trip: the waiter answers each interrupt by raising
// the next one through a second connection.
func BenchmarkIRQWake(b *testing.B) {
	ts := startServer(b, nil)
	ping, _, ps := dialTest(b, ts, "ping", TransportShm, nil)
	pong, _, qs := dialTest(b, ts, "pong", TransportShm, nil)
	stop := make(chan struct{})
	done := make(chan struct{})
	pingSeen := ping.IRQCount() // before the first raise
	go func() {
		defer close(done)
		seen := pingSeen
		for {
			n, err := ping.WaitIRQ(seen, 10*time.Millisecond)
			if err != nil {
				return
			}
			select {
			case <-stop:
				return
			default:
			}
			if n != seen {
				seen = n
				qs.sc.Interrupt()
			}
		}
	}()
	seen := pong.IRQCount()
	for b.Loop() {
		ps.sc.Interrupt()
		n, err := pong.WaitIRQ(seen, time.Second)
		if err != nil || n == seen {
			b.Fatalf("no answer: %d, %v", n, err)
		}
		seen = n
	}
	close(stop)
	<-done
}
