package ioreq

import (
	"errors"
	"testing"
	"unsafe"
)

// rawFrom reads an ioreq_t image from b (zero-padded to 32 bytes), as the
// page would hold it.
func rawFrom(b []byte) Raw {
	var r Raw
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&r)), SlotSize), b)
	return r
}

// FuzzDecode feeds arbitrary slot contents to Decode: it never panics, a
// refusal is one of the two classes, and an accepted request is within
// the protocol's bounds and survives re-encoding unchanged.
func FuzzDecode(f *testing.F) {
	for _, r := range []Raw{
		{Addr: 0xe0000000, Count: 1, Size: 4, Bits: StateReady | bitsDir, Type: typeCopy},
		{Addr: 0xc004, Data: 0xbeef, Count: 1, Size: 2, Bits: StateReady, Type: typePIO},
		{Addr: 0x28<<32 | 0x10, Count: 1, Size: 4, Bits: StateReady | bitsDir, Type: typePCIConfig},
		{Addr: 0x1000, Data: 0x7000, Count: 16, Size: 4, Bits: StateReady | bitsDataIsPtr | bitsDF, Type: typeCopy},
		{Addr: 0x1000, Count: 1, Size: 3, Bits: StateReady, Type: typeCopy},
		{Addr: 0x1ffc, Data: 0, Count: 1024, Size: 4, Bits: StateReady | bitsDF, Type: typeCopy},
	} {
		f.Add(unsafe.Slice((*byte)(unsafe.Pointer(&r)), SlotSize))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r := rawFrom(b)
		req, err := Decode(r)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrUnsupported) {
				t.Fatalf("refusal of another class: %v", err)
			}
			return
		}
		switch {
		case req.Size != 1 && req.Size != 2 && req.Size != 4 && req.Size != 8:
			t.Fatalf("size %d accepted", req.Size)
		case r.Count < 1 || r.Count > MaxReps || r.Count > 1 && req.Kind != KindMMIO || r.DataIsPtr() || r.State() != StateReady:
			t.Fatalf("accepted %+v", r)
		case req.Kind == KindMMIO && func() bool { lo, n := req.Span(); return lo+n-1 < lo || lo > req.Addr }():
			t.Fatalf("wrapping rep %+v accepted", req)
		case req.Data&^req.Mask() != 0:
			t.Fatalf("data %#x wider than %d bytes", req.Data, req.Size)
		case req.Kind == KindPIO && req.Addr+uint64(req.Size) > portSpace:
			t.Fatalf("port %#x+%d accepted", req.Addr, req.Size)
		case req.Kind == KindPCIConfig && req.Addr+uint64(req.Size) > pciConfigSize:
			t.Fatalf("config register %#x+%d accepted", req.Addr, req.Size)
		case req.Kind == KindMMIO && req.Addr+uint64(req.Size)-1 < req.Addr:
			t.Fatalf("wrapping MMIO %#x+%d accepted", req.Addr, req.Size)
		}
		back, err := Decode(req.Raw())
		if err != nil || back != req {
			t.Fatalf("re-encoding %v: %+v, %v", req, back, err)
		}
	})
}
