package aggregator

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/gpu/hostmem"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
	"github.com/gpuvm/gpuvm/pvdrm"
	"github.com/gpuvm/gpuvm/vgpuimage"
)

// pvdrmScene is a pvdrm VM saved off one daemon, with an honest VM on the
// daemon that restores it: the VM's front end (its client, ring and GART
// heap) stays in the test, detached, with a gdev context it opened before
// the save — its files, channel and GEM objects, among them a VRAM buffer
// holding pattern at dev.
type pvdrmScene struct {
	src, dst *Aggregator
	honest   *guestVM
	marker   []uint32
	g        *pvdrmGuest
	guest    Guest
	ctx      *gdev.Context
	dev      gdev.DevPtr
	pattern  []byte
	// dev2 holds pattern2: a second VRAM object, allocated right after
	// the first (a migration stream joins their ranges); none in scenes
	// made by hand.
	dev2     gdev.DevPtr
	pattern2 []byte
	image    []byte
}

func savePVDRMScene(t *testing.T, mode string) *pvdrmScene {
	t.Helper()
	return savePVDRMSceneBy(t, mode, func(src *Aggregator, v *VGPU, w io.Writer) (SaveStats, error) {
		return src.Save(context.Background(), v, w, false)
	})
}

// savePVDRMSceneBy is savePVDRMScene with the vGPU saved by save (which
// ends it on src).
func savePVDRMSceneBy(t *testing.T, mode string, save func(src *Aggregator, v *VGPU, w io.Writer) (SaveStats, error)) *pvdrmScene {
	t.Helper()
	s := &pvdrmScene{guest: Guest{DomID: 12, Name: "drm-saved", Mode: mode}}
	s.src, _ = newTestAggregator(t, 2)
	s.dst, _ = newTestAggregator(t, 2)
	s.honest, s.marker = honestBeside(t, s.dst)
	s.g = startPVDRMDomain(t, s.src, s.guest.DomID, s.guest.Name, mode, pvdrm.Features, nil)
	for _, name := range workloads.Names() {
		w, err := workloads.New(name, smallParams)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Run(s.g.driver()); err != nil {
			t.Fatalf("%s before the save: %v", name, err)
		}
	}
	var err error
	if s.ctx, err = gdev.NewContextOn(s.g.driver()); err != nil {
		t.Fatal(err)
	}
	if err := maddOnce(s.ctx, 16); err != nil {
		t.Fatalf("madd before the save: %v", err)
	}
	s.pattern = make([]byte, 3<<16)
	for i := range s.pattern {
		s.pattern[i] = byte(i*7 + i>>9)
	}
	if s.dev, err = s.ctx.MemAlloc(uint64(len(s.pattern))); err != nil {
		t.Fatal(err)
	}
	if err := s.ctx.MemcpyHtoD(s.dev, s.pattern); err != nil {
		t.Fatal(err)
	}
	s.pattern2 = bytes.Repeat([]byte{0xA5, 0x5A, 0x3C}, 1<<14)
	if s.dev2, err = s.ctx.MemAlloc(uint64(len(s.pattern2))); err != nil {
		t.Fatal(err)
	}
	if err := s.ctx.MemcpyHtoD(s.dev2, s.pattern2); err != nil {
		t.Fatal(err)
	}
	var img bytes.Buffer
	st, err := save(s.src, s.g.b.VGPU(), &img)
	if err != nil {
		t.Fatalf("save: %v", err)
	}
	if st.Bytes < uint64(len(s.pattern)) {
		t.Fatalf("the image carries %d bytes of VRAM, less than the buffer of %d", st.Bytes, len(s.pattern))
	}
	t.Logf("%s saved: %d bytes of VRAM, image %d bytes, pause %v, took %v", mode, st.Bytes, img.Len(), st.Pause, st.Took)
	if n := len(s.src.VGPUs()); n != 0 {
		t.Fatalf("the saved vGPU is still attached on its board (%d vGPUs)", n)
	}
	// The old back end found its vGPU gone and stopped serving.
	s.g.halt()
	if err := s.g.b.Close(); err != nil && !errors.Is(err, ErrDetached) {
		t.Fatalf("the saved back end's close: %v", err)
	}
	s.g.cancel = nil
	s.image = img.Bytes()
	return s
}

