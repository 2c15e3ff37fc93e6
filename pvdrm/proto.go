package pvdrm

import (
	"encoding/binary"
	"fmt"
)

// Protocol version and features (HELLO).
const (
	// Version is the protocol version this package speaks.
	Version = 1
	// FeaturePooling: the back end keeps closed mappable buffers for reuse
	// (GEM pooling) and may answer GEM_NEW with a buffer whose pages are
	// already shared.
	FeaturePooling = 1 << 0
	// FeatureYield: PUSHBUF segments may carry PushYield (scheduling
	// points, GLoop's cooperative yield).
	FeatureYield = 1 << 1
	// Features is every feature this package knows.
	Features = FeaturePooling | FeatureYield
)

// PushYield in a PUSHBUF segment's flags declares a scheduling point after
// the segment: the scheduler may run another VM between it and what the
// channel runs next (only with FeatureYield granted).
const PushYield = 1 << 0

// Slot layout of a request and of a response (SlotSize bytes each).
const (
	OffID     = 0x00 // u64: the front end's cookie, echoed in the response
	OffOp     = 0x08 // u16: the Op (echoed)
	OffFlags  = 0x0A // u16: reserved, 0
	OffFile   = 0x0C // request: u32 file handle (0 for HELLO and OPEN)
	OffStatus = 0x0C // response: i32, 0 or a negative Linux errno
	OffArgs   = 0x10 // request arguments / response results
	ArgsSize  = SlotSize - OffArgs
)

// Op is a pvdrm operation.
type Op uint16

// The operations.
const (
	OpHello        Op = 1
	OpOpen         Op = 2
	OpClose        Op = 3
	OpGetParam     Op = 4
	OpChannelAlloc Op = 5
	OpChannelFree  Op = 6
	OpGEMNew       Op = 7
	OpGEMInfo      Op = 8
	OpGEMClose     Op = 9
	OpGEMMmap      Op = 10
	OpPushbuf      Op = 11
	OpCPUPrep      Op = 12
	OpCPUFini      Op = 13
)

// Limits.
const (
	// MaxPushBuffers bounds the buffers one PUSHBUF names.
	MaxPushBuffers = 8
	// MaxPushEntries bounds the push-buffer segments one PUSHBUF submits.
	MaxPushEntries = 4
)

// Errno values in responses (negated), Linux's.
const (
	ENOENT    = 2
	EIO       = 5
	EBADF     = 9
	ENOMEM    = 12
	EFAULT    = 14
	EBUSY     = 16
	EINVAL    = 22
	ENOSPC    = 28
	ENOSYS    = 38
	EPROTO    = 71
	ETIMEDOUT = 110
)

// Field is an argument or result field.
type Field struct {
	Name string
	Off  int // from OffArgs
	Size int // 4 or 8
	Doc  string
}

// Spec is one operation's layout.
type Spec struct {
	Op      Op
	Name    string
	File    bool // the request names a file (OffFile); otherwise it must be 0
	Args    []Field
	Results []Field
	Doc     string
}

