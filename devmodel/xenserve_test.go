package devmodel_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/bench"
	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/devmodel"
	"github.com/gpuvm/gpuvm/gpu/hostmem"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
	"github.com/gpuvm/gpuvm/guest-driver/xenguest"
	"github.com/gpuvm/gpuvm/ipc"
	"github.com/gpuvm/gpuvm/xen/ioreq"
	"github.com/gpuvm/gpuvm/xen/ioreq/ioreqtest"
	"github.com/gpuvm/gpuvm/xen/privcmd"
)

// xenHost is an aggregator serving Xen guests, whose domains' memory is
// played by memfds (the DomainRAM seam; on Xen, foreign mappings).
type xenHost struct {
	agg    *aggregator.Aggregator
	socket string
	mu     sync.Mutex
	mems   map[uint32]int // domid → memfd of its memory
}

func newXenHost(t *testing.T, onXen bool) *xenHost {
	return newXenHostWith(t, onXen, 1<<30, config.PartitionConfig{VRAMPerVM: 256 << 20, ChannelsPerVM: 8, BAR1PerVM: 16 << 20, BAR3PerVM: 4 << 20, Reserved: 128 << 20})
}

func newXenHostWith(t *testing.T, onXen bool, vram uint64, part config.PartitionConfig) *xenHost {
	t.Helper()
	cfg := sim.DefaultConfig()
	cfg.VRAMSize, cfg.MemPartitions = vram, 4
	layout, err := aggregator.NewLayout(part, 2, cfg.VRAMSize, cfg.Channels)
	if err != nil {
		t.Fatal(err)
	}
	cfg.VRAMSegments = layout.Segments(cfg.VRAMSize)
	board, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { board.Close() })
	h := &xenHost{mems: map[uint32]int{}}
	opts := aggregator.Options{MaxVMs: 2, Channels: cfg.Channels, Partition: part}
	if onXen {
		opts.DomainRAM = func(dom uint32, size uint64) ([]byte, func() error, error) {
			h.mu.Lock()
			fd, ok := h.mems[dom]
			h.mu.Unlock()
			if !ok {
				return nil, nil, errors.New("no such domain")
			}
			b, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
			if err != nil {
				return nil, nil, err
			}
			return b, func() error { return unix.Munmap(b) }, nil
		}
	}
	if h.agg, err = aggregator.New(board, opts); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "gpuvm-xenhost-")
	if err != nil {
		t.Fatal(err)
	}
	h.socket = filepath.Join(dir, "agg.sock")
	ln, err := ipc.Listen(h.socket, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- h.agg.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-served; ln.Close(); h.agg.Close(); os.RemoveAll(dir) })
	return h
}

// domain creates a domain's memory and returns it as the guest's DMA
// memory (guest-physical address = offset).
func (h *xenHost) domain(t *testing.T, dom uint32, size uint64) *hostmem.RAM {
	t.Helper()
	ram, err := hostmem.New("domain", size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ram.Close() })
	h.mu.Lock()
	h.mems[dom] = ram.Fd()
	h.mu.Unlock()
	return ram
}

// waitGone waits until domain dom has no vGPU on h (its detach runs
// after its device model's connection ended).
func (h *xenHost) waitGone(t *testing.T, dom uint32) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
		gone := true
		for _, v := range h.agg.VGPUs() {
			gone = gone && v.Guest.DomID != dom
		}
		if gone {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("domain %d still has a vGPU a minute after its device model closed", dom)
		}
	}
}

// startXenDM starts the device model of domain dom (its memory mem) over
// a new in-memory hypervisor, the BARs placed as for a PVH guest; resume
// is its XenConfig.ResumeTimeout.
func (h *xenHost) startXenDM(ctx context.Context, t *testing.T, dom uint32, name, mode string, mem *hostmem.RAM, resume time.Duration) (*devmodel.XenModel, *ioreqtest.Xen) {
	t.Helper()
	x, err := ioreqtest.New(1)
	if err != nil {
		t.Fatal(err)
	}
	dev, _ := privcmd.MakeSBDF(0, 0, 5, 0)
	m, err := devmodel.StartXen(ctx, devmodel.XenConfig{Socket: h.socket, DomID: dom, Name: name, Mode: mode,
		RAMSize: mem.Size(), Device: dev, PlaceMem: 0xE0000000, PlaceIO: 0xC000, ResumeTimeout: resume,
		OpenServer: func(c ioreq.Config) (devmodel.IoreqServer, error) { return ioreq.NewServer(x.Page(), x.Notifiers(), c) }})
	if err != nil {
		t.Fatal(err)
	}
	return m, x
}

