package ioreq

import (
	"errors"
	"strings"
	"testing"
	"unsafe"

	"github.com/gpuvm/gpuvm/xen/privcmd"
)

// raw builds a READY request.
func raw(typ uint8, read bool, addr, data uint64, size, count uint32) Raw {
	r := Raw{Addr: addr, Data: data, Count: count, Size: size, Bits: StateReady, Type: typ}
	if read {
		r.Bits |= bitsDir
	}
	return r
}

// TestDecodeEverySize decodes every size, direction and type that gpuvm
// serves, and checks the encoding Xen would post round-trips.
func TestDecodeEverySize(t *testing.T) {
	dev, _ := privcmd.MakeSBDF(0, 0, 5, 0)
	for _, kind := range []Kind{KindPIO, KindMMIO, KindPCIConfig} {
		for _, size := range []uint32{1, 2, 4, 8} {
			for _, read := range []bool{true, false} {
				addr := uint64(0xe0001000)
				switch kind {
				case KindPIO:
					addr = 0xc000
				case KindPCIConfig:
					addr = uint64(dev)<<32 | 0x10
				}
				r := raw(uint8(kind), read, addr, 0x1122334455667788, size, 1)
				req, err := Decode(r)
				if size == 8 && kind != KindMMIO {
					if !errors.Is(err, ErrMalformed) {
						t.Errorf("%v size 8: %v", kind, err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("%v size %d read %v: %v", kind, size, read, err)
				}
				if req.Kind != kind || req.Size != int(size) || req.Write == read {
					t.Fatalf("decoded %+v", req)
				}
				wantData := uint64(0)
				if !read {
					wantData = 0x1122334455667788 & sizeMask(int(size))
				}
				if req.Data != wantData {
					t.Fatalf("%v size %d: data %#x, want %#x", kind, size, req.Data, wantData)
				}
				if kind == KindPCIConfig && (req.Device != dev || req.Addr != 0x10) {
					t.Fatalf("config access decoded as %v+%#x", req.Device, req.Addr)
				}
				back, err := Decode(req.Raw())
				if err != nil || back != req {
					t.Fatalf("round trip of %v: %+v, %v", req, back, err)
				}
				if !strings.Contains(req.String(), kind.String()) {
					t.Fatalf("String %q", req.String())
				}
			}
		}
	}
}

// TestDecodeReps: a REP STOS to MMIO arrives as one request with a count
// (and the direction flag); its span is what the claims must cover.
func TestDecodeReps(t *testing.T) {
	up := raw(typeCopy, false, 0x1000, 7, 4, 1024)
	req, err := Decode(up)
	if err != nil {
		t.Fatal(err)
	}
	if lo, n := req.Span(); req.Reps() != 1024 || req.Down || lo != 0x1000 || n != 4096 || req.Data != 7 {
		t.Fatalf("up: %+v span %#x+%#x", req, lo, n)
	}
	down := up
	down.Addr, down.Bits = 0x1ffc, down.Bits|bitsDF
	if req, err = Decode(down); err != nil {
		t.Fatal(err)
	}
	if lo, n := req.Span(); !req.Down || lo != 0x1000 || n != 4096 {
		t.Fatalf("down: %+v span %#x+%#x", req, lo, n)
	}
	if back, err := Decode(req.Raw()); err != nil || back != req {
		t.Fatalf("round trip: %+v, %v", back, err)
	}
	c := MMIO(0x1000, 4096)
	if !c.covers(req) {
		t.Fatal("a claim does not cover a rep inside it")
	}
	req.Count++
	if c.covers(req) {
		t.Fatal("a claim covers a rep running out of it")
	}
}

// TestDecodeRefuses feeds hostile and unsupported requests: each is
// refused with the right class of error and never panics.
func TestDecodeRefuses(t *testing.T) {
	ok := raw(typeCopy, true, 0x1000, 0, 4, 1)
	with := func(f func(*Raw)) Raw { r := ok; f(&r); return r }
	for name, c := range map[string]struct {
		r    Raw
		want error
	}{
		"state none":         {with(func(r *Raw) { r.Bits = StateNone }), ErrMalformed},
		"state inprocess":    {with(func(r *Raw) { r.Bits = StateInProcess | bitsDir }), ErrMalformed},
		"state resp ready":   {with(func(r *Raw) { r.Bits = StateRespReady }), ErrMalformed},
		"state 0xf":          {with(func(r *Raw) { r.Bits = 0xf }), ErrMalformed},
		"size 0":             {with(func(r *Raw) { r.Size = 0 }), ErrMalformed},
		"size 3":             {with(func(r *Raw) { r.Size = 3 }), ErrMalformed},
		"size 16":            {with(func(r *Raw) { r.Size = 16 }), ErrMalformed},
		"size huge":          {with(func(r *Raw) { r.Size = 0xffffffff }), ErrMalformed},
		"count 0":            {with(func(r *Raw) { r.Count = 0 }), ErrMalformed},
		"port rep count 2":   {with(func(r *Raw) { r.Type = typePIO; r.Addr = 0x80; r.Count = 2 }), ErrUnsupported},
		"rep count huge":     {with(func(r *Raw) { r.Count = 0xffffffff }), ErrMalformed},
		"rep count 4097":     {with(func(r *Raw) { r.Count = MaxReps + 1 }), ErrMalformed},
		"rep wraps up":       {with(func(r *Raw) { r.Addr = 1<<64 - 8; r.Count = 3 }), ErrMalformed},
		"rep wraps down":     {with(func(r *Raw) { r.Addr = 4; r.Count = 3; r.Bits |= bitsDF }), ErrMalformed},
		"data_is_ptr":        {with(func(r *Raw) { r.Bits |= bitsDataIsPtr; r.Count = 16 }), ErrUnsupported},
		"data_is_ptr single": {with(func(r *Raw) { r.Bits |= bitsDataIsPtr }), ErrUnsupported},
		"timeoffset":         {with(func(r *Raw) { r.Type = 7 }), ErrUnsupported},
		"invalidate":         {with(func(r *Raw) { r.Type = 8 }), ErrUnsupported},
		"type 0xff":          {with(func(r *Raw) { r.Type = 0xff }), ErrUnsupported},
		"mmio wraps":         {with(func(r *Raw) { r.Addr = ^uint64(0) - 2 }), ErrMalformed},
		"port beyond 64K":    {with(func(r *Raw) { r.Type = typePIO; r.Addr = 0xfffe }), ErrMalformed},
		"port 8 bytes":       {with(func(r *Raw) { r.Type = typePIO; r.Size = 8 }), ErrMalformed},
		"config beyond 4K":   {with(func(r *Raw) { r.Type = typePCIConfig; r.Addr = 0xffe }), ErrMalformed},
		"config high offset": {with(func(r *Raw) { r.Type = typePCIConfig; r.Addr = 0x28<<32 | 0x80000000 }), ErrMalformed},
	} {
		_, err := Decode(c.r)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
	// Direction flag and reserved bits do not matter for a single access.
	if _, err := Decode(with(func(r *Raw) { r.Bits |= bitsDF | 0x80; r.Pad0 = 0xffff })); err != nil {
		t.Fatalf("df set: %v", err)
	}
	// The last bytes of each space are fine.
	for _, r := range []Raw{
		with(func(r *Raw) { r.Addr = ^uint64(0) - 3 }),
		with(func(r *Raw) { r.Type = typePIO; r.Addr = 0xfffc }),
		with(func(r *Raw) { r.Type = typePCIConfig; r.Addr = 0xffc }),
	} {
		if _, err := Decode(r); err != nil {
			t.Errorf("%+v: %v", r, err)
		}
	}
}

// TestPage checks the page's bounds and its port check.
func TestPage(t *testing.T) {
	words := make([]uint64, 512)
	mem := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), 4096)
	for _, n := range []int{0, MaxVCPUs + 1} {
		if _, err := NewPage(mem, n); err == nil {
			t.Errorf("%d vCPUs accepted", n)
		}
	}
	if _, err := NewPage(mem[:63], 2); err == nil {
		t.Error("short page accepted")
	}
	if _, err := NewPage(mem[4:], 1); err == nil {
		t.Error("misaligned page accepted")
	}
	p, err := NewPage(mem, 2)
	if err != nil {
		t.Fatal(err)
	}
	words[4+3] = 7 // slot 1's vp_eport (little-endian low half of word 3)
	if port, err := p.Port(1); err != nil || port != 7 {
		t.Fatalf("port %d, %v", port, err)
	}
	for _, bad := range []uint64{0, 1 << 17} {
		words[3] = bad
		if _, err := p.Port(0); err == nil {
			t.Errorf("port %d accepted", bad)
		}
	}
	if _, err := p.Port(2); err == nil {
		t.Error("slot beyond the vCPUs accepted")
	}
	// setState stores the word holding the state from the copy only.
	r := raw(typeCopy, true, 0x1000, 0, 4, 1)
	p.setState(1, r, StateRespReady)
	if got := p.Load(1); got.State() != StateRespReady || !got.Read() || got.Type != typeCopy || got.VPEport != 7 {
		t.Fatalf("after setState: %+v", got)
	}
}

// TestClaims checks claim bounds and what a claim covers.
func TestClaims(t *testing.T) {
	dev, _ := privcmd.MakeSBDF(0, 0, 5, 0)
	for _, c := range []Claim{MMIO(0x1000, 0), MMIO(^uint64(0), 2), Ports(0xfff0, 0x20), {Kind: KindPCIConfig, Base: 1, Size: 2},
		{Kind: 7, Base: 0, Size: 1}, {Kind: KindPCIConfig, Base: 1 << 32, Size: 1}} {
		if err := c.check(); err == nil {
			t.Errorf("%v accepted", c)
		}
	}
	m := MMIO(0x1000, 0x100)
	for _, c := range []struct {
		r    Request
		want bool
	}{
		{Request{Kind: KindMMIO, Addr: 0x1000, Size: 4}, true},
		{Request{Kind: KindMMIO, Addr: 0x10fc, Size: 4}, true},
		{Request{Kind: KindMMIO, Addr: 0x10fd, Size: 4}, false},
		{Request{Kind: KindMMIO, Addr: 0xffc, Size: 8}, false},
		{Request{Kind: KindPIO, Addr: 0x1000, Size: 4}, false},
	} {
		if got := m.covers(c.r); got != c.want {
			t.Errorf("%v covers %v: %v", m, c.r, got)
		}
	}
	if !MMIO(0, 2).overlaps(MMIO(1, 1)) || MMIO(0, 2).overlaps(MMIO(2, 1)) || MMIO(0, 2).overlaps(Ports(0, 2)) {
		t.Error("overlaps")
	}
	if !PCIDevice(dev).covers(Request{Kind: KindPCIConfig, Device: dev, Size: 4}) || PCIDevice(dev).covers(Request{Kind: KindPCIConfig, Device: dev + 1, Size: 4}) {
		t.Error("PCI device claim")
	}
	if typ, s, e := Ports(0xc000, 0x80).xenRange(); typ != privcmd.RangePort || s != 0xc000 || e != 0xc07f {
		t.Errorf("ports range %v %#x %#x", typ, s, e)
	}
}
