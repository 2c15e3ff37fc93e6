package hypercall

import (
	"encoding/binary"
	"slices"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	calls := []Call{
		{Op: OpMemAlloc, Kind: KindPageDir},
		{Op: OpMemFree, Handle: 7},
		{Op: OpSetPGD, RAMIN: 0x123000, PD: 3},
		{Op: OpMapPGT, PD: 3, PDE: 2, Small: 4, Large: 5},
		{Op: OpMap, PT: 4, Index: 9, PTE: 0x1234_0000_0001},
		{Op: OpMapBatch, PT: 4, Index: 10, Count: 77, PTE: 0x55},
		{Op: OpMapSGBatch, PT: 4, Index: 1, Count: 3, PTEs: []uint64{1, 2, 3}},
		{Op: OpUnmapBatch, PT: 4, Index: 1, Count: 3},
		{Op: OpVMFlush, PD: 3},
		{Op: OpBARMap, BAR: 3, Index: 8, Count: 2, PTE: 0x99},
		{Op: OpBARUnmap, BAR: 1, Index: 8, Count: 2},
		{Op: OpYieldPoints, Channel: 2, Count: 3, Points: []uint32{5, 9, 1023}},
	}
	d := NewDecoder()
	for _, c := range calls {
		e := NewEncoder(false)
		if err := e.Add(c); err != nil {
			t.Fatalf("%v: %v", c.Op, err)
		}
		got, codes, top := d.Decode(e.Page())
		if top != OK || len(got) != 1 || codes[0] != OK {
			t.Fatalf("%v: decode %v %v", c.Op, top, codes)
		}
		if !sameCall(got[0], c) {
			t.Errorf("%v: got %+v want %+v", c.Op, got[0], c)
		}
	}
	e := NewEncoder(true)
	for _, c := range calls {
		if err := e.Add(c); err != nil {
			t.Fatalf("multicall add %v: %v", c.Op, err)
		}
	}
	got, codes, top := d.Decode(e.Page())
	if top != OK || len(got) != len(calls) {
		t.Fatalf("multicall: %v, %d calls", top, len(got))
	}
	for i := range calls {
		if codes[i] != OK || !sameCall(got[i], calls[i]) || got[i].At != e.At(i) {
			t.Errorf("multicall call %d: %v %+v", i, codes[i], got[i])
		}
	}
}

func sameCall(a, b Call) bool {
	if len(a.PTEs) != len(b.PTEs) {
		return false
	}
	for i := range a.PTEs {
		if a.PTEs[i] != b.PTEs[i] {
			return false
		}
	}
	if !slices.Equal(a.Points, b.Points) {
		return false
	}
	a.PTEs, b.PTEs, a.At, b.At = nil, nil, 0, 0
	return a.Channel == b.Channel && a.Op == b.Op && a.Kind == b.Kind && a.Handle == b.Handle && a.RAMIN == b.RAMIN && a.PD == b.PD &&
		a.PDE == b.PDE && a.Small == b.Small && a.Large == b.Large && a.PT == b.PT && a.BAR == b.BAR &&
		a.Index == b.Index && a.Count == b.Count && a.PTE == b.PTE
}

func page(op Op, args ...uint32) []byte {
	p := make([]byte, PageSize)
	binary.LittleEndian.PutUint32(p[OffOp:], uint32(op))
	binary.LittleEndian.PutUint32(p[OffLen:], uint32(4*len(args)))
	for i, a := range args {
		binary.LittleEndian.PutUint32(p[HeaderSize+4*i:], a)
	}
	return p
}

