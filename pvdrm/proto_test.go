package pvdrm

import (
	"encoding/binary"
	"reflect"
	"testing"
)

func TestRequestRoundTrip(t *testing.T) {
	d := NewCodec()
	slot := make([]byte, SlotSize)
	for _, s := range Specs() {
		r := Request{ID: 77, Op: s.Op, Args: map[string]uint64{}}
		if s.File {
			r.File = 3
		}
		for i, f := range s.Args {
			r.Args[f.Name] = uint64(i + 1)
		}
		if s.Op == OpPushbuf {
			r.Buffers = []uint32{5, 6}
			r.Push = []PushEntry{{5, 0x100, 0x40, PushYield}}
			r.Args["nr_buffers"], r.Args["nr_push"] = 2, 1
		}
		if err := d.EncodeRequest(slot, r); err != nil {
			t.Fatal(err)
		}
		got, errno := d.Decode(slot)
		if errno != 0 {
			t.Fatalf("%s: errno %d", s.Name, errno)
		}
		if got.ID != r.ID || got.Op != r.Op || got.File != r.File || !reflect.DeepEqual(got.Args, r.Args) ||
			!reflect.DeepEqual(got.Buffers, r.Buffers) || !reflect.DeepEqual(got.Push, r.Push) {
			t.Errorf("%s: got %+v, want %+v", s.Name, got, r)
		}
		rsp := Response{ID: 77, Op: s.Op, Results: map[string]uint64{}}
		for i, f := range s.Results {
			rsp.Results[f.Name] = uint64(100 + i)
		}
		d.EncodeResponse(slot, rsp)
		if back := d.DecodeResponse(slot); back.ID != 77 || back.Status != 0 || len(back.Results) != len(s.Results) || (len(s.Results) > 0 && !reflect.DeepEqual(back.Results, rsp.Results)) {
			t.Errorf("%s response: %+v", s.Name, back)
		}
	}
	d.EncodeResponse(slot, Response{ID: 1, Op: OpGEMNew, Status: -ENOMEM})
	if r := d.DecodeResponse(slot); r.Status != -ENOMEM || r.Results != nil {
		t.Errorf("error response: %+v", r)
	}
}

func TestRequestRefused(t *testing.T) {
	d := NewCodec()
	mk := func(op Op, file uint32, edit func(args []byte)) []byte {
		slot := make([]byte, SlotSize)
		binary.LittleEndian.PutUint16(slot[OffOp:], uint16(op))
		binary.LittleEndian.PutUint32(slot[OffFile:], file)
		if edit != nil {
			edit(slot[OffArgs:])
		}
		return slot
	}
	for _, tc := range []struct {
		what string
		slot []byte
		want int32
	}{
		{"unknown op", mk(99, 0, nil), -ENOSYS},
		{"flags set", func() []byte { s := mk(OpOpen, 0, nil); s[OffFlags] = 1; return s }(), -EINVAL},
		{"OPEN naming a file", mk(OpOpen, 2, nil), -EBADF},
		{"GEM_NEW without a file", mk(OpGEMNew, 0, nil), -EBADF},
		{"PUSHBUF with 9 buffers", mk(OpPushbuf, 1, func(a []byte) { a[4], a[40] = 9, 1 }), -EINVAL},
		{"PUSHBUF with 5 segments", mk(OpPushbuf, 1, func(a []byte) { a[40] = 5 }), -EINVAL},
		{"PUSHBUF with no segment", mk(OpPushbuf, 1, nil), -EINVAL},
		{"PUSHBUF segment with an unknown flag", mk(OpPushbuf, 1, func(a []byte) { a[40], a[52] = 1, 2 }), -EINVAL},
		{"PUSHBUF segment with flag bit 31", mk(OpPushbuf, 1, func(a []byte) { a[40], a[55] = 1, 0x80 }), -EINVAL},
	} {
		if _, errno := d.Decode(tc.slot); errno != tc.want {
			t.Errorf("%s: errno %d, want %d", tc.what, errno, tc.want)
		}
	}
}

// FuzzDecodeRequest: any slot decodes without panic; a decoded request has
// its lists within limits and re-encodes to a slot that decodes the same.
func FuzzDecodeRequest(f *testing.F) {
	d := NewCodec()
	slot := make([]byte, SlotSize)
	_ = d.EncodeRequest(slot, Request{ID: 1, Op: OpPushbuf, File: 1, Args: map[string]uint64{"channel": 1, "nr_buffers": 1, "nr_push": 1},
		Buffers: []uint32{2}, Push: []PushEntry{{2, 0, 64, 0}}})
	f.Add(append([]byte(nil), slot...))
	_ = d.EncodeRequest(slot, Request{ID: 2, Op: OpGEMNew, File: 1, Args: map[string]uint64{"size": 4096, "domain": DomainGART, "flags": GEMMappable}})
	f.Add(append([]byte(nil), slot...))
	f.Fuzz(func(t *testing.T, b []byte) {
		in := make([]byte, SlotSize)
		copy(in, b)
		r, errno := d.Decode(in)
		if errno != 0 {
			return
		}
		if len(r.Buffers) > MaxPushBuffers || len(r.Push) > MaxPushEntries {
			t.Fatalf("lists beyond limits: %d buffers, %d segments", len(r.Buffers), len(r.Push))
		}
		out := make([]byte, SlotSize)
		if err := d.EncodeRequest(out, r); err != nil {
			t.Fatal(err)
		}
		again, errno := d.Decode(out)
		if errno != 0 || !reflect.DeepEqual(again, r) {
			t.Fatalf("re-decode: %d %+v, want %+v", errno, again, r)
		}
	})
}
