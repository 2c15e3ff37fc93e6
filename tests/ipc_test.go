package tests

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/ipc"
	"golang.org/x/sys/unix"
)

// helloBytes encodes a Hello (docs/protocol.md §4.1).
func helloBytes(version uint16, transport uint32, ramSize uint64, name, mode string, nExtra byte) []byte {
	b := make([]byte, 128)
	binary.LittleEndian.PutUint32(b, 0x4D565047)
	binary.LittleEndian.PutUint16(b[4:], 1)
	binary.LittleEndian.PutUint16(b[6:], version)
	binary.LittleEndian.PutUint32(b[8:], 42)
	binary.LittleEndian.PutUint32(b[12:], transport)
	binary.LittleEndian.PutUint64(b[16:], ramSize)
	b[24], b[25], b[26] = byte(len(name)), byte(len(mode)), nExtra
	copy(b[32:], name)
	copy(b[96:], mode)
	return b
}

// rawConn is a hand-made device-model connection.
type rawConn struct {
	c   *net.UnixConn
	ram *os.File
}

func rawDial(t *testing.T, e *env) *rawConn {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: e.sock, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ram, err := ipc.CreateMemfd("raw-ram", guestRAM)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ram.Close() })
	return &rawConn{c: c, ram: ram}
}

func (rc *rawConn) send(t *testing.T, b []byte, files ...*os.File) {
	t.Helper()
	var oob []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := rc.c.WriteMsgUnix(b, oob, nil); err != nil {
		t.Fatalf("send: %v", err)
	}
}

// recv reads one message: its type, reason (Reject/Bye), fds; eof when closed.
func (rc *rawConn) recv(t *testing.T) (typ uint16, reason string, fds []int, eof bool) {
	t.Helper()
	rc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf, oob := make([]byte, 4096), make([]byte, 1024)
	n, oobn, _, _, err := rc.c.ReadMsgUnix(buf, oob)
	if err != nil || n == 0 {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("the server neither answered nor closed the connection within 10 s")
		}
		return 0, "", nil, true
	}
	if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for _, m := range msgs {
			if f, err := unix.ParseUnixRights(&m); err == nil {
				fds = append(fds, f...)
			}
		}
	}
	typ = binary.LittleEndian.Uint16(buf[4:])
	if (typ == 3 || typ == 4) && n >= 16 {
		l := int(binary.LittleEndian.Uint16(buf[8:]))
		reason = string(buf[16 : 16+min(l, n-16)])
	}
	return typ, reason, fds, false
}

// expectClosedWith checks the server answered typ (Reject 3 / Bye 4) with a
// reason and then closed the connection.
func (rc *rawConn) expectClosedWith(t *testing.T, what string, typ uint16) string {
	t.Helper()
	got, reason, fds, eof := rc.recv(t)
	for _, fd := range fds {
		unix.Close(fd)
	}
	if eof {
		t.Errorf("%s: the server closed without a Reject/Bye", what)
		return ""
	}
	if got != typ || reason == "" {
		t.Errorf("%s: got message type %d reason %q, want type %d with a reason", what, got, reason, typ)
	}
	if _, _, _, eof := rc.recv(t); !eof {
		t.Errorf("%s: the connection stayed open after the refusal", what)
	}
	return reason
}

