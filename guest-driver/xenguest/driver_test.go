package xenguest

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/bench"
	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/gpu"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
	"golang.org/x/sys/unix"
)

// vgpuWindow is the test's seam in place of a BAR mapping: where a Xen
// guest's load or store traps and Xen hands the device model an ioreq
// that ends in the aggregator's VGPU.Read32 or Write32, the window calls
// them directly. Everything above the window (the BARs' bounds checks,
// counting and timing) and everything beside it (the DMA range, mapped
// from the stand-in of /dev/mem that the aggregator maps as the guest's
// RAM) is the production code.
type vgpuWindow struct {
	t   *testing.T
	v   *aggregator.VGPU
	bar int
}

func (w vgpuWindow) load32(off uint64) uint32 {
	val, err := w.v.Read32(w.bar, off)
	if err != nil {
		w.t.Errorf("vGPU read BAR%d %#x: %v", w.bar, off, err)
		return nvc0.ReadAllOnes
	}
	return val
}

func (w vgpuWindow) store32(off uint64, val uint32) {
	if err := w.v.Write32(w.bar, off, val); err != nil {
		w.t.Errorf("vGPU write BAR%d %#x: %v", w.bar, off, err)
	}
}

// fill32 is a REP STOSL's ioreq with a count as the device model serves
// it: one write per word.
func (w vgpuWindow) fill32(off uint64, val uint32, n int) bool {
	for i := range uint64(n) {
		w.store32(off+4*i, val)
	}
	return true
}

func (w vgpuWindow) size() uint64 { return nvc0.BARSize(w.bar) }
func (w vgpuWindow) close() error { return nil }

// The guest driver, opened on BARs and a DMA range of this package, over a
// vGPU of the real aggregator on the simulated board, runs workloads that
// compute on the board and verify: in full virtualization (no BAR5) and in
// a para-virtual mode (hypercalls through BAR5, call slots in the DMA
// range). The guest's own access counts match what reached the aggregator,
// access for access.
func TestDriverOnVGPU(t *testing.T) {
	for _, mode := range []string{string(config.ModeFVOptimized), string(config.ModePVMulticall)} {
		t.Run(mode, func(t *testing.T) { runDriverOnVGPU(t, mode) })
	}
}