// Specs is the protocol as data: docs/pvdrm.md §3 is written from it
// (TestPVDRMDoc checks that they agree).
func Specs() []Spec {
	h := Field{"handle", 0, 4, "GEM handle"}
	return []Spec{
		{OpHello, "HELLO", false,
			[]Field{{"version", 0, 4, "the front end's protocol version"}, {"features", 8, 8, "features it wants"}},
			[]Field{{"version", 0, 4, "the version both speak (≤ each side's)"}, {"max_files", 4, 4, "files the VM may open"}, {"features", 8, 8, "features granted (a subset)"}},
			"first request on a ring; anything else before it is refused with -EPROTO"},
		{OpOpen, "OPEN", false, nil,
			[]Field{{"file", 0, 4, "the new file handle (≥ 1)"}},
			"open a DRM file: its own GPU address space on the host GPU"},
		{OpClose, "CLOSE", true, nil, nil,
			"close a file: its channels stop, its buffers are freed and scrubbed"},
		{OpGetParam, "GETPARAM", true,
			[]Field{{"param", 0, 4, "Param*"}},
			[]Field{{"value", 0, 8, "the parameter's value"}},
			"read a device parameter (chipset, VRAM quota, channels, GPU VA bits)"},
		{OpChannelAlloc, "CHANNEL_ALLOC", true, nil,
			[]Field{{"channel", 0, 4, "channel handle in the file"}},
			"allocate a channel in the file's address space, bounded by the VM's channel quota"},
		{OpChannelFree, "CHANNEL_FREE", true,
			[]Field{{"channel", 0, 4, "channel handle"}}, nil,
			"stop and free a channel"},
		{OpGEMNew, "GEM_NEW", true,
			[]Field{{"size", 0, 8, "bytes (rounded up to 4 KiB)"}, {"domain", 8, 4, "DomainVRAM or DomainGART"}, {"flags", 12, 4, "GEMMappable"}},
			[]Field{{"handle", 0, 4, "GEM handle in the file"}, {"gpu_va", 8, 8, "its GPU virtual address in the file's address space"}, {"size", 16, 8, "its size"}},
			"allocate a buffer, mapped in the file's address space; VRAM counts against the VM's quota"},
		{OpGEMInfo, "GEM_INFO", true, []Field{h},
			[]Field{{"domain", 0, 4, "its domain"}, {"gpu_va", 8, 8, "GPU virtual address"}, {"size", 16, 8, "size"}},
			"describe a buffer"},
		{OpGEMClose, "GEM_CLOSE", true, []Field{h}, nil,
			"close a buffer (pooled when mappable and pooling is on, else freed)"},
		{OpGEMMmap, "GEM_MMAP", true, []Field{h},
			[]Field{{"share", 0, 4, "transport share id of the buffer's pages"}, {"pages", 4, 4, "pages shared"}, {"offset", 8, 8, "transport-specific offset"}},
			"share a GART buffer's pages with the guest (local: an offset in the shared memfd; xen: a page of grant references)"},
		{OpPushbuf, "PUSHBUF", true,
			[]Field{{"channel", 0, 4, "channel handle"}, {"nr_buffers", 4, 4, "buffers used (≤ 8), handles at 8"}, {"nr_push", 40, 4, "push segments (≤ 4), at 48: handle u32, flags u32 (PushYield), offset u32, length u32"}},
			[]Field{{"fence", 0, 8, "sequence number the submission signals"}},
			"submit push-buffer segments held in the file's own buffers; every buffer they and the methods use must be listed and owned by the file"},
		{OpCPUPrep, "CPU_PREP", true, []Field{h, {"timeout_ns", 8, 8, "how long to wait; 0: do not wait"}}, nil,
			"wait until the GPU is done with a buffer (-EBUSY when not waiting, -ETIMEDOUT)"},
		{OpCPUFini, "CPU_FINI", true, []Field{h}, nil,
			"end the CPU's access to a buffer"},
	}
}

// Parameters (GETPARAM).
const (
	ParamChipset  = 1 // PMC_BOOT_0's chipset (0xc0)
	ParamVRAMSize = 2 // the VM's VRAM quota in bytes
	ParamChannels = 3 // the VM's channel quota
	ParamVABits   = 4 // GPU virtual address bits (40)
)

// Buffer domains and flags (GEM_NEW).
const (
	DomainVRAM  = 1
	DomainGART  = 2 // host memory the GPU reaches by DMA; mappable into the guest
	GEMMappable = 1
)

// Request is a decoded request.
type Request struct {
	ID   uint64
	Op   Op
	File uint32
	// Fields by name, as Specs() lists them.
	Args map[string]uint64
	// Pushbuf only: the buffer handles and the push segments.
	Buffers []uint32
	Push    []PushEntry
}

// PushEntry is one push-buffer segment: length bytes at offset in a
// buffer, and its flags (PushYield).
type PushEntry struct {
	Handle, Offset, Length uint32
	Flags                  uint32
}

// Codec encodes and decodes requests and responses by the table Specs()
// returns, built once; it is immutable and safe for concurrent use.
type Codec struct{ specs map[Op]Spec }

// NewCodec returns a Codec for Specs().
func NewCodec() *Codec {
	d := &Codec{specs: map[Op]Spec{}}
	for _, s := range Specs() {
		d.specs[s.Op] = s
	}
	return d
}

