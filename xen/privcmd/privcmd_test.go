//go:build linux && (amd64 || arm64)

package privcmd

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/xen"
)

// fakeKernel plays privcmd's dm_op: it records each struct xen_dm_op as
// bytes and lets the test write Xen's answer into it.
type fakeKernel struct {
	ops    [][32]byte
	doms   []uint16
	answer func(op *[32]byte) error
}

func (k *fakeKernel) handle() *Handle {
	return &Handle{fd: -1, ioctl: func(req uintptr, arg unsafe.Pointer) error {
		if req != ioctlDMOp {
			return unix.ENOTTY
		}
		a := (*dmOp)(arg)
		if a.Num != 1 {
			return unix.EINVAL
		}
		buf := (*dmOpBuf)(a.Ubufs)
		if buf.Size != 32 {
			return unix.EFAULT
		}
		op := (*[32]byte)(buf.Uptr)
		k.ops = append(k.ops, *op)
		k.doms = append(k.doms, a.Dom)
		if k.answer != nil {
			return k.answer(op)
		}
		return nil
	}}
}

// TestDMOpEncoding checks each wrapper writes its arguments where Xen
// reads them (the byte offsets of dm_op.h, independent of the Go structs)
// and reads Xen's answer from where Xen writes it.
func TestDMOpEncoding(t *testing.T) {
	le := binary.LittleEndian
	k := &fakeKernel{answer: func(op *[32]byte) error {
		switch le.Uint32(op[0:]) {
		case 1: // create: id at u+4
			le.PutUint16(op[8+4:], 3)
		case 2: // info: bufioreq_port at u+4
			le.PutUint32(op[8+4:], 77)
		case 20: // nr_vcpus at u+0
			le.PutUint32(op[8:], 2)
		}
		return nil
	}}
	h := k.handle()
	id, err := h.CreateIoreqServer(5, BufIoreqOff)
	if err != nil || id != 3 {
		t.Fatalf("create: id %d, %v", id, err)
	}
	if op := k.ops[0]; le.Uint32(op[0:]) != 1 || op[8] != 0 || k.doms[0] != 5 {
		t.Fatalf("create op % x dom %d", op, k.doms[0])
	}
	port, err := h.IoreqServerInfo(5, 3)
	if err != nil || port != 77 {
		t.Fatalf("info: port %d, %v", port, err)
	}
	if op := k.ops[1]; le.Uint16(op[8:]) != 3 || le.Uint16(op[10:]) != dmopNoGFNs {
		t.Fatalf("info op % x", op)
	}
	if err := h.MapIORange(5, 3, RangeMemory, 0xe0000000, 0xe0ffffff); err != nil {
		t.Fatal(err)
	}
	if op := k.ops[2]; le.Uint32(op[0:]) != 3 || le.Uint16(op[8:]) != 3 || le.Uint32(op[12:]) != 1 ||
		le.Uint64(op[16:]) != 0xe0000000 || le.Uint64(op[24:]) != 0xe0ffffff {
		t.Fatalf("map range op % x", op)
	}
	sbdf, _ := MakeSBDF(0, 0, 5, 0)
	if err := h.UnmapPCIDev(5, 3, sbdf); err != nil {
		t.Fatal(err)
	}
	if op := k.ops[3]; le.Uint32(op[0:]) != 4 || le.Uint32(op[12:]) != 2 || le.Uint64(op[16:]) != 0x28 || le.Uint64(op[24:]) != 0x28 {
		t.Fatalf("unmap pcidev op % x", op)
	}
	if err := h.SetIoreqServerState(5, 3, true); err != nil {
		t.Fatal(err)
	}
	if op := k.ops[4]; le.Uint32(op[0:]) != 5 || le.Uint16(op[8:]) != 3 || op[10] != 1 {
		t.Fatalf("set state op % x", op)
	}
	if err := h.SetMemType(5, MemIoreqServer, 0x1234, 16); err != nil {
		t.Fatal(err)
	}
	if op := k.ops[5]; le.Uint32(op[0:]) != 12 || le.Uint32(op[8:]) != 16 || le.Uint16(op[12:]) != 4 || le.Uint64(op[16:]) != 0x1234 {
		t.Fatalf("set mem type op % x", op)
	}
	if n, err := h.NrVCPUs(5); err != nil || n != 2 {
		t.Fatalf("nr_vcpus %d, %v", n, err)
	}
	if err := h.DestroyIoreqServer(5, 3); err != nil {
		t.Fatal(err)
	}
	if op := k.ops[7]; le.Uint32(op[0:]) != 6 || le.Uint16(op[8:]) != 3 {
		t.Fatalf("destroy op % x", op)
	}
}

