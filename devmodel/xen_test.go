package devmodel_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/devmodel"
	"github.com/gpuvm/gpuvm/gpu/hostmem"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/ipc"
	"github.com/gpuvm/gpuvm/xen/ioreq"
	"github.com/gpuvm/gpuvm/xen/ioreq/ioreqtest"
	"github.com/gpuvm/gpuvm/xen/privcmd"
)

// dialAggregator serves a real aggregator on a socket and connects a VM's
// device-model connection to it.
func dialAggregator(t *testing.T) *ipc.Client {
	t.Helper()
	cfg := sim.DefaultConfig()
	cfg.VRAMSize, cfg.MemPartitions = 1<<30, 4
	board, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { board.Close() })
	agg, err := aggregator.New(board, aggregator.Options{MaxVMs: 2, Channels: cfg.Channels,
		Partition: config.PartitionConfig{VRAMPerVM: 256 << 20, ChannelsPerVM: 8, BAR1PerVM: 16 << 20, BAR3PerVM: 4 << 20, Reserved: 128 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "gpuvm-xen-")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := ipc.Listen(filepath.Join(dir, "agg.sock"), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- agg.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-served; ln.Close(); agg.Close(); os.RemoveAll(dir) })
	ram, err := hostmem.New("xen-guest", 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ram.Close() })
	f, err := ram.File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c, _, extra, err := ipc.Dial(context.Background(), filepath.Join(dir, "agg.sock"),
		ipc.Hello{DomID: 5, Name: "xen-guest", Mode: "fv-lazy", RAMSize: ram.Size(), Transport: ipc.TransportShm}, f, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range extra {
		x.Close()
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// The guest's accesses as Xen forwards them: its firmware sizes and places
// BAR0 through config space, reads PMC_BOOT_0 at the address it chose
// (every width), moves the BAR (the old address reaches the device model
// no more) and turns decoding off; accesses to another function or
// outside the BARs are refused (reads return all ones).
func TestXenRouterFollowsTheGuest(t *testing.T) {
	client := dialAggregator(t)
	dev, err := privcmd.MakeSBDF(0, 0, 5, 0)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := privcmd.MakeSBDF(0, 0, 6, 0)
	x, err := ioreqtest.New(1)
	if err != nil {
		t.Fatal(err)
	}
	router := devmodel.NewXenRouter(dev, client, nil)
	srv := x.Serve(t, ioreq.Config{Handler: router.Handle, Claims: []ioreq.Claim{ioreq.PCIDevice(dev)}})
	if err := router.Attach(srv); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	access := func(r ioreq.Request) uint64 {
		t.Helper()
		v, err := x.Access(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	cfgRead := func(off uint64) uint64 {
		return access(ioreq.Request{Kind: ioreq.KindPCIConfig, Device: dev, Addr: off, Size: 4})
	}
	cfgWrite := func(off, v uint64) {
		access(ioreq.Request{Kind: ioreq.KindPCIConfig, Device: dev, Addr: off, Size: 4, Write: true, Data: v})
	}
	mmio := func(addr uint64, size int) uint64 {
		return access(ioreq.Request{Kind: ioreq.KindMMIO, Addr: addr, Size: size})
	}
	if id := cfgRead(0); id != uint64(nvc0.PCIDeviceQuadro6000)<<16|nvc0.PCIVendorNVIDIA {
		t.Fatalf("vendor/device %#x", id)
	}
	cfgWrite(0x10, 0xFFFFFFFF)
	if mask := cfgRead(0x10); mask != uint64(^uint32(nvc0.BAR0Size-1)) {
		t.Errorf("BAR0 size mask %#x", mask)
	}
	cfgWrite(0x10, 0xE0000000)
	if got := mmio(0xE0000000, 4); got != 0xFFFFFFFF {
		t.Errorf("BAR0 decoded before the command register enables memory: %#x", got)
	}
	cfgWrite(0x04, 0x2) // memory decode on
	if got := mmio(0xE0000000+nvc0.RegBoot0, 4); got != nvc0.Boot0Value {
		t.Fatalf("PMC_BOOT_0 through the ioreq path: %#x, want %#x", got, nvc0.Boot0Value)
	}
	if got := mmio(0xE0000000+nvc0.RegBoot0+3, 1); got != nvc0.Boot0Value>>24 {
		t.Errorf("byte 3 of PMC_BOOT_0: %#x", got)
	}
	if got := mmio(0xE0000000+nvc0.RegBoot0+2, 2); got != nvc0.Boot0Value>>16 {
		t.Errorf("upper half of PMC_BOOT_0: %#x", got)
	}
	if got := mmio(0xE0000000+nvc0.RegBoot0, 8); uint32(got) != nvc0.Boot0Value {
		t.Errorf("8-byte read: %#x", got)
	}
	cfgWrite(0x10, 0xD0000000) // the firmware moves the BAR
	if got := mmio(0xE0000000, 4); got != 0xFFFFFFFF {
		t.Errorf("the BAR's old address still reaches the device: %#x", got)
	}
	if got := mmio(0xD0000000, 4); got != nvc0.Boot0Value {
		t.Errorf("at the new address: %#x", got)
	}
	if got := access(ioreq.Request{Kind: ioreq.KindPCIConfig, Device: other, Size: 4}); got != 0xFFFFFFFF {
		t.Errorf("another function's config space: %#x", got)
	}
	cfgWrite(0x04, 0) // decoding off
	if got := mmio(0xD0000000, 4); got != 0xFFFFFFFF {
		t.Errorf("decoded with the memory enable off: %#x", got)
	}
	if st := srv.Stats(); st.Refused < 4 {
		t.Errorf("refusals counted: %+v", st)
	}
}

// recordingBackend counts what reaches the aggregator's side.
type recordingBackend struct {
	writes int
	fills  []int // words per fill
}

func (b *recordingBackend) Read32(int, uint64) (uint32, error) { return 0, nil }
func (b *recordingBackend) Write32(int, uint64, uint32) error  { b.writes++; return nil }
func (b *recordingBackend) Fill32(_ int, _ uint64, _ uint32, n int) error {
	b.fills = append(b.fills, n)
	return nil
}

type claimAll struct{}

func (claimAll) Claim(ioreq.Claim) error   { return nil }
func (claimAll) Release(ioreq.Claim) error { return nil }

// TestXenRouterFillsWhole: a REP STOSL upwards into an aperture reaches
// the backend as one fill; what a fill cannot express (downwards, port
// strings, the I/O BAR) goes word by word.
func TestXenRouterFillsWhole(t *testing.T) {
	dev, _ := privcmd.MakeSBDF(0, 0, 5, 0)
	b := &recordingBackend{}
	router := devmodel.NewXenRouter(dev, b, nil)
	if err := router.Attach(claimAll{}); err != nil {
		t.Fatal(err)
	}
	place, err := router.PlaceBARs(0xE0000000, 0xC000)
	if err != nil {
		t.Fatal(err)
	}
	base := map[int]uint64{}
	for _, p := range place {
		base[p.Index] = p.Base
	}
	for _, c := range []struct {
		name          string
		req           ioreq.Request
		writes, fills int
	}{
		{"up", ioreq.Request{Kind: ioreq.KindMMIO, Addr: base[nvc0.BAR3] + 0x1000, Size: 4, Write: true, Count: ioreq.MaxReps}, 0, 1},
		{"down", ioreq.Request{Kind: ioreq.KindMMIO, Addr: base[nvc0.BAR3] + 0x4000, Size: 4, Write: true, Count: 16, Down: true}, 16, 0},
		{"8-byte", ioreq.Request{Kind: ioreq.KindMMIO, Addr: base[nvc0.BAR1], Size: 8, Write: true, Count: 4}, 8, 0},
		{"ports", ioreq.Request{Kind: ioreq.KindPIO, Addr: 0xC000, Size: 4, Write: true, Count: 3}, 3, 0},
	} {
		*b = recordingBackend{}
		if _, err := router.Handle(c.req); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if b.writes != c.writes || len(b.fills) != c.fills {
			t.Errorf("%s: %d writes and fills %v, want %d writes and %d fills", c.name, b.writes, b.fills, c.writes, c.fills)
		}
	}
	*b = recordingBackend{}
	if _, err := router.Handle(ioreq.Request{Kind: ioreq.KindMMIO, Addr: base[nvc0.BAR3], Size: 4, Write: true, Count: 1000}); err != nil {
		t.Fatal(err)
	}
	if len(b.fills) != 1 || b.fills[0] != 1000 {
		t.Errorf("fill of 1000 words reached the backend as %v", b.fills)
	}
}

// TestXenRouterPlaceAtAsSaved: placements recorded from one router (its
// guest's firmware programmed the config space; OnPlacements saw each
// change) put another router's BARs at the same addresses, decoding, so
// an access there reaches the backend as before; placements that do not
// fit the device (a BAR it lacks, a wrong size, a misaligned base) are
// refused.
func TestXenRouterPlaceAtAsSaved(t *testing.T) {
	dev, _ := privcmd.MakeSBDF(0, 0, 5, 0)
	first := devmodel.NewXenRouter(dev, &recordingBackend{}, nil)
	if err := first.Attach(claimAll{}); err != nil {
		t.Fatal(err)
	}
	var seen [][]devmodel.BARPlacement
	first.OnPlacements(func(ps []devmodel.BARPlacement) { seen = append(seen, ps) })
	// The firmware: BAR0 where hvmloader would put it, then decoding on.
	for _, w := range []ioreq.Request{
		{Kind: ioreq.KindPCIConfig, Device: dev, Addr: 0x10, Size: 4, Write: true, Data: 0xF0000000},
		{Kind: ioreq.KindPCIConfig, Device: dev, Addr: 0x04, Size: 2, Write: true, Data: 0x6},
	} {
		if _, err := first.Handle(w); err != nil {
			t.Fatal(err)
		}
	}
	if len(seen) != 3 {
		t.Fatalf("OnPlacements told %d times, want 3 (at once, then each write)", len(seen))
	}
	saved := seen[len(seen)-1]
	var bar0 devmodel.BARPlacement
	for _, p := range saved {
		if p.Index == nvc0.BAR0 {
			bar0 = p
		}
	}
	if bar0.Base != 0xF0000000 || !bar0.Enabled {
		t.Fatalf("BAR0 recorded as %+v", bar0)
	}

	b := &recordingBackend{}
	second := devmodel.NewXenRouter(dev, b, nil)
	if err := second.Attach(claimAll{}); err != nil {
		t.Fatal(err)
	}
	if err := second.PlaceAt(saved); err != nil {
		t.Fatal(err)
	}
	if got := second.ConfigSpace().Placements(); !slices.Equal(got, saved) {
		t.Fatalf("placed %+v, saved %+v", got, saved)
	}
	if _, err := second.Handle(ioreq.Request{Kind: ioreq.KindMMIO, Addr: 0xF0000000 + 0x100, Size: 4, Write: true, Count: 1}); err != nil || b.writes != 1 {
		t.Fatalf("a write at the saved BAR0: %v, %d writes", err, b.writes)
	}
	for _, bad := range []devmodel.BARPlacement{
		{Index: 2, Base: 0xF0000000, Size: bar0.Size},
		{Index: nvc0.BAR0, Base: 0xF0000000, Size: bar0.Size / 2},
		{Index: nvc0.BAR0, Base: 0xF0000000 + 0x1000, Size: bar0.Size, Enabled: true},
	} {
		if err := second.PlaceAt([]devmodel.BARPlacement{bad}); err == nil {
			t.Errorf("placement %+v taken", bad)
		}
	}
}
