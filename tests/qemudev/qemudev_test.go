// Package qemudev drives the wire side of the QEMU `gpuvm` device
// (qemu-patches/, built by scripts/qemu-build): a real qemu-system-x86_64
// with the device runs under qtest (no guest CPU: the test issues the
// guest's PCI config and BAR accesses itself), and the test plays the
// aggregator with the ipc package's server side, or with hand-written
// bytes where it must misbehave.
//
// The tests skip, naming the build command, when no built QEMU is found:
// $GPUVM_QEMU, else build/qemu/tree/build/qemu-system-x86_64.
package qemudev

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/ipc"
)

const (
	ramSize = 128 << 20
	domID   = 7
	vmName  = "qtest-guest"
	vmMode  = "fv-optimized"
	slot    = 4 // PCI device number on bus 0

	bar0Base = 0xE0000000
	bar1Base = 0xC8000000
	bar3Base = 0xD0000000
	bar5Base = 0xC000

	bar1Size = 16 << 20 // the vGPU's apertures (Welcome params)
	bar3Size = 16 << 20
)

func qemuBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("GPUVM_QEMU"); p != "" {
		return p
	}
	p, err := filepath.Abs("../../build/qemu/tree/build/qemu-system-x86_64")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Skipf("no QEMU with the gpuvm device (%s): build it with scripts/qemu-build, or set GPUVM_QEMU", p)
	}
	return p
}

// qemu is a running QEMU under qtest.
type qemu struct {
	proc   *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Reader
	stderr *syncBuffer
	done   chan error
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// biosDir holds a firmware image of zeros: under qtest no CPU runs it, but
// the PC machine insists on loading one (Debian's source has no blobs).
var biosDir = sync.OnceValue(func() string {
	dir, err := os.MkdirTemp("", "gpuvm-qemudev-bios")
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "bios-256k.bin"), make([]byte, 256<<10), 0o644)
	}
	if err != nil {
		panic(err)
	}
	return dir
})

func TestMain(m *testing.M) {
	code := m.Run()
	os.RemoveAll(biosDir())
	os.Exit(code)
}

// qemuArgs are a q35 machine under qtest with its RAM in a sealed, shared
// memfd and the gpuvm device at slot 4.
func qemuArgs(device string, memfd bool) []string {
	args := []string{"-machine", "q35", "-accel", "qtest", "-qtest", "stdio", "-L", biosDir(),
		"-display", "none", "-nodefaults", "-monitor", "none", "-serial", "none",
		"-m", fmt.Sprint(ramSize >> 20)}
	if memfd {
		args = append(args, "-object", fmt.Sprintf("memory-backend-memfd,id=mem,size=%d,share=on,seal=on", ramSize),
			"-machine", "memory-backend=mem")
	}
	return append(args, "-device", device)
}

func startQEMU(t *testing.T, args []string) *qemu {
	t.Helper()
	q := &qemu{proc: exec.Command(qemuBinary(t), args...), stderr: &syncBuffer{}, done: make(chan error, 1)}
	q.proc.Stderr = q.stderr
	var err error
	if q.in, err = q.proc.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := q.proc.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	q.out = bufio.NewReader(stdout)
	if err := q.proc.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { q.done <- q.proc.Wait() }()
	t.Cleanup(func() {
		q.in.Close()
		q.proc.Process.Signal(unix.SIGTERM) // qtest does not end at EOF
		select {
		case <-q.done:
		case <-time.After(5 * time.Second):
			q.proc.Process.Kill()
			<-q.done
		}
		if t.Failed() {
			t.Logf("QEMU's stderr:\n%s", q.stderr.String())
		}
	})
	return q
}

