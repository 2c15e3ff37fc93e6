package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/host"
	"github.com/gpuvm/gpuvm/vgpuimage"
)

// The boards' VRAM a handoff passes on (docs/protocol.md §15.3). The old
// process hands each simulated board's VRAM segments (memfds) over, and
// the images of the vGPUs held on it carry no VRAM: each vGPU's VRAM stays
// in its slot, kept for it. The new process builds each board over the
// segments of the board of the same name if its shape is unchanged (VRAM
// size and segments), renews every segment no vGPU's VRAM is kept in —
// the reserve and the free slots, whose contents are the old process's —
// before anything runs on it, and registers each image with its slot
// (aggregator.RegisterKept). A board whose shape changed is built afresh;
// the VRAM kept for its vGPUs is then read out of the handed-over segments
// into their images, which are restored as any image is.

// adoptVRAM returns the files to build the board called name over —
// VRAM bytes in segments of sizes — and the slots whose VRAM is kept
// there, if the previous process handed that board's VRAM over and its
// shape is the same; ok false: build it afresh.
func (in *inherited) adoptVRAM(name string, vram uint64, sizes []uint64, slots int) (files []*os.File, kept map[int]bool, ok bool) {
	if in == nil {
		return nil, nil, false
	}
	var entry *handoffBoard
	for i := range in.m.Boards {
		if in.m.Boards[i].Name == name {
			entry = &in.m.Boards[i]
		}
	}
	files = in.vram[name]
	if entry == nil || entry.VRAM != vram || len(entry.Segments) != len(sizes) || len(files) != len(sizes) {
		return nil, nil, false
	}
	for i, s := range entry.Segments {
		if s.Size != sizes[i] {
			return nil, nil, false
		}
	}
	kept = map[int]bool{}
	for _, g := range in.all() {
		if g.Board != name || g.Kept == nil {
			continue
		}
		seg := g.Kept.Segment
		if g.Kept.Slot < 0 || g.Kept.Slot >= slots || seg != aggregator.SlotSegment(g.Kept.Slot) || seg >= len(sizes) || kept[seg] {
			return nil, nil, false // not this layout's slot: read out, not kept
		}
		kept[seg] = true
	}
	return files, kept, true
}

// newSimBoard builds a board of cfg with slots slots: over the VRAM the
// previous process handed over if adoptVRAM allows, with every segment not
// kept for a vGPU renewed; else — or if that fails — afresh (the kept VRAM
// is then read out into the images).
func (in *inherited) newSimBoard(name string, cfg sim.Config, slots int, log *slog.Logger) (*sim.Board, error) {
	files, kept, ok := in.adoptVRAM(name, cfg.VRAMSize, cfg.VRAMSegments, slots)
	if !ok {
		return sim.New(cfg)
	}
	b, err := sim.NewOver(cfg, files)
	if err != nil {
		log.Warn("handoff: the board's VRAM handed over is unusable: built afresh, the kept VRAM read out into the images", "board", name, "err", err)
		return sim.New(cfg)
	}
	var base uint64
	for i, n := range cfg.VRAMSegments {
		if !kept[i] {
			if err := b.RenewVRAMSegment(base, n); err != nil {
				return nil, errors.Join(fmt.Errorf("board %s: renewing VRAM segment %d: %w", name, i, err), b.Close())
			}
		}
		base += n
	}
	in.adopted[name] = true
	for seg := range kept {
		in.keptSlots[name] = append(in.keptSlots[name], seg-aggregator.SlotSegment(0))
	}
	return b, nil
}

// renewUnclaimed renews every slot an adopted board kept for a vGPU whose
// image was not registered there (refused before it got to its slot: a
// format the new binary does not read, a truncated memfd): no VM's VRAM
// stays in a slot another may be given.
func (in *inherited) renewUnclaimed(h *host.Host, log *slog.Logger) {
	for name, slots := range in.keptSlots {
		b := h.Board(name)
		if b == nil {
			continue
		}
		for _, slot := range slots {
			if err := b.Agg.RenewUnclaimed(slot); err != nil {
				log.Error("handoff: renewing a slot no image claimed", "board", name, "slot", slot, "err", err)
			}
		}
	}
}

// registerOne registers g's image, read from r: in place when its VRAM is
// kept on a board built over the VRAM handed over; with its VRAM read out
// of the segment handed over when its board was built afresh; as the
// image carries it otherwise.
func (in *inherited) registerOne(h *host.Host, g handoffVGPU, r io.ReadSeeker) error {
	if g.Kept == nil {
		_, err := h.RegisterHandoff(g.DomID, g.Board, r, -1)
		return err
	}
	if in.adopted[g.Board] {
		_, err := h.RegisterHandoff(g.DomID, g.Board, r, g.Kept.Slot)
		return err
	}
	files := in.vram[g.Board]
	if g.Kept.Segment < 0 || g.Kept.Segment >= len(files) {
		return fmt.Errorf("its VRAM is in segment %d of board %s, which was not handed over", g.Kept.Segment, g.Board)
	}
	img, err := vgpuimage.Decode(bufio.NewReaderSize(r, 1<<20))
	if err != nil {
		return fmt.Errorf("%w: %w", aggregator.ErrImageRefused, err)
	}
	if len(img.Pages) != 0 {
		img.Scrub()
		return fmt.Errorf("%w: its VRAM is kept on the board, and the image carries pages too", aggregator.ErrImageRefused)
	}
	if img.Pages, err = keptPages(files[g.Kept.Segment], img.Identity.VRAM); err == nil {
		err = img.Check()
	}
	if err != nil {
		img.Scrub()
		return fmt.Errorf("reading its VRAM out of board %s's segment %d: %w", g.Board, g.Kept.Segment, err)
	}
	_, err = h.RegisterImage(g.DomID, img)
	return err
}

// keptPages reads what a kept slot's segment f holds in [0, vram) as an
// image's VRAM pages: its resident ranges (SEEK_DATA, SEEK_HOLE), in
// sections of at most vgpuimage.MaxPageSection.
func keptPages(f *os.File, vram uint64) ([]vgpuimage.Page, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if uint64(st.Size()) < vram {
		return nil, fmt.Errorf("the segment holds %d bytes, the vGPU had %d", st.Size(), vram)
	}
	var pages []vgpuimage.Page
	fd := int(f.Fd())
	for off := int64(0); off < int64(vram); {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break
		}
		if err != nil {
			data = off // no SEEK_DATA: read it all
		}
		if data >= int64(vram) {
			break
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			hole = int64(vram)
		}
		data = max(data&^(vgpuimage.PageSize-1), off)
		hole = min((hole+vgpuimage.PageSize-1)&^(vgpuimage.PageSize-1), int64(vram))
		for p := data; p < hole; {
			n := min(int64(vgpuimage.MaxPageSection), hole-p)
			b := make([]byte, n)
			if _, err := f.ReadAt(b, p); err != nil {
				for _, q := range pages {
					clear(q.Data)
				}
				return nil, err
			}
			pages = append(pages, vgpuimage.Page{Off: uint64(p), Data: b})
			p += n
		}
		off = hole
	}
	return slices.Clip(pages), nil
}

// closeVRAM closes the handed-over VRAM segments: a board built over them
// holds its own descriptors.
func (in *inherited) closeVRAM() {
	for name, files := range in.vram {
		for _, f := range files {
			f.Close()
		}
		delete(in.vram, name)
	}
}