// resume reattaches the front end to a back end restored on s.dst from
// the image waiting for its domain, and serves it.
func (s *pvdrmScene) resume(t *testing.T) error {
	t.Helper()
	gf, err := s.g.gart.File()
	if err != nil {
		t.Fatal(err)
	}
	defer gf.Close()
	back, err := pvdrm.AttachLocalBack(dupAll(t, s.g.front.Files()))
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.dst.AttachPVDRMRestored(s.guest, gf, s.g.gart.Size(), back)
	if err != nil {
		back.Close()
		return err
	}
	s.g.b = b
	ctx, cancel := context.WithCancel(context.Background())
	s.g.cancel, s.g.served, s.g.halted = cancel, make(chan error, 1), false
	go func() { s.g.served <- b.Serve(ctx) }()
	t.Cleanup(func() { s.g.stop(t) })
	return nil
}

// restoreVerified registers s's image on s.dst, resumes the front end on
// it and runs its next verified work there; the honest VM is untouched.
func (s *pvdrmScene) restoreVerified(t *testing.T) {
	t.Helper()
	if _, err := s.dst.RegisterRestore(s.guest.DomID, bytes.NewReader(s.image)); err != nil {
		t.Fatalf("register: %v", err)
	}
	if err := s.resume(t); err != nil {
		t.Fatalf("resume: %v", err)
	}
	s.verifyResumed(t)
	checkHonest(t, s.honest, s.marker)
}

// onlyHonest checks that nothing but the honest VM is attached on s.dst
// and that its marker is untouched.
func (s *pvdrmScene) onlyHonest(t *testing.T) {
	t.Helper()
	if vs := s.dst.VGPUs(); len(vs) != 1 || vs[0] != s.honest.v {
		t.Fatalf("%d vGPUs attached on the restoring daemon, want the honest one only", len(vs))
	}
	checkHonest(t, s.honest, s.marker)
}

// verifyResumed runs the front end's next verified work on the restored
// back end: the buffer it filled before the save reads back, a madd runs
// in the context it opened before the save (its code and parameter
// objects, its channel), and fresh workloads run.
func (s *pvdrmScene) verifyResumed(t *testing.T) {
	t.Helper()
	got := make([]byte, len(s.pattern))
	if err := s.ctx.MemcpyDtoH(got, s.dev); err != nil {
		t.Fatalf("reading the buffer made before the save: %v", err)
	}
	if !bytes.Equal(got, s.pattern) {
		t.Fatal("the VRAM buffer made before the save does not read back its contents")
	}
	if s.pattern2 != nil {
		got2 := make([]byte, len(s.pattern2))
		if err := s.ctx.MemcpyDtoH(got2, s.dev2); err != nil {
			t.Fatalf("reading the second buffer made before the save: %v", err)
		}
		if !bytes.Equal(got2, s.pattern2) {
			t.Fatal("the second VRAM buffer made before the save does not read back its contents")
		}
		if err := s.ctx.MemFree(s.dev2); err != nil {
			t.Fatal(err)
		}
	}
	if err := maddOnce(s.ctx, 16); err != nil {
		t.Fatalf("madd in the context opened before the save: %v", err)
	}
	if err := s.ctx.MemFree(s.dev); err != nil {
		t.Fatal(err)
	}
	if err := s.ctx.Close(); err != nil {
		t.Fatalf("closing the context opened before the save: %v", err)
	}
	for _, name := range workloads.Names() {
		w, err := workloads.New(name, smallParams)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Run(s.g.driver()); err != nil {
			t.Fatalf("%s after the restore: %v", name, err)
		}
	}
}

