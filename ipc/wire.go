package ipc

import (
	"encoding/binary"
	"fmt"
	"sort"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// ProtocolVersion is the protocol version this package speaks. A Hello with
// another version is rejected.
const ProtocolVersion = 1

// Limits of the protocol. They are part of the wire format (docs/protocol.md).
const (
	MinDomID       = 1        // dom0 never runs a device model for itself
	MaxDomID       = 32751    // DOMID_FIRST_RESERVED (0x7FF0) - 1
	MaxNameLen     = 64       // domain name, bytes
	MaxModeLen     = 32       // mode string, bytes
	MinRAMSize     = 1 << 20  // 1 MiB
	MaxRAMSize     = 64 << 30 // 64 GiB
	RAMPageSize    = 4096     // RAM size must be a multiple of this
	MaxExtraFiles  = 8        // extra fds in either direction
	MaxReasonLen   = 256      // Reject / Bye reason, bytes
	MaxParams      = 16       // Welcome key/value pairs
	MaxParamKeyLen = 64       // bytes
	MaxParamValLen = 255      // bytes
	MaxParamsBytes = 1024     // encoded key/value area
	MaxCallArgs    = 6        // Call arguments
	MaxCallResults = 6        // Call results
	// EntrySize is the size of every MMIO/Call request and response, both as
	// a ring entry and as a socket frame.
	EntrySize = 64
)

// Transport selects how MMIO messages travel after the handshake.
type Transport uint32

// Transports.
const (
	TransportShm    Transport = 1 // shared-memory rings in a server-created memfd
	TransportSocket Transport = 2 // fixed-size frames on the Unix socket
)

// RAMSource says where the aggregator finds the guest's RAM.
type RAMSource uint8

const (
	// RAMMemfd is a memfd sent with the Hello as its first fd: the
	// in-process harness's VMs and any device model that owns its guest's
	// memory.
	RAMMemfd RAMSource = 0
	// RAMXen is the memory of Xen domain DomID itself: no RAM fd travels;
	// the aggregator maps the domain's frames 0..RAMSize/4096 by foreign
	// mapping (privcmd), so GPU DMA for the VM reaches that domain's frames
	// and no others. An aggregator not running on Xen refuses it.
	RAMXen RAMSource = 1
)

// String names the source: "memfd" or "xen".
func (s RAMSource) String() string {
	switch s {
	case RAMMemfd:
		return "memfd"
	case RAMXen:
		return "xen"
	}
	return fmt.Sprintf("RAMSource(%d)", uint8(s))
}

// String returns "shm", "socket" or "transport(N)".
func (t Transport) String() string {
	switch t {
	case TransportShm:
		return "shm"
	case TransportSocket:
		return "socket"
	}
	return fmt.Sprintf("transport(%d)", uint32(t))
}

// Control-message framing.
const (
	wireMagic = 0x4D565047 // "GPVM" little endian

	msgHello   = 1
	msgWelcome = 2
	msgReject  = 3
	msgBye     = 4

	helloSize   = 128
	welcomeSize = 48 + MaxParamsBytes
	reasonSize  = 16 + MaxReasonLen // Reject and Bye

	// maxPacket is the receive buffer for any packet; larger packets are
	// detected through MSG_TRUNC.
	maxPacket = welcomeSize + 64
)

// Entry kinds (offset 0 of a request or response entry).
const (
	kindRead32          = 1
	kindWrite32         = 2
	kindCall            = 3
	kindWrite32Sync     = 4 // a Write32 the client waits for (as a Xen ioreq blocks the vCPU)
	kindFill32          = 5 // count Write32s of one value to consecutive words (a REP STOS), waited for
	kindRead32Reply     = 0x81
	kindCallReply       = 0x83
	kindWrite32SyncDone = 0x84
	kindFill32Done      = 0x85
)

// MaxFillCount is the most words one Fill32 request stores: what one Xen
// ioreq of a REP STOS can carry (its count field; Xen clips a longer
// instruction into several ioreqs).
const MaxFillCount = 4096

var le = binary.LittleEndian

// Hello is the client's handshake message. The guest RAM memfd travels with
// it (SCM_RIGHTS), followed by up to MaxExtraFiles extra fds.
type Hello struct {
	// Version is the protocol version; zero means ProtocolVersion.
	Version uint16
	// DomID is the Xen domain id, MinDomID..MaxDomID.
	DomID uint32
	// Name is the domain name: 1..MaxNameLen printable ASCII bytes, no '/'.
	Name string
	// Mode is the virtualization mode, e.g. "fv-naive" or "fv-optimized":
	// 1..MaxModeLen bytes of [a-z0-9._-]. The package checks only length
	// and charset; the aggregator checks the value.
	Mode string
	// RAMSize is the guest RAM size in bytes: a multiple of RAMPageSize in
	// MinRAMSize..MaxRAMSize. The RAM memfd must be at least this large.
	RAMSize uint64
	// Transport is the MMIO transport the client wants.
	Transport Transport
	// RAMSource says where the guest RAM is: a memfd sent as the first fd
	// (the default) or the Xen domain's own memory.
	RAMSource RAMSource
	// Resume asks only for the vGPU a state image restores for DomID
	// (Hello flag HelloResume, docs/protocol.md §13.7): a device model
	// coming back after its vGPU was saved. With no image waiting the
	// server refuses it with a reason beginning RejectNoImage, never
	// with a fresh vGPU its guest's driver does not know.
	Resume bool
	// ResumesHandoff says the device model comes back by itself, with a
	// resuming Hello, after a Bye that says the daemon is handing off
	// (ByeHandoff; Hello flag HelloResumesHandoff, docs/protocol.md §15):
	// a daemon whose vGPUs' device models keep their guests only if they
	// reconnect (a Xen domain's) hands them off only then.
	ResumesHandoff bool
}

// HelloResume is bit 0 of the Hello's flags byte (offset 28): Hello.Resume.
// HelloResumesHandoff is bit 1: Hello.ResumesHandoff. The other bits are
// reserved and must be 0.
const (
	HelloResume         = 1 << 0
	HelloResumesHandoff = 1 << 1
	helloFlags          = HelloResume | HelloResumesHandoff
)

// Welcome is the aggregator's acceptance of a Hello.
type Welcome struct {
	// VGPU is the id of the virtual GPU assigned to the VM.
	VGPU uint32
	// VRAMSize is the VRAM size the guest sees, bytes.
	VRAMSize uint64
	// Channels is the number of GPU channels the guest may use.
	Channels uint32
	// Params are free-form settings: at most MaxParams pairs, keys
	// 1..MaxParamKeyLen bytes of [A-Za-z0-9._-], values up to MaxParamValLen
	// printable ASCII bytes, at most MaxParamsBytes encoded.
	Params map[string]string
}

// CallResult is the reply to a Call.
type CallResult struct {
	// Status is the call's status: 0 for success, a negative errno-like
	// value for failure (the meaning is the op's).
	Status int32
	// Result holds up to MaxCallResults result words; unused ones are zero.
	Result [MaxCallResults]uint64
}

// barSize is the size of BAR bar, or 0 if the device has no such BAR.
func barSize(bar uint16) uint64 { return nvc0.BARSize(int(bar)) }

// checkMMIO validates a BAR index and offset for a 32-bit access.
func checkMMIO(bar int, off uint64) error {
	if bar < 0 || bar > 0xFFFF || barSize(uint16(bar)) == 0 {
		return fmt.Errorf("bad BAR %d (valid: 0, 1, 3, 5)", bar)
	}
	size := barSize(uint16(bar))
	if off%4 != 0 {
		return fmt.Errorf("BAR%d offset %#x not 4-byte aligned", bar, off)
	}
	if off >= size || size-off < 4 {
		return fmt.Errorf("BAR%d offset %#x beyond BAR size %#x", bar, off, size)
	}
	return nil
}

// request is a decoded request entry.
type request struct {
	kind  uint16
	bar   uint16 // READ32/WRITE32/WRITE32_SYNC
	op    uint16 // CALL
	seq   uint32
	value uint32 // WRITE32/WRITE32_SYNC/FILL32
	off   uint64 // READ32/WRITE32/WRITE32_SYNC/FILL32
	count uint32 // FILL32: words, 1..MaxFillCount
	nargs int
	args  [MaxCallArgs]uint64
}

// encodeRequest writes r into b[:EntrySize] (every byte, reserved ones zero).
func encodeRequest(b []byte, r *request) {
	b = b[:EntrySize]
	clear(b)
	le.PutUint16(b[0:], r.kind)
	le.PutUint32(b[4:], r.seq)
	switch r.kind {
	case kindRead32, kindWrite32, kindWrite32Sync, kindFill32:
		le.PutUint16(b[2:], r.bar)
		le.PutUint32(b[8:], r.value)
		le.PutUint64(b[16:], r.off)
		if r.kind == kindFill32 {
			le.PutUint32(b[12:], r.count)
		}
	case kindCall:
		le.PutUint16(b[2:], r.op)
		le.PutUint32(b[8:], uint32(r.nargs))
		for i := 0; i < r.nargs; i++ {
			le.PutUint64(b[16+8*i:], r.args[i])
		}
	}
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// decodeRequest decodes and fully validates one request entry. b must be a
// private copy (never shared memory): the entry is read exactly once.
func decodeRequest(b []byte, r *request) error {
	if len(b) != EntrySize {
		return fmt.Errorf("request entry is %d bytes, want %d", len(b), EntrySize)
	}
	*r = request{kind: le.Uint16(b[0:]), seq: le.Uint32(b[4:])}
	if r.kind != kindRead32 && r.kind != kindWrite32 && r.kind != kindWrite32Sync && r.kind != kindCall && r.kind != kindFill32 {
		return fmt.Errorf("unknown request kind %d", r.kind)
	}
	if r.kind == kindFill32 {
		return decodeFill(b, r)
	}
	if le.Uint32(b[12:]) != 0 {
		return fmt.Errorf("request kind %d: reserved word at offset 12 is %#x, want 0", r.kind, le.Uint32(b[12:]))
	}
	switch r.kind {
	case kindRead32, kindWrite32, kindWrite32Sync:
		r.bar = le.Uint16(b[2:])
		r.value = le.Uint32(b[8:])
		r.off = le.Uint64(b[16:])
		if r.kind == kindRead32 && r.value != 0 {
			return fmt.Errorf("read32: value field is %#x, want 0", r.value)
		}
		if !allZero(b[24:EntrySize]) {
			return fmt.Errorf("%s: bytes 24..63 must be zero", kindName(r.kind))
		}
		if err := checkMMIO(int(r.bar), r.off); err != nil {
			return fmt.Errorf("%s: %w", kindName(r.kind), err)
		}
	case kindCall:
		r.op = le.Uint16(b[2:])
		n := le.Uint32(b[8:])
		if n > MaxCallArgs {
			return fmt.Errorf("call op %d: %d arguments, at most %d", r.op, n, MaxCallArgs)
		}
		r.nargs = int(n)
		for i := 0; i < MaxCallArgs; i++ {
			a := le.Uint64(b[16+8*i:])
			if i >= r.nargs && a != 0 {
				return fmt.Errorf("call op %d: unused argument %d is non-zero", r.op, i)
			}
			r.args[i] = a
		}
	default:
		return fmt.Errorf("unknown request kind %d", r.kind)
	}
	return nil
}

// decodeFill decodes a FILL32 entry: the BAR, value and offset as a
// WRITE32's, the count at offset 12; every word it stores must be in the BAR.
func decodeFill(b []byte, r *request) error {
	r.bar = le.Uint16(b[2:])
	r.value = le.Uint32(b[8:])
	r.count = le.Uint32(b[12:])
	r.off = le.Uint64(b[16:])
	if !allZero(b[24:EntrySize]) {
		return fmt.Errorf("fill32: bytes 24..63 must be zero")
	}
	return checkFill(int(r.bar), r.off, int(r.count))
}

// checkFill validates a fill of n words from off: 1..MaxFillCount words,
// the first and the last (so all) in the BAR.
func checkFill(bar int, off uint64, n int) error {
	if n < 1 || n > MaxFillCount {
		return fmt.Errorf("fill32: %d words, want 1..%d", n, MaxFillCount)
	}
	if err := checkMMIO(bar, off); err != nil {
		return fmt.Errorf("fill32: %w", err)
	}
	if err := checkMMIO(bar, off+4*uint64(n-1)); err != nil {
		return fmt.Errorf("fill32 of %d words: %w", n, err)
	}
	return nil
}

func kindName(k uint16) string {
	switch k {
	case kindRead32:
		return "read32"
	case kindWrite32:
		return "write32"
	case kindWrite32Sync:
		return "write32 sync"
	case kindFill32:
		return "fill32"
	case kindFill32Done:
		return "fill32 done"
	case kindCall:
		return "call"
	case kindRead32Reply:
		return "read32 reply"
	case kindCallReply:
		return "call reply"
	case kindWrite32SyncDone:
		return "write32 sync done"
	}
	return fmt.Sprintf("kind %d", k)
}

// response is a decoded response entry.
type response struct {
	kind   uint16
	seq    uint32
	value  uint32 // READ32 reply value, or CALL status
	result [MaxCallResults]uint64
}

func encodeResponse(b []byte, r *response) {
	b = b[:EntrySize]
	clear(b)
	le.PutUint16(b[0:], r.kind)
	le.PutUint32(b[4:], r.seq)
	le.PutUint32(b[8:], r.value)
	if r.kind == kindCallReply {
		for i, v := range r.result {
			le.PutUint64(b[16+8*i:], v)
		}
	}
}

func decodeResponse(b []byte, r *response) error {
	if len(b) != EntrySize {
		return fmt.Errorf("response entry is %d bytes, want %d", len(b), EntrySize)
	}
	*r = response{kind: le.Uint16(b[0:]), seq: le.Uint32(b[4:]), value: le.Uint32(b[8:])}
	if le.Uint16(b[2:]) != 0 || le.Uint32(b[12:]) != 0 {
		return fmt.Errorf("%s: reserved fields not zero", kindName(r.kind))
	}
	switch r.kind {
	case kindRead32Reply:
		if !allZero(b[16:EntrySize]) {
			return fmt.Errorf("read32 reply: bytes 16..63 must be zero")
		}
	case kindWrite32SyncDone, kindFill32Done:
		if r.value != 0 || !allZero(b[16:EntrySize]) {
			return fmt.Errorf("%s: bytes 8..63 must be zero", kindName(r.kind))
		}
	case kindCallReply:
		for i := range r.result {
			r.result[i] = le.Uint64(b[16+8*i:])
		}
	default:
		return fmt.Errorf("unknown response kind %d", r.kind)
	}
	return nil
}

// ---- control messages ----

func putHeader(b []byte, typ uint16) {
	le.PutUint32(b[0:], wireMagic)
	le.PutUint16(b[4:], typ)
	le.PutUint16(b[6:], ProtocolVersion)
}

func msgName(t uint16) string {
	switch t {
	case msgHello:
		return "hello"
	case msgWelcome:
		return "welcome"
	case msgReject:
		return "reject"
	case msgBye:
		return "bye"
	case msgRemapUpdate:
		return "remap update"
	case msgRemapAck:
		return "remap ack"
	case msgRemapRevoke:
		return "remap revoke"
	}
	return fmt.Sprintf("message type %d", t)
}

// checkHeader validates magic, type and version, then the exact size.
func checkHeader(b []byte, typ uint16, size int) error {
	if len(b) < 8 {
		return fmt.Errorf("truncated %s: %d bytes", msgName(typ), len(b))
	}
	if m := le.Uint32(b[0:]); m != wireMagic {
		return fmt.Errorf("bad magic %#08x (want %#08x)", m, wireMagic)
	}
	if t := le.Uint16(b[4:]); t != typ {
		return fmt.Errorf("got %s, want %s", msgName(t), msgName(typ))
	}
	if v := le.Uint16(b[6:]); v != ProtocolVersion {
		return fmt.Errorf("unsupported protocol version %d (this side speaks %d)", v, ProtocolVersion)
	}
	if len(b) != size {
		return fmt.Errorf("%s is %d bytes, want %d", msgName(typ), len(b), size)
	}
	return nil
}

// peekType returns the control-message type of b, or 0 if b is not one.
func peekType(b []byte) uint16 {
	if len(b) < 8 || le.Uint32(b) != wireMagic {
		return 0
	}
	return le.Uint16(b[4:])
}

func validName(s string) error {
	if len(s) == 0 || len(s) > MaxNameLen {
		return fmt.Errorf("domain name length %d not in 1..%d", len(s), MaxNameLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c > 0x7E || c == '/' {
			return fmt.Errorf("domain name byte %d is %#02x: only printable ASCII without '/' allowed", i, c)
		}
	}
	return nil
}

func validMode(s string) error {
	if len(s) == 0 || len(s) > MaxModeLen {
		return fmt.Errorf("mode length %d not in 1..%d", len(s), MaxModeLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("mode byte %d is %#02x: only [a-z0-9._-] allowed", i, c)
		}
	}
	return nil
}

// validate checks every field of h (Version must already be filled in).
func (h *Hello) validate() error {
	if h.Version != ProtocolVersion {
		return fmt.Errorf("unsupported protocol version %d (this side speaks %d)", h.Version, ProtocolVersion)
	}
	if h.DomID < MinDomID || h.DomID > MaxDomID {
		return fmt.Errorf("domain id %d not in %d..%d", h.DomID, MinDomID, MaxDomID)
	}
	if err := validName(h.Name); err != nil {
		return err
	}
	if err := validMode(h.Mode); err != nil {
		return err
	}
	if h.RAMSize < MinRAMSize || h.RAMSize > MaxRAMSize || h.RAMSize%RAMPageSize != 0 {
		return fmt.Errorf("RAM size %d is not a multiple of %d in %d..%d", h.RAMSize, RAMPageSize, uint64(MinRAMSize), uint64(MaxRAMSize))
	}
	if h.Transport != TransportShm && h.Transport != TransportSocket {
		return fmt.Errorf("unknown transport %d", uint32(h.Transport))
	}
	if h.RAMSource != RAMMemfd && h.RAMSource != RAMXen {
		return fmt.Errorf("unknown RAM source %d", uint8(h.RAMSource))
	}
	return nil
}

// encodeHello encodes h (which must be valid) announcing nExtra extra fds.
func encodeHello(h *Hello, nExtra int) []byte {
	b := make([]byte, helloSize)
	putHeader(b, msgHello)
	le.PutUint16(b[6:], h.Version)
	le.PutUint32(b[8:], h.DomID)
	le.PutUint32(b[12:], uint32(h.Transport))
	le.PutUint64(b[16:], h.RAMSize)
	b[24] = byte(len(h.Name))
	b[25] = byte(len(h.Mode))
	b[26] = byte(nExtra)
	b[27] = byte(h.RAMSource)
	if h.Resume {
		b[28] |= HelloResume
	}
	if h.ResumesHandoff {
		b[28] |= HelloResumesHandoff
	}
	copy(b[32:32+MaxNameLen], h.Name)
	copy(b[96:96+MaxModeLen], h.Mode)
	return b
}

// decodeHello decodes and validates a Hello packet; it returns the number of
// extra fds the client announced.
func decodeHello(b []byte) (Hello, int, error) {
	if err := checkHeader(b, msgHello, helloSize); err != nil {
		return Hello{}, 0, err
	}
	h := Hello{
		Version:   le.Uint16(b[6:]),
		DomID:     le.Uint32(b[8:]),
		Transport: Transport(le.Uint32(b[12:])),
		RAMSize:   le.Uint64(b[16:]),
		RAMSource: RAMSource(b[27]),
		Resume:    b[28]&HelloResume != 0,

		ResumesHandoff: b[28]&HelloResumesHandoff != 0,
	}
	nameLen, modeLen, nExtra := int(b[24]), int(b[25]), int(b[26])
	if b[28]&^helloFlags != 0 {
		return Hello{}, 0, fmt.Errorf("hello: unknown flags %#x (only %#x, resume, and %#x, resumes after a handoff, are defined)", b[28]&^helloFlags, HelloResume, HelloResumesHandoff)
	}
	if b[29] != 0 || b[30] != 0 || b[31] != 0 {
		return Hello{}, 0, fmt.Errorf("hello: reserved bytes 29..31 not zero")
	}
	if nameLen > MaxNameLen {
		return Hello{}, 0, fmt.Errorf("domain name length %d not in 1..%d", nameLen, MaxNameLen)
	}
	if modeLen > MaxModeLen {
		return Hello{}, 0, fmt.Errorf("mode length %d not in 1..%d", modeLen, MaxModeLen)
	}
	if !allZero(b[32+nameLen : 96]) {
		return Hello{}, 0, fmt.Errorf("hello: name padding not zero")
	}
	if !allZero(b[96+modeLen : 128]) {
		return Hello{}, 0, fmt.Errorf("hello: mode padding not zero")
	}
	if nExtra > MaxExtraFiles {
		return Hello{}, 0, fmt.Errorf("hello announces %d extra fds, at most %d", nExtra, MaxExtraFiles)
	}
	h.Name = string(b[32 : 32+nameLen])
	h.Mode = string(b[96 : 96+modeLen])
	if err := h.validate(); err != nil {
		return Hello{}, 0, err
	}
	return h, nExtra, nil
}

// welcomeWire is the Welcome plus the fields the package fills in.
type welcomeWire struct {
	Welcome
	transport  Transport
	reqEntries uint32
	rspEntries uint32
	nExtra     int
}

func validParamKey(k string) error {
	if len(k) == 0 || len(k) > MaxParamKeyLen {
		return fmt.Errorf("param key length %d not in 1..%d", len(k), MaxParamKeyLen)
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("param key %q: byte %d not in [A-Za-z0-9._-]", k, i)
		}
	}
	return nil
}

func validParamVal(k, v string) error {
	if len(v) > MaxParamValLen {
		return fmt.Errorf("param %q: value length %d > %d", k, len(v), MaxParamValLen)
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x20 || v[i] > 0x7E {
			return fmt.Errorf("param %q: value byte %d is not printable ASCII", k, i)
		}
	}
	return nil
}

func encodeWelcome(w *welcomeWire) ([]byte, error) {
	if len(w.Params) > MaxParams {
		return nil, fmt.Errorf("%d params, at most %d", len(w.Params), MaxParams)
	}
	if w.nExtra > MaxExtraFiles {
		return nil, fmt.Errorf("%d extra fds, at most %d", w.nExtra, MaxExtraFiles)
	}
	keys := make([]string, 0, len(w.Params))
	for k, v := range w.Params {
		if err := validParamKey(k); err != nil {
			return nil, err
		}
		if err := validParamVal(k, v); err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	b := make([]byte, welcomeSize)
	putHeader(b, msgWelcome)
	le.PutUint32(b[8:], w.VGPU)
	le.PutUint32(b[12:], w.Channels)
	le.PutUint64(b[16:], w.VRAMSize)
	le.PutUint32(b[24:], uint32(w.transport))
	le.PutUint32(b[28:], w.reqEntries)
	le.PutUint32(b[32:], w.rspEntries)
	b[36] = byte(w.nExtra)
	b[37] = byte(len(keys))
	p := 48
	for _, k := range keys {
		v := w.Params[k]
		if p+2+len(k)+len(v) > 48+MaxParamsBytes {
			return nil, fmt.Errorf("params need more than %d bytes", MaxParamsBytes)
		}
		b[p], b[p+1] = byte(len(k)), byte(len(v))
		p += 2
		p += copy(b[p:], k)
		p += copy(b[p:], v)
	}
	le.PutUint16(b[38:], uint16(p-48))
	return b, nil
}

func decodeWelcome(b []byte) (welcomeWire, error) {
	var w welcomeWire
	if err := checkHeader(b, msgWelcome, welcomeSize); err != nil {
		return w, err
	}
	w.VGPU = le.Uint32(b[8:])
	w.Channels = le.Uint32(b[12:])
	w.VRAMSize = le.Uint64(b[16:])
	w.transport = Transport(le.Uint32(b[24:]))
	w.reqEntries = le.Uint32(b[28:])
	w.rspEntries = le.Uint32(b[32:])
	w.nExtra = int(b[36])
	nParams, plen := int(b[37]), int(le.Uint16(b[38:]))
	if le.Uint64(b[40:]) != 0 {
		return w, fmt.Errorf("welcome: reserved bytes 40..47 not zero")
	}
	if w.nExtra > MaxExtraFiles {
		return w, fmt.Errorf("welcome announces %d extra fds, at most %d", w.nExtra, MaxExtraFiles)
	}
	if nParams > MaxParams || plen > MaxParamsBytes {
		return w, fmt.Errorf("welcome: %d params in %d bytes exceed limits", nParams, plen)
	}
	if !allZero(b[48+plen:]) {
		return w, fmt.Errorf("welcome: params padding not zero")
	}
	area := b[48 : 48+plen]
	if nParams > 0 {
		w.Params = make(map[string]string, nParams)
	}
	prev := ""
	for i := 0; i < nParams; i++ {
		if len(area) < 2 || len(area) < 2+int(area[0])+int(area[1]) {
			return w, fmt.Errorf("welcome: param %d truncated", i)
		}
		k := string(area[2 : 2+int(area[0])])
		v := string(area[2+int(area[0]) : 2+int(area[0])+int(area[1])])
		area = area[2+len(k)+len(v):]
		if err := validParamKey(k); err != nil {
			return w, err
		}
		if err := validParamVal(k, v); err != nil {
			return w, err
		}
		if i > 0 && k <= prev {
			return w, fmt.Errorf("welcome: param keys not strictly sorted at %q", k)
		}
		prev = k
		w.Params[k] = v
	}
	if len(area) != 0 {
		return w, fmt.Errorf("welcome: %d stray bytes after params", len(area))
	}
	return w, nil
}

// sanitizeReason makes s a valid reason: printable ASCII, at most
// MaxReasonLen bytes.
func sanitizeReason(s string) string {
	b := []byte(s)
	if len(b) > MaxReasonLen {
		b = b[:MaxReasonLen]
	}
	for i, c := range b {
		if c < 0x20 || c > 0x7E {
			b[i] = '?'
		}
	}
	return string(b)
}

func encodeReason(typ uint16, reason string) []byte {
	reason = sanitizeReason(reason)
	b := make([]byte, reasonSize)
	putHeader(b, typ)
	le.PutUint16(b[8:], uint16(len(reason)))
	copy(b[16:], reason)
	return b
}

func decodeReason(b []byte, typ uint16) (string, error) {
	if err := checkHeader(b, typ, reasonSize); err != nil {
		return "", err
	}
	n := int(le.Uint16(b[8:]))
	if n > MaxReasonLen || le.Uint16(b[10:]) != 0 || le.Uint32(b[12:]) != 0 || !allZero(b[16+n:]) {
		return "", fmt.Errorf("%s: malformed reason", msgName(typ))
	}
	return sanitizeReason(string(b[16 : 16+n])), nil
}