// cmd sends one qtest command and returns its answer's value (after "OK").
func (q *qemu) cmd(t *testing.T, format string, a ...any) uint64 {
	t.Helper()
	line := fmt.Sprintf(format, a...)
	if _, err := fmt.Fprintln(q.in, line); err != nil {
		t.Fatalf("qtest %q: %v (QEMU's stderr: %s)", line, err, q.stderr.String())
	}
	for {
		ans, err := q.out.ReadString('\n')
		if err != nil {
			t.Fatalf("qtest %q: %v (QEMU's stderr: %s)", line, err, q.stderr.String())
		}
		f := strings.Fields(ans)
		if len(f) == 0 || f[0] == "IRQ" {
			continue
		}
		if f[0] != "OK" {
			t.Fatalf("qtest %q: %q", line, ans)
		}
		if len(f) < 2 {
			return 0
		}
		v, err := strconv.ParseUint(f[1], 0, 64)
		if err != nil {
			t.Fatalf("qtest %q: %q: %v", line, ans, err)
		}
		return v
	}
}

func cfgAddr(reg int) uint32 { return 0x80000000 | slot<<11 | uint32(reg) }

func (q *qemu) cfgRead(t *testing.T, reg int) uint32 {
	t.Helper()
	q.cmd(t, "outl 0xcf8 %#x", cfgAddr(reg&^3))
	return uint32(q.cmd(t, "inl 0xcfc"))
}

func (q *qemu) cfgWrite(t *testing.T, reg int, v uint32) {
	t.Helper()
	q.cmd(t, "outl 0xcf8 %#x", cfgAddr(reg))
	q.cmd(t, "outl 0xcfc %#x", v)
}

// place programs the BARs and enables decoding.
func (q *qemu) place(t *testing.T) {
	t.Helper()
	q.cfgWrite(t, 0x10, bar0Base)
	q.cfgWrite(t, 0x14, bar1Base)
	q.cfgWrite(t, 0x18, 0)
	q.cfgWrite(t, 0x1C, bar3Base)
	q.cfgWrite(t, 0x20, 0)
	q.cfgWrite(t, 0x24, bar5Base)
	q.cfgWrite(t, 0x04, 0x7) // I/O, memory, bus master
}

func (q *qemu) readl(t *testing.T, addr uint64) uint32 {
	t.Helper()
	return uint32(q.cmd(t, "readl %#x", addr))
}

func (q *qemu) writel(t *testing.T, addr uint64, v uint32) {
	t.Helper()
	q.cmd(t, "writel %#x %#x", addr, v)
}

// aggregator is the server side: a register file per BAR that counts
// every access reaching it.
type aggregator struct {
	mu     sync.Mutex
	regs   map[[2]uint64]uint32
	reads  [6]int
	writes [6]int
	resets int
	hello  ipc.Hello
	ramOK  error
	conn   *ipc.ServerConn
	ready  chan struct{}
}

func (a *aggregator) Read32(bar int, off uint64) (uint32, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.reads[bar]++
	if bar == nvc0.BAR0 && off == 0 {
		return nvc0.Boot0Value, nil
	}
	return a.regs[[2]uint64{uint64(bar), off}], nil
}

func (a *aggregator) Write32(bar int, off uint64, v uint32) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.writes[bar]++
	a.regs[[2]uint64{uint64(bar), off}] = v
	return nil
}

func (a *aggregator) Call(op uint16, args []uint64) (ipc.CallResult, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if op == ipc.OpReset {
		a.resets++
		return ipc.CallResult{}, nil
	}
	return ipc.CallResult{Status: -1}, nil
}

func (a *aggregator) counts() (reads, writes [6]int, resets int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.reads, a.writes, a.resets
}

// remapFiles are a remap table and a VRAM slice, mapped here too.
type remapFiles struct {
	table, slice       *os.File
	tableMem, sliceMem []byte
}

