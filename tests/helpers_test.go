// Package tests holds cross-package suites: here, the isolation (security)
// suite. Every test builds a simulated board and an aggregator in this
// process, serving device models on a Unix socket; an honest VM (a real
// `gpuvm devmodel` process) computes and verifies its results next to an
// attacker that drives its own device model with hostile MMIO.
package tests

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/bench"
	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/devmodel"
	"github.com/gpuvm/gpuvm/gpu"
	"github.com/gpuvm/gpuvm/gpu/hostmem"
	"github.com/gpuvm/gpuvm/gpu/hwseq"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
	"github.com/gpuvm/gpuvm/internal/racebuild"
	"github.com/gpuvm/gpuvm/ipc"
)

// The partitioning every test uses: a 1 GiB board, 128 MiB reserved for the
// aggregator, three VM slots of 256 MiB and 8 channels each.
const (
	boardVRAM  = 1 << 30
	reservedSz = 128 << 20
	vramPerVM  = 256 << 20
	chansPerVM = 8
	bar1PerVM  = 16 << 20
	bar3PerVM  = 4 << 20
	maxVMs     = 3
	guestRAM   = 64 << 20
	pageSize   = nvc0.PageSize
)

// ---------------------------------------------------------------------------
// The gpuvm binary (the honest VM and the victim run as real processes).

var (
	binOnce sync.Once
	binDir  string
	binPath string
	binErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// gpuvmBinary builds cmd/gpuvm once per test binary run (without -race: the
// VM processes are not under test, the aggregator in this process is).
func gpuvmBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "gpuvm-isolation-bin-")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "gpuvm")
		cmd := exec.Command("go", "build", "-o", binPath, "github.com/gpuvm/gpuvm/cmd/gpuvm")
		cmd.Env = append(os.Environ(), "GOFLAGS=")
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build ./cmd/gpuvm: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatalf("cannot build the gpuvm binary for the VM processes: %v", binErr)
	}
	return binPath
}

// ---------------------------------------------------------------------------
// The environment: board, aggregator, socket.

type env struct {
	board  *sim.Board
	agg    *aggregator.Aggregator
	layout aggregator.Layout
	sock   string
	dir    string
}

func testLogger() *slog.Logger {
	if os.Getenv("GPUVM_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvWith(t, envOptions{})
}

// envOptions adjust the aggregator of a test environment. Zero values keep
// the defaults of newEnv.
type envOptions struct {
	// Logger receives the aggregator's log (default: testLogger()).
	Logger *slog.Logger
	// Watchdog kills channels whose submission runs longer (0: never).
	Watchdog time.Duration
	// Quota narrows a guest's slot (channels, VRAM bytes), as [[vm]] does.
	Quota func(aggregator.Guest) aggregator.Quota
	// Modify, if set, may change any other aggregator option.
	Modify func(*aggregator.Options)
}

// newEnvWith is newEnv with options.
func newEnvWith(t testing.TB, o envOptions) *env {
	t.Helper()
	part := config.PartitionConfig{VRAMPerVM: vramPerVM, ChannelsPerVM: chansPerVM,
		BAR1PerVM: bar1PerVM, BAR3PerVM: bar3PerVM, Reserved: reservedSz}
	cfg := sim.DefaultConfig()
	cfg.VRAMSize, cfg.MemPartitions = boardVRAM, 4
	layout, err := aggregator.NewLayout(part, maxVMs, cfg.VRAMSize, cfg.Channels)
	if err != nil {
		t.Fatal(err)
	}
	cfg.VRAMSegments = layout.Segments(cfg.VRAMSize) // remap modes hand out a slice
	board, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { board.Close() })
	logger := o.Logger
	if logger == nil {
		logger = testLogger()
	}
	opts := aggregator.Options{Partition: part, MaxVMs: maxVMs, Channels: cfg.Channels,
		Timeout: 5 * time.Second, Logger: logger, Watchdog: o.Watchdog, Quota: o.Quota}
	if o.Modify != nil {
		o.Modify(&opts)
	}
	agg, err := aggregator.New(board, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { agg.Close() })
	// Unix socket paths are short (108 bytes): keep the directory in /tmp.
	dir, err := os.MkdirTemp("", "gpuvm-iso-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "agg.sock")
	ln, err := ipc.Listen(sock, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- agg.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-served:
		case <-time.After(15 * time.Second):
			t.Errorf("aggregator Serve did not return 15 s after shutdown")
		}
		ln.Close()
	})
	return &env{board: board, agg: agg, layout: agg.Layout(), sock: sock, dir: dir}
}

