package aggregator

import (
	"bytes"
	"context"
	"testing"

	"github.com/gpuvm/gpuvm/ipc"
	"github.com/gpuvm/gpuvm/pvdrm"
)

// dialResumingPVDRM connects g's front end (its GART heap and ring) to the
// daemon on sock with a resuming Hello, as a pvdrm front end process does
// after its vGPU was saved.
func dialResumingPVDRM(t *testing.T, sock string, guest Guest, g *pvdrmGuest) (*ipc.Client, error) {
	t.Helper()
	gf, err := g.gart.File()
	if err != nil {
		t.Fatal(err)
	}
	defer gf.Close()
	c, _, extra, err := ipc.Dial(context.Background(), sock,
		ipc.Hello{DomID: guest.DomID, Name: guest.Name, Mode: guest.Mode, RAMSize: g.gart.Size(), Transport: ipc.TransportShm, Resume: true},
		gf, g.front.Files(), nil)
	for _, x := range extra {
		x.Close()
	}
	return c, err
}

// TestResumingPVDRMNoImage: a pvdrm front end that says it resumes a saved
// vGPU while no image waits for its domain is refused with the no-image
// reason (it may try again) and nothing is attached: a fresh back end is
// what the resume flag exists to rule out.
func TestResumingPVDRMNoImage(t *testing.T) {
	agg, _ := newTestAggregator(t, 2)
	sock := serveOnSocket(t, agg)
	g := &pvdrmGuest{}
	var err error
	if g.front, err = pvdrm.NewLocalFront(1); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.front.Close() })
	if g.gart, err = newGART(t, "resume-noimage"); err != nil {
		t.Fatal(err)
	}
	c, err := dialResumingPVDRM(t, sock, Guest{DomID: 9, Name: "pvdrm-guest", Mode: "pvdrm"}, g)
	if err == nil {
		c.Close()
		t.Fatal("a resuming pvdrm front end was welcomed with no image waiting")
	}
	if !ipc.IsNoImage(err) {
		t.Fatalf("refused with %v, want the no-image reason", err)
	}
	if n := len(agg.VGPUs()); n != 0 {
		t.Fatalf("%d vGPUs attached after the refusal", n)
	}
}

// TestResumingPVDRMOverSocket: a saved pvdrm vGPU's front end comes back
// over the daemon's socket with a resuming Hello, bringing its ring and
// GART heap, and goes on on the restoring daemon with the handles it held.
func TestResumingPVDRMOverSocket(t *testing.T) {
	s := savePVDRMScene(t, "pvdrm-pooling")
	sock := serveOnSocket(t, s.dst)
	if _, err := s.dst.RegisterRestore(s.guest.DomID, bytes.NewReader(s.image)); err != nil {
		t.Fatalf("register: %v", err)
	}
	c, err := dialResumingPVDRM(t, sock, s.guest, s.g)
	if err != nil {
		t.Fatalf("resume: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	s.verifyResumed(t)
	checkHonest(t, s.honest, s.marker)
	if s.dst.HasRestore(s.guest.DomID) {
		t.Fatal("the image still waits after the resume")
	}
}
