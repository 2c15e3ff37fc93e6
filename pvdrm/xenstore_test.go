package pvdrm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io/fs"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestXenstoreWireABI checks the wire constants and the xenbus numbers
// against Xen's public headers (Debian's libxen-dev), compiled by gcc.
func TestXenstoreWireABI(t *testing.T) {
	c := cProbe(t, "libxen-dev", []string{"xen/io/xs_wire.h", "xen/io/xenbus.h", "xen/xen.h", "xen/grant_table.h", "xen/event_channel.h"},
		"#include <errno.h>\n", `
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
	}
	P("XenbusStateUnknown", XenbusStateUnknown); P("XenbusStateInitialising", XenbusStateInitialising);
	P("XenbusStateInitWait", XenbusStateInitWait); P("XenbusStateInitialised", XenbusStateInitialised);
	P("XenbusStateConnected", XenbusStateConnected); P("XenbusStateClosing", XenbusStateClosing);
	P("XenbusStateClosed", XenbusStateClosed); P("XenbusStateReconfiguring", XenbusStateReconfiguring);
	P("XenbusStateReconfigured", XenbusStateReconfigured);
	P("DOMID_FIRST_RESERVED", DOMID_FIRST_RESERVED);
	P("GNTTAB_NR_RESERVED_ENTRIES", GNTTAB_NR_RESERVED_ENTRIES);
	P("EVTCHN_FIFO_NR_CHANNELS - 1", EVTCHN_FIFO_NR_CHANNELS - 1);`)

	g := map[string]int64{
		"sizeof xsd_sockmsg": xsHeaderSize,
		"XS_CONTROL":         int64(xsControl), "XS_DIRECTORY": int64(xsDirectory), "XS_READ": int64(xsRead),
		"XS_GET_PERMS": int64(xsGetPerms), "XS_WATCH": int64(xsWatch), "XS_UNWATCH": int64(xsUnwatch),
		"XS_TRANSACTION_START": int64(xsTransactionStart), "XS_TRANSACTION_END": int64(xsTransactionEnd),
		"XS_INTRODUCE": int64(xsIntroduce), "XS_RELEASE": int64(xsRelease), "XS_GET_DOMAIN_PATH": int64(xsGetDomainPath),
		"XS_WRITE": int64(xsWrite), "XS_MKDIR": int64(xsMkdir), "XS_RM": int64(xsRm), "XS_SET_PERMS": int64(xsSetPerms),
		"XS_WATCH_EVENT": int64(xsWatchEvent), "XS_ERROR": int64(xsError),
		"XS_IS_DOMAIN_INTRODUCED": int64(xsIsDomainIntroduced), "XS_RESUME": int64(xsResume),
		"XS_SET_TARGET": int64(xsSetTarget), "XS_RESET_WATCHES": int64(xsResetWatches),
		"XS_DIRECTORY_PART": int64(xsDirectoryPart), "XS_TYPE_COUNT": int64(xsTypeCount), "XS_INVALID": int64(xsInvalid),
		"XENSTORE_PAYLOAD_MAX":  XenstorePayloadMax,
		"XENSTORE_ABS_PATH_MAX": XenstoreAbsPathMax, "XENSTORE_REL_PATH_MAX": XenstoreRelPathMax,
		"XenbusStateUnknown": int64(XenbusStateUnknown), "XenbusStateInitialising": int64(XenbusStateInitialising),
		"XenbusStateInitWait": int64(XenbusStateInitWait), "XenbusStateInitialised": int64(XenbusStateInitialised),
		"XenbusStateConnected": int64(XenbusStateConnected), "XenbusStateClosing": int64(XenbusStateClosing),
		"XenbusStateClosed": int64(XenbusStateClosed), "XenbusStateReconfiguring": int64(XenbusStateReconfiguring),
		"XenbusStateReconfigured":     int64(XenbusStateReconfigured),
		"DOMID_FIRST_RESERVED":        DomidFirstReserved,
		"GNTTAB_NR_RESERVED_ENTRIES":  GrantRefFirst,
		"EVTCHN_FIFO_NR_CHANNELS - 1": EvtchnPortMax,
	}
	for _, f := range []struct {
		name string
		off  int64
	}{{"type", xsOffType}, {"req_id", xsOffReqID}, {"tx_id", xsOffTxID}, {"len", xsOffLen}} {
		g["sizeof xsd_sockmsg."+f.name], g["offsetof xsd_sockmsg."+f.name] = 4, f.off
	}
	// The error names io/xs_wire.h's xsd_errors lists.
	for _, n := range []string{"EINVAL", "EACCES", "EEXIST", "EISDIR", "ENOENT", "ENOMEM", "ENOSPC",
		"EIO", "ENOTEMPTY", "ENOSYS", "EROFS", "EBUSY", "EAGAIN", "EISCONN", "E2BIG", "EPERM"} {
		g["xsd_errors "+n] = int64(xsErrno(n))
	}
	compareProbe(t, c, g)
	if xsRemovedRestrict != xsSetTarget+1 || xsRemovedRestrict.valid() {
		t.Error("XS_RESTRICT's number must be the one after XS_SET_TARGET, and invalid")
	}
}