// vgpu returns the attached vGPU of the named guest, or nil.
func (e *env) vgpu(name string) *aggregator.VGPU {
	for _, v := range e.agg.VGPUs() {
		if v.Guest.Name == name {
			return v
		}
	}
	return nil
}

// waitAttached waits until the named guest has a vGPU.
func (e *env) waitAttached(t *testing.T, name string, p *proc) *aggregator.VGPU {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if v := e.vgpu(name); v != nil {
			return v
		}
		if p != nil && p.exited() {
			t.Fatalf("%s exited before attaching: %v\nstderr:\n%s", name, p.err, p.stderr())
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("%s never got a vGPU", name)
	return nil
}

// waitDetached waits until the named guest's vGPU is gone.
func (e *env) waitDetached(t *testing.T, name string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if e.vgpu(name) == nil {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("the vGPU of %s is still attached %v after its device model went away", name, within)
}

func (e *env) readVRAM(t *testing.T, phys, n uint64) []byte {
	t.Helper()
	b := make([]byte, n)
	if err := e.board.ReadVRAM(b, phys); err != nil {
		t.Fatal(err)
	}
	return b
}

func (e *env) writeVRAM(t *testing.T, phys uint64, b []byte) {
	t.Helper()
	if err := e.board.WriteVRAM(b, phys); err != nil {
		t.Fatal(err)
	}
}

// canary is a recognizable page planted host-side in memory no attacker may reach.
type canary struct {
	name string
	phys uint64
	data []byte
}

func pattern(seed byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed ^ byte(i*7+i>>8)
	}
	return b
}

func (e *env) plant(t *testing.T, name string, phys uint64, seed byte) canary {
	t.Helper()
	c := canary{name: name, phys: phys, data: pattern(seed, pageSize)}
	e.writeVRAM(t, phys, c.data)
	return c
}

func (e *env) checkCanary(t *testing.T, c canary) {
	t.Helper()
	if got := e.readVRAM(t, c.phys, pageSize); !bytes.Equal(got, c.data) {
		i := firstDiff(got, c.data)
		t.Errorf("canary %s at VRAM %#x was modified: byte %#x is %#02x, want %#02x", c.name, c.phys, i, got[i], c.data[i])
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// containsChunk reports whether any 64-byte chunk of secret appears in b.
func containsChunk(b, secret []byte) bool {
	for i := 0; i+64 <= len(secret); i += 64 {
		if bytes.Contains(b, secret[i:i+64]) {
			return true
		}
	}
	return false
}

// ---------------------------------------------------------------------------
// VM processes.

// proc is a `gpuvm devmodel` VM process.
type proc struct {
	name     string
	cmd      *exec.Cmd
	out, err bytes.Buffer
	errv     error
	done     chan struct{}
	start    time.Time
	took     time.Duration
	mu       sync.Mutex
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) stderr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.err.String()
	if len(s) > 4000 {
		s = "…" + s[len(s)-4000:]
	}
	return s
}

// lockedWriter serialises the process's output with reads of it.
type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// honestArgs is the honest VM's job: small matrix add and copies, verified.
func honestArgs() []string {
	if testing.Short() {
		return []string{"--workloads", "madd,cpy", "--runs", "1", "--matrix-dim", "32", "--copy-size", "1MiB"}
	}
	return []string{"--workloads", "madd,cpy", "--runs", "3", "--matrix-dim", "64", "--copy-size", "4MiB"}
}

// startVM runs `gpuvm devmodel` as the named guest.
func (e *env) startVM(t *testing.T, name string, domid int, mode string, job []string) *proc {
	t.Helper()
	bin := gpuvmBinary(t)
	args := append([]string{"devmodel", "--socket", e.sock, "--mode", mode, "--domid", strconv.Itoa(domid),
		"--name", name, "--ram", strconv.Itoa(guestRAM), "--json"}, job...)
	p := &proc{name: name, cmd: exec.Command(bin, args...), done: make(chan struct{}), start: time.Now()}
	p.cmd.Stdout = lockedWriter{&p.mu, &p.out}
	p.cmd.Stderr = lockedWriter{&p.mu, &p.err}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.errv = p.cmd.Wait()
		p.took = time.Since(p.start)
		close(p.done)
	}()
	t.Cleanup(func() {
		if !p.exited() {
			p.cmd.Process.Signal(syscall.SIGKILL)
			<-p.done
		}
	})
	return p
}

func (e *env) startHonest(t *testing.T) (*proc, *aggregator.VGPU) {
	t.Helper()
	return e.startHonestMode(t, bystanderMode())
}

// bystanderMode is the honest VM's mode: fv-naive, the mode that traps
// the most; under the race detector's -short run, fv-optimized, whose
// bystander costs the instrumented aggregator a fraction of the CPU (the
// attacks' own VMs keep their modes).
func bystanderMode() string {
	if racebuild.Enabled && testing.Short() {
		return "fv-optimized"
	}
	return "fv-naive"
}

// startHonestMode starts the honest VM in a given mode.
func (e *env) startHonestMode(t *testing.T, mode string) (*proc, *aggregator.VGPU) {
	t.Helper()
	p := e.startVM(t, "honest", 7, mode, honestArgs())
	return p, e.waitAttached(t, "honest", p)
}

// wait waits for the process to exit (killing it after limit).
func (p *proc) wait(t *testing.T, limit time.Duration) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(limit):
		// A hang is a bug to find: the VM process prints its goroutines
		// on SIGQUIT, and the aggregator's (this process's) are dumped to
		// a file beside the test's temporary files.
		p.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-p.done:
		case <-time.After(2 * time.Second):
			p.cmd.Process.Signal(syscall.SIGKILL)
			<-p.done
		}
		buf := make([]byte, 8<<20)
		buf = buf[:runtime.Stack(buf, true)]
		dump := filepath.Join(os.TempDir(), fmt.Sprintf("gpuvm-hang-%s-%d.txt", p.name, os.Getpid()))
		_ = os.WriteFile(dump, buf, 0o644)
		t.Fatalf("%s did not finish within %v (killed; the aggregator's goroutines are in %s)\nstderr:\n%s", p.name, limit, dump, p.stderr())
	}
}

