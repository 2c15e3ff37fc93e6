package pvdrm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

func ringMem(slots int) []byte { return make([]byte, HeaderSize+slots*SlotSize) }

func req(v byte) []byte { return bytes.Repeat([]byte{v}, SlotSize) }

func TestSlots(t *testing.T) {
	for _, tc := range []struct {
		size int
		want uint32
	}{{4096, 16}, {4096 * 2, 32}, {HeaderSize + SlotSize, 1}, {HeaderSize + 3*SlotSize, 2}, {100, 0}} {
		if got := Slots(tc.size); got != tc.want {
			t.Errorf("Slots(%d) = %d, want %d", tc.size, got, tc.want)
		}
	}
}

func TestRoundTrip(t *testing.T) {
	mem := ringMem(4)
	f, err := NewFront(mem)
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewBack(mem)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, SlotSize)
	for round := range 10 { // wraps the 4-slot ring several times
		for i := range 4 {
			kick, err := f.Push(req(byte(round*4 + i)))
			if err != nil {
				t.Fatal(err)
			}
			if i == 0 && !kick {
				t.Errorf("round %d: the first request after an idle back end did not ask for a notification", round)
			}
		}
		if _, err := f.Push(req(0)); err == nil {
			t.Fatal("a fifth request fit in a 4-slot ring")
		}
		for i := range 4 {
			ok, err := b.Next(got)
			if !ok || err != nil || got[0] != byte(round*4+i) {
				t.Fatalf("round %d request %d: %v %v %d", round, i, ok, err, got[0])
			}
			b.Respond(req(got[0] + 100))
		}
		if b.FinalCheck() {
			t.Fatal("final check found requests that were never made")
		}
		for i := range 4 {
			ok, err := f.Poll(got)
			if !ok || err != nil || got[0] != byte(round*4+i+100) {
				t.Fatalf("round %d response %d: %v %v %d", round, i, ok, err, got[0])
			}
		}
		f.FinalCheck()
	}
}

// The back end copies a request out once: a front end that rewrites the
// slot after the back end read it changes nothing the back end holds.
func TestRequestCopiedOnce(t *testing.T) {
	mem := ringMem(2)
	f, _ := NewFront(mem)
	b, _ := NewBack(mem)
	f.Push(req(1))
	got := make([]byte, SlotSize)
	if ok, _ := b.Next(got); !ok {
		t.Fatal("no request")
	}
	copy(mem[HeaderSize:], req(9)) // the hostile rewrite
	if !bytes.Equal(got, req(1)) {
		t.Error("the back end's copy changed with the shared slot")
	}
}

// A producer index the front end sets more than the ring size ahead is a
// protocol error, for good; a back end never reads past it.
func TestHostileProducer(t *testing.T) {
	for _, prod := range []uint32{5, 1 << 31, ^uint32(0)} {
		mem := ringMem(4)
		NewFront(mem)
		b, _ := NewBack(mem)
		binary.LittleEndian.PutUint32(mem[offReqProd:], prod)
		got := make([]byte, SlotSize)
		if _, err := b.Next(got); !errors.Is(err, ErrOverflow) {
			t.Errorf("req_prod %d: %v, want ErrOverflow", prod, err)
		}
		binary.LittleEndian.PutUint32(mem[offReqProd:], 1)
		if _, err := b.Next(got); !errors.Is(err, ErrOverflow) {
			t.Errorf("after req_prod %d the ring works again: %v", prod, err)
		}
	}
	// A front end that keeps producing without taking responses is
	// refused once the unanswered requests would overwrite its responses.
	mem := ringMem(4)
	NewFront(mem)
	b, _ := NewBack(mem)
	got := make([]byte, SlotSize)
	binary.LittleEndian.PutUint32(mem[offReqProd:], 4)
	for range 4 {
		if ok, err := b.Next(got); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	binary.LittleEndian.PutUint32(mem[offReqProd:], 5)
	if _, err := b.Next(got); !errors.Is(err, ErrOverflow) {
		t.Errorf("a fifth request with four unanswered: %v", err)
	}
}

// A back end that publishes more responses than were requested is refused
// by the front end.
func TestHostileResponder(t *testing.T) {
	mem := ringMem(4)
	f, _ := NewFront(mem)
	f.Push(req(1))
	binary.LittleEndian.PutUint32(mem[offRspProd:], 3)
	if _, err := f.Poll(make([]byte, SlotSize)); !errors.Is(err, ErrOverflow) {
		t.Errorf("rsp_prod 3 for 1 request: %v", err)
	}
}

// FuzzBackRing: whatever the front end writes in the shared page (indices
// and slots, between the back end's reads), the back end never panics,
// never reads more outstanding requests than the ring holds, and once it
// reports an overflow it stays broken.
func FuzzBackRing(f *testing.F) {
	f.Add([]byte{1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		mem := ringMem(8)
		NewFront(mem)
		b, err := NewBack(mem)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, SlotSize)
		broken := false
		read, answered := uint32(0), uint32(0)
		for len(data) >= 4 {
			v := binary.LittleEndian.Uint32(data)
			data = data[4:]
			switch v % 3 {
			case 0: // the front end moves req_prod
				binary.LittleEndian.PutUint32(mem[offReqProd:], v/3)
			case 1: // the back end reads
				ok, err := b.Next(got)
				if broken && err == nil {
					t.Fatal("the ring worked again after an overflow")
				}
				if err != nil {
					broken = true
				}
				if ok {
					read++
					if read-answered > b.Size() {
						t.Fatalf("%d requests read, %d answered, in a %d-slot ring", read, answered, b.Size())
					}
				}
			case 2: // the back end answers one it read
				if answered < read {
					b.Respond(got)
					answered++
				}
			}
		}
	})
}
