package xenstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/internal/cprobe"
	"golang.org/x/sys/unix"
)

// TestWireABI checks the wire constants against Xen's io/xs_wire.h
// (Debian's libxen-dev), compiled by gcc.
func TestWireABI(t *testing.T) {
	c := cprobe.Run(t, "libxen-dev", []string{"xen/io/xs_wire.h"}, "#include <errno.h>\n", `
	SZ(xsd_sockmsg);
	FIELD(xsd_sockmsg, type); FIELD(xsd_sockmsg, req_id); FIELD(xsd_sockmsg, tx_id); FIELD(xsd_sockmsg, len);
	P("XS_CONTROL", XS_CONTROL); P("XS_DIRECTORY", XS_DIRECTORY); P("XS_READ", XS_READ);
	P("XS_GET_PERMS", XS_GET_PERMS); P("XS_WATCH", XS_WATCH); P("XS_UNWATCH", XS_UNWATCH);
	P("XS_TRANSACTION_START", XS_TRANSACTION_START); P("XS_TRANSACTION_END", XS_TRANSACTION_END);
	P("XS_INTRODUCE", XS_INTRODUCE); P("XS_RELEASE", XS_RELEASE); P("XS_GET_DOMAIN_PATH", XS_GET_DOMAIN_PATH);
	P("XS_WRITE", XS_WRITE); P("XS_MKDIR", XS_MKDIR); P("XS_RM", XS_RM); P("XS_SET_PERMS", XS_SET_PERMS);
	P("XS_WATCH_EVENT", XS_WATCH_EVENT); P("XS_ERROR", XS_ERROR);
	P("XS_IS_DOMAIN_INTRODUCED", XS_IS_DOMAIN_INTRODUCED); P("XS_RESUME", XS_RESUME);
	P("XS_SET_TARGET", XS_SET_TARGET); P("XS_RESET_WATCHES", XS_RESET_WATCHES);
	P("XS_DIRECTORY_PART", XS_DIRECTORY_PART); P("XS_TYPE_COUNT", XS_TYPE_COUNT); P("XS_INVALID", XS_INVALID);
	P("XENSTORE_PAYLOAD_MAX", XENSTORE_PAYLOAD_MAX);
	P("XENSTORE_ABS_PATH_MAX", XENSTORE_ABS_PATH_MAX); P("XENSTORE_REL_PATH_MAX", XENSTORE_REL_PATH_MAX);
	for (unsigned i = 0; i < sizeof(xsd_errors) / sizeof(xsd_errors[0]); i++) {
		char name[64];
		snprintf(name, sizeof(name), "xsd_errors %s", xsd_errors[i].errstring);
		P(name, xsd_errors[i].errnum);
	}`)

	g := map[string]int64{
		"sizeof xsd_sockmsg": headerSize,
		"XS_CONTROL":         int64(MsgControl), "XS_DIRECTORY": int64(MsgDirectory), "XS_READ": int64(MsgRead),
		"XS_GET_PERMS": int64(MsgGetPerms), "XS_WATCH": int64(MsgWatch), "XS_UNWATCH": int64(MsgUnwatch),
		"XS_TRANSACTION_START": int64(MsgTransactionStart), "XS_TRANSACTION_END": int64(MsgTransactionEnd),
		"XS_INTRODUCE": int64(MsgIntroduce), "XS_RELEASE": int64(MsgRelease), "XS_GET_DOMAIN_PATH": int64(MsgGetDomainPath),
		"XS_WRITE": int64(MsgWrite), "XS_MKDIR": int64(MsgMkdir), "XS_RM": int64(MsgRm), "XS_SET_PERMS": int64(MsgSetPerms),
		"XS_WATCH_EVENT": int64(MsgWatchEvent), "XS_ERROR": int64(MsgError),
		"XS_IS_DOMAIN_INTRODUCED": int64(MsgIsDomainIntroduced), "XS_RESUME": int64(MsgResume),
		"XS_SET_TARGET": int64(MsgSetTarget), "XS_RESET_WATCHES": int64(MsgResetWatches),
		"XS_DIRECTORY_PART": int64(MsgDirectoryPart), "XS_TYPE_COUNT": int64(msgTypeCount), "XS_INVALID": int64(msgInvalid),
		"XENSTORE_PAYLOAD_MAX":  PayloadMax,
		"XENSTORE_ABS_PATH_MAX": AbsPathMax, "XENSTORE_REL_PATH_MAX": RelPathMax,
	}
	for _, f := range []struct {
		name string
		off  int64
	}{{"type", offType}, {"req_id", offReqID}, {"tx_id", offTxID}, {"len", offLen}} {
		g["sizeof xsd_sockmsg."+f.name], g["offsetof xsd_sockmsg."+f.name] = 4, f.off
	}
	// The error names io/xs_wire.h's xsd_errors lists.
	for _, n := range []string{"EINVAL", "EACCES", "EEXIST", "EISDIR", "ENOENT", "ENOMEM", "ENOSPC",
		"EIO", "ENOTEMPTY", "ENOSYS", "EROFS", "EBUSY", "EAGAIN", "EISCONN", "E2BIG", "EPERM"} {
		g["xsd_errors "+n] = int64(errnoOf(n))
	}
	cprobe.Compare(t, c, g)
	if msgRemovedRestrict != MsgSetTarget+1 || msgRemovedRestrict.valid() {
		t.Error("XS_RESTRICT's number must be the one after XS_SET_TARGET, and invalid")
	}
}

