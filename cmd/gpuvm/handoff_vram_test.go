package main

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/host"
)

// TestHandedOverKeptSlotRenewedWhenImageRefused: a new process adopts a
// board whose slot 1 keeps domain 5's VRAM, and the image for it is
// refused before it reaches the slot (it does not decode: a format this
// binary does not read, a truncated memfd). The sweep after the
// registrations renews the slot: it is free, and holds none of domain 5's
// VRAM.
func TestHandedOverKeptSlotRenewedWhenImageRefused(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	part := config.PartitionConfig{VRAMPerVM: 256 << 20, ChannelsPerVM: 8, BAR1PerVM: 16 << 20, BAR3PerVM: 4 << 20, Reserved: 128 << 20}
	cfg := sim.DefaultConfig()
	cfg.VRAMSize, cfg.MemPartitions = 1<<30, 4
	layout, err := aggregator.NewLayout(part, 2, cfg.VRAMSize, cfg.Channels)
	if err != nil {
		t.Fatal(err)
	}
	cfg.VRAMSegments = layout.Segments(cfg.VRAMSize)
	old, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	secret := bytes.Repeat([]byte("DOMID5-SECRET!!!"), 256)
	slotBase := layout.Slots[1].VRAM.Base
	if err := old.WriteVRAM(secret, slotBase); err != nil {
		t.Fatal(err)
	}
	files, err := old.VRAMSegmentFiles()
	if err != nil {
		t.Fatal(err)
	}
	old.Close()
	var segs []handoffSegment
	for i, f := range files {
		segs = append(segs, handoffSegment{Size: cfg.VRAMSegments[i], FD: int(f.Fd())})
	}
	g := handoffVGPU{DomID: 5, Name: "victim", Mode: "fv-optimized", Board: "b", VGPU: 1, FD: 99, Bytes: 10,
		Kept: &handoffKept{Slot: 1, Segment: aggregator.SlotSegment(1)}}
	in := &inherited{m: handoffManifest{Version: handoffVersion, VGPUs: []handoffVGPU{g},
		Boards: []handoffBoard{{Name: "b", VRAM: cfg.VRAMSize, Segments: segs}}},
		vram: map[string][]*os.File{"b": files}, adopted: map[string]bool{}, keptSlots: map[string][]int{}}
	board, err := in.newSimBoard("b", cfg, len(layout.Slots), log)
	if err != nil {
		t.Fatal(err)
	}
	if !in.adopted["b"] {
		t.Fatal("the board was not built over the VRAM handed over")
	}
	agg, err := aggregator.New(board, aggregator.Options{Partition: part, MaxVMs: 2, Channels: cfg.Channels, BoardName: "b",
		Registry: aggregator.NewRegistry(), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	h, err := host.New(aggregator.NewRegistry(), []*host.Board{{Name: "b", Agg: agg, Release: board.Close}}, host.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	got := make([]byte, len(secret))
	if err := board.ReadVRAM(got, slotBase); err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("the kept slot does not hold the VRAM handed over: %q %v", got[:16], err)
	}
	if err := in.registerOne(h, g, bytes.NewReader([]byte("not an image"))); err == nil {
		t.Fatal("a broken image registered")
	}
	in.renewUnclaimed(h, log)
	in.closeVRAM()
	if err := board.ReadVRAM(got, slotBase); err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(got, secret) || len(agg.KeptSlots()) != 0 || agg.Room() != 2 {
		t.Fatalf("slot 1 after its image was refused: room %d, kept %v, holds %q", agg.Room(), agg.KeptSlots(), got[:16])
	}
}

// TestUnusableManifestNamesItsXenDevices: a manifest the new process
// cannot use (here, of a version it does not read) still gives up the Xen
// pvdrm devices it lists when it is this PID's — the previous process
// disowned them, and the new one must close them or their front ends
// wait forever — and none when it is another process's.
func TestUnusableManifestNamesItsXenDevices(t *testing.T) {
	for _, tc := range []struct {
		pid  int
		want int
	}{{os.Getpid(), 1}, {os.Getpid() + 1, 0}} {
		f, err := memfd("test-manifest")
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(f, `{"version": 99, "pid": %d, "xen_pvdrm": [{"domid": 7, "request": {"name": "pv7", "devid": 0}}]}`, tc.pid)
		fd, err := unix.Dup(int(f.Fd())) // inheritHandoff closes the one it is given
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		t.Setenv(handoffEnv, strconv.Itoa(fd))
		in, orphans, err := inheritHandoff()
		if err == nil || in != nil {
			t.Fatalf("pid %d: a manifest of version 99 was used: %v", tc.pid, err)
		}
		if len(orphans) != tc.want || (tc.want == 1 && (orphans[0].DomID != 7 || orphans[0].Req.Name != "pv7")) {
			t.Errorf("pid %d: orphans %+v, want %d", tc.pid, orphans, tc.want)
		}
	}
}
