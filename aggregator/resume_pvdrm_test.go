package aggregator

import (
	"context"
	"strings"
	"testing"

	"github.com/gpuvm/gpuvm/gpu/hostmem"
	"github.com/gpuvm/gpuvm/ipc"
)

// TestResumingPVDRMRefused: a device model that says it resumes a saved
// vGPU (the Hello's resume flag) in a pvdrm mode is refused: no pvdrm vGPU
// is ever saved, and a fresh one is what the flag exists to rule out.
func TestResumingPVDRMRefused(t *testing.T) {
	agg, _ := newTestAggregator(t, 2)
	sock := serveOnSocket(t, agg)
	ram, err := hostmem.New("pvdrm-resume", 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ram.Close() })
	f, err := ram.File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c, _, extra, err := ipc.Dial(context.Background(), sock,
		ipc.Hello{DomID: 9, Name: "pvdrm-guest", Mode: "pvdrm", RAMSize: ram.Size(), Transport: ipc.TransportShm, Resume: true}, f, nil, nil)
	if err == nil {
		for _, x := range extra {
			x.Close()
		}
		c.Close()
		t.Fatal("a resuming pvdrm device model was welcomed")
	}
	if !strings.Contains(err.Error(), "pvdrm vGPUs are never saved") {
		t.Fatalf("refused with %v, want the pvdrm reason", err)
	}
	if n := len(agg.VGPUs()); n != 0 {
		t.Fatalf("%d vGPUs attached after the refusal", n)
	}
}
