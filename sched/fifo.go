package sched

import (
	"fmt"
	"time"
)

// fifo releases submissions in the order they were submitted, across all
// VMs (the thesis' FIFO baseline, §4.3.3). It ignores weights.
type fifo struct {
	roster
	queue []VMID // submission order; queue[head:] is live
	head  int
}

func newFIFO() *fifo { return &fifo{roster: newRoster("fifo")} }

func (p *fifo) AddVM(id VMID, weight int, now time.Duration) error {
	_, err := p.add(id, weight, now)
	return err
}

func (p *fifo) RemoveVM(id VMID, now time.Duration) error {
	if _, err := p.remove(id); err != nil {
		return err
	}
	live := p.queue[:0]
	for _, x := range p.queue[p.head:] {
		if x != id {
			live = append(live, x)
		}
	}
	p.queue, p.head = live, 0
	return nil
}

func (p *fifo) Submitted(id VMID, now time.Duration) error {
	if _, err := p.submitted(id, now); err != nil {
		return err
	}
	if p.head > 0 && p.head == len(p.queue) {
		p.queue, p.head = p.queue[:0], 0
	} else if p.head > 1024 && p.head*2 > len(p.queue) {
		n := copy(p.queue, p.queue[p.head:])
		p.queue, p.head = p.queue[:n], 0
	}
	p.queue = append(p.queue, id)
	return nil
}

func (p *fifo) Next(now time.Duration) Decision {
	if p.head == len(p.queue) {
		return Decision{Action: Idle}
	}
	return Decision{Action: Dispatch, VM: p.queue[p.head]}
}

func (p *fifo) Started(id VMID, now time.Duration) error {
	if _, err := p.started(id, now); err != nil {
		return err
	}
	// Normally the head; a dispatcher that released out of order (it
	// should not) costs a scan.
	for i := p.head; i < len(p.queue); i++ {
		if p.queue[i] == id {
			copy(p.queue[p.head+1:i+1], p.queue[p.head:i])
			p.head++
			return nil
		}
	}
	return fmt.Errorf("sched: fifo: started vm %d: %w", id, ErrNotQueued)
}

func (p *fifo) Completed(id VMID, gpuTime, now time.Duration) error {
	_, err := p.completed(id, now)
	return err
}

func (p *fifo) Overhead(d, now time.Duration) {}
