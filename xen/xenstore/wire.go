package xenstore

// This file is the xenstore wire protocol (Xen's io/xs_wire.h): every
// message is a 16-byte header (u32 type, u32 req_id, u32 tx_id, u32 len,
// little-endian as on every machine Xen runs on) and len bytes of payload,
// mostly NUL-terminated strings. The peer is not trusted: a length above
// PayloadMax or an unknown type is a protocol error that ends the
// connection, since its framing can no longer be believed. Msg, MsgType,
// ReadMsg and Msg.Marshal are exported for the other end of the protocol:
// a daemon such as xenstoretest's.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Protocol limits (io/xs_wire.h).
const (
	// PayloadMax bounds the payload of any one message.
	PayloadMax = 4096
	// AbsPathMax bounds an absolute path.
	AbsPathMax = 3072
	// RelPathMax bounds a relative path.
	RelPathMax = 2048

	// struct xsd_sockmsg: the header, its fields at these offsets.
	headerSize = 16
	offType    = 0
	offReqID   = 4
	offTxID    = 8
	offLen     = 12
)

// MsgType is a message type, enum xsd_sockmsg_type.
type MsgType uint32

// The message types: MsgRead is XS_READ, and so on. Number 20 was
// XS_RESTRICT, since removed.
const (
	MsgControl            MsgType = 0
	MsgDirectory          MsgType = 1
	MsgRead               MsgType = 2
	MsgGetPerms           MsgType = 3
	MsgWatch              MsgType = 4
	MsgUnwatch            MsgType = 5
	MsgTransactionStart   MsgType = 6
	MsgTransactionEnd     MsgType = 7
	MsgIntroduce          MsgType = 8
	MsgRelease            MsgType = 9
	MsgGetDomainPath      MsgType = 10
	MsgWrite              MsgType = 11
	MsgMkdir              MsgType = 12
	MsgRm                 MsgType = 13
	MsgSetPerms           MsgType = 14
	MsgWatchEvent         MsgType = 15
	MsgError              MsgType = 16
	MsgIsDomainIntroduced MsgType = 17
	MsgResume             MsgType = 18
	MsgSetTarget          MsgType = 19
	MsgResetWatches       MsgType = 21
	MsgDirectoryPart      MsgType = 22
	msgTypeCount          MsgType = 23
	msgInvalid            MsgType = 0xffff
)

// msgRemovedRestrict is XS_RESTRICT's old number, no longer valid.
const msgRemovedRestrict MsgType = 20

// valid reports whether t is a message type of the current protocol.
func (t MsgType) valid() bool { return t < msgTypeCount && t != msgRemovedRestrict }

// String returns the type's name, e.g. XS_READ.
func (t MsgType) String() string {
	names := [...]string{"CONTROL", "DIRECTORY", "READ", "GET_PERMS", "WATCH", "UNWATCH",
		"TRANSACTION_START", "TRANSACTION_END", "INTRODUCE", "RELEASE", "GET_DOMAIN_PATH",
		"WRITE", "MKDIR", "RM", "SET_PERMS", "WATCH_EVENT", "ERROR", "IS_DOMAIN_INTRODUCED",
		"RESUME", "SET_TARGET", "", "RESET_WATCHES", "DIRECTORY_PART"}
	if t.valid() {
		return "XS_" + names[t]
	}
	return fmt.Sprintf("xenstore type %d", uint32(t))
}

// ErrProtocol is wrapped by every error caused by a malformed
// message from the xenstore peer.
var ErrProtocol = errors.New("xenstore protocol error")

// Msg is one message: struct xsd_sockmsg and its payload.
type Msg struct {
	Type    MsgType
	ReqID   uint32 // the request's id, echoed in its reply
	TxID    uint32 // the transaction, 0 for none
	Payload []byte // at most PayloadMax bytes
}

