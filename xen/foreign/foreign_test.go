//go:build linux && (amd64 || arm64)

package foreign

import (
	"encoding/binary"
	"errors"
	"os"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/xen"
	"github.com/gpuvm/gpuvm/xen/privcmd"
)

// fakeDomain plays a domain's memory and privcmd's foreign mapping: its
// frames are pages of a memfd, frame g at offset g×4096, stamped with g.
type fakeDomain struct {
	t      *testing.T
	fd     int
	frames uint64
	bad    map[uint64]bool // frames the domain does not own
	calls  [][]uint64
}

const memfdName = "gpuvm-foreign-test-domain"

func newFakeDomain(t *testing.T, frames uint64) *fakeDomain {
	fd, err := unix.MemfdCreate(memfdName, unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Ftruncate(fd, int64(frames*xen.PageSize)); err != nil {
		t.Fatal(err)
	}
	for g := range frames {
		var stamp [8]byte
		binary.LittleEndian.PutUint64(stamp[:], 0xd0d0<<48|g)
		if _, err := unix.Pwrite(fd, stamp[:], int64(g*xen.PageSize)); err != nil {
			t.Fatal(err)
		}
	}
	return &fakeDomain{t: t, fd: fd, frames: frames, bad: map[uint64]bool{}}
}

// MapForeignInto maps each run of consecutive frames with one mmap, and
// reports the frames it does not own as privcmd does.
func (d *fakeDomain) MapForeignInto(dst []byte, dom uint16, gfns []uint64) error {
	d.calls = append(d.calls, append([]uint64(nil), gfns...))
	if len(dst) != len(gfns)*xen.PageSize {
		d.t.Fatalf("%d bytes for %d frames", len(dst), len(gfns))
	}
	var be privcmd.BatchError
	for i := 0; i < len(gfns); {
		n := 1
		for i+n < len(gfns) && gfns[i+n] == gfns[i]+uint64(n) && !d.bad[gfns[i+n]] && gfns[i+n] < d.frames {
			n++
		}
		if d.bad[gfns[i]] || gfns[i] >= d.frames {
			be.Failed++
			be.First = append(be.First, privcmd.FrameError{Index: i, GFN: gfns[i], Err: unix.EINVAL})
			be.Indices = append(be.Indices, i)
			i++
			continue
		}
		if _, err := unix.MmapPtr(d.fd, int64(gfns[i]*xen.PageSize), unsafe.Pointer(&dst[i*xen.PageSize]), uintptr(n*xen.PageSize),
			unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_FIXED); err != nil {
			return err
		}
		i += n
	}
	if be.Failed > 0 {
		be.Dom, be.Frames = dom, len(gfns)
		return &be
	}
	return nil
}

// mappedHere counts this process's mappings of the fake domain's memfd.
func mappedHere(t *testing.T) int {
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(maps), memfdName)
}

func stamp(b []byte, page uint64) uint64 {
	return binary.LittleEndian.Uint64(b[page*xen.PageSize:])
}

