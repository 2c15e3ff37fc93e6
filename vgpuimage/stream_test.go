package vgpuimage

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"strings"
	"testing"
)

// sampleStream is a stream of sample(pv)'s vGPU: round 0 sends pages 0,
// 1 MiB and 2 MiB, round 1 re-sends page 0 changed, the stop finds 0 and
// 1 MiB in use (2 MiB was freed meanwhile).
func sampleStream(t testing.TB, pv bool) (stream []byte, want *Image) {
	t.Helper()
	want = sample(pv)
	var b bytes.Buffer
	w, err := NewStreamWriter(&b, want.Identity.VRAM)
	if err != nil {
		t.Fatal(err)
	}
	old := bytes.Repeat([]byte{9}, PageSize)
	for _, p := range []struct {
		off  uint64
		data []byte
	}{{0, old}, {1 << 20, want.Pages[1].Data}, {2 << 20, old}, {0, want.Pages[0].Data}} {
		if err := w.Pages(p.off, p.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Resident([]Range{{0, PageSize}, {1 << 20, PageSize}}); err != nil {
		t.Fatal(err)
	}
	img := *want
	img.Pages = nil
	if err := w.Image(&img); err != nil {
		t.Fatal(err)
	}
	if err := w.End(); err != nil {
		t.Fatal(err)
	}
	if w.Bytes() != uint64(b.Len()) {
		t.Fatalf("writer counted %d bytes, wrote %d", w.Bytes(), b.Len())
	}
	return b.Bytes(), want
}

func TestStreamRoundTrip(t *testing.T) {
	for _, pv := range []bool{false, true} {
		s, want := sampleStream(t, pv)
		got, info, err := ReadStream(bytes.NewReader(s), 256<<20)
		if err != nil {
			t.Fatal(err)
		}
		if info.Bytes != uint64(len(s)) || info.PageBytes != 4*PageSize {
			t.Fatalf("info %+v for a %d-byte stream", info, len(s))
		}
		// The image as sent: the pages as last sent, the freed one gone.
		if !bytes.Equal(encode(t, got), encode(t, want)) {
			t.Fatalf("pv %v: the stream's image differs from the vGPU's", pv)
		}
		var relay bytes.Buffer
		tail := []byte("the answer channel's bytes")
		n, err := CopyStream(&relay, bytes.NewReader(append(bytes.Clone(s), tail...)))
		if err != nil || n != int64(len(s)) || !bytes.Equal(relay.Bytes(), s) {
			t.Fatalf("CopyStream: %d bytes, %v; relayed the stream whole: %v", n, err, bytes.Equal(relay.Bytes(), s))
		}
	}
}

// rawStream writes a stream's header for vram and the given records
// (type, body) with a correct end record unless end is false.
func rawStream(vram uint64, end bool, recs ...[]byte) []byte {
	var b bytes.Buffer
	var hdr [StreamHeaderSize]byte
	copy(hdr[:], StreamMagic[:])
	le.PutUint32(hdr[8:], StreamVersion)
	le.PutUint64(hdr[16:], vram)
	b.Write(hdr[:])
	for _, r := range recs {
		b.Write(r)
	}
	if end {
		sum := sha256.Sum256(b.Bytes())
		b.Write(rec(RecEnd, sum[:]))
	}
	return b.Bytes()
}

func rec(typ uint16, body ...[]byte) []byte {
	var n int
	for _, p := range body {
		n += len(p)
	}
	h := make(buf, 0, RecordHeaderSize+n)
	h.u16(typ)
	h.u16(0)
	h.u32(uint32(n))
	for _, p := range body {
		h = append(h, p...)
	}
	return h
}

func pagesRec(off uint64, n int) []byte {
	var o buf
	o.u64(off)
	return rec(RecPages, o, make([]byte, n))
}

func residentRec(rs ...Range) []byte {
	var b buf
	b.u32(uint32(len(rs)))
	for _, r := range rs {
		b.u64(r.Off)
		b.u64(r.Len)
	}
	return rec(RecResident, b)
}

func imageRec(t *testing.T, m *Image) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := encodeUnchecked(&b, m); err != nil {
		t.Fatal(err)
	}
	return rec(RecImage, b.Bytes())
}

// TestStreamRefusals: hostile streams are refused with the reason, and
// nothing is returned.
func TestStreamRefusals(t *testing.T) {
	good, _ := sampleStream(t, true)
	m := sample(false)
	m.Pages = nil
	const vram = 256 << 20
	img := imageRec(t, m)
	withPages := sample(false)
	flipped := bytes.Clone(good)
	flipped[StreamHeaderSize+RecordHeaderSize+100] ^= 1
	bigger := sample(false)
	bigger.Pages, bigger.Identity.VRAM = nil, 512<<20
	for _, c := range []struct {
		name string
		s    []byte
		want string
	}{
		{"truncated in the pages", good[:StreamHeaderSize+RecordHeaderSize+500], "truncated"},
		{"truncated before the end", good[:len(good)-RecordHeaderSize-sha256.Size], "truncated"},
		{"truncated in the checksum", good[:len(good)-3], "truncated"},
		{"bad checksum", flipped, "checksum"},
		{"not a stream", append([]byte("GPUVMIMG"), good[8:]...), "not a gpuvm migration stream"},
		{"slot larger than the board's", rawStream(512<<20, true, residentRec(), imageRec(t, bigger)), "up to"},
		{"page past the slot", rawStream(vram, true, pagesRec(vram, PageSize), residentRec(), img), "inside the slot"},
		{"page straddling the slot's end", rawStream(vram, true, pagesRec(vram-PageSize, 2*PageSize), residentRec(), img), "inside the slot"},
		{"page offset wrapping", rawStream(vram, true, pagesRec(^uint64(0)&^(PageSize-1), PageSize), residentRec(), img), "inside the slot"},
		{"partial page", rawStream(vram, true, pagesRec(0, 100), residentRec(), img), "whole pages"},
		{"oversized record", rawStream(vram, true, pagesRec(0, 2*MaxPageSection)), "at most"},
		{"resident past the slot", rawStream(vram, true, residentRec(Range{vram - PageSize, 2 * PageSize}), img), "past the slot"},
		{"resident never sent", rawStream(vram, true, pagesRec(0, PageSize), residentRec(Range{0, 2 * PageSize}), img), "never sent"},
		{"resident unsorted", rawStream(vram, true, residentRec(Range{8192, PageSize}, Range{0, PageSize}), img), "before the end"},
		{"pages after the stop", rawStream(vram, true, residentRec(), pagesRec(0, PageSize), img), "records go"},
		{"image before the stop", rawStream(vram, true, img), "records go"},
		{"no image", rawStream(vram, true, residentRec()), "records go"},
		{"two images", rawStream(vram, true, residentRec(), img, img), "records go"},
		{"image carrying pages", rawStream(vram, true, residentRec(), imageRec(t, withPages)), "carries 2 VRAM pages"},
		{"image of another VRAM size", rawStream(vram, true, residentRec(), imageRec(t, bigger)), "stream of a"},
		{"unknown record", rawStream(vram, true, rec(9, []byte{1})), "record type 9"},
	} {
		got, _, err := ReadStream(bytes.NewReader(c.s), vram)
		if err == nil || got != nil {
			t.Errorf("%s: accepted", c.name)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: refused as %q, want %q", c.name, err, c.want)
		}
		if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrChecksum) && !errors.Is(err, ErrNotImage) {
			t.Errorf("%s: %v wraps none of the format's errors", c.name, err)
		}
	}
	// The relay refuses the framing errors too, and a stream cut short.
	if _, err := CopyStream(&bytes.Buffer{}, bytes.NewReader(good[:len(good)-3])); !errors.Is(err, ErrTruncated) {
		t.Errorf("relay of a truncated stream: %v", err)
	}
	if _, err := CopyStream(&bytes.Buffer{}, bytes.NewReader(rawStream(vram, true, pagesRec(0, 2*MaxPageSection)))); !errors.Is(err, ErrMalformed) {
		t.Errorf("relay of an oversized record: %v", err)
	}
}