// Marshal encodes m, refusing a payload over PayloadMax.
func (m Msg) Marshal() ([]byte, error) {
	if len(m.Payload) > PayloadMax {
		return nil, fmt.Errorf("xenstore %v: payload of %d bytes exceeds %d", m.Type, len(m.Payload), PayloadMax)
	}
	b := make([]byte, headerSize+len(m.Payload))
	binary.LittleEndian.PutUint32(b[offType:], uint32(m.Type))
	binary.LittleEndian.PutUint32(b[offReqID:], m.ReqID)
	binary.LittleEndian.PutUint32(b[offTxID:], m.TxID)
	binary.LittleEndian.PutUint32(b[offLen:], uint32(len(m.Payload)))
	copy(b[headerSize:], m.Payload)
	return b, nil
}

// ReadMsg reads one message. It returns io.EOF only for a clean end
// before a header; a length over PayloadMax or an invalid type
// fails with ErrProtocol before any payload is read, and a short
// payload with io.ErrUnexpectedEOF.
func ReadMsg(r io.Reader) (Msg, error) {
	var hdr [headerSize]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		if errors.Is(err, io.EOF) {
			return Msg{}, io.EOF
		}
		return Msg{}, fmt.Errorf("xenstore: read header: %w", err)
	}
	m := Msg{
		Type:  MsgType(binary.LittleEndian.Uint32(hdr[offType:])),
		ReqID: binary.LittleEndian.Uint32(hdr[offReqID:]),
		TxID:  binary.LittleEndian.Uint32(hdr[offTxID:]),
	}
	n := binary.LittleEndian.Uint32(hdr[offLen:])
	if n > PayloadMax {
		return Msg{}, fmt.Errorf("%w: %v payload length %d exceeds %d", ErrProtocol, m.Type, n, PayloadMax)
	}
	if !m.Type.valid() {
		return Msg{}, fmt.Errorf("%w: unknown message type %d", ErrProtocol, uint32(m.Type))
	}
	m.Payload = make([]byte, n)
	if _, err := io.ReadFull(r, m.Payload); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return Msg{}, fmt.Errorf("xenstore: read %v payload of %d bytes: %w", m.Type, n, err)
	}
	return m, nil
}

// splitStrings splits a payload of NUL-terminated strings. Every string must
// be terminated; an empty payload is no strings.
func splitStrings(p []byte) ([]string, error) {
	if len(p) == 0 {
		return nil, nil
	}
	if p[len(p)-1] != 0 {
		return nil, fmt.Errorf("%w: unterminated string list", ErrProtocol)
	}
	return strings.Split(string(p[:len(p)-1]), "\x00"), nil
}

// oneString returns the single NUL-terminated string of a payload (a
// final NUL is optional: some servers omit it).
func oneString(p []byte) (string, error) {
	s := string(p)
	s = strings.TrimSuffix(s, "\x00")
	if strings.IndexByte(s, 0) >= 0 {
		return "", fmt.Errorf("%w: %d strings where one was expected", ErrProtocol, strings.Count(s, "\x00")+1)
	}
	return s, nil
}

// parseWatchEvent decodes an XS_WATCH_EVENT payload: path and token.
func parseWatchEvent(p []byte) (path, token string, err error) {
	f, err := splitStrings(p)
	if err != nil {
		return "", "", err
	}
	if len(f) != 2 {
		return "", "", fmt.Errorf("%w: watch event with %d fields, want path and token", ErrProtocol, len(f))
	}
	return f[0], f[1], nil
}

// Error is an XS_ERROR reply: the daemon refused a request.
// errors.Is matches its errno (unix.ENOENT, fs.ErrNotExist, unix.EAGAIN…).
type Error struct {
	Op    string // the request, e.g. "XS_READ"
	Path  string // the path it named, if any
	Errno string // the daemon's error name, e.g. "ENOENT"
}

// Error describes the refused request.
func (e *Error) Error() string {
	if e.Path == "" {
		return fmt.Sprintf("xenstore %s: %s", e.Op, e.Errno)
	}
	return fmt.Sprintf("xenstore %s %s: %s", e.Op, e.Path, e.Errno)
}

// Unwrap returns the errno the name stands for, or nil if it is not one
// io/xs_wire.h lists.
func (e *Error) Unwrap() error {
	if n := errnoOf(e.Errno); n != 0 {
		return n
	}
	return nil
}

