package tests

// Helpers of the lifetime (lifetime_test.go: shadow page directories freed
// under a running channel, stale TLB entries) and tenancy (tenancy_test.go:
// ghost channels, teardown races) isolation tests. Every name here starts
// with a1 so that it cannot collide with other files of the suite.

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/devmodel"
	"github.com/gpuvm/gpuvm/gpu/hostmem"
	"github.com/gpuvm/gpuvm/gpu/kernels"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
)

// ---------------------------------------------------------------------------
// Guests driven from this process that may leave abruptly.

// a1Guest is a VM whose device model and guest driver run in this process
// (an attacker, or a tenant of a slot). Unlike newAttacker's, it may depart
// abruptly (its device model closes without the driver shutting down), as a
// killed VM does.
type a1Guest struct {
	*attacker
	gone bool
}

// a1Options shape a guest's setup.
type a1Options struct {
	// SkipVA reserves this many bytes of GPU virtual addresses before the
	// guest maps anything, so its objects land at other addresses than an
	// identical guest's (0: none).
	SkipVA uint64
	// BeforeChannel runs after the address space exists and before the
	// first channel is created (e.g. to write page-directory entries before
	// the aggregator first shadows the space).
	BeforeChannel func(g *a1Guest)
}

// a1Connect connects a device model (no driver).
func a1Connect(t *testing.T, e *env, name string, domid uint32, mode string) *a1Guest {
	t.Helper()
	dev, err := e.tryConnect(name, domid, mode)
	if err != nil {
		t.Fatalf("connect %s: %v", name, err)
	}
	return a1Wrap(t, e, name, dev)
}

