// Package vgpuimage is the vGPU state image: the versioned stream that
// carries everything needed to re-create a vGPU on another slot, board or
// daemon (docs/protocol.md §13, "vGPU state image"). It only encodes and
// decodes: the structure, the checksum and every count and length are
// checked here; what the values mean (a channel instance inside the new
// slot, a page-table entry inside the VM's memory) is checked by the
// aggregator when it re-applies them through the guest-write paths.
//
// The package is kept apart from the aggregator so that the decoder — the
// part that reads hostile input — can be fuzzed alone, fast, and so that
// nothing in it can reach a board.
package vgpuimage

import "errors"

// Version is the image format this package writes and reads.
const Version = 1

// Magic opens every image.
var Magic = [8]byte{'G', 'P', 'U', 'V', 'M', 'I', 'M', 'G'}

// Errors of Decode, wrapped with where they were found.
var (
	// ErrNotImage: the stream does not start with Magic.
	ErrNotImage = errors.New("not a gpuvm vGPU state image")
	// ErrVersion: an image of another format version.
	ErrVersion = errors.New("unsupported image version")
	// ErrTruncated: the stream ended inside the image.
	ErrTruncated = errors.New("image truncated")
	// ErrChecksum: the SHA-256 trailer does not match.
	ErrChecksum = errors.New("image checksum mismatch")
	// ErrMalformed: a field, count or length outside the format's bounds.
	ErrMalformed = errors.New("malformed image")
)

// Limits of version 1 (docs/protocol.md §13.4). Each bounds what a decoder
// allocates for a hostile image; none is below what an honest vGPU needs.
const (
	MaxVRAM         = 64 << 30 // declared VRAM (config.MaxVRAM)
	MinRAM          = 1 << 20  // ipc.MinRAMSize
	MaxRAM          = 64 << 30 // ipc.MaxRAMSize
	MaxChannels     = 128      // nvc0.MaxChannels
	MaxBAR1         = 128 << 20
	MaxBAR3         = 64 << 20
	PageSize        = 4096      // BAR slice and VRAM page granularity
	VRAMGranule     = 128 << 10 // declared VRAM: a multiple of the large page
	MaxNameLen      = 64
	MaxModeLen      = 32
	MaxProfileLen   = 64
	MaxRegs         = 1024
	BAR0Size        = 32 << 20
	MaxStateWords   = 256
	MaxPVObjects    = 1024
	MaxPVBindings   = 256
	SmallTableLen   = 32768 // entries of a PV small-page table
	LargeTableLen   = 1024  // entries of a PV large-page table
	MaxHCSlots      = 64    // hypercall.Slots
	MaxWaitBuckets  = 64
	MaxPageSection  = 1 << 20 // VRAM bytes in one page section
	maxPDE          = 8192    // nvc0.PDECount
	maxIdentityBody = 4096
)

// PV object kinds (shadow.PVKind).
const (
	KindPageDir    = 1
	KindSmallTable = 2
	KindLargeTable = 3
)

// Image is one vGPU's state.
type Image struct {
	Identity Identity
	// Regs are the guest-visible BAR0 registers the vGPU keeps as state,
	// strictly increasing by offset.
	Regs []Reg
	// Chans has one entry per guest channel (Identity.Channels).
	Chans []Chan
	// PV is a PV vGPU's tables, apertures and hypercall window (nil for
	// full virtualization; present exactly when Identity.PV).
	PV *PV
	// Account is the vGPU's scheduler account totals.
	Account Account
	// PVDRM is a pvdrm vGPU's back end (present exactly when
	// Identity.PVDRM).
	PVDRM *PVDRM
	// Pages are the VRAM ranges of the slot in use, sorted, not
	// overlapping, inside Identity.VRAM.
	Pages []Page
}

// Identity is who the vGPU is for and what its guest was told.
type Identity struct {
	Mode, Profile, Name string
	DomID               uint32 // the domain it was saved from (informational)
	RAM                 uint64 // guest RAM bytes the vGPU was built over
	VRAM                uint64 // slot sizes the guest was told
	Channels            uint32
	BAR1, BAR3          uint64
	PV                  bool
	// PVDRM: a pvdrm vGPU, whose back end's state is the PVDRM section;
	// its registers, channels and PV tables are its back-end driver's and
	// are not carried (a restore opens a new driver).
	PVDRM bool
}

// Reg is one register's value.
type Reg struct{ Off, Val uint32 }

// Chan is one guest channel.
type Chan struct {
	Inst, Ctl, Put          uint32
	Enabled, Listed, Killed bool
	// State is the board's channel-state words of a channel that was
	// running (nil: it was not).
	State []uint32
}

// PV is a PV vGPU's aggregator-held state, in the guest's terms.
type PV struct {
	Next     uint32
	Objects  []PVObject // strictly increasing by handle
	Bindings []PVBinding
	BAR1     []uint64 // aperture entries, one per BAR1 slice page
	BAR3     []uint64
	HC       Hypercall
}

// PVObject is one PV handle.
type PVObject struct {
	Handle uint32
	Kind   uint8
	In     uint32 // directory the table is linked into (0: none)
	PDE    uint32
	// Entries: a table's guest PTE words (SmallTableLen or LargeTableLen
	// of them); none for a directory.
	Entries []uint64
}

// PVBinding binds a guest instance block to a page directory.
type PVBinding struct {
	RAMIN uint64
	PD    uint32
}

// Hypercall is the hypercall window's register state.
type Hypercall struct {
	Slots                        []HCSlot // registered slot pages, by index
	Sel, Lo, Hi, Status, Last, N uint32
}

// HCSlot is one registered slot page.
type HCSlot struct {
	Index uint32
	GPA   uint64
}

// Account is a vGPU's scheduler account totals.
type Account struct {
	Submissions, GPUTimeNs, QueueWaitNs, Released uint64
	SLOViolations, SLOBoosted                     uint64
	Waits                                         []uint64
}

// Page is one range of the slot's VRAM in use.
type Page struct {
	Off  uint64
	Data []byte
}

// Bytes is the VRAM the image carries.
func (m *Image) Bytes() uint64 {
	var n uint64
	for _, p := range m.Pages {
		n += uint64(len(p.Data))
	}
	return n
}

// Scrub zeroes everything of the guest the image holds.
func (m *Image) Scrub() {
	for _, p := range m.Pages {
		clear(p.Data)
	}
	for i := range m.Chans {
		clear(m.Chans[i].State)
	}
	if m.PV != nil {
		for _, o := range m.PV.Objects {
			clear(o.Entries)
		}
		clear(m.PV.BAR1)
		clear(m.PV.BAR3)
	}
	clear(m.Regs)
	if m.PVDRM != nil {
		clear(m.PVDRM.Files)
		clear(m.PVDRM.Pool)
	}
	*m = Image{}
}