// verified waits for the honest VM and checks that it completed every
// workload with verified results.
func (p *proc) verified(t *testing.T) {
	t.Helper()
	// A hang detector, not a performance bound: under a loaded `go test
	// ./...` (other packages' VM processes spinning on the same two CPUs)
	// each trap of the honest VM can wait a scheduler time slice, and an
	// fv-naive run of thousands of traps took over a minute.
	p.wait(t, 3*time.Minute)
	p.mu.Lock()
	out := p.out.Bytes()
	p.mu.Unlock()
	var results []struct {
		Workload string `json:"workload"`
		Runs     int    `json:"runs"`
		Verified bool   `json:"verified"`
		Error    string `json:"error"`
	}
	if err := json.Unmarshal(out, &results); err != nil {
		t.Fatalf("%s: exit %v, output is not a result list: %v\nstdout:\n%s\nstderr:\n%s", p.name, p.errv, err, out, p.stderr())
	}
	if len(results) == 0 {
		t.Fatalf("%s: no results (exit %v)\nstderr:\n%s", p.name, p.errv, p.stderr())
	}
	for _, r := range results {
		if !r.Verified || r.Error != "" {
			t.Errorf("%s: workload %s not verified (error %q)", p.name, r.Workload, r.Error)
		}
	}
	if p.errv != nil {
		t.Fatalf("%s exited with %v\nstderr:\n%s", p.name, p.errv, p.stderr())
	}
	t.Logf("%s: %d workloads verified in %v", p.name, len(results), p.took.Round(time.Millisecond))
}

