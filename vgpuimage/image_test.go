package vgpuimage

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// sample is a small image of every section: a PV vGPU with one running
// channel and two VRAM pages.
func sample(pv bool) *Image {
	m := &Image{
		Identity: Identity{Mode: "fv-optimized", Profile: "vgpu-256m", Name: "vm one", DomID: 7, RAM: 64 << 20,
			VRAM: 256 << 20, Channels: 2, BAR1: 8 << 12, BAR3: 8 << 12},
		Regs:    []Reg{{0x200, 0xffffffff}, {0x1700, 0x10}, {0x2270, 0x1234}},
		Chans:   []Chan{{Inst: 0x80000010, Ctl: 1, Put: 5, Enabled: true, Listed: true, State: []uint32{1, 0, 5, 6, 7, 8}}, {}},
		Account: Account{Submissions: 3, GPUTimeNs: 1000, QueueWaitNs: 20, Released: 3, Waits: []uint64{1, 2, 0, 0, 0, 0, 0}},
		Pages:   []Page{{Off: 0, Data: bytes.Repeat([]byte{1}, 4096)}, {Off: 1 << 20, Data: bytes.Repeat([]byte{2}, 4096)}},
	}
	if pv {
		m.Identity.Mode, m.Identity.PV = "pv-multicall", true
		entries := make([]uint64, LargeTableLen)
		entries[3] = 0x1234_0000_0001
		m.PV = &PV{Next: 3,
			Objects:  []PVObject{{Handle: 1, Kind: KindPageDir}, {Handle: 3, Kind: KindLargeTable, In: 1, PDE: 2, Entries: entries}},
			Bindings: []PVBinding{{RAMIN: 0x10000, PD: 1}},
			BAR1:     make([]uint64, 8), BAR3: make([]uint64, 8),
			HC: Hypercall{Slots: []HCSlot{{Index: 0, GPA: 0x3000}}, Sel: 0, Lo: 0x3001, N: 9}}
	}
	return m
}

func encode(t testing.TB, m *Image) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := Encode(&b, m); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// resum recomputes the trailer of an edited image, so that only the
// structure or bounds check can catch the edit.
func resum(b []byte) []byte {
	out := bytes.Clone(b)
	sum := sha256.Sum256(out[:len(out)-TrailerSize])
	copy(out[len(out)-TrailerSize:], sum[:])
	return out
}

func TestImageRoundTrip(t *testing.T) {
	for _, pv := range []bool{false, true} {
		m := sample(pv)
		b := encode(t, m)
		got, err := Decode(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("pv %v: %v", pv, err)
		}
		if !reflect.DeepEqual(got, m) {
			t.Fatalf("pv %v: decoded %+v, want %+v", pv, got, m)
		}
		if again := encode(t, got); !bytes.Equal(again, b) {
			t.Fatalf("pv %v: re-encoding differs", pv)
		}
		if got.Bytes() != 8192 {
			t.Fatalf("Bytes %d", got.Bytes())
		}
	}
}

// sectionEnds are the offsets at which each section of b ends.
func sectionEnds(t *testing.T, b []byte) []int {
	t.Helper()
	var ends []int
	for off := HeaderSize; off < len(b)-TrailerSize; {
		n := int(le.Uint32(b[off+4:]))
		off += SectionHeaderSize + n
		ends = append(ends, off)
	}
	return ends
}

// TestImageTruncatedRefused: an image cut at any byte — at every section
// boundary and inside every section — is refused as truncated.
func TestImageTruncatedRefused(t *testing.T) {
	b := encode(t, sample(true))
	ends := sectionEnds(t, b)
	if len(ends) != 8 {
		t.Fatalf("%d sections", len(ends))
	}
	cuts := append([]int{0, 8, HeaderSize}, ends...)
	for i := 0; i < len(b); i += 97 {
		cuts = append(cuts, i)
	}
	cuts = append(cuts, len(b)-1)
	for _, n := range cuts {
		_, err := Decode(bytes.NewReader(b[:n]))
		if !errors.Is(err, ErrTruncated) && !(n < 8 && err != nil) {
			t.Fatalf("cut at %d of %d: %v, want ErrTruncated", n, len(b), err)
		}
	}
}