// TestMalformedIPC: garbage, truncated, oversized and inconsistent hellos,
// and hostile traffic after the handshake (shm ring indices, garbage ring
// entries, truncated and oversized socket frames) end only that connection;
// its vGPU (if any) is torn down; the honest VM is unaffected and the
// aggregator keeps accepting VMs.
func TestMalformedIPC(t *testing.T) {
	e := newEnv(t)
	honest, _ := e.startHonest(t)
	valid := func() []byte { return helloBytes(1, 1, guestRAM, "evil", "fv-naive", 0) }
	garbage := pattern(0x99, 128)
	oversized := append(valid(), make([]byte, 64<<10)...)
	wrongVersion := helloBytes(7, 1, guestRAM, "evil", "fv-naive", 0)
	badReserved := valid()
	badReserved[30] = 1
	tooBig := helloBytes(1, 1, 2*guestRAM, "evil", "fv-naive", 0)
	extraMissing := helloBytes(1, 1, guestRAM, "evil", "fv-naive", 3)
	badName := helloBytes(1, 1, guestRAM, "ev/il\x01", "fv-naive", 0)
	unsealed, err := os.CreateTemp("", "not-a-memfd")
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(unsealed.Name())
	unsealed.Truncate(guestRAM)
	cases := []struct {
		name  string
		msg   []byte
		files func(rc *rawConn) []*os.File
	}{
		{"garbage hello", garbage, nil},
		{"truncated hello", valid()[:40], nil},
		{"oversized packet", oversized, nil},
		{"wrong version", wrongVersion, nil},
		{"non-zero reserved byte", badReserved, nil},
		{"RAM size beyond the memfd", tooBig, nil},
		{"fewer fds than announced", extraMissing, nil},
		{"bad name", badName, nil},
		{"no fd", valid(), func(*rawConn) []*os.File { return nil }},
		{"RAM not a memfd", valid(), func(*rawConn) []*os.File { return []*os.File{unsealed} }},
	}
	for _, c := range cases {
		rc := rawDial(t, e)
		files := []*os.File{rc.ram}
		if c.files != nil {
			files = c.files(rc)
		}
		rc.send(t, c.msg, files...)
		reason := rc.expectClosedWith(t, c.name, 3)
		t.Logf("%s: refused: %s", c.name, reason)
	}
	// A client that connects and hangs up.
	rc := rawDial(t, e)
	rc.c.Close()

	// Hostile traffic after a valid handshake.
	welcome := func(transport uint32) (*rawConn, []int) {
		rc := rawDial(t, e)
		rc.send(t, helloBytes(1, transport, guestRAM, "evil", "fv-naive", 0), rc.ram)
		typ, reason, fds, eof := rc.recv(t)
		if eof || typ != 2 {
			t.Fatalf("valid hello: type %d reason %q eof %v, want a Welcome", typ, reason, eof)
		}
		e.waitAttached(t, "evil", nil)
		return rc, fds
	}
	shmCase := func(what string, evil func(ring []byte)) {
		rc, fds := welcome(1)
		if len(fds) < 1 {
			t.Fatalf("shm Welcome without a ring fd")
		}
		var st unix.Stat_t
		unix.Fstat(fds[0], &st)
		ring, err := unix.Mmap(fds[0], 0, int(st.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		for _, fd := range fds {
			unix.Close(fd)
		}
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Munmap(ring)
		evil(ring)
		// Wake the server (it also re-checks every 250 ms).
		unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(&ring[0x140])), 1, 1<<30, 0, 0, 0)
		reason := rc.expectClosedWith(t, what, 4)
		t.Logf("%s: Bye: %s", what, reason)
		e.waitDetached(t, "evil", 10*time.Second)
	}
	shmCase("ring producer index far ahead", func(ring []byte) {
		n := binary.LittleEndian.Uint32(ring[0x10:])
		atomic.StoreUint32((*uint32)(unsafe.Pointer(&ring[0x40])), n+5)
	})
	shmCase("garbage ring entry", func(ring []byte) {
		copy(ring[0x1000:0x1040], pattern(0x31, 64))
		atomic.StoreUint32((*uint32)(unsafe.Pointer(&ring[0x40])), 1)
	})
	shmCase("ring entry with BAR 2", func(ring []byte) {
		ent := make([]byte, 64)
		binary.LittleEndian.PutUint16(ent, 1)
		binary.LittleEndian.PutUint16(ent[2:], 2)
		copy(ring[0x1000:], ent)
		atomic.StoreUint32((*uint32)(unsafe.Pointer(&ring[0x40])), 1)
	})
	for _, c := range []struct {
		what  string
		frame []byte
	}{
		{"truncated socket frame", make([]byte, 10)},
		{"oversized socket frame", make([]byte, 4096)},
		{"socket frame with an unknown kind", append([]byte{0x77, 0x77}, make([]byte, 62)...)},
	} {
		rc, fds := welcome(2)
		for _, fd := range fds {
			unix.Close(fd)
		}
		rc.send(t, c.frame)
		reason := rc.expectClosedWith(t, c.what, 4)
		t.Logf("%s: Bye: %s", c.what, reason)
		e.waitDetached(t, "evil", 10*time.Second)
	}
	// Still accepting, with every slot but the honest VM's free again.
	for i := range maxVMs - 1 {
		d := e.connect(t, fmt.Sprintf("after%d", i), uint32(30+i), "fv-naive")
		if v := d.Read32(nvc0.BAR0, nvc0.RegBoot0); v != nvc0.Boot0Value {
			t.Errorf("a VM attached after the hostile clients reads BOOT0 %#x", v)
		}
	}
	honest.verified(t)
}

// allZero reports whether VRAM [base, base+size) reads all zero (host-side),
// and the first non-zero address otherwise.
