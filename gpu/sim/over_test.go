package sim

import (
	"bytes"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

func overConfig() Config {
	cfg := DefaultConfig()
	cfg.VRAMSize, cfg.MemPartitions = 128<<20, 1
	cfg.VRAMSegments = []uint64{64 << 20, 64 << 20}
	return cfg
}

// A board built over the memfds another board handed over has that
// board's VRAM, also once the first is closed; each board's writes after
// that are the other's too (one memory), and segments stay separate.
func TestNewOverKeepsVRAM(t *testing.T) {
	cfg := overConfig()
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := []byte("the guest's VRAM, kept across the handoff")
	if err := a.WriteVRAM(want, 64<<20+4096); err != nil {
		t.Fatal(err)
	}
	files, err := a.VRAMSegmentFiles()
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 {
		t.Fatalf("%d segment files, want 2", len(files))
	}
	a.Close()
	b, err := NewOver(cfg, files)
	for _, f := range files {
		f.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	got := make([]byte, len(want))
	if err := b.ReadVRAM(got, 64<<20+4096); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("VRAM over the handed-over memfds: %q %v, want %q", got, err, want)
	}
	if n, err := b.VRAMResident(64<<20, 64<<20); err != nil || n == 0 {
		t.Fatalf("resident bytes of the kept segment: %d %v", n, err)
	}
	if n, err := b.VRAMResident(0, 64<<20); err != nil || n != 0 {
		t.Fatalf("resident bytes of the untouched segment: %d %v", n, err)
	}
	// Renewing a segment of the new board leaves it zeroed, as on any board.
	if err := b.RenewVRAMSegment(64<<20, 64<<20); err != nil {
		t.Fatal(err)
	}
	if err := b.ReadVRAM(got, 64<<20+4096); err != nil || !bytes.Equal(got, make([]byte, len(want))) {
		t.Fatalf("renewed segment: %q %v", got, err)
	}
}

// NewOver refuses memfds that are not the configuration's segments: a
// wrong count, a wrong size, a file anyone could shrink under the board.
func TestNewOverRefuses(t *testing.T) {
	cfg := overConfig()
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	files, err := a.VRAMSegmentFiles()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	unsealed := func() *os.File {
		fd, err := unix.MemfdCreate("unsealed", unix.MFD_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Ftruncate(fd, 64<<20); err != nil {
			t.Fatal(err)
		}
		return os.NewFile(uintptr(fd), "unsealed")
	}()
	defer unsealed.Close()
	cases := map[string][]*os.File{
		"one file for two segments": files[:1],
		"three files for two":       {files[0], files[1], files[0]},
		"an unsealed memfd":         {files[0], unsealed},
	}
	for name, fs := range cases {
		if b, err := NewOver(cfg, fs); err == nil {
			b.Close()
			t.Errorf("%s: board built", name)
		}
	}
	small := cfg
	small.VRAMSegments = []uint64{32 << 20, 96 << 20}
	if b, err := NewOver(small, files); err == nil {
		b.Close()
		t.Error("segments of other sizes: board built")
	}
	// Nothing taken from the refused attempts: the handed files still work.
	b, err := NewOver(cfg, files)
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
}
