package aggregator

import (
	"fmt"
	"io"

	"github.com/gpuvm/gpuvm/vgpuimage"
)

// The destination of a live migration (docs/protocol.md §14.4). The
// stream is hostile input: vgpuimage.ReadStream checks its framing, every
// bound and its checksum, and holds at most the slot's VRAM in pages; the
// image it yields is then checked here exactly as an image given to
// RegisterRestore is (CheckImage) and waits for the domain's next device
// model like one, whose attach re-applies every value through the guest's
// write paths (attachRestored): a stream that names memory outside the
// new slot is refused there with nothing attached.

// ReadMigration reads a migration stream from r for a slot of this board
// and returns its image, checked against the board for domain domid. The
// caller holds it (RegisterImage) or scrubs it.
func (a *Aggregator) ReadMigration(domid uint32, r io.Reader) (*vgpuimage.Image, vgpuimage.StreamInfo, error) {
	img, info, err := vgpuimage.ReadStream(r, a.slotVRAM())
	if err != nil {
		return nil, info, fmt.Errorf("%w: %w", ErrImageRefused, err)
	}
	if err := a.CheckImage(domid, img); err != nil {
		img.Scrub()
		return nil, info, err
	}
	return img, info, nil
}

// slotVRAM is the VRAM of the board's slots: the most a stream may
// declare.
func (a *Aggregator) slotVRAM() uint64 {
	if len(a.layout.Slots) == 0 {
		return 0
	}
	return a.layout.Slots[0].VRAM.Size
}
