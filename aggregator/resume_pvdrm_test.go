package aggregator

import (
	"bytes"
	"context"
	"io"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/guest-driver/gdev"

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

// TestPVDRMFrontEndResumes: a pvdrm front end (pvdrm.DialLocal, as `gpuvm
// pvdrm` runs it) outlives a save of its vGPU: on the saved Bye it dials
// the restoring daemon with a resuming Hello, is refused no-image until
// the image arrives (a counters call made meanwhile waits for the resume),
// and then goes on with the gdev context it opened
// before the save — its VRAM buffer reads back, madd runs in it — and
// runs fresh verified workloads; the honest VM beside is untouched.
func TestPVDRMFrontEndResumes(t *testing.T) {
	src, _ := newTestAggregator(t, 2)
	dst, _ := newTestAggregator(t, 2)
	honest, marker := honestBeside(t, dst)
	srcSock, dstSock := serveOnSocket(t, src), serveOnSocket(t, dst)
	fe, err := pvdrm.DialLocal(context.Background(), pvdrm.DialConfig{Socket: srcSock, DomID: 21, Name: "drm-fe", Mode: "pvdrm-pooling",
		GARTSize: 128 << 20, ResumeTimeout: 30 * time.Second, ResumeSockets: []string{dstSock}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fe.Close() })
	s := &pvdrmScene{dst: dst, honest: honest, marker: marker, g: &pvdrmGuest{c: fe.Client, shares: fe.Shares.(*pvdrm.LocalShares)}}
	if s.ctx, err = gdev.NewContextOn(s.g.driver()); err != nil {
		t.Fatal(err)
	}
	if err := maddOnce(s.ctx, 16); err != nil {
		t.Fatalf("madd before the save: %v", err)
	}
	s.pattern = bytes.Repeat([]byte{1, 2, 3, 5, 8, 13, 21, 34}, 1<<13)
	if s.dev, err = s.ctx.MemAlloc(uint64(len(s.pattern))); err != nil {
		t.Fatal(err)
	}
	if err := s.ctx.MemcpyHtoD(s.dev, s.pattern); err != nil {
		t.Fatal(err)
	}
	vs := src.VGPUs()
	if len(vs) != 1 {
		t.Fatalf("%d vGPUs on the source", len(vs))
	}
	var img bytes.Buffer
	if _, err := src.Save(context.Background(), vs[0], &img, false); err != nil {
		t.Fatalf("save: %v", err)
	}
	// A call on the device-model connection that meets the saved Bye
	// goes on on the resumed one.
	counted := make(chan error, 1)
	go func() {
		_, err := fe.Counters(CounterNames()[:1])
		counted <- err
	}()
	time.Sleep(50 * time.Millisecond) // the front end is refused no-image meanwhile
	if _, err := dst.RegisterRestore(21, &img); err != nil {
		t.Fatalf("register: %v", err)
	}
	if err := <-counted; err != nil {
		t.Fatalf("counters across the save: %v", err)
	}
	s.verifyResumed(t)
	checkHonest(t, honest, marker)
	if n := len(src.VGPUs()); n != 0 {
		t.Fatalf("%d vGPUs left on the source", n)
	}
	if w := fe.Welcome(); w.VGPU != uint32(dst.VGPUs()[1].ID) && w.VGPU != uint32(dst.VGPUs()[0].ID) {
		t.Fatalf("the front end's Welcome names vGPU %d, not one of the restoring daemon's", w.VGPU)
	}
}

// TestPVDRMFrontEndGivesUp: a pvdrm front end whose saved vGPU is
// restored nowhere within its resume timeout gives up: its DRM calls and
// its calls on the device-model connection fail with the reason — none
// waits for a resume that will not come.
func TestPVDRMFrontEndGivesUp(t *testing.T) {
	src, _ := newTestAggregator(t, 2)
	sock := serveOnSocket(t, src)
	fe, err := pvdrm.DialLocal(context.Background(), pvdrm.DialConfig{Socket: sock, DomID: 22, Name: "drm-lost", Mode: "pvdrm",
		GARTSize: 64 << 20, ResumeTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fe.Close() })
	vs := src.VGPUs()
	if len(vs) != 1 {
		t.Fatalf("%d vGPUs", len(vs))
	}
	if _, err := src.Save(context.Background(), vs[0], io.Discard, false); err != nil {
		t.Fatalf("save: %v", err)
	}
	for i := range 2 { // during the resume, and after it gave up
		done := make(chan error, 1)
		go func() {
			_, err := fe.Counters(CounterNames()[:1])
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil {
				t.Fatalf("call %d: counters of a vGPU restored nowhere", i)
			}
			t.Logf("call %d: %v", i, err)
		case <-time.After(time.Minute): // a hang guard only
			t.Fatalf("call %d: the counters call still waits after the resume gave up", i)
		}
	}
	if _, err := fe.Client.Do(context.Background(), pvdrm.Request{Op: pvdrm.OpOpen}); err == nil {
		t.Fatal("a DRM call succeeded after the resume gave up")
	}
}

// TestHandoffWaitsForPVDRMBye: a handoff's commit of a pvdrm vGPU of the
// local transport returns only once its connection ended, the saved Bye
// written — an exec right after it would otherwise close the socket with
// the Bye unsent, and the front end would take that for a crash — and the
// front end then resumes.
func TestHandoffWaitsForPVDRMBye(t *testing.T) {
	src, _ := newTestAggregator(t, 2)
	dst, _ := newTestAggregator(t, 2)
	srcSock, dstSock := serveOnSocket(t, src), serveOnSocket(t, dst)
	fe, err := pvdrm.DialLocal(context.Background(), pvdrm.DialConfig{Socket: srcSock, DomID: 23, Name: "drm-handed", Mode: "pvdrm",
		GARTSize: 64 << 20, ResumeTimeout: 30 * time.Second, ResumeSockets: []string{dstSock}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fe.Close() })
	v := src.VGPUs()[0]
	var img bytes.Buffer
	h, err := src.Hold(context.Background(), v, &img, true)
	if err != nil {
		t.Fatal(err)
	}
	v.hangMu.Lock()
	ended := v.connEnded
	v.hangMu.Unlock()
	if ended == nil {
		t.Fatal("the pvdrm vGPU's connection is not one a commit waits for")
	}
	if err := h.Commit(); err != nil {
		t.Fatalf("commit: %v", err)
	}
	select {
	case <-ended:
	default:
		t.Fatal("the commit returned before the connection ended")
	}
	if _, err := dst.RegisterRestore(23, &img); err != nil {
		t.Fatal(err)
	}
	if _, err := fe.Counters(CounterNames()[:1]); err != nil {
		t.Fatalf("the front end did not resume: %v", err)
	}
}
