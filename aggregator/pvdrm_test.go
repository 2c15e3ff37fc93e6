package aggregator

import (
	"context"
	"hash/fnv"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/gpu/hostmem"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
	"github.com/gpuvm/gpuvm/pvdrm"
)

// pvdrmGuest is a pvdrm VM in the test process: its GART heap, its ring
// (local transport), the back end serving it and the front end's client.
type pvdrmGuest struct {
	gart   *hostmem.RAM
	b      *PVDRMBackend
	c      *pvdrm.Client
	shares *pvdrm.LocalShares
	front  *pvdrm.Local
	cancel context.CancelFunc
	served chan error
	halted bool
}

func (g *pvdrmGuest) driver() gdev.Driver { return gdev.PVDRM(g.c, g.shares) }

// halt stops the back end's serving goroutine (its state may then be
// read).
func (g *pvdrmGuest) halt() {
	if g.halted {
		return
	}
	g.cancel()
	<-g.served
	g.halted = true
}

// stop ends the back end as a vanished front end does, and detaches.
func (g *pvdrmGuest) stop(t testing.TB) {
	t.Helper()
	if g.cancel == nil {
		return
	}
	g.halt()
	if err := g.b.Close(); err != nil {
		t.Errorf("back end close: %v", err)
	}
	g.cancel = nil
}

func dupAll(t testing.TB, fs []*os.File) []*os.File {
	t.Helper()
	out, err := dupFiles(fs)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func startPVDRM(t testing.TB, agg *Aggregator, name, mode string) *pvdrmGuest {
	t.Helper()
	return startPVDRMWith(t, agg, name, mode, nil)
}

// startPVDRMWith is startPVDRM with before run on the guest after its
// back end is attached and before it serves.
func startPVDRMWith(t testing.TB, agg *Aggregator, name, mode string, before func(*pvdrmGuest)) *pvdrmGuest {
	t.Helper()
	return startPVDRMFeatures(t, agg, name, mode, pvdrm.Features, before)
}

// startPVDRMFeatures is startPVDRMWith for a front end that asks for
// features at HELLO.
func startPVDRMFeatures(t testing.TB, agg *Aggregator, name, mode string, features uint64, before func(*pvdrmGuest)) *pvdrmGuest {
	t.Helper()
	h := fnv.New32a()
	h.Write([]byte(name))
	return startPVDRMDomain(t, agg, h.Sum32(), name, mode, features, before)
}

// startPVDRMDomain is startPVDRMFeatures for domain domid.
func startPVDRMDomain(t testing.TB, agg *Aggregator, domid uint32, name, mode string, features uint64, before func(*pvdrmGuest)) *pvdrmGuest {
	t.Helper()
	g := &pvdrmGuest{}
	var err error
	if g.gart, err = hostmem.New(name+"-gart", 128<<20); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.gart.Close() })
	gf, err := g.gart.File()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gf.Close() })
	if g.front, err = pvdrm.NewLocalFront(1); err != nil {
		t.Fatal(err)
	}
	back, err := pvdrm.AttachLocalBack(dupAll(t, g.front.Files()))
	if err != nil {
		t.Fatal(err)
	}
	if g.b, err = agg.AttachPVDRM(Guest{DomID: domid, Name: name, Mode: mode}, gf, g.gart.Size(), back); err != nil {
		t.Fatal(err)
	}
	if before != nil {
		before(g)
	}
	ctx, cancel := context.WithCancel(context.Background())
	g.cancel, g.served = cancel, make(chan error, 1)
	go func() { g.served <- g.b.Serve(ctx) }()
	t.Cleanup(func() { g.stop(t) })
	if g.c, err = pvdrm.Connect(context.Background(), g.front, features); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.c.Close() })
	g.shares = pvdrm.NewLocalShares(g.gart.Fd(), g.gart.Size(), g.c.Features&pvdrm.FeaturePooling != 0)
	t.Cleanup(func() { g.shares.Close() })
	return g
}

func TestPVDRMWorkloads(t *testing.T) {
	for _, mode := range []string{"pvdrm", "pvdrm-pooling"} {
		t.Run(mode, func(t *testing.T) {
			agg, _ := newTestAggregator(t, 2)
			g := startPVDRM(t, agg, "vm1", mode)
			for _, name := range workloads.Names() {
				w, err := workloads.New(name, smallParams)
				if err != nil {
					t.Fatal(err)
				}
				for range 2 {
					if _, err := w.Run(g.driver()); err != nil {
						t.Fatalf("%s on %s: %v", name, mode, err)
					}
				}
			}
			c := g.b.VGPU().Counters()
			t.Logf("%s counters: %+v, front end mapped %d shares", mode, c, g.shares.Mappings())
			if c.PVDRMRequests == 0 || c.Doorbells == 0 || c.Scans != 0 || c.Denied != 0 {
				t.Errorf("counters: %+v", c)
			}
			if (mode == "pvdrm-pooling") != (c.PVDRMPoolHits > 0) {
				t.Errorf("%s: %d pool hits", mode, c.PVDRMPoolHits)
			}
		})
	}
}

var _ = unix.Getpid
