package pvdrm

// This file is the xenstore wire protocol (Xen's io/xs_wire.h): every
// message is a 16-byte header (u32 type, u32 req_id, u32 tx_id, u32 len,
// little-endian as on every machine Xen runs on) and len bytes of payload,
// mostly NUL-terminated strings. The peer is not trusted: a length above
// XenstorePayloadMax or an unknown type is a protocol error that ends the
// connection, since its framing can no longer be believed.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Xenstore protocol limits (io/xs_wire.h).
const (
	// XenstorePayloadMax bounds the payload of any one message.
	XenstorePayloadMax = 4096
	// XenstoreAbsPathMax bounds an absolute path.
	XenstoreAbsPathMax = 3072
	// XenstoreRelPathMax bounds a relative path.
	XenstoreRelPathMax = 2048

	// struct xsd_sockmsg: the header, its fields at these offsets.
	xsHeaderSize = 16
	xsOffType    = 0
	xsOffReqID   = 4
	xsOffTxID    = 8
	xsOffLen     = 12
)

// xsType is a message type, enum xsd_sockmsg_type.
type xsType uint32

// Message types. Number 20 was XS_RESTRICT, since removed.
const (
	xsControl            xsType = 0
	xsDirectory          xsType = 1
	xsRead               xsType = 2
	xsGetPerms           xsType = 3
	xsWatch              xsType = 4
	xsUnwatch            xsType = 5
	xsTransactionStart   xsType = 6
	xsTransactionEnd     xsType = 7
	xsIntroduce          xsType = 8
	xsRelease            xsType = 9
	xsGetDomainPath      xsType = 10
	xsWrite              xsType = 11
	xsMkdir              xsType = 12
	xsRm                 xsType = 13
	xsSetPerms           xsType = 14
	xsWatchEvent         xsType = 15
	xsError              xsType = 16
	xsIsDomainIntroduced xsType = 17
	xsResume             xsType = 18
	xsSetTarget          xsType = 19
	xsResetWatches       xsType = 21
	xsDirectoryPart      xsType = 22
	xsTypeCount          xsType = 23
	xsInvalid            xsType = 0xffff
)

// xsRemovedRestrict is XS_RESTRICT's old number, no longer valid.
const xsRemovedRestrict xsType = 20

// valid reports whether t is a message type of the current protocol.
func (t xsType) valid() bool { return t < xsTypeCount && t != xsRemovedRestrict }

// String returns the type's name, e.g. XS_READ.
func (t xsType) String() string {
	names := [...]string{"CONTROL", "DIRECTORY", "READ", "GET_PERMS", "WATCH", "UNWATCH",
		"TRANSACTION_START", "TRANSACTION_END", "INTRODUCE", "RELEASE", "GET_DOMAIN_PATH",
		"WRITE", "MKDIR", "RM", "SET_PERMS", "WATCH_EVENT", "ERROR", "IS_DOMAIN_INTRODUCED",
		"RESUME", "SET_TARGET", "", "RESET_WATCHES", "DIRECTORY_PART"}
	if t.valid() {
		return "XS_" + names[t]
	}
	return fmt.Sprintf("xenstore type %d", uint32(t))
}

// ErrXenstoreProtocol is wrapped by every error caused by a malformed
// message from the xenstore peer.
var ErrXenstoreProtocol = errors.New("xenstore protocol error")

// xsMsg is one message: struct xsd_sockmsg and its payload.
type xsMsg struct {
	Type    xsType
	ReqID   uint32
	TxID    uint32
	Payload []byte
}

// marshal encodes m, refusing a payload over XenstorePayloadMax.
func (m xsMsg) marshal() ([]byte, error) {
	if len(m.Payload) > XenstorePayloadMax {
		return nil, fmt.Errorf("xenstore %v: payload of %d bytes exceeds %d", m.Type, len(m.Payload), XenstorePayloadMax)
	}
	b := make([]byte, xsHeaderSize+len(m.Payload))
	binary.LittleEndian.PutUint32(b[xsOffType:], uint32(m.Type))
	binary.LittleEndian.PutUint32(b[xsOffReqID:], m.ReqID)
	binary.LittleEndian.PutUint32(b[xsOffTxID:], m.TxID)
	binary.LittleEndian.PutUint32(b[xsOffLen:], uint32(len(m.Payload)))
	copy(b[xsHeaderSize:], m.Payload)
	return b, nil
}