func FuzzReadStream(f *testing.F) {
	good, _ := sampleStream(f, false)
	f.Add(good)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, _, err := ReadStream(bytes.NewReader(b), 256<<20)
		if err == nil {
			var out bytes.Buffer
			if err := Encode(&out, m); err != nil {
				t.Fatalf("a stream's image does not encode: %v", err)
			}
		}
	})
}

// TestStreamPagesInAnyOrder: pages sent out of order, re-sent, and in
// runs longer than a section come out as the image's sorted sections
// holding each page as last sent.
func TestStreamPagesInAnyOrder(t *testing.T) {
	m := sample(false)
	m.Pages = nil
	const n = 3 * MaxPageSection / PageSize // three sections' worth
	want := make([]byte, n*PageSize)
	for i := range want {
		want[i] = byte(i/PageSize + i)
	}
	var b bytes.Buffer
	w, err := NewStreamWriter(&b, m.Identity.VRAM)
	if err != nil {
		t.Fatal(err)
	}
	send := func(page int, data []byte) {
		if err := w.Pages(uint64(page)*PageSize, data); err != nil {
			t.Fatal(err)
		}
	}
	send(5, make([]byte, PageSize)) // stale, re-sent below
	for p := n - 1; p >= n/2; p-- {
		send(p, want[p*PageSize:(p+1)*PageSize])
	}
	send(0, want[:n/2*PageSize])
	send(5, want[5*PageSize:6*PageSize])
	if err := errors.Join(w.Resident([]Range{{0, n * PageSize}}), w.Image(m), w.End()); err != nil {
		t.Fatal(err)
	}
	got, _, err := ReadStream(&b, 256<<20)
	if err != nil {
		t.Fatal(err)
	}
	var joined []byte
	var end uint64
	for _, p := range got.Pages {
		if p.Off != end || len(p.Data) > MaxPageSection {
			t.Fatalf("section at %#x of %d bytes after %#x", p.Off, len(p.Data), end)
		}
		end += uint64(len(p.Data))
		joined = append(joined, p.Data...)
	}
	if !bytes.Equal(joined, want) {
		t.Fatal("the image's pages are not the pages as last sent")
	}
}