// a1ConnectRetry connects a device model, retrying for up to 15 s while the
// aggregator refuses it (every slot taken, or a freed slot not yet back in
// service).
func a1ConnectRetry(t *testing.T, e *env, name string, domid uint32, mode string) *a1Guest {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		dev, err := e.tryConnect(name, domid, mode)
		if err == nil {
			return a1Wrap(t, e, name, dev)
		}
		if time.Now().After(deadline) {
			t.Fatalf("connect %s: %v", name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func a1Wrap(t *testing.T, e *env, name string, dev *devmodel.Device) *a1Guest {
	g := &a1Guest{attacker: &attacker{e: e, name: name, dev: dev, r: raw{dev}}}
	t.Cleanup(func() {
		if g.gone {
			return
		}
		if g.drv != nil {
			g.drv.Close()
		}
		dev.Close()
	})
	if e.agg != nil {
		if v := e.vgpu(name); v != nil {
			g.slot = v.Slot
		}
	}
	return g
}

// a1NewGuest connects a VM and brings up its guest driver (see up).
func a1NewGuest(t *testing.T, e *env, name string, domid uint32, mode string, o a1Options) *a1Guest {
	t.Helper()
	g := a1Connect(t, e, name, domid, mode)
	g.up(t, o)
	return g
}

// up brings up the guest driver, one address space, one channel, two RAM
// pages (sink, src) and a VRAM page of its own (own), as newAttacker does.
func (g *a1Guest) up(t *testing.T, o a1Options) {
	t.Helper()
	if err := g.tryUp(t, o); err != nil {
		t.Fatal(err)
	}
}

// tryUp is up, returning an error if the GPU refuses the guest's first
// channel (the guest driver's view of a refusal: a timeout or a fault).
func (g *a1Guest) tryUp(t *testing.T, o a1Options) error {
	t.Helper()
	bar1, bar3 := g.dev.BARSizes()
	drv, err := nouveau.Open(g.dev, g.dev.RAM(), nouveau.Options{BAR1Size: bar1, BAR3Size: bar3, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("%s: guest driver: %v (device: %v)", g.name, err, g.dev.Err())
	}
	g.drv = drv
	if g.vm, err = drv.NewVM(); err != nil {
		t.Fatal(err)
	}
	if o.SkipVA > 0 {
		if _, err := g.vm.AllocVA(o.SkipVA, pageSize); err != nil {
			t.Fatal(err)
		}
	}
	if o.BeforeChannel != nil {
		o.BeforeChannel(g)
	}
	if g.ch, err = drv.NewChannel(g.vm); err != nil {
		return fmt.Errorf("%s: first channel: %w (device: %v)", g.name, err, g.dev.Err())
	}
	g.sink, g.sinkVA = g.hostPage(t)
	g.src, g.srcVA = g.hostPage(t)
	copy(g.src.Bytes, pattern(0xA5, pageSize))
	if g.own, err = drv.AllocVRAM(pageSize, pageSize); err != nil {
		t.Fatal(err)
	}
	g.ownVA = g.mapVRAM(t, g.own)
	return nil
}

// depart makes the VM vanish the way a killed VM process does: its device
// model's connection closes, its driver never shuts down (also what is left
// to do once its vGPU was destroyed from outside: the driver would wait on a
// dead device). Its RAM is no longer mapped in this process afterwards: do
// not touch its buffers.
func (g *a1Guest) depart() {
	g.gone = true
	g.dev.Close()
}

// channel creates another channel in address space vm.
func (g *a1Guest) channel(t *testing.T, vm *nouveau.VM) *nouveau.Channel {
	t.Helper()
	ch, err := g.drv.NewChannel(vm)
	if err != nil {
		t.Fatalf("%s: new channel: %v (device: %v)", g.name, err, g.dev.Err())
	}
	return ch
}

// hostBuf allocates n bytes of the guest's RAM and maps them at a fresh
// virtual address of vm.
func (g *a1Guest) hostBuf(t *testing.T, vm *nouveau.VM, n uint64) (hostmem.Buffer, uint64) {
	t.Helper()
	b, err := g.dev.RAM().Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	va, err := vm.AllocVA(n, pageSize)
	if err != nil {
		t.Fatal(err)
	}
	if err := vm.MapHost(va, b.Bus, n); err != nil {
		t.Fatal(err)
	}
	return b, va
}

// vramBuf allocates n bytes of the guest's VRAM (aligned to align) and maps
// them at a fresh virtual address of vm.
func (g *a1Guest) vramBuf(t *testing.T, vm *nouveau.VM, n, align uint64) (uint64, uint64) {
	t.Helper()
	addr, err := g.drv.AllocVRAM(n, align)
	if err != nil {
		t.Fatal(err)
	}
	va, err := vm.AllocVA(n, pageSize)
	if err != nil {
		t.Fatal(err)
	}
	if err := vm.MapVRAM(va, addr, n); err != nil {
		t.Fatal(err)
	}
	return addr, va
}

// vramWords writes words to the guest's own VRAM through the PRAMIN window,
// keeping the driver's cached window valid.
func (g *a1Guest) vramWords(addr uint64, words ...uint32) {
	w := g.r.saveWindow()
	g.r.vramWrite(addr, words)
	g.r.restoreWindow(w)
	g.r.sync()
}

// vramWord reads a word of the guest's own VRAM through the PRAMIN window.
func (g *a1Guest) vramWord(addr uint64) uint32 {
	w := g.r.saveWindow()
	defer g.r.restoreWindow(w)
	return g.r.vramRead32(addr)
}

// ramin returns the guest VRAM address of channel ch's instance block, as
// the guest's channel table holds it.
func (g *a1Guest) ramin(ch int) uint64 { return nvc0.InstDecode(g.r.rd(nvc0.ChanInst(ch))) }

// pollBase returns the BAR1 offset of the guest's poll area (doorbells).
func (g *a1Guest) pollBase() uint64 {
	return uint64(g.r.rd(nvc0.RegPollArea)&nvc0.PollAreaMask) << nvc0.PageShift
}

// rering writes channel ch's GP_PUT again with its current value: a
// doorbell that adds no work but makes the aggregator activate the channel.
func (g *a1Guest) rering(ch int) {
	off := g.pollBase() + uint64(ch)*nvc0.UserAreaSize + nvc0.UserGPPut
	put := g.dev.Read32(nvc0.BAR1, off)
	g.dev.Write32(nvc0.BAR1, off, put)
	g.r.sync()
}

// ctl returns channel ch's control word as the guest reads it (busy and
// faulted bits included).
func (g *a1Guest) ctl(ch int) uint32 { return g.r.rd(nvc0.ChanCtl(ch)) }

// ---------------------------------------------------------------------------
// Push buffers.

func a1SemRelease(va uint64, payload uint32) []uint32 {
	return []uint32{nvc0.Incr(0, nvc0.MthdSemaphoreAddrHi, 4), uint32(va >> 32), uint32(va), payload, nvc0.SemaphoreRelease}
}

func a1SemAcquire(va uint64, payload uint32) []uint32 {
	return []uint32{nvc0.Incr(0, nvc0.MthdSemaphoreAddrHi, 4), uint32(va >> 32), uint32(va), payload, nvc0.SemaphoreAcquireEqual}
}

// a1Copy is a copy-engine launch: lines lines of lineLen bytes, the source
// advancing by pitchIn and the destination by pitchOut per line.
func a1Copy(dst, src uint64, lineLen, lines, pitchIn, pitchOut uint32) []uint32 {
	return []uint32{
		nvc0.Incr(nouveau.SubcCopy, nvc0.CopyMthdSrcAddrHi, 8),
		uint32(src >> 32), uint32(src), uint32(dst >> 32), uint32(dst),
		pitchIn, pitchOut, lineLen, lines,
		nvc0.Immd(nouveau.SubcCopy, nvc0.CopyMthdExec, nvc0.CopyExecLinear),
	}
}

// a1CopyPage copies one page.
func a1CopyPage(dst, src uint64) []uint32 { return a1Copy(dst, src, pageSize, 1, pageSize, pageSize) }

func a1Cat(parts ...[]uint32) []uint32 {
	var out []uint32
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// a1Kernel is a loop kernel the guest can launch: its code object and
// parameter buffer in the guest's RAM.
type a1Kernel struct {
	buf hostmem.Buffer
	va  uint64
}

// a1NewKernel maps one RAM page holding a loop-kernel code object.
func (g *a1Guest) newKernel(t *testing.T, vm *nouveau.VM) *a1Kernel {
	t.Helper()
	b, va := g.hostBuf(t, vm, pageSize)
	k := &a1Kernel{buf: b, va: va}
	a1Put32(b, 0, nvc0.KernelMagic)
	a1Put32(b, 4, uint32(nvc0.KernelLoop))
	a1Put32(b, 8, nvc0.KernelVersion)
	return k
}

// launch returns the methods that run the loop kernel for iters iterations,
// storing its value at result (0: nowhere). slot (0..15) selects the
// parameter block, so several launches may be queued.
func (k *a1Kernel) launch(slot int, iters, result uint64) []uint32 {
	cb := 64 + 16*slot
	a1Put32(k.buf, cb, uint32(iters))
	a1Put32(k.buf, cb+4, uint32(iters>>32))
	a1Put32(k.buf, cb+8, uint32(result))
	a1Put32(k.buf, cb+12, uint32(result>>32))
	cbVA := k.va + uint64(cb)
	return []uint32{
		nvc0.Incr(nouveau.SubcCompute, nvc0.ComputeMthdCodeAddrHi, 2), uint32(k.va >> 32), uint32(k.va),
		nvc0.Incr(nouveau.SubcCompute, nvc0.ComputeMthdStartID, 1), 0,
		nvc0.Incr(nouveau.SubcCompute, nvc0.ComputeMthdCBSize, 3), 16, uint32(cbVA >> 32), uint32(cbVA),
		nvc0.Incr(nouveau.SubcCompute, nvc0.ComputeMthdLaunch, 1), 0,
	}
}

// a1LoopValue is the loop kernel's reference result.
func a1LoopValue(iters uint64) uint64 { return kernels.LoopValue(iters) }

// ---------------------------------------------------------------------------
// Guest RAM words (the GPU writes them concurrently).

func a1Word(b hostmem.Buffer, off int) *uint32 { return (*uint32)(unsafe.Pointer(&b.Bytes[off])) }
func a1Get32(b hostmem.Buffer, off int) uint32 { return atomic.LoadUint32(a1Word(b, off)) }
func a1Put32(b hostmem.Buffer, off int, v uint32) {
	atomic.StoreUint32(a1Word(b, off), v)
}

// ---------------------------------------------------------------------------
// Canaries.

// a1Region is host memory registered with the board as system memory: it
// stands in for another VM's RAM, which no guest may ever read or write.
type a1Region struct {
	mem  []byte
	base uint64 // machine address
}

// a1RegisterRegion registers size bytes of fresh host memory and plants a
// secret page at each offset in secretAt: a1Secret(seed), a1Secret(seed+1), …
func a1RegisterRegion(t *testing.T, e *env, size uint64, seed byte, secretAt ...uint64) *a1Region {
	t.Helper()
	mem, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	r := &a1Region{mem: mem}
	for i, off := range secretAt {
		copy(mem[off:off+pageSize], a1Secret(seed+byte(i)))
	}
	if r.base, err = e.board.RegisterSystemMemory(mem); err != nil {
		unix.Munmap(mem)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if e.board.UnregisterSystemMemory(r.base) == nil {
			unix.Munmap(mem)
		}
	})
	return r
}

// a1Secret is the content of secret page i of a region.
func a1Secret(seed byte) []byte { return pattern(seed, pageSize) }

// page returns the region's page at off.
func (r *a1Region) page(off uint64) []byte { return r.mem[off : off+pageSize] }

// a1Canaries are pages no guest may ever read or write: a marker in the
// honest VM's VRAM (the first and last page of its slice, which its driver
// never uses), a page of another VM's RAM (a registered region standing in
// for it) and a page of the aggregator's reserve.
type a1Canaries struct {
	e      *env
	honest aggregator.Region
	vram   []canary
	ram    *a1Region
}

// a1CanarySeed is the pattern of the canary RAM page.
const a1CanarySeed = 0x68

// a1PlantCanaries plants the canaries. Plant them after the VMs whose RAM
// placement matters attached: the region takes machine memory too.
func a1PlantCanaries(t *testing.T, e *env, honest aggregator.Slot) *a1Canaries {
	t.Helper()
	H, R := honest.VRAM, e.layout.Reserved
	return &a1Canaries{e: e, honest: H, ram: a1RegisterRegion(t, e, pageSize, a1CanarySeed, 0), vram: []canary{
		e.plant(t, "the honest VM's VRAM marker (first page of its slice)", H.Base, 0x11),
		e.plant(t, "the honest VM's VRAM marker (last page of its slice)", H.End()-pageSize, 0x22),
		e.plant(t, "the reserve (last page)", R.End()-pageSize, 0x55),
	}}
}

// secrets names every canary's content.
func (c *a1Canaries) secrets() map[string][]byte {
	m := map[string][]byte{"a page of another VM's RAM (canary region)": a1Secret(a1CanarySeed)}
	for _, v := range c.vram {
		m[v.name] = v.data
	}
	return m
}

// leaks reports which canaries occur in b (memory a guest could read).
func (c *a1Canaries) leaks(b []byte) []string { return a1Leaked(b, c.secrets()) }

// check checks that no canary changed. The honest VM's slice is scrubbed
// when it leaves, so its markers may also read all zero once it is gone.
func (c *a1Canaries) check(t *testing.T) {
	t.Helper()
	for _, v := range c.vram {
		got := c.e.readVRAM(t, v.phys, pageSize)
		if c.honest.Contains(v.phys, pageSize) && bytes.Equal(got, make([]byte, pageSize)) {
			continue
		}
		if !bytes.Equal(got, v.data) {
			i := firstDiff(got, v.data)
			t.Errorf("canary %s at VRAM %#x was modified: byte %#x is %#02x, want %#02x", v.name, v.phys, i, got[i], v.data[i])
		}
	}
	if !bytes.Equal(c.ram.page(0), a1Secret(a1CanarySeed)) {
		t.Errorf("canary: a page of another VM's RAM (machine %#x) was modified", c.ram.base)
	}
}

// a1Leaked reports which of the named secrets occur (any 64-byte chunk) in b.
func a1Leaked(b []byte, secrets map[string][]byte) []string {
	var out []string
	for name, s := range secrets {
		if containsChunk(b, s) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// ---------------------------------------------------------------------------
// The aggregator as a process (`gpuvm serve`), for attacks that may crash it.

// a1Daemon is a `gpuvm serve` process with its own simulated board.
type a1Daemon struct {
	cmd    *exec.Cmd
	dir    string
	sock   string
	ctl    string
	mu     sync.Mutex
	stderr bytes.Buffer
	done   chan struct{}
	err    error
}

// a1StartDaemon starts `gpuvm serve` with the suite's partitioning (three
// slots of 256 MiB and 8 channels, a 128 MiB reserve) and no watchdog.
func a1StartDaemon(t *testing.T) *a1Daemon {
	t.Helper()
	bin := gpuvmBinary(t)
	dir, err := os.MkdirTemp("", "gpuvm-iso-d-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	d := &a1Daemon{dir: dir, sock: filepath.Join(dir, "agg.sock"), ctl: filepath.Join(dir, "ctl.sock"), done: make(chan struct{})}
	conf := filepath.Join(dir, "gpuvm.toml")
	text := fmt.Sprintf(`[board]
vram = "%d"
mem_partitions = 4
[daemon]
socket = %q
control_socket = %q
max_vms = %d
log_level = "warn"
[partition]
vram_per_vm = "%d"
channels_per_vm = %d
bar1_per_vm = "%d"
bar3_per_vm = "%d"
reserved = "%d"
[scheduler]
policy = "fifo"
watchdog = "0"
`, boardVRAM, d.sock, d.ctl, maxVMs, vramPerVM, chansPerVM, bar1PerVM, bar3PerVM, reservedSz)
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	d.cmd = exec.Command(bin, "serve", "--config", conf)
	d.cmd.Stderr = lockedWriter{&d.mu, &d.stderr}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		d.err = d.cmd.Wait()
		close(d.done)
	}()
	t.Cleanup(func() {
		if !d.exited() {
			d.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-d.done:
			case <-time.After(15 * time.Second):
				d.cmd.Process.Signal(syscall.SIGKILL)
				<-d.done
			}
		}
	})
	if !pollUntil(10*time.Second, func() bool {
		_, err := os.Stat(d.ctl)
		return err == nil || d.exited()
	}) || d.exited() {
		t.Fatalf("gpuvm serve did not come up (exit %v):\n%s", d.err, d.log())
	}
	return d
}

func (d *a1Daemon) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

func (d *a1Daemon) log() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.stderr.String()
	if len(s) > 6000 {
		s = "…" + s[len(s)-6000:]
	}
	return s
}

// crash returns the head of a Go crash report in the daemon's log (the
// fault, the signal and the goroutine that crashed), or its log's tail.
func (d *a1Daemon) crash() string {
	d.mu.Lock()
	text := d.stderr.String()
	d.mu.Unlock()
	lines := strings.Split(text, "\n")
	start := -1
	for i, l := range lines {
		if strings.HasPrefix(l, "panic:") || strings.HasPrefix(l, "fatal error:") || strings.HasPrefix(l, "unexpected fault address") ||
			strings.HasPrefix(l, "SIGSEGV") || strings.HasPrefix(l, "SIGBUS") {
			start = i
			break
		}
	}
	if start < 0 {
		return d.log()
	}
	var out []string
	running := false
	for _, l := range lines[start:] {
		if strings.HasPrefix(l, "goroutine ") {
			if running {
				break // only the crashing goroutine
			}
			running = strings.Contains(l, "[running]")
			if !running {
				continue
			}
		}
		if running || len(out) < 8 {
			out = append(out, l)
		}
		if len(out) >= 40 {
			break
		}
	}
	return strings.Join(out, "\n")
}

// env returns an environment whose socket is the daemon's (board and
// aggregator are in the daemon: only connect and startVM work).
func (d *a1Daemon) env() *env { return &env{sock: d.sock, dir: d.dir} }
