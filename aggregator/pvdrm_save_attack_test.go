package aggregator

import (
	"bytes"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/gpuvm/gpuvm/ipc"
	"github.com/gpuvm/gpuvm/pvdrm"
	"github.com/gpuvm/gpuvm/vgpuimage"
)

// TestRestorePVDRMHostileImage: a saved pvdrm image edited to lie — a GEM
// object outside the slot's VRAM quota, the VM's address space or the
// GART heap, a duplicate handle, two objects at one address, counts over
// the back end's bounds, a VRAM page in no object, features never
// offered, a truncated stream — is refused with the reason and nothing
// stays attached; the honest VM beside is never read or changed. The edits
// are made to the decoded image and registered as decoded (past the
// format's own checks, which vgpuimage's tests cover), so that each is
// caught by the back end's paths. The front end, which waited through all
// of them, then resumes from the true image.
func TestRestorePVDRMHostileImage(t *testing.T) {
	s := savePVDRMScene(t, "pvdrm-pooling")
	vramGEM := func(m *vgpuimage.Image) *vgpuimage.PVDRMGEM {
		for i, g := range m.PVDRM.Files[0].GEMs {
			if g.Domain == vgpuimage.DomainVRAM {
				return &m.PVDRM.Files[0].GEMs[i]
			}
		}
		t.Fatal("no VRAM object in the image")
		return nil
	}
	gartGEM := func(m *vgpuimage.Image) *vgpuimage.PVDRMGEM {
		for i, g := range m.PVDRM.Files[0].GEMs {
			if g.Domain == vgpuimage.DomainGART {
				return &m.PVDRM.Files[0].GEMs[i]
			}
		}
		t.Fatal("no GART object in the image")
		return nil
	}
	for _, tc := range []struct {
		name string
		edit func(m *vgpuimage.Image)
	}{
		{"VRAM object past the VRAM quota", func(m *vgpuimage.Image) { vramGEM(m).Size = m.Identity.VRAM }},
		{"GEM address outside the VM", func(m *vgpuimage.Image) { vramGEM(m).VA = 0 }},
		{"GART object past the heap", func(m *vgpuimage.Image) { gartGEM(m).Place = m.PVDRM.GARTSize }},
		{"duplicate handle", func(m *vgpuimage.Image) {
			f := &m.PVDRM.Files[0]
			g := f.GEMs[0]
			g.VA = 1 << 38
			f.GEMs = append(f.GEMs, g)
		}},
		{"two objects at one address", func(m *vgpuimage.Image) {
			f := &m.PVDRM.Files[0]
			f.GEMs[1].VA = f.GEMs[0].VA
		}},
		{"files over the bound", func(m *vgpuimage.Image) {
			for i := range pvdrmMaxFiles {
				m.PVDRM.Files = append(m.PVDRM.Files, vgpuimage.PVDRMFile{ID: 1000 + uint32(i)})
			}
		}},
		{"channels over the quota", func(m *vgpuimage.Image) {
			f := &m.PVDRM.Files[0]
			for h := uint32(100); h < 100+m.Identity.Channels+1; h++ {
				f.Chans = append(f.Chans, vgpuimage.PVDRMChan{Handle: h})
			}
		}},
		{"pooled buffers over the bound", func(m *vgpuimage.Image) {
			for i := range pvdrmPoolCount + 1 {
				m.PVDRM.Pool = append(m.PVDRM.Pool, vgpuimage.PVDRMPooled{Flags: pvdrm.GEMMappable, Size: 4096,
					GART: m.PVDRM.GARTSize - uint64(i+1)*4096})
			}
		}},
		{"pooled buffer over a live one", func(m *vgpuimage.Image) {
			g := gartGEM(m)
			m.PVDRM.Pool = append(m.PVDRM.Pool, vgpuimage.PVDRMPooled{Flags: pvdrm.GEMMappable, Size: g.Size, GART: g.Place})
		}},
		{"VRAM page in no object", func(m *vgpuimage.Image) {
			m.Pages = append(m.Pages, vgpuimage.Page{Off: m.Identity.VRAM - 4096, Data: make([]byte, 4096)})
		}},
		{"features never offered", func(m *vgpuimage.Image) { m.PVDRM.Features |= 1 << 40 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := vgpuimage.Decode(bytes.NewReader(s.image))
			if err != nil {
				t.Fatal(err)
			}
			tc.edit(m)
			if _, err := s.dst.RegisterImage(s.guest.DomID, m); err != nil {
				t.Fatalf("register: %v", err)
			}
			err = s.resume(t)
			if err == nil {
				t.Fatal("the edited image was restored")
			}
			if !errors.Is(err, ErrImageRefused) {
				t.Fatalf("refused with %v, want ErrImageRefused", err)
			}
			t.Logf("refused: %v", err)
			if s.dst.HasRestore(s.guest.DomID) {
				t.Fatal("the refused image still waits")
			}
			s.onlyHonest(t)
		})
	}
	t.Run("truncated", func(t *testing.T) {
		if _, err := s.dst.RegisterRestore(s.guest.DomID, bytes.NewReader(s.image[:len(s.image)/2])); !errors.Is(err, vgpuimage.ErrTruncated) {
			t.Fatalf("register of half an image: %v, want ErrTruncated", err)
		}
		if err := s.resume(t); err == nil || !strings.HasPrefix(err.Error(), ipc.RejectNoImage) {
			t.Fatalf("resume with no image registered: %v, want the no-image reason", err)
		}
		s.onlyHonest(t)
	})
	if _, err := s.dst.RegisterRestore(s.guest.DomID, bytes.NewReader(s.image)); err != nil {
		t.Fatalf("register the true image: %v", err)
	}
	if err := s.resume(t); err != nil {
		t.Fatalf("resume from the true image: %v", err)
	}
	s.verifyResumed(t)
	checkHonest(t, s.honest, s.marker)
}

// TestRestorePVDRMRingMovedWhileSaved: a front end that, while its vGPU
// is saved (its requests waiting on a ring no back end reads), moves the
// ring's producer index past what the ring holds — a guest whose front
// end's ring the toolstack will grant again to the restoring back end
// (xl save and restore of a pvdrm domain, docs/pvdrm.md §8, "A device across a save") — is
// refused by the restored back end at its first look: the ring is broken
// for good, the back end stops, and closing it leaves only the honest VM,
// whose marker is untouched. The image names the index the save stood
// at; the ring's indices are the guest's, checked as ever.
func TestRestorePVDRMRingMovedWhileSaved(t *testing.T) {
	s := savePVDRMScene(t, "pvdrm")
	if _, err := s.dst.RegisterRestore(s.guest.DomID, bytes.NewReader(s.image)); err != nil {
		t.Fatalf("register: %v", err)
	}
	ring := s.g.front.Ring()
	reqProd := (*uint32)(unsafe.Pointer(&ring[0])) // io/ring.h: req_prod first
	atomic.AddUint32(reqProd, pvdrm.Slots(len(ring))+3)
	if err := s.resume(t); err != nil {
		t.Fatalf("resume: %v", err)
	}
	if err := s.g.front.Notify(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-s.g.served:
		if !errors.Is(err, pvdrm.ErrOverflow) {
			t.Fatalf("the restored back end stopped with %v, want the ring's overflow", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the restored back end serves a ring whose producer index ran past its size")
	}
	s.g.halted = true
	if err := s.g.b.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	s.g.cancel = nil
	s.onlyHonest(t)
}