func TestMsgRoundTrip(t *testing.T) {
	for _, m := range []Msg{
		{Type: MsgRead, ReqID: 1, Payload: []byte("/local/domain/0\x00")},
		{Type: MsgWrite, ReqID: 0xffffffff, TxID: 7, Payload: []byte("a\x00b")},
		{Type: MsgWatchEvent, Payload: []byte{}},
		{Type: MsgDirectoryPart, ReqID: 3, Payload: bytes.Repeat([]byte{'x'}, PayloadMax)},
	} {
		b, err := m.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if binary.LittleEndian.Uint32(b[offLen:]) != uint32(len(m.Payload)) || len(b) != headerSize+len(m.Payload) {
			t.Fatalf("%v: encoded %d bytes", m.Type, len(b))
		}
		got, err := ReadMsg(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		if got.Type != m.Type || got.ReqID != m.ReqID || got.TxID != m.TxID || !bytes.Equal(got.Payload, m.Payload) {
			t.Fatalf("round trip of %+v gave %+v", m, got)
		}
	}
	if _, err := (Msg{Type: MsgWrite, Payload: make([]byte, PayloadMax+1)}).Marshal(); err == nil {
		t.Fatal("marshalled an oversized payload")
	}
}

// rawHeader builds a header with any length field.
func rawHeader(typ MsgType, id, tx, n uint32) []byte {
	b := make([]byte, headerSize)
	binary.LittleEndian.PutUint32(b[offType:], uint32(typ))
	binary.LittleEndian.PutUint32(b[offReqID:], id)
	binary.LittleEndian.PutUint32(b[offTxID:], tx)
	binary.LittleEndian.PutUint32(b[offLen:], n)
	return b
}

func TestPayloadParsers(t *testing.T) {
	if s, err := splitStrings([]byte("a\x00bc\x00\x00")); err != nil || len(s) != 3 || s[1] != "bc" || s[2] != "" {
		t.Fatalf("splitStrings: %q %v", s, err)
	}
	if _, err := splitStrings([]byte("a\x00b")); !errors.Is(err, ErrProtocol) {
		t.Fatal("unterminated list accepted")
	}
	if p, tok, err := parseWatchEvent([]byte("/a/b\x00tok\x00")); err != nil || p != "/a/b" || tok != "tok" {
		t.Fatalf("watch event: %q %q %v", p, tok, err)
	}
	for _, bad := range []string{"", "/a\x00", "/a\x00t\x00x\x00", "/a\x00t"} {
		if _, _, err := parseWatchEvent([]byte(bad)); err == nil {
			t.Errorf("watch event %q accepted", bad)
		}
	}
	if n, err := parseError([]byte("ENOENT\x00")); err != nil || n != "ENOENT" {
		t.Fatalf("error: %q %v", n, err)
	}
	for _, bad := range []string{"", "\x00", "enoent\x00", "E NOENT\x00", "ENOENT\x00X\x00", strings.Repeat("E", 33)} {
		if _, err := parseError([]byte(bad)); !errors.Is(err, ErrProtocol) {
			t.Errorf("error reply %q accepted", bad)
		}
	}
	err := &Error{Op: "XS_READ", Path: "/x", Errno: "ENOENT"}
	if !errors.Is(err, fs.ErrNotExist) || !errors.Is(err, unix.ENOENT) || (&Error{Errno: "EWHAT"}).Unwrap() != nil {
		t.Fatal("Error does not unwrap to its errno")
	}
	for s, want := range map[string]int64{"0": 0, "7": 7, "65535": 65535, "4294967295": 4294967295} {
		if v, err := ParseUint(s, 1<<32-1); err != nil || int64(v) != want {
			t.Errorf("ParseUint(%q) = %d, %v", s, v, err)
		}
	}
	for _, bad := range []string{"", "-1", "+1", " 1", "1 ", "01", "0x10", "1e3", "4294967296", "99999999999999999999999", "１"} {
		if v, err := ParseUint(bad, 1<<32-1); err == nil {
			t.Errorf("ParseUint(%q) accepted: %d", bad, v)
		}
	}
	if _, err := ParseUint("7", 5); err == nil {
		t.Error("a single digit over the maximum accepted")
	}
	for _, good := range []string{"/", "/local/domain/0", "domid", "@releaseDomain", "device/pvdrm/0/ring-ref", "a_b-c"} {
		if err := checkPath(good); err != nil {
			t.Errorf("path %q refused: %v", good, err)
		}
	}
	for _, bad := range []string{"", "/a//b", "/a/", "/a b", "/a\x00b", "/é", "/" + strings.Repeat("a", AbsPathMax), strings.Repeat("a", RelPathMax+1)} {
		if err := checkPath(bad); err == nil {
			t.Errorf("path %q accepted", bad)
		}
	}
	if b, err := setPermsPayload("/p", []Perm{{5, 'n'}, {0, 'r'}}); err != nil || string(b) != "/p\x00n5\x00r0\x00" {
		t.Fatalf("perms payload %q %v", b, err)
	}
	if _, err := setPermsPayload("/p", []Perm{{5, 'x'}}); err == nil {
		t.Fatal("bad access letter accepted")
	}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}