func TestXsMsgRoundTrip(t *testing.T) {
	for _, m := range []xsMsg{
		{Type: xsRead, ReqID: 1, Payload: []byte("/local/domain/0\x00")},
		{Type: xsWrite, ReqID: 0xffffffff, TxID: 7, Payload: []byte("a\x00b")},
		{Type: xsWatchEvent, Payload: []byte{}},
		{Type: xsDirectoryPart, ReqID: 3, Payload: bytes.Repeat([]byte{'x'}, XenstorePayloadMax)},
	} {
		b, err := m.marshal()
		if err != nil {
			t.Fatal(err)
		}
		if binary.LittleEndian.Uint32(b[xsOffLen:]) != uint32(len(m.Payload)) || len(b) != xsHeaderSize+len(m.Payload) {
			t.Fatalf("%v: encoded %d bytes", m.Type, len(b))
		}
		got, err := readXsMsg(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		if got.Type != m.Type || got.ReqID != m.ReqID || got.TxID != m.TxID || !bytes.Equal(got.Payload, m.Payload) {
			t.Fatalf("round trip of %+v gave %+v", m, got)
		}
	}
	if _, err := (xsMsg{Type: xsWrite, Payload: make([]byte, XenstorePayloadMax+1)}).marshal(); err == nil {
		t.Fatal("marshalled an oversized payload")
	}
}

// rawXsHeader builds a header with any length field.
func rawXsHeader(typ xsType, id, tx, n uint32) []byte {
	b := make([]byte, xsHeaderSize)
	binary.LittleEndian.PutUint32(b[xsOffType:], uint32(typ))
	binary.LittleEndian.PutUint32(b[xsOffReqID:], id)
	binary.LittleEndian.PutUint32(b[xsOffTxID:], tx)
	binary.LittleEndian.PutUint32(b[xsOffLen:], n)
	return b
}

func TestXsPayloadParsers(t *testing.T) {
	if s, err := xsStrings([]byte("a\x00bc\x00\x00")); err != nil || len(s) != 3 || s[1] != "bc" || s[2] != "" {
		t.Fatalf("xsStrings: %q %v", s, err)
	}
	if _, err := xsStrings([]byte("a\x00b")); !errors.Is(err, ErrXenstoreProtocol) {
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
	if n, err := parseXsError([]byte("ENOENT\x00")); err != nil || n != "ENOENT" {
		t.Fatalf("error: %q %v", n, err)
	}
	for _, bad := range []string{"", "\x00", "enoent\x00", "E NOENT\x00", "ENOENT\x00X\x00", strings.Repeat("E", 33)} {
		if _, err := parseXsError([]byte(bad)); !errors.Is(err, ErrXenstoreProtocol) {
			t.Errorf("error reply %q accepted", bad)
		}
	}
	err := &XenstoreError{Op: "XS_READ", Path: "/x", Errno: "ENOENT"}
	if !errors.Is(err, fs.ErrNotExist) || !errors.Is(err, unix.ENOENT) || (&XenstoreError{Errno: "EWHAT"}).Unwrap() != nil {
		t.Fatal("XenstoreError does not unwrap to its errno")
	}
	for s, want := range map[string]int64{"0": 0, "7": 7, "65535": 65535, "4294967295": 4294967295} {
		if v, err := parseXsUint(s, 1<<32-1); err != nil || int64(v) != want {
			t.Errorf("parseXsUint(%q) = %d, %v", s, v, err)
		}
	}
	for _, bad := range []string{"", "-1", "+1", " 1", "1 ", "01", "0x10", "1e3", "4294967296", "99999999999999999999999", "１"} {
		if v, err := parseXsUint(bad, 1<<32-1); err == nil {
			t.Errorf("parseXsUint(%q) accepted: %d", bad, v)
		}
	}
	if _, err := parseXsUint("7", 5); err == nil {
		t.Error("a single digit over the maximum accepted")
	}
	for _, good := range []string{"/", "/local/domain/0", "domid", "@releaseDomain", "device/pvdrm/0/ring-ref", "a_b-c"} {
		if err := checkXsPath(good); err != nil {
			t.Errorf("path %q refused: %v", good, err)
		}
	}
	for _, bad := range []string{"", "/a//b", "/a/", "/a b", "/a\x00b", "/é", "/" + strings.Repeat("a", XenstoreAbsPathMax), strings.Repeat("a", XenstoreRelPathMax+1)} {
		if err := checkXsPath(bad); err == nil {
			t.Errorf("path %q accepted", bad)
		}
	}
	if b, err := setPermsPayload("/p", []XenstorePerm{{5, 'n'}, {0, 'r'}}); err != nil || string(b) != "/p\x00n5\x00r0\x00" {
		t.Fatalf("perms payload %q %v", b, err)
	}
	if _, err := setPermsPayload("/p", []XenstorePerm{{5, 'x'}}); err == nil {
		t.Fatal("bad access letter accepted")
	}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestXenstoreClient(t *testing.T) {
	ctx := testCtx(t)
	s := newTestXenstored()
	xs := s.connect(t, 5)
	if err := xs.Write(ctx, "/local/domain/5/a/b", "v1"); err != nil {
		t.Fatal(err)
	}
	if v, err := xs.Read(ctx, "a/b"); err != nil || v != "v1" { // relative to the domain's home
		t.Fatalf("read: %q %v", v, err)
	}
	if err := xs.Mkdir(ctx, "/local/domain/5/a/c"); err != nil {
		t.Fatal(err)
	}
	if kids, err := xs.Directory(ctx, "/local/domain/5/a"); err != nil || strings.Join(kids, ",") != "b,c" {
		t.Fatalf("directory: %q %v", kids, err)
	}
	if err := xs.SetPerms(ctx, "/local/domain/5/a", XenstorePerm{5, 'n'}, XenstorePerm{0, 'r'}); err != nil {
		t.Fatal(err)
	}
	if p, err := xs.GetDomainPath(ctx, 5); err != nil || p != "/local/domain/5" {
		t.Fatalf("domain path: %q %v", p, err)
	}
	if err := xs.Rm(ctx, "/local/domain/5/a"); err != nil {
		t.Fatal(err)
	}
	_, err := xs.Read(ctx, "/local/domain/5/a/b")
	var xe *XenstoreError
	if !errors.As(err, &xe) || xe.Errno != "ENOENT" || xe.Op != "XS_READ" || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("read of a removed node: %v", err)
	}
	if err := xs.Write(ctx, "/bad path", "x"); err == nil {
		t.Fatal("bad path sent")
	}
	if err := xs.Write(ctx, "/big", strings.Repeat("x", XenstorePayloadMax)); err == nil {
		t.Fatal("oversized write sent")
	}
	if xs.Close() != nil || xs.Err() == nil {
		t.Fatal("close")
	}
	if _, err := xs.Read(ctx, "/x"); !errors.Is(err, ErrXenstoreClosed) {
		t.Fatalf("read after close: %v", err)
	}
}

func TestXenstoreWatch(t *testing.T) {
	ctx := testCtx(t)
	s := newTestXenstored()
	xs, other := s.connect(t, 0), s.connect(t, 0)
	w, err := xs.Watch(ctx, "/dev/x")
	if err != nil {
		t.Fatal(err)
	}
	next := func() string {
		select {
		case p := <-w.Events():
			return p
		case <-ctx.Done():
			t.Fatal("no watch event")
			return ""
		}
	}
	if p := next(); p != "/dev/x" {
		t.Fatalf("initial event %q", p)
	}
	if err := other.Write(ctx, "/dev/x/state", "4"); err != nil {
		t.Fatal(err)
	}
	if p := next(); p != "/dev/x/state" {
		t.Fatalf("event %q", p)
	}
	if err := other.Write(ctx, "/dev/y", "1"); err != nil { // not watched
		t.Fatal(err)
	}
	if err := w.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if _, open := <-w.Events(); open {
		t.Fatal("an event outside the watched path, or the channel open after Stop")
	}
	if err := w.Stop(ctx); err != nil {
		t.Fatal("second stop:", err)
	}
	// A watch ends when the connection does.
	w2, err := xs.Watch(ctx, "/dev")
	if err != nil {
		t.Fatal(err)
	}
	xs.Close()
	for range w2.Events() {
	}
}

func TestXenstoreTransaction(t *testing.T) {
	ctx := testCtx(t)
	s := newTestXenstored()
	xs := s.connect(t, 0)
	s.failEnds = 2
	runs := 0
	err := xs.Transaction(ctx, func(tx XenstoreTx) error {
		runs++
		return tx.Write(ctx, "/t/a", "1")
	})
	if err != nil || runs != 3 {
		t.Fatalf("transaction: %v after %d runs", err, runs)
	}
	if v, _ := s.get("/t/a"); v != "1" {
		t.Fatal("commit not applied")
	}
	boom := errors.New("boom")
	err = xs.Transaction(ctx, func(tx XenstoreTx) error {
		if err := tx.Write(ctx, "/t/b", "1"); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if _, there := s.get("/t/b"); there {
		t.Fatal("an abandoned transaction was applied")
	}
	cctx, cancel := context.WithCancel(ctx)
	err = xs.Transaction(cctx, func(tx XenstoreTx) error {
		cancel()
		return tx.Write(ctx, "/t/c", "1")
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled transaction: %v", err)
	}
	s.mu.Lock()
	open := len(s.txs)
	s.mu.Unlock()
	if _, there := s.get("/t/c"); there || open != 0 {
		t.Fatalf("a cancelled transaction was applied, or left open (%d)", open)
	}
	s.failEnds = xsTransactionRetries
	if err := xs.Transaction(ctx, func(XenstoreTx) error { return nil }); !errors.Is(err, unix.EAGAIN) {
		t.Fatalf("endless conflicts: %v", err)
	}
}