func newRemapFiles(t *testing.T) *remapFiles {
	t.Helper()
	r := &remapFiles{}
	var err error
	n := uint64((bar1Size + bar3Size) / nvc0.PageSize * 8)
	if r.table, err = ipc.CreateMemfd("test-remap", n); err != nil {
		t.Fatal(err)
	}
	if r.slice, err = ipc.CreateMemfd("test-slice", 1<<20); err != nil {
		t.Fatal(err)
	}
	if r.tableMem, err = unix.Mmap(int(r.table.Fd()), 0, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		t.Fatal(err)
	}
	if r.sliceMem, err = unix.Mmap(int(r.slice.Fd()), 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		unix.Munmap(r.tableMem)
		unix.Munmap(r.sliceMem)
		r.table.Close()
		r.slice.Close()
	})
	return r
}

// pass makes aperture page idx (BAR1 pages first, then BAR3's) an alias of
// the slice's page at sliceOff.
func (r *remapFiles) pass(idx int, sliceOff uint64) {
	e := uint64(0)
	if sliceOff != ^uint64(0) {
		e = sliceOff | 1
	}
	p := (*uint64)(unsafe.Pointer(&r.tableMem[idx*8]))
	*p = e // x86: a plain aligned store is atomic; the device loads it seq-cst
}

func (r *remapFiles) word(off int) uint32 { return binary.LittleEndian.Uint32(r.sliceMem[off:]) }
func (r *remapFiles) setWord(off int, v uint32) {
	binary.LittleEndian.PutUint32(r.sliceMem[off:], v)
}