// serveGuest serves m's ioreqs in the background (its end on served)
// and returns the guest's side of its BARs, at the addresses m placed them.
func serveGuest(ctx context.Context, t *testing.T, m *devmodel.XenModel, x *ioreqtest.Xen) (served chan error, mmio *trappedMMIO) {
	served = make(chan error, 1)
	go func() { served <- m.Serve(ctx) }()
	place := map[int]devmodel.BARPlacement{}
	for _, p := range m.Placements() {
		place[p.Index] = p
	}
	return served, &trappedMMIO{t: t, x: x, place: place, traps: map[[2]int]int{}}
}

// trappedMMIO is the guest's side: each register access is one ioreq
// through the in-memory hypervisor, at the address the BARs were placed.
type trappedMMIO struct {
	t     *testing.T
	x     *ioreqtest.Xen
	place map[int]devmodel.BARPlacement
	traps map[[2]int]int // {BAR, write} → traps
	dead  bool           // an access failed: the rest read all-ones at once
}

func (m *trappedMMIO) req(bar int, off uint64, write bool, v uint32) uint32 {
	w := 0
	if write {
		w = 1
	}
	m.traps[[2]int{bar, w}]++
	p, ok := m.place[bar]
	if !ok || !p.Enabled || m.dead {
		return 0xFFFFFFFF
	}
	kind := ioreq.KindMMIO
	if p.IO {
		kind = ioreq.KindPIO
	}
	// Bounded: with no device model serving (a test failing), the guest's
	// access fails instead of hanging the test.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got, err := m.x.Access(ctx, ioreq.Request{Kind: kind, Addr: p.Base + off, Size: 4, Write: write, Data: uint64(v)})
	if err != nil {
		m.t.Errorf("BAR%d %#x: %v", bar, off, err)
		m.dead = true
		return 0xFFFFFFFF
	}
	return uint32(got)
}

// Fill32 is one REP STOSD: Xen clips it to ioreq.MaxReps repetitions per
// ioreq and restarts the instruction for the rest.
func (m *trappedMMIO) Fill32(bar int, off uint64, v uint32, n int) {
	p, ok := m.place[bar]
	if !ok || !p.Enabled || p.IO {
		m.t.Errorf("fill of BAR%d", bar)
		return
	}
	for n > 0 {
		reps := min(n, ioreq.MaxReps)
		m.traps[[2]int{bar, 1}]++
		if _, err := m.x.Access(context.Background(), ioreq.Request{Kind: ioreq.KindMMIO, Addr: p.Base + off, Size: 4, Write: true, Data: uint64(v), Count: reps}); err != nil {
			m.t.Errorf("fill of BAR%d %#x: %v", bar, off, err)
		}
		off += uint64(4 * reps)
		n -= reps
	}
}

func (m *trappedMMIO) Read32(bar int, off uint64) uint32     { return m.req(bar, off, false, 0) }
func (m *trappedMMIO) Write32(bar int, off uint64, v uint32) { m.req(bar, off, true, v) }

// TestXenDeviceModelEndToEnd runs the guest driver of a "Xen domain"
// through the whole Xen path but the hypervisor: its accesses are ioreqs,
// the device model forwards them, and the aggregator reaches the guest's
// buffers in the domain's own memory (no memfd crosses the socket). Both
// a full-virtualization and a para-virtual guest (hypercalls through the
// I/O BAR's ports) verify madd; destroying the vGPU ends the device model.
func TestXenDeviceModelEndToEnd(t *testing.T) {
	h := newXenHost(t, true)
	for i, mode := range []string{"fv-optimized", "pv-multicall"} {
		t.Run(mode, func(t *testing.T) {
			dom := uint32(11 + i)
			mem := h.domain(t, dom, 64<<20)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			m, x := h.startXenDM(ctx, t, dom, "xen-"+mode, mode, mem, 0)
			// Nothing can pass an aperture page through on Xen: no remap
			// table is kept or offered, in either mode.
			if r, ok := m.Welcome().Params[ipc.ParamRemap]; ok {
				t.Errorf("Welcome offers remap (%q) to a Xen domain's device model", r)
			}
			served, mmio := serveGuest(ctx, t, m, x)
			place := mmio.place
			if p := place[nvc0.BAR3]; !p.Enabled || p.Size != 4<<20 || p.Base%p.Size != 0 {
				t.Fatalf("BAR3 placed %+v: want the 4 MiB slice, aligned", p)
			}
			drv, err := nouveau.Open(mmio, mem, nouveau.Options{BAR1Size: place[nvc0.BAR1].Size, BAR3Size: place[nvc0.BAR3].Size, PV: bench.DriverPVMode(mode)})
			if err != nil {
				t.Fatal(err)
			}
			w, err := workloads.New("madd", workloads.Params{MatrixDim: 16})
			if err != nil {
				t.Fatal(err)
			}
			res := bench.RunWorkload(ctx, mode, gdev.Nouveau(drv), w, 1, func() map[string]uint64 { return nil }, nil)
			if !res.Verified {
				t.Fatalf("madd on the Xen path: %+v", res)
			}
			t.Logf("%s: %+v; traps by {BAR, write}: %v", mode, m.Stats(), mmio.traps)
			if st := m.Stats(); st.Served < 100 || st.HandlerErrors != 0 {
				t.Errorf("ioreq server stats %+v", st)
			}
			drv.Close()
			for _, v := range h.agg.VGPUs() {
				if v.Guest.DomID == dom {
					if c := v.Counters(); c.RemappedPages != 0 {
						t.Errorf("%d aperture pages remapped for a Xen domain", c.RemappedPages)
					}
					if err := h.agg.Destroy(v, "test"); err != nil {
						t.Fatal(err)
					}
				}
			}
			select {
			case err := <-served:
				if err == nil || !strings.Contains(err.Error(), "aggregator ended") {
					t.Fatalf("Serve after the vGPU was destroyed: %v", err)
				}
			case <-time.After(time.Minute):
				t.Fatal("the device model outlived its vGPU")
			}
			if err := m.Close(); err != nil {
				t.Logf("close: %v", err)
			}
		})
	}
}