// errnoOf maps the error names of io/xs_wire.h's xsd_errors to errnos.
func errnoOf(name string) syscall.Errno {
	switch name {
	case "EINVAL":
		return unix.EINVAL
	case "EACCES":
		return unix.EACCES
	case "EEXIST":
		return unix.EEXIST
	case "EISDIR":
		return unix.EISDIR
	case "ENOENT":
		return unix.ENOENT
	case "ENOMEM":
		return unix.ENOMEM
	case "ENOSPC":
		return unix.ENOSPC
	case "EIO":
		return unix.EIO
	case "ENOTEMPTY":
		return unix.ENOTEMPTY
	case "ENOSYS":
		return unix.ENOSYS
	case "EROFS":
		return unix.EROFS
	case "EBUSY":
		return unix.EBUSY
	case "EAGAIN":
		return unix.EAGAIN
	case "EISCONN":
		return unix.EISCONN
	case "E2BIG":
		return unix.E2BIG
	case "EPERM":
		return unix.EPERM
	}
	return 0
}

// parseError decodes an XS_ERROR payload: one short upper-case name.
func parseError(p []byte) (string, error) {
	s, err := oneString(p)
	if err != nil {
		return "", err
	}
	if s == "" || len(s) > 32 {
		return "", fmt.Errorf("%w: error reply of %d bytes", ErrProtocol, len(s))
	}
	for _, c := range []byte(s) {
		if (c < 'A' || c > 'Z') && (c < '0' || c > '9') {
			return "", fmt.Errorf("%w: error reply %q is not an errno name", ErrProtocol, s)
		}
	}
	return s, nil
}

// checkPath refuses a path xenstored would refuse, before it is sent:
// empty, too long, with characters outside [A-Za-z0-9/_@-], an empty
// component, or a trailing slash. Relative paths are allowed.
func checkPath(p string) error {
	limit := RelPathMax
	if strings.HasPrefix(p, "/") {
		limit = AbsPathMax
	}
	switch {
	case p == "":
		return errors.New("xenstore: empty path")
	case len(p) > limit:
		return fmt.Errorf("xenstore: path of %d bytes exceeds %d", len(p), limit)
	case strings.Contains(p, "//") || (len(p) > 1 && strings.HasSuffix(p, "/")):
		return fmt.Errorf("xenstore: malformed path %q", p)
	}
	for _, c := range []byte(p) {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '/' || c == '_' || c == '@' || c == '-'
		if !ok {
			return fmt.Errorf("xenstore: path %q has a character xenstore refuses", p)
		}
	}
	return nil
}

// Perm is one entry of a node's permission list (XS_SET_PERMS).
// The first entry names the owner, and its access is what every domain not
// listed gets.
type Perm struct {
	Domid  uint16
	Access byte // 'n' none, 'r' read, 'w' write, 'b' both
}

// String returns the entry as XS_SET_PERMS sends it, e.g. "r5".
func (p Perm) String() string { return fmt.Sprintf("%c%d", p.Access, p.Domid) }

// setPermsPayload encodes path and perms for XS_SET_PERMS.
func setPermsPayload(path string, perms []Perm) ([]byte, error) {
	if len(perms) == 0 {
		return nil, errors.New("xenstore: set perms: empty permission list")
	}
	b := append([]byte(path), 0)
	for _, p := range perms {
		if strings.IndexByte("nrwb", p.Access) < 0 || p.Access == 0 {
			return nil, fmt.Errorf("xenstore: set perms %s: access %q is not one of n, r, w, b", path, p.Access)
		}
		b = append(append(b, p.String()...), 0)
	}
	return b, nil
}

// ParseUint parses a decimal number as xenstore keys hold them, strictly:
// digits only (no sign, space or base prefix), no leading zero except "0"
// itself, at most max.
func ParseUint(s string, max uint64) (uint64, error) {
	if s == "" || len(s) > 20 || strings.Trim(s, "0123456789") != "" {
		return 0, fmt.Errorf("%q is not a decimal number", s)
	}
	if len(s) > 1 && s[0] == '0' {
		return 0, fmt.Errorf("%q has a leading zero", s)
	}
	var v uint64
	for _, c := range []byte(s) {
		d := uint64(c - '0')
		if d > max || v > (max-d)/10 {
			return 0, fmt.Errorf("%s exceeds %d", s, max)
		}
		v = v*10 + d
	}
	return v, nil
}