// serve listens at a fresh socket and accepts one device model with the
// given remap files (nil: no remap).
func serve(t *testing.T, remap *remapFiles) (*aggregator, string) {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "gpuvm.sock")
	ln, err := ipc.Listen(sock, &ipc.ListenOptions{HandshakeTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a := &aggregator{regs: map[[2]uint64]uint32{}, ready: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		p, err := ln.Accept(ctx)
		if err != nil {
			return
		}
		a.hello = p.Hello()
		a.ramOK = checkRAM(p.RAM())
		w := ipc.Welcome{VGPU: 1, VRAMSize: 256 << 20, Channels: 8, Params: map[string]string{
			ipc.ParamBAR1Size: fmt.Sprint(bar1Size), ipc.ParamBAR3Size: fmt.Sprint(bar3Size)}}
		var extra []*os.File
		if remap != nil {
			w.Params[ipc.ParamRemap] = "1"
			extra = []*os.File{remap.table, remap.slice}
		}
		sc, err := p.Accept(w, extra)
		if err != nil {
			t.Errorf("accept: %v", err)
			return
		}
		a.conn = sc
		close(a.ready)
		sc.Serve(ctx, a)
		sc.Close()
	}()
	t.Cleanup(func() {
		cancel()
		ln.Close()
		wg.Wait()
	})
	return a, sock
}

// checkRAM checks the guest RAM fd as the protocol wants it: a memfd of
// the RAM's size, sealed against shrinking.
func checkRAM(f *os.File) error {
	if f == nil {
		return fmt.Errorf("no RAM fd")
	}
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	if err != nil {
		return fmt.Errorf("not a memfd: %v", err)
	}
	if seals&unix.F_SEAL_SHRINK == 0 {
		return fmt.Errorf("seals %#x: no F_SEAL_SHRINK", seals)
	}
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size() < ramSize {
		return fmt.Errorf("RAM memfd of %d bytes", st.Size())
	}
	return nil
}

func device(sock string, extra string) string {
	return fmt.Sprintf("gpuvm,addr=%02x.0,socket=%s,domid=%d,name=%s,mode=%s%s", slot, sock, domID, vmName, vmMode, extra)
}

func waitReady(t *testing.T, a *aggregator) {
	t.Helper()
	select {
	case <-a.ready:
	case <-time.After(10 * time.Second):
		t.Fatal("the device never completed the handshake")
	}
}

// The handshake, the PCI identity and BAR layout, and BAR accesses
// forwarded to the aggregator and back.
func TestRoundTrip(t *testing.T) {
	a, sock := serve(t, nil)
	q := startQEMU(t, qemuArgs(device(sock, ""), true))
	if v := q.cfgRead(t, 0); v != nvc0.PCIDeviceQuadro6000<<16|nvc0.PCIVendorNVIDIA {
		t.Fatalf("vendor/device %#x", v)
	}
	waitReady(t, a)
	if h := a.hello; h.DomID != domID || h.Name != vmName || h.Mode != vmMode || h.RAMSize != ramSize || h.Transport != ipc.TransportShm {
		t.Errorf("Hello %+v", h)
	}
	if a.ramOK != nil {
		t.Errorf("guest RAM fd: %v", a.ramOK)
	}
	if v := q.cfgRead(t, 0x08); v != uint32(nvc0.PCIClassDisplayVGA)<<8|nvc0.PCIRevision {
		t.Errorf("class/revision %#x", v)
	}
	if v := q.cfgRead(t, 0x2C); v != nvc0.PCIDeviceQuadro6000<<16|nvc0.PCIVendorNVIDIA {
		t.Errorf("subsystem %#x", v)
	}
	// BAR sizing: all ones, read back the size mask and type bits.
	for _, c := range []struct {
		reg  int
		want uint32
	}{
		{0x10, ^uint32(nvc0.BAR0Size - 1)},
		{0x14, ^uint32(bar1Size-1) | 0xC},
		{0x1C, ^uint32(bar3Size-1) | 0xC},
		{0x24, ^uint32(nvc0.BAR5Size-1) | 1},
	} {
		q.cfgWrite(t, c.reg, 0xFFFFFFFF)
		if v := q.cfgRead(t, c.reg); v != c.want {
			t.Errorf("BAR at %#x sizes as %#x, want %#x", c.reg, v, c.want)
		}
	}
	// The PCI Express capability with function-level reset.
	if v := q.cfgRead(t, 0x34) & 0xFF; v != nvc0.PCIExpCapOffset {
		t.Errorf("capability pointer %#x", v)
	}
	if v := q.cfgRead(t, nvc0.PCIExpCapOffset+nvc0.PCIExpDevCap); v&nvc0.PCIExpDevCapFLR == 0 {
		t.Errorf("Device Capabilities %#x: no FLR", v)
	}
	q.place(t)

	if v := q.readl(t, bar0Base); v != nvc0.Boot0Value {
		t.Errorf("PMC_BOOT_0 reads %#x, want %#x", v, uint32(nvc0.Boot0Value))
	}
	q.writel(t, bar0Base+0x1700, 0x12345)
	if v := q.readl(t, bar0Base+0x1700); v != 0x12345 {
		t.Errorf("written register reads %#x", v)
	}
	if v := uint32(q.cmd(t, "readb %#x", bar0Base+3)); v != nvc0.Boot0Value>>24 {
		t.Errorf("byte 3 of PMC_BOOT_0 reads %#x", v)
	}
	q.writel(t, bar1Base+0x100, 0xABCD) // no remap: the aperture traps
	if v := q.readl(t, bar1Base+0x100); v != 0xABCD {
		t.Errorf("aperture word reads %#x", v)
	}
	if v := uint32(q.cmd(t, "inl %#x", bar5Base+4)); v != 0 {
		t.Errorf("I/O BAR reads %#x", v)
	}
	reads, writes, _ := a.counts()
	if reads[0] != 3 || writes[0] != 1 || reads[1] != 1 || writes[1] != 1 || reads[5] != 1 {
		t.Errorf("aggregator saw reads %v writes %v", reads, writes)
	}

	// Function-level reset: the aggregator resets the vGPU, Command
	// returns to 0.
	q.cfgWrite(t, nvc0.PCIExpCapOffset+nvc0.PCIExpDevCtl, nvc0.PCIExpDevCtlFLR|nvc0.PCIExpDevCtlDefault)
	if _, _, resets := a.counts(); resets != 1 {
		t.Errorf("FLR: %d resets reached the aggregator", resets)
	}
	if v := q.cfgRead(t, 0x04) & 0xFFFF; v&0x7 != 0 {
		t.Errorf("Command %#x after FLR", v)
	}
}

// With remap, passed-through aperture pages are served from the slice
// without reaching the aggregator; remap updates revoke and rebind.
func TestRemap(t *testing.T) {
	r := newRemapFiles(t)
	const page = 2
	r.pass(page, 0x5000)
	r.setWord(0x5010, 0xCAFE)
	a, sock := serve(t, r)
	q := startQEMU(t, qemuArgs(device(sock, ",spin=0"), true))
	waitReady(t, a)
	q.place(t)

	base := uint64(bar1Base + page*nvc0.PageSize)
	if v := q.readl(t, base+0x10); v != 0xCAFE {
		t.Errorf("remapped word reads %#x, want 0xcafe", v)
	}
	q.writel(t, base+0x14, 0x1234)
	if v := r.word(0x5014); v != 0x1234 {
		t.Errorf("remapped write left %#x in the slice", v)
	}
	// BAR3's pages follow BAR1's in the table.
	r.pass(bar1Size/nvc0.PageSize+1, 0x6000)
	r.setWord(0x6008, 0xD00D)
	if v := q.readl(t, bar3Base+nvc0.PageSize+8); v != 0xD00D {
		t.Errorf("remapped BAR3 word reads %#x", v)
	}
	reads, writes, _ := a.counts()
	if reads[1]+writes[1]+reads[3] != 0 {
		t.Fatalf("remapped accesses reached the aggregator: reads %v writes %v", reads, writes)
	}
	q.readl(t, bar1Base+(page+1)*nvc0.PageSize) // entry 0: traps
	if reads, _, _ := a.counts(); reads[1] != 1 {
		t.Errorf("a trapped aperture read reached the aggregator %d times", reads[1])
	}

	// The device mapped the page into the guest (§6.8): clearing its
	// table entry alone does not stop the guest's accesses — they no
	// longer reach the device — so the page is revoked by name, and once
	// the device acknowledged, the same page's accesses reach the
	// aggregator.
	if !a.conn.RemapMapped() {
		t.Fatal("the device did not set client_features REMAP_MAPPED")
	}
	r.pass(page, ^uint64(0))
	q.writel(t, base+0x18, 0x5678)
	if v := r.word(0x5018); v != 0x5678 {
		t.Errorf("a write to the mapped page left %#x in the slice, want 0x5678", v)
	}
	if reads, writes, _ := a.counts(); reads[1] != 1 || writes[1] != 0 {
		t.Errorf("accesses to the mapped page reached the aggregator: reads %v writes %v", reads, writes)
	}
	epoch, err := a.conn.RevokeRemap([]uint32{page})
	if err != nil {
		t.Fatalf("revoke page %d: %v", page, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for a.conn.RemapAcked() < epoch {
		if time.Now().After(deadline) {
			t.Fatalf("the device did not acknowledge revocation %d", epoch)
		}
		time.Sleep(time.Millisecond)
	}
	q.readl(t, base+0x10)
	q.writel(t, base+0x18, 0x9ABC)
	if reads, writes, _ := a.counts(); reads[1] != 2 || writes[1] != 1 {
		t.Errorf("after the revocation: reads %v writes %v, want one more of each trapped", reads, writes)
	}
	if v := r.word(0x5018); v != 0x5678 {
		t.Errorf("a trapped write reached the slice: %#x", v)
	}
	r.pass(page, 0x5000)

	// Revoke the mappings: every aperture access traps.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if !a.conn.RemapOffered() {
		t.Fatal("the device did not set client_features REMAP")
	}
	st, err := a.conn.UpdateRemap(ctx, nil)
	if err != nil || st != ipc.RemapDone {
		t.Fatalf("revoke: status %d, %v", st, err)
	}
	q.readl(t, base+0x10)
	if reads, _, _ := a.counts(); reads[1] != 3 {
		t.Errorf("after a revoke: %d trapped reads, want 3", reads[1])
	}

	// Rebind to another slice.
	r2 := newRemapFiles(t)
	r2.pass(page, 0)
	r2.setWord(0x10, 0xBEEF)
	if st, err := a.conn.UpdateRemap(ctx, []*os.File{r2.table, r2.slice}); err != nil || st != ipc.RemapDone {
		t.Fatalf("rebind: status %d, %v", st, err)
	}
	if v := q.readl(t, base+0x10); v != 0xBEEF {
		t.Errorf("after a rebind the page reads %#x, want 0xbeef", v)
	}
	if reads, _, _ := a.counts(); reads[1] != 3 {
		t.Errorf("after a rebind: %d trapped reads, want 3", reads[1])
	}
}

// A Bye makes the device read all ones, as a device that fell off the bus.
func TestBye(t *testing.T) {
	r := newRemapFiles(t)
	r.pass(0, 0)
	r.setWord(0, 0x77)
	a, sock := serve(t, r)
	q := startQEMU(t, qemuArgs(device(sock, ""), true))
	waitReady(t, a)
	q.place(t)
	if v := q.readl(t, bar0Base); v != nvc0.Boot0Value {
		t.Fatalf("PMC_BOOT_0 reads %#x", v)
	}
	a.conn.End("vGPU 1 destroyed by the test")
	deadline := time.Now().Add(5 * time.Second)
	for q.readl(t, bar0Base) != 0xFFFFFFFF {
		if time.Now().After(deadline) {
			t.Fatal("BAR0 still reads the register 5 s after the Bye")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if v := q.readl(t, bar1Base); v != 0xFFFFFFFF {
		t.Errorf("a remapped page reads %#x after the Bye", v)
	}
	if v := uint32(q.cmd(t, "readw %#x", bar0Base+2)); v != 0xFFFF {
		t.Errorf("a 16-bit read gives %#x after the Bye", v)
	}
	// The report follows the switch to all ones.
	for !strings.Contains(q.stderr.String(), "gpuvm: the aggregator ended the connection: vGPU 1 destroyed by the test") {
		if time.Now().After(deadline) {
			t.Fatalf("QEMU did not report the Bye: %q", q.stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// rawServer accepts one connection on a SOCK_SEQPACKET socket, reads its
// Hello and answers with answer (and fds).
func rawServer(t *testing.T, answer func(hello []byte, fds []int) ([]byte, []int)) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "raw.sock")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		defer c.Close()
		b, oob := make([]byte, 256), make([]byte, 256)
		n, oobn, _, _, err := c.ReadMsgUnix(b, oob)
		if err != nil {
			t.Errorf("reading Hello: %v", err)
			return
		}
		var fds []int
		msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
		for _, m := range msgs {
			f, _ := unix.ParseUnixRights(&m)
			fds = append(fds, f...)
		}
		out, outFds := answer(b[:n], fds)
		var rights []byte
		if len(outFds) > 0 {
			rights = unix.UnixRights(outFds...)
		}
		if _, _, err := c.WriteMsgUnix(out, rights, nil); err != nil {
			t.Errorf("writing the answer: %v", err)
		}
		for _, fd := range fds {
			unix.Close(fd)
		}
		// Keep the connection until QEMU gives up on it.
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		c.Read(b)
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
	})
	return sock
}

func header(typ uint16, size int) []byte {
	b := make([]byte, size)
	binary.LittleEndian.PutUint32(b, 0x4D565047)
	binary.LittleEndian.PutUint16(b[4:], typ)
	binary.LittleEndian.PutUint16(b[6:], 1)
	return b
}

// runToExit runs QEMU expecting realize to fail; it returns stderr.
func runToExit(t *testing.T, args []string) string {
	t.Helper()
	cmd := exec.Command(qemuBinary(t), args...)
	cmd.Stdin = strings.NewReader("")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatalf("QEMU exited 0; stderr: %s", stderr.String())
		}
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("QEMU did not exit; stderr: %s", stderr.String())
	}
	return stderr.String()
}

// The device checks what the aggregator sends and refuses to start,
// saying why, on a malformed Welcome or a Reject.
func TestRefusals(t *testing.T) {
	validWelcome := func() []byte {
		w := header(2, 1072)
		binary.LittleEndian.PutUint32(w[24:], 1)   // shm
		binary.LittleEndian.PutUint32(w[28:], 256) // req entries
		binary.LittleEndian.PutUint32(w[32:], 16)  // rsp entries
		return w
	}
	cases := []struct {
		name   string
		answer func(hello []byte, fds []int) ([]byte, []int)
		want   string
	}{
		{"reject", func([]byte, []int) ([]byte, []int) {
			b := header(3, 272)
			reason := "no free vGPU"
			binary.LittleEndian.PutUint16(b[8:], uint16(len(reason)))
			copy(b[16:], reason)
			return b, nil
		}, "the aggregator refused the VM: no free vGPU"},
		{"reserved-byte", func([]byte, []int) ([]byte, []int) {
			w := validWelcome()
			w[44] = 1
			return w, nil
		}, "Welcome: bad counts or reserved bytes"},
		{"short", func([]byte, []int) ([]byte, []int) {
			return validWelcome()[:100], nil
		}, "malformed answer from the aggregator"},
		{"params-unsorted", func([]byte, []int) ([]byte, []int) {
			w := validWelcome()
			area := []byte{1, 1, 'b', '1', 1, 1, 'a', '2'}
			w[37] = 2
			binary.LittleEndian.PutUint16(w[38:], uint16(len(area)))
			copy(w[48:], area)
			return w, nil
		}, "params not strictly ascending"},
		{"no-ring-fd", func([]byte, []int) ([]byte, []int) {
			return validWelcome(), nil
		}, "Welcome: 0 fds, want 1"},
		{"ring-not-memfd", func(_ []byte, fds []int) ([]byte, []int) {
			return validWelcome(), fds[:1] // the guest RAM memfd is no ring
		}, "ring:"},
		{"version", func([]byte, []int) ([]byte, []int) {
			w := validWelcome()
			binary.LittleEndian.PutUint16(w[6:], 2)
			return w, nil
		}, "protocol version 2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			hellos := make(chan []byte, 1)
			sock := rawServer(t, func(h []byte, fds []int) ([]byte, []int) {
				hellos <- append([]byte(nil), h...)
				if len(fds) != 1 {
					t.Errorf("Hello carried %d fds, want 1", len(fds))
				}
				return c.answer(h, fds)
			})
			stderr := runToExit(t, qemuArgs(device(sock, ""), true))
			if !strings.Contains(stderr, "gpuvm: ") || !strings.Contains(stderr, c.want) {
				t.Errorf("stderr %q does not say %q", stderr, c.want)
			}
			var hello []byte
			select {
			case hello = <-hellos:
			case <-time.After(10 * time.Second):
			}
			if len(hello) != 128 || binary.LittleEndian.Uint32(hello[8:]) != domID || hello[27] != 0 {
				t.Errorf("Hello % x", hello)
			}
		})
	}

	t.Run("ram-not-memfd", func(t *testing.T) {
		stderr := runToExit(t, qemuArgs(device(filepath.Join(t.TempDir(), "none.sock"), ""), false))
		if !strings.Contains(stderr, "memory-backend-memfd") {
			t.Errorf("stderr %q does not say how to give the guest RAM as a memfd", stderr)
		}
	})
	t.Run("bad-mode", func(t *testing.T) {
		stderr := runToExit(t, qemuArgs("gpuvm,socket=/nonexistent,domid=7,mode=FV!", true))
		if !strings.Contains(stderr, "mode 'FV!'") {
			t.Errorf("stderr %q", stderr)
		}
	})
}