// TestDMOpRefusals checks what is refused before Xen is asked, and that
// Xen's errors come back wrapped with the operation and domain.
func TestDMOpRefusals(t *testing.T) {
	k := &fakeKernel{}
	h := k.handle()
	for name, err := range map[string]error{
		"reserved domain":  h.DestroyIoreqServer(xen.DomidFirstReserved, 1),
		"bufioreq mode":    func() error { _, err := h.CreateIoreqServer(1, 3); return err }(),
		"end before start": h.MapIORange(1, 0, RangeMemory, 0x2000, 0x1000),
		"port beyond 64K":  h.MapIORange(1, 0, RangePort, 0xfff0, 0x10000),
		"sbdf beyond 32":   h.MapIORange(1, 0, RangePCI, 0, 1<<32),
		"unknown type":     h.MapIORange(1, 0, 7, 0, 1),
		"zero pages":       h.SetMemType(1, MemRAMRW, 0, 0),
		"pfn beyond":       h.SetMemType(1, MemRAMRW, MaxFrame-1, 2),
		"restrict self":    h.Restrict(0x7FF0),
	} {
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if len(k.ops) != 0 {
		t.Fatalf("%d refused ops reached the kernel", len(k.ops))
	}
	k.answer = func(*[32]byte) error { return unix.ESRCH }
	err := h.SetIoreqServerState(9, 2, false)
	if !errors.Is(err, unix.ESRCH) || !strings.Contains(err.Error(), "domain 9") || !strings.Contains(err.Error(), "set_ioreq_server_state 2") {
		t.Fatalf("Xen's error: %v", err)
	}
	k.answer = func(op *[32]byte) error { binary.LittleEndian.PutUint32(op[8:], 129); return nil }
	if _, err := h.NrVCPUs(9); err == nil {
		t.Fatal("129 vCPUs accepted")
	}
}

// TestFrameErrors checks the per-frame codes of MMAPBATCH_V2 are all
// looked at and reported by frame.
func TestFrameErrors(t *testing.T) {
	gfns := []uint64{0x10, 0x11, 0x12, 0x13}
	if err := frameErrors(1, gfns, make([]int32, 4)); err != nil {
		t.Fatalf("no failures: %v", err)
	}
	err := frameErrors(1, gfns, []int32{0, -int32(unix.ENOENT), 0, 5})
	var be *BatchError
	if !errors.As(err, &be) || be.Failed != 2 || be.Frames != 4 || be.First[0].GFN != 0x11 || be.First[1].Err != unix.EINVAL {
		t.Fatalf("failures: %#v", err)
	}
	if !errors.Is(err, unix.ENOENT) || !strings.Contains(err.Error(), "gfn 0x11") {
		t.Fatalf("error %q does not say paged out", err)
	}
	many := make([]uint64, 100)
	codes := make([]int32, 100)
	for i := range codes {
		codes[i] = -int32(unix.EPERM)
	}
	if err := frameErrors(1, many, codes); !errors.As(err, &be) || be.Failed != 100 || len(be.First) != maxFrameErrors || !strings.HasSuffix(err.Error(), "…") {
		t.Fatalf("100 failures: %v", err)
	}
}

// TestMapRefusals checks the bounds of the mapping calls, which hold
// before the device is touched.
func TestMapRefusals(t *testing.T) {
	h := &Handle{fd: -1, ioctl: func(uintptr, unsafe.Pointer) error { t.Fatal("reached the kernel"); return nil }}
	if _, err := h.MapForeign(1, nil); err == nil {
		t.Fatal("empty frame list accepted")
	}
	if _, err := h.MapForeign(1, []uint64{MaxFrame}); err == nil {
		t.Fatal("frame beyond MaxFrame accepted")
	}
	if _, err := h.MapForeign(xen.DomidFirstReserved+1, []uint64{1}); err == nil {
		t.Fatal("reserved domain accepted")
	}
	if err := h.MapForeignInto(make([]byte, 100), 1, []uint64{1}); err == nil {
		t.Fatal("short destination accepted")
	}
	if _, err := h.MapResource(1, ResourceIoreqServer, 0, FrameIoreq0, 0); err == nil {
		t.Fatal("zero frames accepted")
	}
	if _, err := h.MapResource(1, ResourceIoreqServer, 0, FrameIoreq0, MaxResourceFrames+1); err == nil {
		t.Fatal("too many frames accepted")
	}
}

// TestOpenWithoutXen checks a missing device says so.
func TestOpenWithoutXen(t *testing.T) {
	_, err := Open(t.TempDir())
	if !errors.Is(err, xen.ErrNoXen) || !strings.Contains(err.Error(), "privcmd") {
		t.Fatalf("open without the device: %v", err)
	}
	var m *Mapping = &Mapping{}
	if m.Close() != nil || m.Bytes() != nil {
		t.Fatal("an empty mapping")
	}
}

// TestSBDF checks the PCI address helpers.
func TestSBDF(t *testing.T) {
	s, err := ParseSBDF("0001:02:1f.7")
	if err != nil || s.Segment() != 1 || s.Bus() != 2 || s.Device() != 0x1f || s.Function() != 7 || s.String() != "0001:02:1f.7" {
		t.Fatalf("parse: %v %v", s, err)
	}
	if s, err := ParseSBDF("00:05.0"); err != nil || s != 0x28 {
		t.Fatalf("short form: %#x %v", uint32(s), err)
	}
	for _, bad := range []string{"", "5", "00:20.0", "00:05.8", "00:05", "x:00:05.0", "1:2:3:4.0", "00:05.", "10000:00:00.0"} {
		if _, err := ParseSBDF(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if _, err := MakeSBDF(0, 0, 32, 0); err == nil {
		t.Fatal("device 32 accepted")
	}
	if RangeMemory.String() != "memory" || RangeType(9).String() != "range type 9" {
		t.Fatal("range type names")
	}
}
