//go:build linux && (amd64 || arm64)

package pvdrm

import (
	"encoding/binary"
	"slices"
	"testing"

	"github.com/gpuvm/gpuvm/xen"
)

// walkGARTDir follows a directory as MapXenGART does, over pages held in
// a map from reference to page.
func walkGARTDir(dir map[uint32][]byte, first uint32, pages int) ([]uint32, error) {
	var refs []uint32
	for ref := first; len(refs) < pages; {
		page := slices.Clone(dir[ref])
		next, got, err := parseGARTDirPage(page, pages-len(refs))
		if err != nil {
			return nil, err
		}
		refs = append(refs, got...)
		ref = next
	}
	return refs, nil
}

// encodedDir encodes refs into directory pages granted as 100, 101, ...
func encodedDir(t *testing.T, refs []uint32) (map[uint32][]byte, []uint32) {
	t.Helper()
	n := gartDirPages(len(refs))
	dirRefs := make([]uint32, n)
	for i := range dirRefs {
		dirRefs[i] = uint32(100 + i)
	}
	mem := make([]byte, n*xen.PageSize)
	if err := encodeGARTDir(mem, dirRefs, refs); err != nil {
		t.Fatal(err)
	}
	pages := map[uint32][]byte{}
	for i, r := range dirRefs {
		pages[r] = mem[i*xen.PageSize : (i+1)*xen.PageSize]
	}
	return pages, dirRefs
}

func TestGARTDirectoryRoundTrip(t *testing.T) {
	for _, n := range []int{1, GARTRefsPerDirPage, GARTRefsPerDirPage + 1, 5000, MaxXenGARTPages} {
		refs := make([]uint32, n)
		for i := range refs {
			refs[i] = uint32(1000 + 3*i)
		}
		dir, dirRefs := encodedDir(t, refs)
		got, err := walkGARTDir(dir, dirRefs[0], n)
		if err != nil {
			t.Fatalf("%d pages: %v", n, err)
		}
		if !slices.Equal(got, refs) {
			t.Fatalf("%d pages: references differ", n)
		}
	}
}

// TestGARTDirectoryForged: a guest's directory that lies about its count,
// names a reserved reference, ends early or runs on is refused.
func TestGARTDirectoryForged(t *testing.T) {
	refs := make([]uint32, GARTRefsPerDirPage+10)
	for i := range refs {
		refs[i] = uint32(1000 + i)
	}
	for _, tc := range []struct {
		name  string
		edit  func(dir map[uint32][]byte)
		pages int
	}{
		{"a count past the page", func(d map[uint32][]byte) { binary.LittleEndian.PutUint32(d[100][4:], 5000) }, len(refs)},
		{"a short count", func(d map[uint32][]byte) { binary.LittleEndian.PutUint32(d[101][4:], 3) }, len(refs)},
		{"a reserved heap reference", func(d map[uint32][]byte) { binary.LittleEndian.PutUint32(d[101][8:], 2) }, len(refs)},
		{"ends early", func(d map[uint32][]byte) { binary.LittleEndian.PutUint32(d[100][0:], 0) }, len(refs)},
		{"runs on past the heap", func(d map[uint32][]byte) { binary.LittleEndian.PutUint32(d[101][0:], 100) }, len(refs)},
		{"more pages published than listed", func(map[uint32][]byte) {}, len(refs) + 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, dirRefs := encodedDir(t, refs)
			tc.edit(dir)
			if _, err := walkGARTDir(dir, dirRefs[0], tc.pages); err == nil {
				t.Fatal("accepted")
			} else {
				t.Log(err)
			}
		})
	}
}

func TestXenSharesBounds(t *testing.T) {
	s := NewXenShares(make([]byte, 4*pageSize))
	if b, err := s.Map(0, 2, 2*pageSize); err != nil || len(b) != 2*pageSize || cap(b) != 2*pageSize {
		t.Fatalf("in bounds: %d bytes, %v", len(b), err)
	}
	for _, c := range []struct {
		pages uint32
		off   uint64
	}{{0, 0}, {1, 1}, {3, 2 * pageSize}, {1, 4 * pageSize}, {1 << 31, 0}, {1, 1 << 63}} {
		if _, err := s.Map(0, c.pages, c.off); err == nil {
			t.Errorf("share of %d pages at %#x accepted", c.pages, c.off)
		}
	}
}