func TestMalformed(t *testing.T) {
	d := NewDecoder()
	for _, tc := range []struct {
		name string
		page []byte
		want Code
	}{
		{"short page", make([]byte, 100), ErrInval},
		{"unknown op", page(99, 0, 0), ErrNoSys},
		{"length beyond the page", func() []byte {
			p := page(OpMemFree, 1, 0)
			binary.LittleEndian.PutUint32(p[OffLen:], PageSize)
			return p
		}(), ErrRange},
		{"reserved field set", page(OpMemFree, 1, 1), ErrInval},
		{"too short", page(OpMemFree, 1), ErrInval},
		{"too long", page(OpMemFree, 1, 0, 0), ErrInval},
		{"sg count over the limit", page(OpMapSGBatch, 1, 0, MaxSGEntries+1, 0), ErrRange},
		{"sg count and length disagree", page(OpMapSGBatch, 1, 0, 2, 0, 5, 0), ErrInval},
		{"yield points over the limit", page(OpYieldPoints, 0, MaxYieldPoints+1, 0, 0), ErrRange},
		{"yield count and length disagree", page(OpYieldPoints, 0, 2, 0, 0, 7), ErrInval},
		{"yield reserved field set", page(OpYieldPoints, 0, 1, 1, 0, 7), ErrInval},
		{"empty multicall", page(OpMulticall), ErrInval},
		{"multicall entry runs off the end", page(OpMulticall, uint32(OpMemFree), 64, 0, 0), ErrInval},
	} {
		if _, _, got := d.Decode(tc.page); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
	// A multicall inside a multicall is refused for that call only.
	p := page(OpMulticall, uint32(OpMulticall), 0, 0, 0, uint32(OpVMFlush), 8, 0, 0, 3, 0)
	calls, codes, top := d.Decode(p)
	if top != OK || len(calls) != 2 || codes[0] != ErrNoSys || codes[1] != OK || calls[1].PD != 3 {
		t.Errorf("nested multicall: %v %v %+v", top, codes, calls)
	}
}

func TestEncoderLimits(t *testing.T) {
	e := NewEncoder(true)
	n := 0
	for {
		err := e.Add(Call{Op: OpVMFlush, PD: 1})
		if err != nil {
			if err != ErrFull {
				t.Fatal(err)
			}
			break
		}
		n++
	}
	if n != MaxMulticall {
		t.Errorf("multicall held %d flushes, want %d", n, MaxMulticall)
	}
	if _, _, top := NewDecoder().Decode(e.Page()); top != OK {
		t.Errorf("full multicall: %v", top)
	}
	if err := NewEncoder(false).Add(Call{Op: OpYieldPoints, Count: MaxYieldPoints + 1, Points: make([]uint32, MaxYieldPoints+1)}); err != ErrInval {
		t.Errorf("encoding %d yield points: %v, want ErrInval", MaxYieldPoints+1, err)
	}
	one := NewEncoder(false)
	_ = one.Add(Call{Op: OpVMFlush})
	if err := one.Add(Call{Op: OpVMFlush}); err != ErrFull {
		t.Errorf("second call in a single-call encoder: %v", err)
	}
}

// FuzzDecode: the decoder never panics, never returns a count beyond its
// limit, and a decoded call re-encodes to a page that decodes the same.
func FuzzDecode(f *testing.F) {
	e := NewEncoder(true)
	_ = e.Add(Call{Op: OpMapSGBatch, PT: 2, Count: 2, PTEs: []uint64{5, 6}})
	_ = e.Add(Call{Op: OpVMFlush, PD: 1})
	f.Add(append([]byte(nil), e.Page()...))
	f.Add(page(OpMapBatch, 2, 0, 512, 0, 1, 0))
	f.Add(page(OpMulticall, uint32(OpMulticall), 0, 0, 0))
	d := NewDecoder()
	f.Fuzz(func(t *testing.T, b []byte) {
		p := make([]byte, PageSize)
		copy(p, b)
		calls, codes, top := d.Decode(p)
		if top != OK {
			return
		}
		if len(calls) > MaxMulticall || len(codes) != len(calls) {
			t.Fatalf("%d calls, %d codes", len(calls), len(codes))
		}
		for i, c := range calls {
			if codes[i] != OK {
				continue
			}
			if len(c.PTEs) > MaxSGEntries || len(c.Points) > MaxYieldPoints || c.At < 0 || c.At+HeaderSize > PageSize {
				t.Fatalf("call %d: %d PTEs at %d", i, len(c.PTEs), c.At)
			}
			re := NewEncoder(false)
			if err := re.Add(c); err != nil {
				t.Fatalf("re-encode %+v: %v", c, err)
			}
			again, _, top := d.Decode(re.Page())
			if top != OK || !sameCall(again[0], c) {
				t.Fatalf("re-decode of %+v: %v %+v", c, top, again)
			}
		}
	})
}
