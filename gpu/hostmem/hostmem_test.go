package hostmem

import (
	"testing"

	"golang.org/x/sys/unix"
)

func TestAllocSharedThroughFd(t *testing.T) {
	r, err := New("t", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.SetBusBase(0x40_0000_0000)
	b, err := r.Alloc(5000)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Bytes) != 8192 || b.Bus != 0x40_0000_0000 {
		t.Fatalf("buffer len %d bus %#x", len(b.Bytes), b.Bus)
	}
	b.Bytes[100] = 0xAB
	// A second mapping of the same memfd (as another process would make) sees the write.
	dup, err := unix.Dup(r.Fd())
	if err != nil {
		t.Fatal(err)
	}
	other, err := FromFd("t2", dup, r.Size())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if other.Bytes()[100] != 0xAB {
		t.Fatal("write not visible through the shared memfd")
	}
	if err := r.Free(Buffer{Bus: 1}); err == nil {
		t.Fatal("freed a foreign buffer")
	}
	if err := r.Free(b); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Alloc(2 << 20); err == nil {
		t.Fatal("allocated more than the region")
	}
}

func TestRegionCannotShrink(t *testing.T) {
	r, err := New("t", 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := unix.Ftruncate(r.Fd(), 4096); err == nil {
		t.Fatal("truncated a sealed region")
	}
	seals, err := unix.FcntlInt(uintptr(r.Fd()), unix.F_GET_SEALS, 0)
	if err != nil || seals&SizeSeals != SizeSeals {
		t.Fatalf("seals %#x, %v", seals, err)
	}
}
