package devmodel

import (
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/internal/buspipe"
	"golang.org/x/sys/unix"
)

// remapFiles makes a remap table passing BAR1 page 0 through to slice page
// 0, and a one-page slice, as the aggregator's memfds.
func remapFiles(t *testing.T, bar1Pages uint64) []*os.File {
	t.Helper()
	mk := func(name string, size int64) *os.File {
		fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		f := os.NewFile(uintptr(fd), name)
		if err := f.Truncate(size); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	table := mk("remap", int64(bar1Pages*8))
	entry := make([]byte, 8)
	entry[0] = 1 // slice offset 0, present
	if _, err := table.WriteAt(entry, 0); err != nil {
		t.Fatal(err)
	}
	return []*os.File{table, mk("slice", nvc0.PageSize)}
}

// TestRebindWhileAccessing: remap updates (a move's rebind) while the
// guest reads and writes a passed-through page. Under -race this catches
// any field of the remap path that an access reads outside remapMu while a
// rebind writes it (a CI run caught the bus costs read after the unlock).
func TestRebindWhileAccessing(t *testing.T) {
	const bar1Pages = 4
	d := &Device{bar1Size: bar1Pages * nvc0.PageSize, bar3Size: 0, bus: buspipe.New(),
		log: slog.New(slog.DiscardHandler), closing: make(chan struct{})}
	if err := d.rebind(remapFiles(t, bar1Pages)); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var passed atomic.Int64
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for v := uint32(1); !stop.Load(); v++ {
				// Between a rebind's unmap and map the access would trap
				// (there is no aggregator here): only passed-through ones count.
				if d.passWrite(nvc0.BAR1, 0, v) {
					passed.Add(1)
				}
				if _, ok := d.passRead(nvc0.BAR1, 0); ok {
					passed.Add(1)
				}
			}
		}()
	}
	for range 200 {
		if err := d.rebind(remapFiles(t, bar1Pages)); err != nil {
			stop.Store(true)
			wg.Wait()
			t.Fatal(err)
		}
	}
	stop.Store(true)
	wg.Wait()
	if passed.Load() == 0 {
		t.Fatal("no access was passed through")
	}
	d.remapMu.Lock()
	defer d.remapMu.Unlock()
	if err := d.unmapRemap(); err != nil {
		t.Fatal(err)
	}
}
