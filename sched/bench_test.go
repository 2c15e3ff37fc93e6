package sched

import (
	"testing"
	"time"
)

// BenchmarkDecision64VMs measures one scheduling decision cycle —
// Submitted, Next, Started and Completed — with 64 backlogged VMs of mixed
// weights, per policy. During DFQ free runs the cycle is Submitted, Started
// and Completed (no decision), as for a disengaged dispatcher.
func BenchmarkDecision64VMs(b *testing.B) {
	for _, name := range Names() {
		b.Run(name, func(b *testing.B) {
			p := mustNew(b, name, Params{})
			const n = 64
			now := time.Duration(0)
			for i := 0; i < n; i++ {
				if err := p.AddVM(VMID(i), 1+i%4, 0); err != nil {
					b.Fatal(err)
				}
				if err := p.Submitted(VMID(i), 0); err != nil {
					b.Fatal(err)
				}
			}
			free := false
			var until time.Duration
			next := 0
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				var id VMID
				if free && now < until {
					id = VMID(next)
					next = (next + 1) % n
				} else {
					d := p.Next(now)
					switch d.Action {
					case Dispatch:
						id = d.VM
					case FreeRun:
						free, until = true, d.Until
						id = VMID(next)
						next = (next + 1) % n
					default:
						now += 10 * time.Microsecond
						continue
					}
				}
				if err := p.Submitted(id, now); err != nil {
					b.Fatal(err)
				}
				if err := p.Started(id, now); err != nil {
					b.Fatal(err)
				}
				now += 100 * time.Microsecond
				if err := p.Completed(id, 100*time.Microsecond, now); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