// readXsMsg reads one message. It returns io.EOF only for a clean end
// before a header; a length over XenstorePayloadMax or an invalid type
// fails with ErrXenstoreProtocol before any payload is read, and a short
// payload with io.ErrUnexpectedEOF.
func readXsMsg(r io.Reader) (xsMsg, error) {
	var hdr [xsHeaderSize]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		if errors.Is(err, io.EOF) {
			return xsMsg{}, io.EOF
		}
		return xsMsg{}, fmt.Errorf("xenstore: read header: %w", err)
	}
	m := xsMsg{
		Type:  xsType(binary.LittleEndian.Uint32(hdr[xsOffType:])),
		ReqID: binary.LittleEndian.Uint32(hdr[xsOffReqID:]),
		TxID:  binary.LittleEndian.Uint32(hdr[xsOffTxID:]),
	}
	n := binary.LittleEndian.Uint32(hdr[xsOffLen:])
	if n > XenstorePayloadMax {
		return xsMsg{}, fmt.Errorf("%w: %v payload length %d exceeds %d", ErrXenstoreProtocol, m.Type, n, XenstorePayloadMax)
	}
	if !m.Type.valid() {
		return xsMsg{}, fmt.Errorf("%w: unknown message type %d", ErrXenstoreProtocol, uint32(m.Type))
	}
	m.Payload = make([]byte, n)
	if _, err := io.ReadFull(r, m.Payload); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return xsMsg{}, fmt.Errorf("xenstore: read %v payload of %d bytes: %w", m.Type, n, err)
	}
	return m, nil
}

// xsStrings splits a payload of NUL-terminated strings. Every string must
// be terminated; an empty payload is no strings.
func xsStrings(p []byte) ([]string, error) {
	if len(p) == 0 {
		return nil, nil
	}
	if p[len(p)-1] != 0 {
		return nil, fmt.Errorf("%w: unterminated string list", ErrXenstoreProtocol)
	}
	return strings.Split(string(p[:len(p)-1]), "\x00"), nil
}

// xsOneString returns the single NUL-terminated string of a payload (a
// final NUL is optional: some servers omit it).
func xsOneString(p []byte) (string, error) {
	s := string(p)
	s = strings.TrimSuffix(s, "\x00")
	if strings.IndexByte(s, 0) >= 0 {
		return "", fmt.Errorf("%w: %d strings where one was expected", ErrXenstoreProtocol, strings.Count(s, "\x00")+1)
	}
	return s, nil
}

// parseWatchEvent decodes an XS_WATCH_EVENT payload: path and token.
func parseWatchEvent(p []byte) (path, token string, err error) {
	f, err := xsStrings(p)
	if err != nil {
		return "", "", err
	}
	if len(f) != 2 {
		return "", "", fmt.Errorf("%w: watch event with %d fields, want path and token", ErrXenstoreProtocol, len(f))
	}
	return f[0], f[1], nil
}

// XenstoreError is an XS_ERROR reply: the daemon refused a request.
// errors.Is matches its errno (unix.ENOENT, fs.ErrNotExist, unix.EAGAIN…).
type XenstoreError struct {
	Op    string // the request, e.g. "XS_READ"
	Path  string // the path it named, if any
	Errno string // the daemon's error name, e.g. "ENOENT"
}

// Error describes the refused request.
func (e *XenstoreError) Error() string {
	if e.Path == "" {
		return fmt.Sprintf("xenstore %s: %s", e.Op, e.Errno)
	}
	return fmt.Sprintf("xenstore %s %s: %s", e.Op, e.Path, e.Errno)
}

// Unwrap returns the errno the name stands for, or nil if it is not one
// io/xs_wire.h lists.
func (e *XenstoreError) Unwrap() error {
	if n := xsErrno(e.Errno); n != 0 {
		return n
	}
	return nil
}

// xsErrno maps the error names of io/xs_wire.h's xsd_errors to errnos.
func xsErrno(name string) syscall.Errno {
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

// parseXsError decodes an XS_ERROR payload: one short upper-case name.
func parseXsError(p []byte) (string, error) {
	s, err := xsOneString(p)
	if err != nil {
		return "", err
	}
	if s == "" || len(s) > 32 {
		return "", fmt.Errorf("%w: error reply of %d bytes", ErrXenstoreProtocol, len(s))
	}
	for _, c := range []byte(s) {
		if (c < 'A' || c > 'Z') && (c < '0' || c > '9') {
			return "", fmt.Errorf("%w: error reply %q is not an errno name", ErrXenstoreProtocol, s)
		}
	}
	return s, nil
}

// checkXsPath refuses a path xenstored would refuse, before it is sent:
// empty, too long, with characters outside [A-Za-z0-9/_@-], an empty
// component, or a trailing slash. Relative paths are allowed.
func checkXsPath(p string) error {
	limit := XenstoreRelPathMax
	if strings.HasPrefix(p, "/") {
		limit = XenstoreAbsPathMax
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

// XenstorePerm is one entry of a node's permission list (XS_SET_PERMS).
// The first entry names the owner, and its access is what every domain not
// listed gets.
type XenstorePerm struct {
	Domid  uint16
	Access byte // 'n' none, 'r' read, 'w' write, 'b' both
}

// String returns the entry as XS_SET_PERMS sends it, e.g. "r5".
func (p XenstorePerm) String() string { return fmt.Sprintf("%c%d", p.Access, p.Domid) }

// setPermsPayload encodes path and perms for XS_SET_PERMS.
func setPermsPayload(path string, perms []XenstorePerm) ([]byte, error) {
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

// parseXsUint parses a decimal number as xenstore keys hold them, strictly:
// digits only (no sign, space or base prefix), no leading zero except "0"
// itself, at most max.
func parseXsUint(s string, max uint64) (uint64, error) {
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
