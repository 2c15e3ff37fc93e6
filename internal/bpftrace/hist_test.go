package bpftrace

import (
	"strings"
	"testing"
	"time"
)

func TestSlot(t *testing.T) {
	for v, want := range map[uint64]int{0: 0, 1: 1, 2: 2, 3: 2, 4: 3, 1023: 10, 1024: 11, 1500: 11, 2047: 11, 1 << 39: 40, 1 << 40: 41, 1<<63 + 5: 41} {
		if got := Slot(v); got != want {
			t.Errorf("Slot(%d) = %d, want %d", v, got, want)
		}
		if lo, hi := SlotBounds(Slot(v)); v < lo || (hi != 0 && v >= hi) {
			t.Errorf("%d outside its slot [%d, %d)", v, lo, hi)
		}
	}
}

// The rendering is bpftrace's hist(): a line per slot from the first to
// the last non-empty one, power-of-1024 suffixes, bars scaled to the
// largest count.
func TestRender(t *testing.T) {
	var h Hist
	for range 26 {
		h.Observe(1500) // [1K, 2K)
	}
	for range 13 {
		h.Observe(5000) // [4K, 8K)
	}
	h.Observe(3 << 20) // [2M, 4M)
	h.Observe(0)
	var sb strings.Builder
	if err := h.Render(&sb, "  "); err != nil {
		t.Fatal(err)
	}
	bar := func(n int) string { return "|" + strings.Repeat("@", n) + strings.Repeat(" ", 52-n) + "|" }
	want := strings.Join([]string{
		"  [0]                     1 " + bar(2),
		"  [1]                     0 " + bar(0),
		"  [2, 4)                  0 " + bar(0),
	}, "\n")
	got := sb.String()
	if !strings.HasPrefix(got, want) {
		t.Errorf("render starts\n%s\nwant\n%s", got, want)
	}
	for _, line := range []string{
		"  [1K, 2K)               26 " + bar(52),
		"  [2K, 4K)                0 " + bar(0),
		"  [4K, 8K)               13 " + bar(26),
		"  [2M, 4M)                1 " + bar(2),
	} {
		if !strings.Contains(got, line+"\n") {
			t.Errorf("no line %q in\n%s", line, got)
		}
	}
	if n := strings.Count(got, "\n"); n != 23 { // [0] .. [2M, 4M): slots 0..22
		t.Errorf("%d lines, want 23:\n%s", n, got)
	}
	if strings.HasSuffix(got, "[4M, 8M)") {
		t.Error("drew past the last non-empty slot")
	}
	var empty Hist
	sb.Reset()
	if err := empty.Render(&sb, ""); err != nil || sb.Len() != 0 {
		t.Errorf("empty histogram drew %q", sb.String())
	}
	var top Hist
	top.Observe(1 << 50)
	sb.Reset()
	_ = top.Render(&sb, "")
	if !strings.HasPrefix(sb.String(), "[1T, ...)") {
		t.Errorf("last slot drawn %q", sb.String())
	}
}

func TestHistArithmetic(t *testing.T) {
	var a, b Hist
	for _, v := range []uint64{100, 200, 3000, 3000, 3000, 70000} {
		a.Observe(v)
	}
	b = a
	b.Observe(10)
	d := b.Sub(a)
	if d.Count != 1 || d.SumNs != 10 || d.Slots[Slot(10)] != 1 {
		t.Errorf("Sub = %+v", d)
	}
	if got := a.Mean(); got != time.Duration((100+200+9000+70000)/6) {
		t.Errorf("Mean = %v", got)
	}
	if got := a.Quantile(0.5); got != 4096*time.Nanosecond {
		t.Errorf("p50 = %v, want < 4.096µs", got)
	}
	if got := a.Quantile(1); got != 131072*time.Nanosecond {
		t.Errorf("p100 = %v, want < 131.072µs", got)
	}
	bs := a.Buckets()
	if len(bs) == 0 || bs[0].Lo != 64 || bs[len(bs)-1].Hi != 131072 {
		t.Errorf("Buckets = %+v", bs)
	}
	var sum Hist
	sum.Add(a)
	sum.Add(d)
	if sum != b {
		t.Errorf("Add: %+v, want %+v", sum, b)
	}
}