// TestSaveRestorePVDRM: pvdrm and pvdrm-pooling vGPUs that ran verified
// workloads are saved off one daemon and restored on another, where the
// same front end goes on with the files, channel and GEM objects it made
// before the save; the honest VM beside is never read or changed.
func TestSaveRestorePVDRM(t *testing.T) {
	for _, mode := range []string{"pvdrm", "pvdrm-pooling"} {
		t.Run(mode, func(t *testing.T) {
			s := savePVDRMScene(t, mode)
			m, err := vgpuimage.Decode(bytes.NewReader(s.image))
			if err != nil {
				t.Fatal(err)
			}
			if m.PVDRM == nil || len(m.PVDRM.Files) != 1 || m.PVDRM.Objects() == 0 || len(m.Regs) != 0 {
				t.Fatalf("the image's pvdrm state: %+v, %d registers", m.PVDRM, len(m.Regs))
			}
			if (mode == "pvdrm-pooling") != (len(m.PVDRM.Pool) > 0) {
				t.Errorf("%s: %d pooled buffers saved", mode, len(m.PVDRM.Pool))
			}
			if _, err := s.dst.RegisterRestore(s.guest.DomID, bytes.NewReader(s.image)); err != nil {
				t.Fatalf("register: %v", err)
			}
			start := time.Now()
			if err := s.resume(t); err != nil {
				t.Fatalf("resume: %v", err)
			}
			t.Logf("%s restored in %v", mode, time.Since(start))
			s.verifyResumed(t)
			checkHonest(t, s.honest, s.marker)
			if c := s.g.b.VGPU().Counters(); c.PVDRMRequests == 0 || c.Denied != 0 {
				t.Errorf("restored vGPU's counters: %+v", c)
			}
		})
	}
}

// newGART is a GART heap for a front end made by hand.
func newGART(t *testing.T, name string) (*hostmem.RAM, error) {
	t.Helper()
	r, err := hostmem.New(name+"-gart", 128<<20)
	if err == nil {
		t.Cleanup(func() { r.Close() })
	}
	return r, err
}

// TestSavePVDRMKept: a pvdrm vGPU saved with keep stays parked on its
// daemon, its back end serves on, and the same front end's next work
// (its VRAM buffer from before the save, a madd in its context) brings
// the vGPU back there.
func TestSavePVDRMKept(t *testing.T) {
	agg, _ := newTestAggregator(t, 2)
	g := startPVDRMDomain(t, agg, 14, "drm-kept", "pvdrm", pvdrm.Features, nil)
	s := &pvdrmScene{g: g}
	var err error
	if s.ctx, err = gdev.NewContextOn(g.driver()); err != nil {
		t.Fatal(err)
	}
	s.pattern = bytes.Repeat([]byte{9, 8, 7, 6}, 1<<14)
	if s.dev, err = s.ctx.MemAlloc(uint64(len(s.pattern))); err != nil {
		t.Fatal(err)
	}
	if err := s.ctx.MemcpyHtoD(s.dev, s.pattern); err != nil {
		t.Fatal(err)
	}
	s.pattern2 = bytes.Repeat([]byte{0xA5, 0x5A, 0x3C}, 1<<14)
	if s.dev2, err = s.ctx.MemAlloc(uint64(len(s.pattern2))); err != nil {
		t.Fatal(err)
	}
	if err := s.ctx.MemcpyHtoD(s.dev2, s.pattern2); err != nil {
		t.Fatal(err)
	}
	var img bytes.Buffer
	if _, err := agg.Save(context.Background(), g.b.VGPU(), &img, true); err != nil {
		t.Fatalf("save: %v", err)
	}
	if !g.b.VGPU().evicted.Load() {
		t.Fatal("the kept vGPU is not parked")
	}
	if _, err := vgpuimage.Decode(&img); err != nil {
		t.Fatalf("the kept vGPU's image: %v", err)
	}
	s.verifyResumed(t)
	if g.b.VGPU().evicted.Load() {
		t.Fatal("the kept vGPU is still parked after its front end's work")
	}
}
