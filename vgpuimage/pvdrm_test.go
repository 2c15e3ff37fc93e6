package vgpuimage

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

// samplePVDRM is a pvdrm vGPU's image: two files, a VRAM object whose
// contents are a VRAM page, GART objects and a pooled buffer.
func samplePVDRM() *Image {
	return &Image{
		Identity: Identity{Mode: "pvdrm-pooling", Name: "drm one", DomID: 9, RAM: 64 << 20,
			VRAM: 256 << 20, Channels: 2, BAR1: 8 << 12, BAR3: 8 << 12, PVDRM: true},
		Chans:   []Chan{{}, {}},
		Account: Account{Submissions: 3, Waits: []uint64{1, 2}},
		PVDRM: &PVDRM{Features: 3, Ring: 40, NextFile: 2, GARTSize: 32 << 20,
			Files: []PVDRMFile{
				{ID: 1, NextChan: 1, NextGEM: 3, Chans: []PVDRMChan{{Handle: 1, Fence: 77}}, GEMs: []PVDRMGEM{
					{Handle: 1, Domain: DomainGART, Flags: 1, Shared: true, Size: 8192, VA: 1 << 28, Place: 0},
					{Handle: 3, Domain: DomainVRAM, Size: 4096, VA: 1<<28 + 8192, Place: 1 << 20},
				}},
				{ID: 2, NextGEM: 0},
			},
			Pool: []PVDRMPooled{{Flags: 1, Size: 4096, GART: 16384}}},
		Pages: []Page{{Off: 1 << 20, Data: bytes.Repeat([]byte{5}, 4096)}},
	}
}

func TestPVDRMImageRoundTrip(t *testing.T) {
	m := samplePVDRM()
	b := encode(t, m)
	got, err := Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, m) {
		t.Fatalf("decoded %+v, want %+v", got.PVDRM, m.PVDRM)
	}
	if again := encode(t, got); !bytes.Equal(again, b) {
		t.Fatal("re-encoding differs")
	}
}

// TestPVDRMImageRefused: each edit of a pvdrm image outside the format's
// bounds is refused by Encode and, written anyway, by Decode.
func TestPVDRMImageRefused(t *testing.T) {
	for name, edit := range map[string]func(m *Image){
		"duplicate GEM handle": func(m *Image) { m.PVDRM.Files[0].GEMs[1].Handle = 1 },
		"GEM handle 0":         func(m *Image) { m.PVDRM.Files[0].GEMs[0].Handle = 0 },
		"VRAM object past the VRAM": func(m *Image) {
			m.PVDRM.Files[0].GEMs[1].Place = m.Identity.VRAM - 4096
			m.PVDRM.Files[0].GEMs[1].Size = 8192
		},
		"GART object past the heap": func(m *Image) { m.PVDRM.Files[0].GEMs[0].Place = m.PVDRM.GARTSize },
		"unaligned size":            func(m *Image) { m.PVDRM.Files[0].GEMs[0].Size = 100 },
		"unknown domain":            func(m *Image) { m.PVDRM.Files[0].GEMs[0].Domain = 3 },
		"duplicate file":            func(m *Image) { m.PVDRM.Files[1].ID = 1 },
		"duplicate channel":         func(m *Image) { m.PVDRM.Files[0].Chans = []PVDRMChan{{Handle: 1}, {Handle: 1}} },
		"too many files": func(m *Image) {
			for i := range MaxPVDRMFiles {
				m.PVDRM.Files = append(m.PVDRM.Files, PVDRMFile{ID: uint32(3 + i)})
			}
		},
		"too many objects": func(m *Image) {
			f := &m.PVDRM.Files[1]
			for i := range MaxPVDRMObjects {
				f.GEMs = append(f.GEMs, PVDRMGEM{Handle: uint32(1 + i), Domain: DomainGART, Size: 4096})
			}
		},
		"pool over its bytes": func(m *Image) {
			for range 2 {
				m.PVDRM.Pool = append(m.PVDRM.Pool, PVDRMPooled{Size: MaxPVDRMPoolBytes / 2, GART: 0})
			}
			m.PVDRM.GARTSize = MaxPVDRMPoolBytes
		},
		"section without the flag": func(m *Image) { m.Identity.PVDRM = false },
		"flag without the section": func(m *Image) { m.PVDRM = nil },
	} {
		t.Run(name, func(t *testing.T) {
			m := samplePVDRM()
			edit(m)
			if err := Encode(&bytes.Buffer{}, m); !errors.Is(err, ErrMalformed) {
				t.Fatalf("Encode: %v, want ErrMalformed", err)
			}
			var b bytes.Buffer
			if err := encodeUnchecked(&b, m); err != nil {
				t.Fatal(err)
			}
			if _, err := Decode(&b); !errors.Is(err, ErrMalformed) {
				t.Fatalf("Decode: %v, want ErrMalformed", err)
			}
		})
	}
}

// TestPVDRMImageTruncated: a pvdrm image cut anywhere is refused.
func TestPVDRMImageTruncated(t *testing.T) {
	b := encode(t, samplePVDRM())
	for n := 0; n < len(b); n += 7 {
		if _, err := Decode(bytes.NewReader(b[:n])); err == nil {
			t.Fatalf("an image cut at %d of %d bytes was accepted", n, len(b))
		}
	}
}
