package rangealloc

import (
	"errors"
	"testing"
)

func TestAllocAlignFreeCoalesce(t *testing.T) {
	a := New(0x1000, 0x10000)
	x, err := a.Alloc(0x1000, 0x1000)
	if err != nil || x != 0x1000 {
		t.Fatalf("first alloc %#x %v", x, err)
	}
	y, err := a.Alloc(0x1000, 0x4000)
	if err != nil || y != 0x4000 {
		t.Fatalf("aligned alloc %#x %v", y, err)
	}
	if _, err := a.Alloc(0x100000, 1); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("oversize: %v", err)
	}
	if err := a.Free(0x2000); err == nil {
		t.Fatal("free of unallocated start succeeded")
	}
	if err := a.Free(x); err != nil {
		t.Fatal(err)
	}
	if err := a.Free(y); err != nil {
		t.Fatal(err)
	}
	if a.FreeBytes() != 0x10000 || len(a.free) != 1 {
		t.Fatalf("not coalesced: %+v", a.free)
	}
	if err := a.Reserve(0x8000, 0x2000); err != nil {
		t.Fatal(err)
	}
	if err := a.Reserve(0x8800, 0x100); err == nil {
		t.Fatal("double reserve succeeded")
	}
	if _, err := a.Alloc(0, 1); err == nil {
		t.Fatal("zero alloc succeeded")
	}
	if _, err := a.Alloc(1, 3); err == nil {
		t.Fatal("bad alignment accepted")
	}
}

func TestExhaustAndReuse(t *testing.T) {
	a := New(0, 16)
	var got []uint64
	for i := 0; i < 16; i++ {
		v, err := a.Alloc(1, 1)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, v)
	}
	if _, err := a.Alloc(1, 1); err == nil {
		t.Fatal("allocated past the end")
	}
	for i := 0; i < 16; i += 2 {
		if err := a.Free(got[i]); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Alloc(2, 1); err == nil {
		t.Fatal("found 2 contiguous in a fragmented range")
	}
	for i := 1; i < 16; i += 2 {
		_ = a.Free(got[i])
	}
	if v, err := a.Alloc(16, 1); err != nil || v != 0 {
		t.Fatalf("full range after frees: %v %v", v, err)
	}
}
