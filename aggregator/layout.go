package aggregator

import (
	"fmt"

	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// Region is a [Base, Base+Size) range of an address space.
type Region struct {
	Base uint64 `json:"base"`
	Size uint64 `json:"size"`
}

// End is one past the region's last byte.
func (r Region) End() uint64 { return r.Base + r.Size }

// Contains reports whether [addr, addr+n) lies inside the region.
func (r Region) Contains(addr, n uint64) bool {
	return addr >= r.Base && n <= r.Size && addr-r.Base <= r.Size-n
}

// Slot is one VM's static partition of the board.
//
// Its JSON form (the control API's /v1/layout) uses the snake_case names of
// VGPUInfo: channel_base and channels as there.
type Slot struct {
	Index    int    `json:"index"`
	VRAM     Region `json:"vram"`         // physical VRAM slice; the guest sees [0, VRAM.Size)
	ChanBase int    `json:"channel_base"` // first physical channel; the guest's channel v is ChanBase+v
	Chans    int    `json:"channels"`
	BAR1     Region `json:"bar1"` // slice of the physical BAR1 aperture
	BAR3     Region `json:"bar3"` // slice of the physical BAR3 aperture
}

// Layout is how the board is shared: the aggregator's reserved VRAM at the
// bottom, the physical poll area at the bottom of BAR1, and one Slot per VM.
type Layout struct {
	Reserved Region `json:"reserved"`  // VRAM for the physical BAR tables, playlists and every shadow structure
	PollArea Region `json:"poll_area"` // BAR1 range of the physical poll area (one user page per board channel)
	Slots    []Slot `json:"slots"`
}

// NewLayout partitions a board of vramSize bytes and channels channels as the
// partition settings say.
func NewLayout(p config.PartitionConfig, maxVMs int, vramSize uint64, channels int) (Layout, error) {
	l := Layout{
		Reserved: Region{0, uint64(p.Reserved)},
		PollArea: Region{0, nvc0.MaxChannels * nvc0.UserAreaSize},
	}
	vpv, bar1, bar3 := uint64(p.VRAMPerVM), uint64(p.BAR1PerVM), uint64(p.BAR3PerVM)
	switch {
	case maxVMs < 1:
		return l, fmt.Errorf("layout: max VMs %d", maxVMs)
	case l.Reserved.Size+uint64(maxVMs)*vpv > vramSize:
		return l, fmt.Errorf("layout: %d VMs × %d MiB + %d MiB reserved exceed %d MiB of VRAM", maxVMs, vpv>>20, l.Reserved.Size>>20, vramSize>>20)
	case maxVMs*p.ChannelsPerVM > channels:
		return l, fmt.Errorf("layout: %d VMs × %d channels exceed the board's %d", maxVMs, p.ChannelsPerVM, channels)
	case l.PollArea.End()+uint64(maxVMs)*bar1 > nvc0.BAR1Size || uint64(maxVMs)*bar3 > nvc0.BAR3Size:
		return l, fmt.Errorf("layout: BAR slices do not fit the apertures")
	case vpv%nvc0.LargePageSize != 0 || bar1%nvc0.PageSize != 0 || bar3%nvc0.PageSize != 0 || l.Reserved.Size%nvc0.LargePageSize != 0:
		return l, fmt.Errorf("layout: slices must be page multiples (VRAM slices and reserve: 128 KiB)")
	}
	for i := range maxVMs {
		l.Slots = append(l.Slots, Slot{
			Index:    i,
			VRAM:     Region{l.Reserved.End() + uint64(i)*vpv, vpv},
			ChanBase: i * p.ChannelsPerVM,
			Chans:    p.ChannelsPerVM,
			BAR1:     Region{l.PollArea.End() + uint64(i)*bar1, bar1},
			BAR3:     Region{uint64(i) * bar3, bar3},
		})
	}
	return l, nil
}

// SlotSegment is the index, among Segments, of slot i's segment.
func SlotSegment(i int) int { return 1 + i }

// Segments returns VRAM segment sizes that give every slot's slice its own
// backing (for a board that supports it, such as the simulated one): the
// reserve, each slice, and what is left.
func (l Layout) Segments(vramSize uint64) []uint64 {
	segs := []uint64{l.Reserved.Size}
	end := l.Reserved.End()
	for _, s := range l.Slots {
		segs = append(segs, s.VRAM.Size)
		end = s.VRAM.End()
	}
	if end < vramSize {
		segs = append(segs, vramSize-end)
	}
	return segs
}
