package bpftrace

import (
	"fmt"
	"io"
	"math/bits"
	"strings"
	"time"
)

// HistSlots is the number of slots of a histogram: slot 0 counts zeros,
// slot i ≥ 1 values in [2^(i-1), 2^i), and the last everything from
// 2^(HistSlots-2) up. It is HIST_SLOTS of gpuvm_trace.bpf.c.
const HistSlots = 42

// Kind is what a histogram measures (hist_key.kind in the BPF program).
type Kind uint16

// Histogram kinds.
const (
	KindRead  Kind = 0 // a trapped read, TrapBegin to TrapEnd
	KindWrite Kind = 1 // a trapped write
	KindWait  Kind = 2 // a submission's doorbell-to-release wait
)

func (k Kind) String() string {
	switch k {
	case KindRead:
		return "read"
	case KindWrite:
		return "write"
	case KindWait:
		return "wait"
	}
	return fmt.Sprintf("kind%d", uint16(k))
}

// HistKey names one histogram: a vGPU, a kind and, for trapped accesses,
// the BAR. Its layout is struct hist_key's.
type HistKey struct {
	VGPU uint32
	Kind Kind
	BAR  uint16
}

// Hist is a log2 histogram of nanoseconds, laid out as struct hist_val.
type Hist struct {
	Count uint64
	SumNs uint64
	Slots [HistSlots]uint64
}

// Slot is the slot a value of v nanoseconds falls in (log2_slot in the BPF
// program).
func Slot(v uint64) int {
	if v == 0 {
		return 0
	}
	return min(bits.Len64(v), HistSlots-1)
}

// SlotBounds is the range [lo, hi) of slot i; hi is 0 for the last slot,
// which has no upper bound.
func SlotBounds(i int) (lo, hi uint64) {
	switch {
	case i <= 0:
		return 0, 1
	case i >= HistSlots-1:
		return 1 << (HistSlots - 2), 0
	}
	return 1 << (i - 1), 1 << i
}

// Observe adds one value, as the BPF program does (for tests and for
// merging).
func (h *Hist) Observe(v uint64) {
	h.Count++
	h.SumNs += v
	h.Slots[Slot(v)]++
}

// Add adds o to h.
func (h *Hist) Add(o Hist) {
	h.Count += o.Count
	h.SumNs += o.SumNs
	for i := range h.Slots {
		h.Slots[i] += o.Slots[i]
	}
}

// Sub is what h counted since prev, an earlier reading of the same
// histogram.
func (h Hist) Sub(prev Hist) Hist {
	h.Count -= prev.Count
	h.SumNs -= prev.SumNs
	for i := range h.Slots {
		h.Slots[i] -= prev.Slots[i]
	}
	return h
}

// Mean is the mean value in nanoseconds (0 for an empty histogram).
func (h Hist) Mean() time.Duration {
	if h.Count == 0 {
		return 0
	}
	return time.Duration(h.SumNs / h.Count)
}

// Quantile is an upper bound of the q-quantile (0 < q ≤ 1): the upper end
// of the slot it falls in, or the lower end of the last slot. It is 0 for
// an empty histogram.
func (h Hist) Quantile(q float64) time.Duration {
	var total uint64
	for _, n := range h.Slots {
		total += n
	}
	if total == 0 {
		return 0
	}
	want := uint64(q*float64(total) + 0.5)
	want = max(want, 1)
	var seen uint64
	for i, n := range h.Slots {
		seen += n
		if seen >= want {
			lo, hi := SlotBounds(i)
			if hi == 0 {
				return time.Duration(lo)
			}
			return time.Duration(hi)
		}
	}
	return 0
}

// Bucket is one non-empty slot of a histogram, for machine-readable
// output: Count values in [Lo, Hi) ns (Hi 0: no upper bound).
type Bucket struct {
	Lo    uint64 `json:"lo_ns"`
	Hi    uint64 `json:"hi_ns,omitempty"`
	Count uint64 `json:"count"`
}

// Buckets lists the slots from the first to the last non-empty one.
func (h Hist) Buckets() []Bucket {
	first, last := -1, -1
	for i, n := range h.Slots {
		if n != 0 {
			if first < 0 {
				first = i
			}
			last = i
		}
	}
	if first < 0 {
		return nil
	}
	out := make([]Bucket, 0, last-first+1)
	for i := first; i <= last; i++ {
		lo, hi := SlotBounds(i)
		out = append(out, Bucket{Lo: lo, Hi: hi, Count: h.Slots[i]})
	}
	return out
}

// histWidth is the width of the longest bar, as bpftrace draws them.
const histWidth = 52

// Render draws h as bpftrace's hist() does: one line per slot from the
// first to the last non-empty one, "[lo, hi)" with K, M and G for powers
// of 1024 (of nanoseconds), the count and a bar scaled to the largest
// count. Each line starts with indent. An empty histogram draws nothing.
func (h Hist) Render(w io.Writer, indent string) error {
	buckets := h.Buckets()
	var most uint64
	for _, b := range buckets {
		most = max(most, b.Count)
	}
	var sb strings.Builder
	for _, b := range buckets {
		var label string
		switch {
		case b.Lo == 0:
			label = "[0]"
		case b.Lo == 1 && b.Hi == 2:
			label = "[1]"
		case b.Hi == 0:
			label = "[" + size1024(b.Lo) + ", ...)"
		default:
			label = "[" + size1024(b.Lo) + ", " + size1024(b.Hi) + ")"
		}
		n := int(b.Count * histWidth / most) // as bpftrace: too small a count draws no mark
		fmt.Fprintf(&sb, "%s%-16s %8d |%s%s|\n", indent, label, b.Count, strings.Repeat("@", n), strings.Repeat(" ", histWidth-n))
	}
	_, err := io.WriteString(w, sb.String())
	return err
}

// size1024 writes a power of two as bpftrace does: 512, 1K, 2K, ..., 1M, 1G.
func size1024(v uint64) string {
	for _, u := range []struct {
		shift  uint
		suffix string
	}{{40, "T"}, {30, "G"}, {20, "M"}, {10, "K"}} {
		if v >= 1<<u.shift && v%(1<<u.shift) == 0 {
			return fmt.Sprintf("%d%s", v>>u.shift, u.suffix)
		}
	}
	return fmt.Sprint(v)
}