func runDriverOnVGPU(t *testing.T, mode string) {
	cfg := sim.DefaultConfig()
	cfg.VRAMSize, cfg.MemPartitions = 1<<30, 4
	board, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { board.Close() })
	part := config.PartitionConfig{VRAMPerVM: 256 << 20, ChannelsPerVM: 8, BAR1PerVM: 15 << 20, BAR3PerVM: 2 << 20, Reserved: 128 << 20}
	agg, err := aggregator.New(board, aggregator.Options{Partition: part, MaxVMs: 2, Channels: cfg.Channels})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { agg.Close() })

	// The guest's physical memory: 64 MiB, of which the kernel was told
	// (memmap=32M$0x1000000) to leave 16..48 MiB alone.
	dir := t.TempDir()
	const ramSize, dmaBase, dmaSize = 64 << 20, 16 << 20, 32 << 20
	devmem := filepath.Join(dir, "mem")
	f, err := os.Create(devmem)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(ramSize); err != nil {
		t.Fatal(err)
	}
	iomem := filepath.Join(dir, "iomem")
	if err := os.WriteFile(iomem, []byte("00000000-00000fff : Reserved\n00001000-00ffffff : System RAM\n01000000-02ffffff : Reserved\n03000000-03ffffff : System RAM\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The aggregator is in-process: a hang in it would hang the test
	// binary, so the attach gets a deadline of its own.
	type attached struct {
		v   *aggregator.VGPU
		err error
	}
	done := make(chan attached, 1)
	go func() {
		v, err := agg.Attach(aggregator.Guest{DomID: 7, Name: "xenguest", Mode: mode}, f, ramSize)
		done <- attached{v, err}
	}()
	var v *aggregator.VGPU
	select {
	case a := <-done:
		if a.err != nil {
			t.Fatal(a.err)
		}
		v = a.v
	case <-time.After(30 * time.Second):
		t.Fatal("aggregator.Attach did not return within 30s")
	}
	dma, err := OpenDMA(DMAConfig{Base: dmaBase, Size: dmaSize, DevMem: devmem, IOMem: iomem})
	if err != nil {
		t.Fatal(err)
	}
	defer dma.Close()
	if !dma.Checked {
		t.Error("DMA range not checked against the resource map")
	}

	bars := &BARs{}
	indices := []int{nvc0.BAR0, nvc0.BAR1, nvc0.BAR3}
	if config.Mode(mode).IsPV() {
		indices = append(indices, nvc0.BAR5)
	}
	for _, i := range indices {
		bars.win[i] = vgpuWindow{t: t, v: v, bar: i}
		bars.bars[i] = BAR{Index: i, Size: nvc0.BARSize(i), IO: i == nvc0.BAR5}
	}
	defer bars.Close()

	drv, err := nouveau.Open(bars, dma, nouveau.Options{BAR1Size: part.BAR1PerVM.Bytes(), BAR3Size: part.BAR3PerVM.Bytes(), PV: bench.DriverPVMode(mode)})
	if err != nil {
		t.Fatalf("guest driver: %v (BARs: %v)", err, bars.Err())
	}
	before := v.Counters()
	guestBefore := bars.Stats()
	params := workloads.Params{MatrixDim: 32, LoopIterations: 1000, CopyBytes: 1<<20 + 123}
	for _, name := range []string{"madd", "cpy"} {
		w, err := workloads.New(name, params)
		if err != nil {
			t.Fatal(err)
		}
		counters := func() map[string]uint64 { return bars.Stats().Counters() }
		res := bench.RunWorkload(context.Background(), mode, gdev.Nouveau(drv), w, 2, counters, nil)
		if !res.Verified {
			t.Fatalf("%s: not verified: %s", name, res.Error)
		}
		if n, _ := res.Counters["guest_bar0_writes"].(uint64); n == 0 {
			t.Errorf("%s: counters per run %v: no BAR0 writes", name, res.Counters)
		}
	}
	if err := drv.Close(); err != nil {
		t.Fatalf("driver close: %v", err)
	}
	if err := bars.Err(); err != nil {
		t.Errorf("BARs: %v", err)
	}

	// Every access the guest counted reached the vGPU, once; a fill's
	// words arrive as writes.
	got, s := v.Counters(), bars.Stats().Sub(guestBefore)
	for _, c := range []struct {
		bar             int
		reads, writes   uint64
		vreads, vwrites uint64
	}{
		{nvc0.BAR0, s.Reads[0], s.Writes[0] + s.FillWords[0], got.BAR0Reads - before.BAR0Reads, got.BAR0Writes - before.BAR0Writes},
		{nvc0.BAR1, s.Reads[1], s.Writes[1] + s.FillWords[1], got.BAR1Reads - before.BAR1Reads, got.BAR1Writes - before.BAR1Writes},
		{nvc0.BAR3, s.Reads[3], s.Writes[3] + s.FillWords[3], got.BAR3Reads - before.BAR3Reads, got.BAR3Writes - before.BAR3Writes},
	} {
		if c.reads != c.vreads || c.writes != c.vwrites {
			t.Errorf("BAR%d: guest counted %d reads, %d writes; the vGPU saw %d, %d", c.bar, c.reads, c.writes, c.vreads, c.vwrites)
		}
	}
	if s.Accesses() == 0 || s.Mean() <= 0 {
		t.Errorf("no accesses timed: %+v", s)
	}
	if !config.Mode(mode).IsPV() && s.TotalFills() == 0 {
		t.Errorf("the driver cleared no page table with a fill: %+v", s)
	}
	if config.Mode(mode).IsPV() {
		calls := got.Hypercalls - before.Hypercalls
		if calls == 0 || s.Writes[nvc0.BAR5] < calls {
			t.Errorf("PV: %d hypercalls, %d BAR5 writes by the guest", calls, s.Writes[nvc0.BAR5])
		}
	} else if s.Reads[nvc0.BAR5]+s.Writes[nvc0.BAR5] != 0 {
		t.Errorf("full virtualization touched BAR5: %+v", s)
	}
	t.Logf("%s: %d accesses (%d reads, %d writes), mean %v in the seam; %d fills of %d words", mode, s.Accesses(), s.TotalReads(), s.TotalWrites(), s.Mean(), s.TotalFills(), s.TotalFillWords())
}

// mmioWindow is the same seam over any gpu.MMIO: here the simulated
// board's port, a GPU with no hypervisor in between.
type mmioWindow struct {
	m   gpu.MMIO
	bar int
}

func (w mmioWindow) load32(off uint64) uint32       { return w.m.Read32(w.bar, off) }
func (w mmioWindow) store32(off uint64, val uint32) { w.m.Write32(w.bar, off, val) }
func (w mmioWindow) size() uint64                   { return nvc0.BARSize(w.bar) }
func (w mmioWindow) close() error                   { return nil }

func (w mmioWindow) fill32(off uint64, val uint32, n int) bool {
	for i := range uint64(n) {
		w.store32(off+4*i, val)
	}
	return true
}

// The driver on this package's BARs and DMA range over the bare simulated
// board (as if the GPU were passed through): the board reaches the DMA
// range through its own mapping of the /dev/mem stand-in, at the machine
// address it chose for it, which is the range's bus address.
func TestDriverOnBoard(t *testing.T) {
	cfg := sim.DefaultConfig()
	cfg.VRAMSize, cfg.MemPartitions = 256<<20, 1
	board, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer board.Close()

	// The board puts the first system memory it is given at machine
	// address 1 GiB; "physical memory" is a file that deep, and the
	// board's region is [1 GiB, 1 GiB + 64 MiB) of it.
	const machBase, ramSize = 1 << 30, 64 << 20
	dir := t.TempDir()
	devmem := filepath.Join(dir, "mem")
	f, err := os.Create(devmem)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(machBase + ramSize); err != nil {
		t.Fatal(err)
	}
	region, err := mapShared(devmem, machBase, ramSize, false)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(region)
	base, err := board.RegisterSystemMemory(region)
	if err != nil {
		t.Fatal(err)
	}
	if base != machBase {
		t.Skipf("the board placed system memory at %#x, not %#x: the test's layout no longer fits", base, uint64(machBase))
	}
	dma, err := OpenDMA(DMAConfig{Base: machBase + 16<<20, Size: 32 << 20, DevMem: devmem, IOMem: filepath.Join(dir, "no-iomem")})
	if err != nil {
		t.Fatal(err)
	}
	defer dma.Close()

	port := board.NewPort()
	bars := &BARs{}
	for _, i := range []int{nvc0.BAR0, nvc0.BAR1, nvc0.BAR3} {
		bars.win[i] = mmioWindow{m: port, bar: i}
		bars.bars[i] = BAR{Index: i, Size: nvc0.BARSize(i)}
	}
	drv, err := nouveau.Open(bars, dma, nouveau.Options{BAR1Size: bars.Size(nvc0.BAR1), BAR3Size: bars.Size(nvc0.BAR3)})
	if err != nil {
		t.Fatalf("guest driver: %v (BARs: %v)", err, bars.Err())
	}
	defer drv.Close()
	w, err := workloads.New("mmul", workloads.Params{MatrixDim: 48})
	if err != nil {
		t.Fatal(err)
	}
	res := bench.RunWorkload(context.Background(), "native", gdev.Nouveau(drv), w, 1, nil, nil)
	if !res.Verified {
		t.Fatalf("mmul: %s", res.Error)
	}
	st := board.Stats()
	s := bars.Stats()
	for _, bar := range []int{nvc0.BAR0, nvc0.BAR1, nvc0.BAR3} {
		if st.MMIOReads[bar] != s.Reads[bar] || st.MMIOWrites[bar] != s.Writes[bar]+s.FillWords[bar] {
			t.Errorf("BAR%d: the guest counted %d/%d+%d reads/writes+filled words, the board %d/%d", bar,
				s.Reads[bar], s.Writes[bar], s.FillWords[bar], st.MMIOReads[bar], st.MMIOWrites[bar])
		}
	}
	if st.KernelsRun == 0 || st.CopiesRun == 0 {
		t.Errorf("the board ran %d kernels and %d copies", st.KernelsRun, st.CopiesRun)
	}
	if err := bars.Err(); err != nil {
		t.Error(err)
	}
}

// Without BAR5 a PV driver cannot start: the hypercall window reads
// all-ones and the BARs say why.
func TestPVWithoutBAR5(t *testing.T) {
	bars := &BARs{}
	bars.win[nvc0.BAR0] = constWindow(nvc0.Boot0Value)
	bars.bars[nvc0.BAR0] = BAR{Index: 0, Size: nvc0.BAR0Size}
	if v := bars.Read32(5, 0); v != nvc0.ReadAllOnes {
		t.Errorf("BAR5 read %#x", v)
	}
	if err := bars.Err(); err == nil || !strings.Contains(err.Error(), "BAR5 is not mapped") {
		t.Errorf("Err = %v", err)
	}
}

type constWindow uint32

func (c constWindow) load32(uint64) uint32   { return uint32(c) }
func (c constWindow) store32(uint64, uint32) {}
func (c constWindow) size() uint64           { return nvc0.BAR0Size }
func (c constWindow) close() error           { return nil }