// Decode decodes a request slot (a private copy: Back.Next's). The error is
// the negative errno to answer with.
func (d *Codec) Decode(slot []byte) (Request, int32) {
	r := Request{ID: binary.LittleEndian.Uint64(slot[OffID:]), Op: Op(binary.LittleEndian.Uint16(slot[OffOp:]))}
	s, ok := d.specs[r.Op]
	if !ok {
		return r, -ENOSYS
	}
	if binary.LittleEndian.Uint16(slot[OffFlags:]) != 0 {
		return r, -EINVAL
	}
	r.File = binary.LittleEndian.Uint32(slot[OffFile:])
	if s.File != (r.File != 0) {
		return r, -EBADF
	}
	args := slot[OffArgs:SlotSize]
	r.Args = make(map[string]uint64, len(s.Args))
	for _, f := range s.Args {
		r.Args[f.Name] = get(args, f)
	}
	if r.Op == OpPushbuf {
		nb, np := r.Args["nr_buffers"], r.Args["nr_push"]
		if nb > MaxPushBuffers || np > MaxPushEntries || np == 0 {
			return r, -EINVAL
		}
		for i := range int(nb) {
			r.Buffers = append(r.Buffers, binary.LittleEndian.Uint32(args[8+4*i:]))
		}
		for i := range int(np) {
			e := args[48+16*i:]
			flags := binary.LittleEndian.Uint32(e[4:])
			if flags&^PushYield != 0 {
				return r, -EINVAL
			}
			r.Push = append(r.Push, PushEntry{Handle: binary.LittleEndian.Uint32(e), Flags: flags, Offset: binary.LittleEndian.Uint32(e[8:]), Length: binary.LittleEndian.Uint32(e[12:])})
		}
	}
	return r, 0
}

func get(b []byte, f Field) uint64 {
	if f.Size == 8 {
		return binary.LittleEndian.Uint64(b[f.Off:])
	}
	return uint64(binary.LittleEndian.Uint32(b[f.Off:]))
}

func put(b []byte, f Field, v uint64) {
	if f.Size == 8 {
		binary.LittleEndian.PutUint64(b[f.Off:], v)
		return
	}
	binary.LittleEndian.PutUint32(b[f.Off:], uint32(v))
}

// EncodeRequest writes a request into slot (SlotSize bytes) from its
// fields by name (the front end's side).
func (d *Codec) EncodeRequest(slot []byte, r Request) error {
	s, ok := d.specs[r.Op]
	if !ok {
		return fmt.Errorf("pvdrm: unknown op %d", r.Op)
	}
	clear(slot[:SlotSize])
	binary.LittleEndian.PutUint64(slot[OffID:], r.ID)
	binary.LittleEndian.PutUint16(slot[OffOp:], uint16(r.Op))
	binary.LittleEndian.PutUint32(slot[OffFile:], r.File)
	args := slot[OffArgs:SlotSize]
	for _, f := range s.Args {
		put(args, f, r.Args[f.Name])
	}
	if r.Op == OpPushbuf {
		if len(r.Buffers) > MaxPushBuffers || len(r.Push) > MaxPushEntries {
			return fmt.Errorf("pvdrm: PUSHBUF with %d buffers and %d segments", len(r.Buffers), len(r.Push))
		}
		binary.LittleEndian.PutUint32(args[4:], uint32(len(r.Buffers)))
		binary.LittleEndian.PutUint32(args[40:], uint32(len(r.Push)))
		for i, h := range r.Buffers {
			binary.LittleEndian.PutUint32(args[8+4*i:], h)
		}
		for i, p := range r.Push {
			e := args[48+16*i:]
			binary.LittleEndian.PutUint32(e, p.Handle)
			binary.LittleEndian.PutUint32(e[4:], p.Flags)
			binary.LittleEndian.PutUint32(e[8:], p.Offset)
			binary.LittleEndian.PutUint32(e[12:], p.Length)
		}
	}
	return nil
}

// Response is a decoded response.
type Response struct {
	ID      uint64
	Op      Op
	Status  int32
	Results map[string]uint64
}

// EncodeResponse writes a response into slot (the back end's side).
func (d *Codec) EncodeResponse(slot []byte, r Response) {
	clear(slot[:SlotSize])
	binary.LittleEndian.PutUint64(slot[OffID:], r.ID)
	binary.LittleEndian.PutUint16(slot[OffOp:], uint16(r.Op))
	binary.LittleEndian.PutUint32(slot[OffStatus:], uint32(r.Status))
	if s, ok := d.specs[r.Op]; ok && r.Status == 0 {
		for _, f := range s.Results {
			put(slot[OffArgs:SlotSize], f, r.Results[f.Name])
		}
	}
}

// DecodeResponse reads a response slot (the front end's side).
func (d *Codec) DecodeResponse(slot []byte) Response {
	r := Response{ID: binary.LittleEndian.Uint64(slot[OffID:]), Op: Op(binary.LittleEndian.Uint16(slot[OffOp:])),
		Status: int32(binary.LittleEndian.Uint32(slot[OffStatus:]))}
	if s, ok := d.specs[r.Op]; ok && r.Status == 0 {
		r.Results = map[string]uint64{}
		for _, f := range s.Results {
			r.Results[f.Name] = get(slot[OffArgs:SlotSize], f)
		}
	}
	return r
}