// ---------------------------------------------------------------------------
// In-process device models (the attacker).

func (e *env) connect(t testing.TB, name string, domid uint32, mode string) *devmodel.Device {
	t.Helper()
	d, err := e.tryConnect(name, domid, mode)
	if err != nil {
		t.Fatalf("connect %s: %v", name, err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func (e *env) tryConnect(name string, domid uint32, mode string) (*devmodel.Device, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	return devmodel.Connect(ctx, devmodel.Config{Socket: e.sock, DomID: domid, Name: name, Mode: mode,
		RAMSize: guestRAM, Logger: testLogger()})
}

// raw is hostile MMIO straight to a device model, no driver.
type raw struct{ m gpu.MMIO }

func (r raw) rd(off uint32) uint32      { return r.m.Read32(nvc0.BAR0, uint64(off)) }
func (r raw) wr(off uint32, val uint32) { r.m.Write32(nvc0.BAR0, uint64(off), val) }

// window points the PRAMIN window at guest VRAM address addr (64 KiB
// granular) and returns the BAR0 offset of addr in it.
func (r raw) window(addr uint64) uint32 {
	r.wr(nvc0.RegPRAMINWindow, uint32(addr>>nvc0.PRAMINWindowShift))
	return nvc0.PRAMINBase + uint32(addr&(1<<nvc0.PRAMINWindowShift-1))
}

// sync is a round trip: every write posted before it has been handled.
func (r raw) sync() { _ = r.rd(nvc0.RegBoot0) }

// errorReported reports whether the (virtual) GPU presents an error report
// about channel ch — an MMU fault record naming its instance or a PBDMA
// error naming its id — without releasing anything: what a driver sees
// before it handles the interrupt.
func (r raw) errorReported(ch int) bool {
	intr := r.rd(nvc0.RegPFIFOIntr)
	if intr&nvc0.PFIFOIntrMMUFault != 0 {
		inst := r.rd(nvc0.ChanInst(ch))
		mask := r.rd(nvc0.RegFaultUnitMask)
		for u := range nvc0.NumFaultUnits {
			if mask&(1<<u) != 0 && nvc0.InstDecode(r.rd(nvc0.RegFaultInst(u))) == nvc0.InstDecode(inst) {
				return true
			}
		}
	}
	if intr&nvc0.PFIFOIntrPBDMA != 0 {
		src := r.rd(nvc0.RegPBDMAIntrSource)
		for p := range nvc0.NumPBDMAs {
			if src&(1<<p) != 0 && int(r.rd(nvc0.RegPBDMAChan(p))&nvc0.PBDMAChanMask) == ch {
				return true
			}
		}
	}
	return false
}

// saveWindow and restoreWindow keep a driver's cached PRAMIN window valid
// around raw window moves.
func (r raw) saveWindow() uint32     { return r.rd(nvc0.RegPRAMINWindow) }
func (r raw) restoreWindow(w uint32) { r.wr(nvc0.RegPRAMINWindow, w) }

func (r raw) vramWrite32(addr uint64, v uint32) { r.wr(r.window(addr), v) }
func (r raw) vramRead32(addr uint64) uint32     { return r.rd(r.window(addr)) }

func (r raw) vramWrite64(addr uint64, v uint64) {
	r.vramWrite32(addr, uint32(v))
	r.vramWrite32(addr+4, uint32(v>>32))
}

// vramWrite writes words through the window (moving it once per 64 KiB).
func (r raw) vramWrite(addr uint64, words []uint32) {
	cur := ^uint64(0)
	for i, w := range words {
		a := addr + uint64(i)*4
		if base := a &^ (1<<nvc0.PRAMINWindowShift - 1); base != cur {
			r.wr(nvc0.RegPRAMINWindow, uint32(base>>nvc0.PRAMINWindowShift))
			cur = base
		}
		r.wr(nvc0.PRAMINBase+uint32(a-cur), w)
	}
}

// flushTLB runs a TLB flush of the page directory at pd, as a driver does.
func (r raw) flushTLB(t *testing.T, pd uint64, bar bool) {
	t.Helper()
	if err := hwseq.FlushTLB(r.m, pd, bar, 5*time.Second); err != nil {
		t.Fatalf("TLB flush: %v", err)
	}
}

// denied returns the guest's denied-access counter as the aggregator keeps it.
func (e *env) denied(t *testing.T, name string) uint64 {
	t.Helper()
	v := e.vgpu(name)
	if v == nil {
		t.Fatalf("%s has no vGPU", name)
	}
	return v.Counters().Denied
}

// expectDenied checks that the guest's denied counter grew by at least n since before.
func (e *env) expectDenied(t *testing.T, name string, before, n uint64, what string) {
	t.Helper()
	got := e.denied(t, name) - before
	if got < n {
		t.Errorf("%s: denied counter of %s grew by %d, want at least %d", what, name, got, n)
	}
}

// attacker is a guest whose own driver set up an address space and a channel
// normally; the attacks then write hostile entries into its own tables.
type attacker struct {
	e    *env
	name string
	dev  *devmodel.Device
	r    raw
	drv  *nouveau.Device
	vm   *nouveau.VM
	ch   *nouveau.Channel
	slot aggregator.Slot

	sink, src     hostmem.Buffer // attacker RAM pages
	sinkVA, srcVA uint64
	own           uint64 // guest VRAM page of its own, mapped at ownVA
	ownVA         uint64
}

const sinkFill = 0x5A

func newAttacker(t *testing.T, e *env, name string, domid uint32, mode string) *attacker {
	t.Helper()
	dev := e.connect(t, name, domid, mode)
	bar1, bar3 := dev.BARSizes()
	drv, err := nouveau.Open(dev, dev.RAM(), nouveau.Options{BAR1Size: bar1, BAR3Size: bar3, Timeout: 5 * time.Second, PV: bench.DriverPVMode(mode)})
	if err != nil {
		t.Fatalf("%s: guest driver: %v (device: %v)", name, err, dev.Err())
	}
	t.Cleanup(func() { drv.Close() })
	a := &attacker{e: e, name: name, dev: dev, r: raw{dev}, drv: drv, slot: e.vgpu(name).Slot}
	if a.vm, err = drv.NewVM(); err != nil {
		t.Fatal(err)
	}
	a.newChannel(t)
	a.sink, a.sinkVA = a.hostPage(t)
	a.src, a.srcVA = a.hostPage(t)
	copy(a.src.Bytes, pattern(0xA5, pageSize))
	if a.own, err = drv.AllocVRAM(pageSize, pageSize); err != nil {
		t.Fatal(err)
	}
	a.ownVA = a.mapVRAM(t, a.own)
	return a
}

func (a *attacker) hostPage(t *testing.T) (hostmem.Buffer, uint64) {
	t.Helper()
	b, err := a.dev.RAM().Alloc(pageSize)
	if err != nil {
		t.Fatal(err)
	}
	va, err := a.vm.AllocVA(pageSize, pageSize)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.vm.MapHost(va, b.Bus, pageSize); err != nil {
		t.Fatal(err)
	}
	return b, va
}

// mapVRAM maps guest VRAM address g (anything: the driver does not check)
// at a fresh virtual address; the driver flushes the TLB.
func (a *attacker) mapVRAM(t *testing.T, g uint64) uint64 {
	t.Helper()
	va, err := a.vm.AllocVA(pageSize, pageSize)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.vm.MapVRAM(va, g, pageSize); err != nil {
		t.Fatal(err)
	}
	return va
}

// mapSys maps guest-physical system address gpa at a fresh virtual address.
func (a *attacker) mapSys(t *testing.T, gpa uint64) uint64 {
	t.Helper()
	va, err := a.vm.AllocVA(pageSize, pageSize)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.vm.MapHost(va, gpa, pageSize); err != nil {
		t.Fatal(err)
	}
	return va
}

// newChannel replaces the attacker's channel (a faulted channel stays stopped).
func (a *attacker) newChannel(t *testing.T) {
	t.Helper()
	if a.ch != nil {
		a.ch.Close() // a stopped channel may report its fault again: ignore
	}
	ch, err := a.drv.NewChannel(a.vm)
	if err != nil {
		t.Fatalf("%s: new channel: %v (device: %v)", a.name, err, a.dev.Err())
	}
	a.ch = ch
}

// gpuCopy makes the copy engine move one page from src to dst (GPU virtual
// addresses) and waits for it: nil, or the channel's fault.
func (a *attacker) gpuCopy(dst, src uint64) error {
	if err := a.submitCopy(dst, src); err != nil {
		return err
	}
	return a.ch.Finish()
}

// submitCopy submits a one-page copy from src to dst without waiting.
func (a *attacker) submitCopy(dst, src uint64) error {
	return a.ch.Submit([]uint32{
		nvc0.Incr(nouveau.SubcCopy, nvc0.CopyMthdSrcAddrHi, 8),
		uint32(src >> 32), uint32(src), uint32(dst >> 32), uint32(dst),
		pageSize, pageSize, pageSize, 1,
		nvc0.Immd(nouveau.SubcCopy, nvc0.CopyMthdExec, nvc0.CopyExecLinear),
	})
}

// physChan returns the physical channel id of the attacker's current channel.
func (a *attacker) physChan() int { return a.slot.ChanBase + a.ch.ID() }

// controlCopies proves the attack machinery works: a copy between the
// attacker's own pages completes and moves the data.
func (a *attacker) controlCopies(t *testing.T) {
	t.Helper()
	if err := a.gpuCopy(a.ownVA, a.srcVA); err != nil {
		t.Fatalf("control copy RAM→own VRAM failed: %v", err)
	}
	fillSink(a)
	if err := a.gpuCopy(a.sinkVA, a.ownVA); err != nil {
		t.Fatalf("control copy own VRAM→RAM failed: %v", err)
	}
	if !bytes.Equal(a.sink.Bytes, a.src.Bytes) {
		t.Fatalf("control copies did not move the data: the attack harness is broken")
	}
}

func fillSink(a *attacker) {
	for i := range a.sink.Bytes {
		a.sink.Bytes[i] = sinkFill
	}
}

// sinkUntouched reports whether the sink page still holds its fill.
func sinkUntouched(a *attacker) bool {
	for _, b := range a.sink.Bytes {
		if b != sinkFill {
			return false
		}
	}
	return true
}

// le32 is little-endian decoding of a VRAM word read host-side.
func le32(b []byte) uint32 { return binary.LittleEndian.Uint32(b) }

// expectFault checks that err is a channel fault (the hostile mapping was
// dropped, so the GPU found nothing there).
func expectFault(t *testing.T, err error, what string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: the copy completed: the hostile mapping was not dropped", what)
		return
	}
	if !errors.Is(err, nouveau.ErrChannelFault) {
		t.Errorf("%s: got %v, want a channel fault", what, err)
	}
}

// errText flattens an error for messages.
func errText(err error) string {
	if err == nil {
		return "<nil>"
	}
	return strings.ReplaceAll(err.Error(), "\n", "; ")
}

// pollUntil polls cond every millisecond until it holds (true) or within passes (false).
func pollUntil(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
}