func TestImageRefusals(t *testing.T) {
	good := encode(t, sample(false))
	ends := sectionEnds(t, good)
	edit := func(f func(b []byte) []byte) []byte { return resum(f(bytes.Clone(good))) }
	cases := []struct {
		name string
		b    []byte
		want error
		msg  string
	}{
		{"bad checksum", func() []byte { b := bytes.Clone(good); b[len(b)-1] ^= 1; return b }(), ErrChecksum, ""},
		{"a flipped VRAM byte", func() []byte { b := bytes.Clone(good); b[ends[5]-1] ^= 1; return b }(), ErrChecksum, ""},
		{"version 2", edit(func(b []byte) []byte { le.PutUint32(b[8:], 2); return b }), ErrVersion, "image version 2: this gpuvm reads version 1"},
		{"not an image", []byte("#!/bin/sh\necho hello, this is no image\n"), ErrNotImage, ""},
		{"trailing bytes", append(bytes.Clone(good), 0), ErrMalformed, "after the checksum"},
		{"header flags", edit(func(b []byte) []byte { b[12] = 1; return b }), ErrMalformed, "flags"},
		{"unknown section", edit(func(b []byte) []byte { le.PutUint16(b[ends[4]:], 99); return b }), ErrMalformed, "type 99"},
		{"sections out of order", edit(func(b []byte) []byte { le.PutUint16(b[HeaderSize:], SecRegs); return b }), ErrMalformed, "identity section belongs"},
		{"page past the declared VRAM", reencode(t, func(m *Image) { m.Pages[1].Off = m.Identity.VRAM }), ErrMalformed, "past the image's VRAM"},
		{"page straddling the end", reencode(t, func(m *Image) { m.Pages[1].Off = m.Identity.VRAM - 4096; m.Pages[1].Data = make([]byte, 8192) }), ErrMalformed, "past the image's VRAM"},
		{"overlapping pages", reencode(t, func(m *Image) { m.Pages[1].Off = 0 }), ErrMalformed, "not overlap"},
		{"unsorted pages", reencode(t, func(m *Image) { m.Pages[0], m.Pages[1] = m.Pages[1], m.Pages[0] }), ErrMalformed, "sorted"},
		{"too many channels", reencode(t, func(m *Image) {
			m.Identity.Channels = MaxChannels + 1
			m.Chans = make([]Chan, MaxChannels+1)
		}), ErrMalformed, "channels"},
		{"channel count unlike the identity", reencode(t, func(m *Image) { m.Chans = m.Chans[:1] }), ErrMalformed, "1 channels for a vGPU of 2"},
		{"register outside BAR0", reencode(t, func(m *Image) { m.Regs[2].Off = BAR0Size }), ErrMalformed, "not a BAR0 word"},
		{"registers unsorted", reencode(t, func(m *Image) { m.Regs[0].Off = 0x3000 }), ErrMalformed, "increase"},
		{"VRAM beyond the limit", reencode(t, func(m *Image) { m.Identity.VRAM = MaxVRAM + VRAMGranule }), ErrMalformed, "VRAM"},
		{"PV section in an FV image", reencodeWithPV(t), ErrMalformed, "PV section where the account section belongs"},
		{"a second account section", edit(func(b []byte) []byte {
			acc := bytes.Clone(b[ends[2]:ends[3]])
			return slices.Concat(b[:ends[3]], acc, b[ends[3]:])
		}), ErrMalformed, "a second account section"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Decode(bytes.NewReader(c.b))
			if !errors.Is(err, c.want) || !strings.Contains(fmtErr(err), c.msg) {
				t.Fatalf("%v, want %v with %q", err, c.want, c.msg)
			}
		})
	}
}

func fmtErr(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// reencode writes sample(false) edited by f, bypassing Encode's own check
// (as a hostile writer would) and with a good checksum.
func reencode(t *testing.T, f func(*Image)) []byte {
	t.Helper()
	m := sample(false)
	f(m)
	return rawEncode(m)
}

// reencodeWithPV is an FV image carrying a PV section.
func reencodeWithPV(t *testing.T) []byte {
	m := sample(false)
	m.PV = sample(true).PV
	return rawEncode(m)
}

// rawEncode encodes m without checking it.
func rawEncode(m *Image) []byte {
	var b bytes.Buffer
	if err := encodeUnchecked(&b, m); err != nil {
		panic(err) // a bytes.Buffer does not fail
	}
	return b.Bytes()
}

// TestEncodeRefusesOutOfBounds: Encode never writes an image Decode would
// refuse.
func TestEncodeRefusesOutOfBounds(t *testing.T) {
	m := sample(false)
	m.Pages[1].Off = m.Identity.VRAM
	if err := Encode(&bytes.Buffer{}, m); !errors.Is(err, ErrMalformed) {
		t.Fatalf("encode of a page past the VRAM: %v", err)
	}
}

// FuzzDecode: no input makes Decode panic or allocate past its bounds,
// and an input it accepts is canonical: encoding what it returned gives
// the input back.
func FuzzDecode(f *testing.F) {
	f.Add(rawEncode(sample(false)))
	f.Add(rawEncode(sample(true)))
	f.Add(rawEncode(samplePVDRM()))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(bytes.NewReader(b))
		if err != nil {
			return
		}
		var out bytes.Buffer
		if err := Encode(&out, m); err != nil {
			t.Fatalf("Decode accepted what Encode refuses: %v", err)
		}
		if !bytes.Equal(out.Bytes(), b) {
			t.Fatal("an accepted image is not canonical")
		}
	})
}
