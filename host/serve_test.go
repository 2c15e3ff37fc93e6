package host

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/gpu/hostmem"
	"github.com/gpuvm/gpuvm/ipc"
)

// TestFullBoardPlacesAgain: placement chose a board whose last slot another
// VM took before this VM attached (the race of two VMs connecting at once,
// made here by a choice that ignores the board is full). The VM is not
// refused: it is placed again among the other boards, and attaches there.
func TestFullBoardPlacesAgain(t *testing.T) {
	h := newTestHost(t, Options{}, 1, 1)
	fast, slow := h.Board("fast"), h.Board("slow")
	if b, _, _ := attach(t, h, 1, "first"); b == nil {
		t.Fatal("the first VM was not placed")
	}
	full := fast
	if len(slow.Agg.VGPUs()) == 1 {
		full = slow
	}
	dir := t.TempDir()
	ln, err := ipc.Listen(filepath.Join(dir, "g.sock"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan bool, 1)
	go func() {
		p, err := ln.Accept(ctx)
		if err != nil {
			served <- false
			return
		}
		stale := func(g aggregator.Guest) (*Board, Decision) { return full, Decision{} } // chosen before the other VM took it
		served <- h.serveOn(ctx, p, aggregator.Guest{DomID: p.Hello().DomID, Name: p.Hello().Name, Mode: p.Hello().Mode}, stale, nil)
	}()
	ram, err := hostmem.New("second", 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer ram.Close()
	f, err := ram.File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dctx, dcancel := context.WithTimeout(ctx, time.Minute)
	defer dcancel()
	c, w, extra, err := ipc.Dial(dctx, filepath.Join(dir, "g.sock"), ipc.Hello{DomID: 2, Name: "second", Mode: "fv-naive", RAMSize: ram.Size(), Transport: ipc.TransportShm}, f, nil, nil)
	if err != nil {
		t.Fatalf("the VM placed on a full board was refused: %v", err)
	}
	for _, x := range extra {
		x.Close()
	}
	b, v := h.Lookup(int(w.VGPU))
	if v == nil || b == full {
		t.Fatalf("the VM landed on %v, want the board other than the full %s", b, full.Name)
	}
	var again bool
	for _, d := range h.Decisions() {
		for _, c := range d.Candidates {
			again = again || c.Excluded == "found full when the VM attached"
		}
	}
	if !again {
		t.Fatalf("no decision records the second placement: %+v", h.Decisions())
	}
	c.Close()
	if !<-served {
		t.Fatal("serveOn reports the VM not served")
	}
}
