package ipc

import (
	"bytes"
	"testing"
)

// FuzzDecodeRequest: the server's entry/frame decoder never panics, accepts
// only entries that re-encode to exactly the same bytes (no ignored bits),
// and never accepts an MMIO access outside the device's BARs.
func FuzzDecodeRequest(f *testing.F) {
	for _, r := range []request{
		{kind: kindRead32, bar: 0, off: 0x1700, seq: 1},
		{kind: kindWrite32, bar: 1, off: 0x2000, value: 0xdeadbeef, seq: 2},
		{kind: kindWrite32, bar: 5, off: 124, value: 1, seq: 3},
		{kind: kindCall, op: 7, nargs: 6, args: [6]uint64{1, 2, 3, 4, 5, 6}, seq: 4},
		{kind: kindCall, op: 1, nargs: 0, seq: 5},
		{kind: kindFill32, bar: 3, off: 0x1000, value: 0, count: MaxFillCount, seq: 6},
	} {
		b := make([]byte, EntrySize)
		encodeRequest(b, &r)
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add(make([]byte, EntrySize))
	f.Fuzz(func(t *testing.T, b []byte) {
		var r request
		if err := decodeRequest(b, &r); err != nil {
			return
		}
		out := make([]byte, EntrySize)
		encodeRequest(out, &r)
		if !bytes.Equal(out, b) {
			t.Fatalf("accepted entry does not re-encode identically:\n in %x\nout %x", b, out)
		}
		if r.kind != kindCall {
			if err := checkMMIO(int(r.bar), r.off); err != nil {
				t.Fatalf("accepted invalid access: %v", err)
			}
			if r.off+4 > barSize(r.bar) {
				t.Fatalf("accepted BAR%d+%#x", r.bar, r.off)
			}
			if r.kind == kindFill32 && (r.count == 0 || r.count > MaxFillCount || r.off+4*uint64(r.count) > barSize(r.bar)) {
				t.Fatalf("accepted a fill of %d words at BAR%d+%#x", r.count, r.bar, r.off)
			}
		} else if r.nargs > MaxCallArgs {
			t.Fatalf("accepted %d args", r.nargs)
		}
	})
}

// FuzzDecodeResponse: the client's decoder never panics and is exact.
func FuzzDecodeResponse(f *testing.F) {
	for _, r := range []response{
		{kind: kindRead32Reply, seq: 1, value: 0x12345678},
		{kind: kindCallReply, seq: 2, value: 0xFFFFFFEA, result: [6]uint64{1, 2, 3, 4, 5, 6}},
	} {
		b := make([]byte, EntrySize)
		encodeResponse(b, &r)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var r response
		if err := decodeResponse(b, &r); err != nil {
			return
		}
		out := make([]byte, EntrySize)
		encodeResponse(out, &r)
		if !bytes.Equal(out, b) {
			t.Fatalf("accepted response does not re-encode identically")
		}
	})
}

// FuzzDecodeHello: the handshake decoder never panics, and everything it
// accepts is valid and re-encodes to exactly the same bytes.
func FuzzDecodeHello(f *testing.F) {
	for _, h := range []Hello{
		{Version: 1, DomID: 1, Name: "a", Mode: "fv-naive", RAMSize: 1 << 20, Transport: TransportShm},
		{Version: 1, DomID: 32751, Name: "guest with a long name, 64 bytes long......................... ", Mode: "pv-multicall", RAMSize: 64 << 30, Transport: TransportSocket},
		{Version: 1, DomID: 5, Name: "vm1", Mode: "fv-optimized", RAMSize: 256 << 20, Transport: TransportShm},
	} {
		f.Add(encodeHello(&h, 0))
		f.Add(encodeHello(&h, 8))
	}
	f.Add([]byte("GPVM"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, n, err := decodeHello(b)
		if err != nil {
			return
		}
		if err := h.validate(); err != nil {
			t.Fatalf("decoder accepted an invalid hello: %v", err)
		}
		if n < 0 || n > MaxExtraFiles {
			t.Fatalf("accepted %d extra fds", n)
		}
		if out := encodeHello(&h, n); !bytes.Equal(out, b) {
			t.Fatalf("accepted hello does not re-encode identically:\n in %x\nout %x", b, out)
		}
	})
}

// FuzzDecodeWelcome: the client's Welcome decoder never panics and is exact.
func FuzzDecodeWelcome(f *testing.F) {
	for _, w := range []welcomeWire{
		{Welcome: Welcome{VGPU: 1, VRAMSize: 1 << 30, Channels: 32}, transport: TransportSocket},
		{Welcome: Welcome{VGPU: 2, Params: map[string]string{"a": "b", "sched": "band", "empty": ""}}, transport: TransportShm, reqEntries: 256, rspEntries: 16, nExtra: 2},
	} {
		b, err := encodeWelcome(&w)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		w, err := decodeWelcome(b)
		if err != nil {
			return
		}
		out, err := encodeWelcome(&w)
		if err != nil {
			t.Fatalf("decoder accepted a welcome the encoder refuses: %v", err)
		}
		if !bytes.Equal(out, b) {
			t.Fatalf("accepted welcome does not re-encode identically")
		}
	})
}