// TestMapHVMLayout maps an HVM-like layout (RAM, the VGA hole, RAM, a hole
// up to a high extent) in small chunks, and checks every page is its own
// frame or a zero page, holes absorb writes, and Contains tells them
// apart.
func TestMapHVMLayout(t *testing.T) {
	d := newFakeDomain(t, 64)
	frames, err := Identity([]Extent{{0, 10}, {12, 20}, {40, 8}})
	if err != nil {
		t.Fatal(err)
	}
	if len(frames) != 48 || frames[10] != Hole || frames[12] != 12 || frames[39] != Hole {
		t.Fatalf("frames %v", frames)
	}
	r, err := mapChunked(d, 7, frames, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Size() != 48*xen.PageSize || r.Domain() != 7 || len(r.Bytes()) != 48*xen.PageSize {
		t.Fatalf("size %d", r.Size())
	}
	for p, f := range frames {
		got := stamp(r.Bytes(), uint64(p))
		if f == Hole && got != 0 || f != Hole && got != 0xd0d0<<48|f {
			t.Fatalf("page %d (frame %#x) reads %#x", p, f, got)
		}
	}
	for _, c := range d.calls {
		if len(c) > 3 {
			t.Fatalf("a mapping of %d frames with chunks of 3", len(c))
		}
	}
	// A write lands in the domain's frame; a hole takes it for itself.
	r.Bytes()[13*xen.PageSize+8] = 0xaa
	var b [1]byte
	if _, err := unix.Pread(d.fd, b[:], 13*xen.PageSize+8); err != nil || b[0] != 0xaa {
		t.Fatalf("write to guest page 13 not in frame 13: %#x %v", b[0], err)
	}
	r.Bytes()[10*xen.PageSize] = 0x55
	for g := range d.frames {
		if _, err := unix.Pread(d.fd, b[:], int64(g*xen.PageSize)); err != nil || b[0] == 0x55 {
			t.Fatalf("a write to the hole reached frame %d", g)
		}
	}
	if got := r.Extents(); len(got) != 3 || got[1] != (Extent{12, 20}) {
		t.Fatalf("extents %v", got)
	}
	for _, c := range []struct {
		gpa, n uint64
		want   bool
	}{
		{0, xen.PageSize * 10, true}, {0, xen.PageSize*10 + 1, false}, {9 * xen.PageSize, 8, true},
		{11 * xen.PageSize, 1, false}, {12 * xen.PageSize, 20 * xen.PageSize, true}, {47*xen.PageSize + 4095, 1, true},
		{48 * xen.PageSize, 1, false}, {0, 0, false}, {^uint64(0), 2, false}, {39 * xen.PageSize, 2 * xen.PageSize, false},
	} {
		if got := r.Contains(c.gpa, c.n); got != c.want {
			t.Errorf("Contains(%#x, %#x) = %v", c.gpa, c.n, got)
		}
	}
	if err := r.Close(); err != nil || r.Bytes() != nil || r.Close() != nil {
		t.Fatalf("close: %v", err)
	}
	if n := mappedHere(t); n != 0 {
		t.Fatalf("%d mappings of the domain's frames after Close", n)
	}
}

// TestMapPVFrameList maps a permuted frame list (a PV guest's p2m).
func TestMapPVFrameList(t *testing.T) {
	d := newFakeDomain(t, 16)
	frames := []uint64{5, 3, 9, 10, 11, Hole, 0}
	r, err := Map(d, 3, frames)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for p, f := range frames {
		if got := stamp(r.Bytes(), uint64(p)); f != Hole && got != 0xd0d0<<48|f || f == Hole && got != 0 {
			t.Fatalf("page %d reads %#x", p, got)
		}
	}
}

// TestMapFailures: a frame the domain does not own fails the whole map
// with the frame named, and nothing stays mapped; bad lists never reach
// the mapper.
func TestMapFailures(t *testing.T) {
	d := newFakeDomain(t, 32)
	d.bad[20] = true
	frames, err := Identity([]Extent{{0, 8}, {16, 8}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = mapChunked(d, 4, frames, 4)
	var be *privcmd.BatchError
	if !errors.As(err, &be) || be.First[0].GFN != 20 || !strings.Contains(err.Error(), "guest pages 0x14..0x17") {
		t.Fatalf("map with a foreign frame: %v", err)
	}
	if n := mappedHere(t); n != 0 {
		t.Fatalf("%d mappings left after a failed map", n)
	}
	d.calls = nil
	for name, fr := range map[string][]uint64{
		"empty":                 nil,
		"all holes":             {Hole, Hole},
		"frame beyond MaxFrame": {1, privcmd.MaxFrame},
	} {
		if _, err := Map(d, 4, fr); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
	for name, ext := range map[string][]Extent{
		"none":      nil,
		"empty":     {{0, 0}},
		"overlap":   {{0, 4}, {3, 2}},
		"unsorted":  {{8, 4}, {0, 2}},
		"too large": {{0, MaxPages + 1}},
		"wraps":     {{^uint64(0), 2}},
	} {
		if _, err := Identity(ext); err == nil {
			t.Errorf("extents %s accepted", name)
		}
	}
	if len(d.calls) != 0 {
		t.Fatalf("refused lists reached the mapper: %v", d.calls)
	}
}

// TestMapPopulated maps the first pages of a domain whose layout nobody
// told us: unpopulated frames (here the VGA hole and the end) become zero
// pages, the rest are the domain's own, and nothing stays mapped from the
// probe.
func TestMapPopulated(t *testing.T) {
	d := newFakeDomain(t, 40)
	for g := uint64(0xA); g < 0xC; g++ {
		d.bad[g] = true
	}
	ram, err := mapPopulated(d, 5, 48, 7)
	if err != nil {
		t.Fatal(err)
	}
	defer ram.Close()
	want := []Extent{{0, 0xA}, {0xC, 40 - 0xC}}
	if got := ram.Extents(); len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("extents %v, want %v", got, want)
	}
	b := ram.Bytes()
	for _, p := range []uint64{0, 9, 0xC, 39} {
		if got := stamp(b, p); got != 0xd0d0<<48|p {
			t.Fatalf("page %#x holds %#x", p, got)
		}
	}
	for _, p := range []uint64{0xA, 0xB, 40, 47} {
		if got := stamp(b, p); got != 0 {
			t.Fatalf("hole %#x holds %#x", p, got)
		}
	}
	if ram.Contains(0xA*xen.PageSize, 8) || !ram.Contains(0xC*xen.PageSize, 8) {
		t.Fatal("Contains does not tell the hole")
	}
	ram.Close()
	if n := mappedHere(t); n != 0 {
		t.Fatalf("%d mappings left after Close", n)
	}
	// A domain with no frame at all is an error, not an empty RAM.
	if _, err := mapPopulated(newFakeDomain(t, 0), 5, 8, 7); err == nil {
		t.Fatal("a domain without RAM mapped")
	}
}