// TestXenRAMRefused: a daemon not serving Xen refuses a device model that
// offers a domain's own RAM, and says how to start one that does.
func TestXenRAMRefused(t *testing.T) {
	h := newXenHost(t, false)
	_, err := devmodel.StartXen(context.Background(), devmodel.XenConfig{Socket: h.socket, DomID: 3, Name: "x", Mode: "fv-optimized", RAMSize: 1 << 20,
		OpenServer: func(ioreq.Config) (devmodel.IoreqServer, error) { t.Fatal("opened an ioreq server"); return nil, nil }})
	var re *ipc.RejectedError
	if !errors.As(err, &re) || !strings.Contains(err.Error(), "gpuvm serve --xen") {
		t.Fatalf("got %v", err)
	}
}

// TestXenDMAStaysInTheGuestsBuffers runs the guest driver as it runs in a
// Xen guest (gpuvm guest: DMA buffers in a range of guest RAM the guest
// kernel leaves alone, mapped from "/dev/mem" — here the domain's memory
// itself), with the daemon's default partition, and checks that the vGPU
// wrote nothing outside that range: GPU DMA that missed it would land in
// the guest kernel's memory.
func TestXenDMAStaysInTheGuestsBuffers(t *testing.T) {
	def := config.Default()
	h := newXenHostWith(t, true, uint64(def.Board.VRAM), def.Partition)
	dev, _ := privcmd.MakeSBDF(0, 0, 5, 0)
	const dom, dmaBase, dmaSize = 21, 32 << 20, 16 << 20
	mem := h.domain(t, dom, 64<<20)
	b := mem.Bytes()
	for i := range b {
		b[i] = byte(i*7 + 1)
	}
	dma, err := xenguest.OpenDMA(xenguest.DMAConfig{Base: dmaBase, Size: dmaSize, DevMem: fmt.Sprintf("/proc/self/fd/%d", mem.Fd()), IOMem: "/nonexistent"})
	if err != nil {
		t.Fatal(err)
	}
	defer dma.Close()
	x, err := ioreqtest.New(1)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, mode := range []string{"fv-optimized", "pv-multicall"} {
		m, err := devmodel.StartXen(ctx, devmodel.XenConfig{Socket: h.socket, DomID: dom, Name: "xen-dma", Mode: mode,
			RAMSize: mem.Size(), Device: dev, PlaceMem: 0xE0000000, PlaceIO: 0xC000,
			OpenServer: func(c ioreq.Config) (devmodel.IoreqServer, error) { return ioreq.NewServer(x.Page(), x.Notifiers(), c) }})
		if err != nil {
			t.Fatal(err)
		}
		served, mmio := serveGuest(ctx, t, m, x)
		place := mmio.place
		drv, err := nouveau.Open(mmio, dma, nouveau.Options{BAR1Size: place[nvc0.BAR1].Size, BAR3Size: place[nvc0.BAR3].Size, PV: bench.DriverPVMode(mode)})
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"madd", "cpy"} {
			w, err := workloads.New(name, workloads.Params{MatrixDim: 16, CopyBytes: 64 << 10})
			if err != nil {
				t.Fatal(err)
			}
			if res := bench.RunWorkload(ctx, mode, gdev.Nouveau(drv), w, 1, func() map[string]uint64 { return nil }, nil); !res.Verified {
				t.Fatalf("%s %s: %+v", mode, name, res)
			}
		}
		drv.Close()
		if err := m.Close(); err != nil {
			t.Logf("close: %v", err)
		}
		<-served
		h.waitGone(t, dom) // the detach ends after the connection: the next mode's Hello names the same domain
		for i := range b {
			if (i < dmaBase || i >= dmaBase+dmaSize) && b[i] != byte(i*7+1) {
				t.Fatalf("%s: guest RAM at %#x was written (%#x), outside the DMA range %#x+%#x", mode, i, b[i], dmaBase, dmaSize)
			}
		}
	}
}
